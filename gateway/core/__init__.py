"""Pure scheduling policy: workflows, estimates, budgets, dispatchers, queue disciplines, scheduler.

Nothing here performs I/O, reads a clock or creates randomness; time and the RNG are arguments.
Import-linter contracts (``pyproject.toml``) and ``tests/core/test_purity.py`` keep it that way. The
numbers of the workflow templates are data (``gateway/config/workflows.yaml``, ``gateway.config.workflows``).
"""

from gateway.core.policy import POLICIES, Policy, get_policy
from gateway.core.profile import PerfProfile
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import (
    Call,
    CallSpec,
    Stage,
    StagedWorkflow,
    Workflow,
    WorkflowTemplate,
)

__all__ = [
    "POLICIES",
    "Call",
    "CallSpec",
    "PerfProfile",
    "Policy",
    "Scheduler",
    "Stage",
    "StagedWorkflow",
    "WorkerInfo",
    "Workflow",
    "WorkflowTemplate",
    "get_policy",
]

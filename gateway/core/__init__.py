"""Pure scheduling policy: workflows, estimates, budgets, dispatchers, queue disciplines, scheduler.

Nothing here performs I/O, reads a clock or creates randomness; time and the RNG are arguments.
``tests/core/test_purity.py`` walks these modules with ``ast`` and fails on a forbidden import.
"""

from gateway.core.policy import POLICIES, Policy, get_policy
from gateway.core.profile import PerfProfile
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import (
    CHESS_TEMPLATE,
    STANDARD_WORKFLOW,
    Call,
    CallSpec,
    Stage,
    StagedWorkflow,
    Workflow,
    WorkflowTemplate,
)

__all__ = [
    "CHESS_TEMPLATE",
    "POLICIES",
    "STANDARD_WORKFLOW",
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

"""``gateway/config/workflows.yaml``: the workflow templates the scheduler budgets stages with and the
calibration workflow, loaded once (``WORKFLOWS`` and its module constants). The types are the core's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from gateway.config.base import FieldError, Name, NonNegFloat, _Strict, load_yaml_model
from gateway.core.workflow import CallSpec, PhaseSpec, WorkflowTemplate

DEFAULT_WORKFLOWS = Path(__file__).with_name("workflows.yaml")
"""The packaged workflows file (measured data shipped with the code, not an operator setting)."""


class CallModel(_Strict):
    """One call: stage kind and token counts."""

    kind: Name = Field(description="Stage kind (generate_candidate, revise, ...).")
    input_tokens: int = Field(ge=0, le=10_000_000, description="Prompt tokens.")
    output_tokens: int = Field(ge=0, le=10_000_000, description="Generated tokens.")


class PhaseModel(CallModel):
    """One phase of a template: one call's mean tokens, expected rounds and parallel width."""

    rounds: NonNegFloat = Field(1.0, description="Expected sequential rounds (0.82: runs in 82% of workflows).")
    width: int = Field(1, ge=1, le=1024, description="Calls run in parallel per round.")
    repeatable: bool = Field(False, description="The phase may repeat (revise rounds).")


class TemplateModel(_Strict):
    """One template: its phases in order and the stage kinds whose calls run in parallel."""

    phases: list[PhaseModel] = Field(min_length=1, description="Phases in order.")
    parallel_kinds: list[Name] = Field(
        default_factory=list, description="Stage kinds whose consecutive calls form one parallel stage."
    )


class WorkflowsFile(_Strict):
    """``gateway/config/workflows.yaml``."""

    templates: dict[Name, TemplateModel] = Field(min_length=1, description="Template name -> template.")
    standard_workflow: list[CallModel] = Field(
        min_length=1, description="The calibration workflow: the published standard workflow, call by call."
    )

    @model_validator(mode="after")
    def _chess_exists(self) -> WorkflowsFile:
        if "chess" not in self.templates:
            raise FieldError("templates", "the 'chess' template (the Text-to-SQL pipeline's) is required")
        return self


@dataclass(frozen=True)
class Workflows:
    """The loaded file, as the core's types."""

    templates: dict[str, WorkflowTemplate]
    parallel_kinds: dict[str, frozenset[str]]
    standard_workflow: tuple[CallSpec, ...]


def load_workflows(path: Path | str | None = None) -> Workflows:
    """Load a workflows file (default: ``gateway/config/workflows.yaml``); errors are one-line ``ConfigError``."""
    f = load_yaml_model(DEFAULT_WORKFLOWS if path is None else path, WorkflowsFile)
    templates = {
        name: WorkflowTemplate(
            name=name,
            phases=tuple(
                PhaseSpec(p.kind, p.input_tokens, p.output_tokens, p.rounds, p.width, p.repeatable) for p in t.phases
            ),
        )
        for name, t in f.templates.items()
    }
    return Workflows(
        templates=templates,
        parallel_kinds={name: frozenset(t.parallel_kinds) for name, t in f.templates.items()},
        standard_workflow=tuple(CallSpec(c.kind, c.input_tokens, c.output_tokens) for c in f.standard_workflow),
    )


WORKFLOWS = load_workflows()
CHESS_TEMPLATE: WorkflowTemplate = WORKFLOWS.templates["chess"]
"""The expected shape of a CHESS Text-to-SQL workflow (budgets of the pipeline, trace replay, simulation)."""
CHESS_PARALLEL_KINDS: frozenset[str] = WORKFLOWS.parallel_kinds["chess"]
"""Stage kinds of CHESS whose consecutive calls run in parallel."""
STANDARD_WORKFLOW: tuple[CallSpec, ...] = WORKFLOWS.standard_workflow
"""The calibration workflow (its published latency is its published steps summed; SLOs are multiples of it)."""
TEMPLATES: dict[str, WorkflowTemplate] = WORKFLOWS.templates
"""Registered templates by name (``/v1/workflows`` accepts ``template: chess`` as a budgeting hint)."""

"""Request and response models of the gateway's HTTP API (OpenAPI is generated from these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KIND_PATTERN = r"^[A-Za-z0-9_.-]{1,48}$"


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=32)
    content: str | list[dict[str, Any]] | None = None


class WorkflowCall(BaseModel):
    """One LLM call of a workflow: either ``messages`` (chat) or a synthetic prompt of ``prompt_tokens``."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(min_length=1, max_length=64, description="Unique within the workflow.")]
    kind: Annotated[
        str,
        Field(
            pattern=KIND_PATTERN, description="Stage kind (schema_linking, revise, ...): used in budgets and metrics."
        ),
    ] = "call"
    depends_on: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=512, description="Ids of the calls whose results this call needs."
    )
    messages: list[Message] | None = Field(None, min_length=1, max_length=256, description="Chat messages.")
    prompt_tokens: int | None = Field(
        None, ge=1, description="A synthetic prompt of exactly this many tokens (trace replay), instead of messages."
    )
    max_tokens: int = Field(256, ge=1, description="Most output tokens.")
    min_tokens: int = Field(0, ge=0, description="Fewest output tokens (vLLM's min_tokens).")
    ignore_eos: bool = Field(False, description="Generate until max_tokens (vLLM's ignore_eos; exact output lengths).")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    expected_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Output length the scheduler should expect (default: max_tokens, or min_tokens if exact).",
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> WorkflowCall:
        if (self.messages is None) == (self.prompt_tokens is None):
            raise ValueError("give exactly one of messages and prompt_tokens")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        return self


class WorkflowRequest(BaseModel):
    """``POST /v1/workflows``: a DAG of LLM calls run under the tenant's deadline."""

    model_config = ConfigDict(extra="forbid")

    calls: list[WorkflowCall] = Field(min_length=1, description="The calls; dependencies form a DAG.")
    deadline_s: float | None = Field(None, description="End-to-end deadline; default: the tenant's.")
    template: Literal["chess"] | None = Field(
        None,
        description="Budget stages with this template's expectation instead of the DAG's own critical path "
        "(what trace replay uses, so budgets match the simulator's).",
    )
    return_outputs: bool = Field(True, description="Include each call's output text in the response.")


class CallReport(BaseModel):
    """One call in a workflow response."""

    id: str
    kind: str
    worker: str | None
    queued_s: float
    run_s: float
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    output: str | None = None
    error: str | None = None


class WorkflowResponse(BaseModel):
    """The result of a workflow."""

    id: str
    tenant: str
    status: Literal["ok", "failed"]
    deadline_s: float
    latency_s: float
    deadline_met: bool
    calls: list[CallReport]
    error: str | None = None


class ErrorDetail(BaseModel):
    """OpenAI-style error object."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: ``{"error": {...}}`` as OpenAI clients expect."""

    error: ErrorDetail

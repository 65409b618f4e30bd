"""Request and response models of the gateway's HTTP API (OpenAPI is generated from these). Requests are
strict (a wrong JSON type is a 422, never coerced); the chat requests keep OpenAI's open shape, the gateway's
own forbid unknown fields; rules JSON Schema cannot state are checked by the routes (422)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from gateway.core.degrade import QualityMode

KIND_PATTERN = r"^[A-Za-z0-9_.-]{1,48}$"
NUMBER_PATTERN = r"^(-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?([eE][-+]?[0-9]{1,2})?)?$"
"""A JSON number, or nothing, as a header value (``x-hexflow-deadline-s``), its exponent at most two digits:
every value it admits is a finite float."""

NOT_BLANK = r"\S"
"""A string with a character that is not whitespace."""

PATTERN_PROBLEMS: dict[str, str] = {
    NOT_BLANK: "must not be blank",
    NUMBER_PATTERN: "must be a finite number of seconds written as a JSON number, such as 30 or 2.5",
    KIND_PATTERN: "must be 1 to 48 letters, digits, '_', '.' or '-'",
}
"""What a string that does not match one of the models' patterns is told, instead of the pattern itself."""
TYPE_PROBLEMS: dict[str, str] = {"finite_number": "must be a finite number (not NaN or Infinity)"}
"""What a value that fails one of pydantic's checks (by its error ``type``) is told."""


def problem_text(error: Mapping[str, Any]) -> str:
    """The words for one of pydantic's validation ``error``s: the gateway's own where it has some, else
    pydantic's message."""
    kind = error.get("type")
    ctx = error.get("ctx")
    if kind == "string_pattern_mismatch" and isinstance(ctx, Mapping):
        words = PATTERN_PROBLEMS.get(str(ctx.get("pattern")))
        if words is not None:
            return words
    words = TYPE_PROBLEMS.get(str(kind))
    return words if words is not None else str(error.get("msg", "invalid value"))


def strict(extra: Literal["allow", "forbid"], *examples: JsonValue, **schema: JsonValue) -> ConfigDict:
    """A request model's config: strict types, unknown fields refused or passed through (``extra``), and the
    schema's ``examples`` and other keywords."""
    more: dict[str, JsonValue] = {"examples": list(examples), **schema} if examples else dict(schema)
    return ConfigDict(strict=True, extra=extra, json_schema_extra=more or None)


OPEN = strict("allow")
"""Strict types, unknown fields passed through (OpenAI's open shapes)."""


class Passed(BaseModel):
    """A response model whose unknown fields are kept (a worker's objects, status sections)."""

    model_config = ConfigDict(extra="allow")


Deadline = Annotated[
    float | None,
    Field(
        gt=0, allow_inf_nan=False, description="End-to-end deadline, within the tenant's range; default: the tenant's."
    ),
]
"""A request's optional ``deadline_s``."""


def integral(v: Any) -> Any:
    """An integral float becomes the int (JSON Schema's ``integer`` includes ``37.0``); the rest is left to the
    strict check."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


Int = Annotated[int, BeforeValidator(integral)]
"""A strict int that also takes an integral JSON number (``37.0``), as JSON Schema's ``integer`` does."""
PosInt = Annotated[int, Field(ge=1), BeforeValidator(integral)]
"""A positive ``Int`` (the bound inside the type reaches the JSON schema of an optional field too)."""


class ContentPart(BaseModel):
    """One part of a message's content (``{"type": "text", "text": ...}``; other OpenAI part types pass)."""

    model_config = OPEN

    type: str = Field(min_length=1, max_length=64, description="``text``, ``image_url``, ...")
    text: str | None = Field(None, description="The text of a ``text`` part.")


class Message(BaseModel):
    """One chat message (OpenAI's shape; fields beside ``role`` and ``content`` are passed through)."""

    model_config = strict("allow", {"role": "user", "content": "How many singers are there?"})

    role: str = Field(min_length=1, max_length=32, description="``system``, ``user``, ``assistant``, ``tool``, ...")
    content: str | list[ContentPart] | None = Field(None, description="A string, or a list of content parts.")


def _no_default(schema: dict[str, Any]) -> None:
    """Leave ``default: null`` out of a field whose schema does not allow null."""
    schema.pop("default", None)


_ONE_PROMPT: list[JsonValue] = [
    {"required": ["messages"], "not": {"anyOf": [{"required": ["prompt_tokens"]}, {"required": ["shared_prefix"]}]}},
    {"required": ["prompt_tokens"], "not": {"required": ["messages"]}},
]

MAX_SHARED_PREFIX_SEGMENTS = 8
"""Most segments in one call's ``shared_prefix``."""
MAX_SEGMENT_NAME = 128
"""Longest name of a ``shared_prefix`` segment."""


class SharedPrefixSegment(BaseModel):
    """A run of a synthetic prompt that other calls share: ``tokens`` token ids derived from ``name`` (and,
    with scope ``workflow``, from the workflow's own id), so calls that name the same segments in the same
    order send the same leading token ids and the worker's prefix cache serves them (vLLM's automatic
    prefix caching)."""

    model_config = strict("forbid", {"name": "sql_generation/template", "tokens": 1200, "scope": "global"})

    name: str = Field(
        min_length=1,
        max_length=MAX_SEGMENT_NAME,
        description="What the segment is (a template, a schema): equal names, equal token ids.",
    )
    tokens: PosInt = Field(description="Its length in tokens.")
    scope: Literal["workflow", "global"] = Field(
        "global",
        description="``global``: every call that names it shares it (a stage's fixed template); ``workflow``: "
        "only calls of the same workflow do (the schema and question that later rounds repeat).",
    )


class WorkflowCall(BaseModel):
    """One LLM call of a workflow: either ``messages`` (chat) or, in benchmark mode only (``benchmark: true``
    in the gateway's config), a synthetic prompt of ``prompt_tokens``."""

    model_config = strict(
        "forbid",
        {"id": "link", "kind": "schema_linking", "prompt_tokens": 12, "max_tokens": 4},
        {
            "id": "revise",
            "kind": "revise",
            "prompt_tokens": 40,
            "shared_prefix": [
                {"name": "revise/template", "tokens": 16, "scope": "global"},
                {"name": "schema+question", "tokens": 16, "scope": "workflow"},
            ],
            "max_tokens": 4,
        },
        oneOf=_ONE_PROMPT,
    )

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
    messages: Annotated[list[Message], Field(min_length=1, max_length=256)] | SkipJsonSchema[None] = Field(
        None,
        description="Chat messages (exactly one of ``messages`` and ``prompt_tokens``).",
        json_schema_extra=_no_default,
    )
    prompt_tokens: PosInt | SkipJsonSchema[None] = Field(
        None,
        description="Benchmark mode only (benchmark: true): a synthetic prompt of exactly this many tokens "
        "(trace replay), instead of messages.",
        json_schema_extra=_no_default,
    )
    shared_prefix: (
        Annotated[list[SharedPrefixSegment], Field(max_length=MAX_SHARED_PREFIX_SEGMENTS)] | SkipJsonSchema[None]
    ) = Field(
        None,
        description="Benchmark mode only, with ``prompt_tokens``: the synthetic prompt starts with these "
        "segments, in order (at most ``prompt_tokens`` tokens in all), and the call's own filler makes up the "
        "rest. Calls naming the same segments send the same leading tokens, which the worker's prefix cache can serve.",
        json_schema_extra=_no_default,
    )
    max_tokens: Int = Field(256, ge=1, description="Most output tokens.")
    min_tokens: Int = Field(0, ge=0, description="Fewest output tokens (vLLM's min_tokens; at most max_tokens).")
    ignore_eos: bool = Field(
        False,
        description="Benchmark mode only: generate until max_tokens (vLLM's ignore_eos; exact output lengths).",
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    expected_output_tokens: PosInt | None = Field(
        None,
        description="Output length the scheduler should expect (default: max_tokens, or min_tokens if exact).",
    )

    @field_validator("messages", "prompt_tokens", "shared_prefix", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        # ``null`` would make "exactly one of" ambiguous (the schema's oneOf counts a present key).
        if v is None:
            raise ValueError("must not be null (leave the field out)")
        return v

    @model_validator(mode="after")
    def _one_prompt(self) -> WorkflowCall:
        if (self.messages is None) == (self.prompt_tokens is None):
            raise ValueError("give exactly one of messages and prompt_tokens")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        if self.shared_prefix is not None:
            if self.prompt_tokens is None:
                raise ValueError("shared_prefix needs prompt_tokens (chat messages carry their own text)")
            total = sum(s.tokens for s in self.shared_prefix)
            if total > self.prompt_tokens:
                raise ValueError(f"shared_prefix: {total} tokens exceed prompt_tokens={self.prompt_tokens}")
        return self


class WorkflowRequest(BaseModel):
    """``POST /v1/workflows``: a DAG of LLM calls run under the tenant's deadline."""

    model_config = strict(
        "forbid",
        {
            "calls": [
                {
                    "id": "link",
                    "kind": "schema_linking",
                    "messages": [{"role": "user", "content": "Which tables hold singers?"}],
                    "max_tokens": 4,
                },
                {
                    "id": "sql",
                    "kind": "sql_generation",
                    "depends_on": ["link"],
                    "messages": [{"role": "user", "content": "Write the SQL."}],
                    "max_tokens": 4,
                },
            ]
        },
    )

    calls: list[WorkflowCall] = Field(min_length=1, description="The calls; dependencies form a DAG.")
    deadline_s: Deadline = None
    template: Literal["chess"] | None = Field(
        None,
        description="Budget stages with this template's expectation instead of the DAG's own critical path "
        "(what trace replay uses, so budgets match the simulator's).",
    )
    return_outputs: bool = Field(True, description="Include each call's output text in the response.")


class CallReport(BaseModel):
    """One call in a workflow response: its ``CallOutcome`` (``gateway.core.records``) as the API shows it
    (``routers.workflows.workflow_response``); the replay client parses responses back into it."""

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


class Text2SqlRequest(BaseModel):
    """``POST /v1/text2sql``."""

    model_config = strict("forbid", {"question": "How many customers are there?", "db_id": "demo_retail"})

    question: str = Field(pattern=NOT_BLANK, description="The question in natural language (not blank).")
    db_id: str = Field(min_length=1, max_length=64, description="Which database (see the databases file).")
    evidence: str | None = Field(None, description="A hint (BIRD-style evidence), optional.")
    deadline_s: Deadline = None
    stream: bool = Field(False, description="Send stage completions as server-sent events, the result last.")


class Text2SqlStage(BaseModel):
    """One call of one stage."""

    kind: str
    worker: str | None
    queued_s: float
    run_s: float
    error: str | None = None


class Text2SqlCandidate(BaseModel):
    """One SQL candidate through its revisions."""

    index: int
    strategy: str
    sql: str | None
    valid: bool
    row_count: int | None
    problem: str | None
    revisions: int
    verdict: bool | None


class Text2SqlDegradation(BaseModel):
    """One knob a question ran with turned down, and the decision that turned it down."""

    step: Literal["candidates", "revisions", "evaluation"]
    detail: str = Field(description="What was skipped, in words (e.g. 'candidates 2 -> 1').")
    at: str = Field(description="The stage boundary of the decision: 'arrival' or the stage kind just finished.")
    reason: str = Field(description="'predicted to miss the deadline' (adaptive) or 'quality mode fast'.")
    predicted_full_s: float | None = Field(
        description="Predicted remaining seconds with the fullest knobs still open then (null: no worker)."
    )
    predicted_s: float | None = Field(description="Predicted remaining seconds with the knobs chosen.")
    time_left_s: float = Field(description="Seconds to the deadline at the decision.")


class Text2SqlResponse(BaseModel):
    """The answer to a question: the chosen SQL and its result, every candidate and every stage's call.
    ``status`` other than ``ok`` comes with ``error`` (and ``failed_stage`` when a stage failed)."""

    id: str
    status: Literal["ok", "no_valid_sql", "deadline_exceeded", "failed"]
    sql: str | None
    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    candidates: list[Text2SqlCandidate]
    revisions: int
    stages: list[Text2SqlStage]
    deadline_s: float
    latency_s: float
    deadline_met: bool
    local_s: float
    quality_mode: QualityMode = Field(description="The tenant's quality mode (tenants.yaml `quality`).")
    degraded: list[Text2SqlDegradation] = Field(
        description="Knobs turned down to meet the deadline (empty: full quality), each with the decision why."
    )
    error: str | None = None
    failed_stage: str | None = None


class Health(BaseModel):
    """``GET /healthz``."""

    status: Literal["ok"]


class EjectedWorker(BaseModel):
    """A worker out of dispatch as an outlier, in ``/readyz``."""

    name: str
    reason: str = Field(description="Why it was ejected (its recent calls' failures or latency against its peers').")
    ejected_for_s: float = Field(
        description="Seconds until its back-off ends; then a probe call re-admits it once one answers (0: due)."
    )


class Readiness(BaseModel):
    """``GET /readyz``: ready, or why not."""

    ready: bool
    healthy_workers: int | None = None
    reason: str | None = Field(
        None, description="Why not ready: starting, shutting down, not the leader, no healthy worker."
    )
    leader: str | None = Field(None, description="With leader election: the replica that holds the Lease, if known.")
    ejected_workers: list[EjectedWorker] | None = Field(
        None,
        description="The workers ejected as outliers, with why and for how long (only while any is, on a leader "
        "past start-up).",
    )


class WorkerStatus(Passed):
    """One worker in ``/v1/status`` (more fields than these: queues, estimates, metrics)."""

    name: str


class GatewayStatus(Passed):
    """``GET /v1/status``: workers, queues, in-flight calls, current alpha, tuning and discovery state."""

    policy: str
    alpha: float
    ready: bool
    draining: bool
    active_workflows: int
    active_by_tenant: dict[str, int]
    parked_calls: int
    tenants: dict[str, Any]
    tuning: dict[str, Any] | None
    discovery: dict[str, Any] | None
    workers: list[WorkerStatus]


class ErrorDetail(BaseModel):
    """OpenAI-style error object."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(Passed):
    """Every 4xx/5xx body: ``{"error": {...}}`` as OpenAI clients expect. A 422 from validation adds every
    problem under ``detail``; a failed workflow adds its report under ``workflow``."""

    error: ErrorDetail
    detail: list[Any] | None = None
    workflow: WorkflowResponse | None = None


def sse_content(data: str) -> dict[str, Any]:
    """The ``text/event-stream`` entry of a 200 that may stream: the schema of one event, ``data`` described."""
    event = {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string", "description": data}, "event": {"type": "string"}},
    }
    return {"text/event-stream": {"schema": event}}


_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds after which a retry may succeed.", "schema": {"type": "string"}}
}
_STATUS_TEXT: dict[int, str] = {
    400: "The worker refused the call (its 4xx, message and param passed through).",
    401: "Missing or unknown API key (``WWW-Authenticate: Bearer``).",
    404: "An unknown model or database.",
    413: "The request body is over ``limits.max_body_bytes``.",
    415: "The body was sent with a content type other than JSON: send ``Content-Type: application/json``.",
    422: "Malformed JSON (not UTF-8 text, or nested too deeply to parse among them), a field of the wrong "
    "type or out of range, or a rule the schema cannot state (the message names the field).",
    429: "Over the tenant's queue or concurrency limit (``Retry-After``).",
    502: "The call failed on every attempt (the worker answered garbage, or a 5xx).",
    503: "No healthy worker, the gateway is starting or shutting down, or a database is down (``Retry-After``"
    " where a retry may succeed).",
    504: "A call timed out on its worker.",
}


ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
"""The JSON schema of an error body, by reference (where a route states its error content itself)."""


def route_responses(
    *statuses: int, ok: dict[str, Any] | None = None, schema: dict[str, Any] | None = None, more: str = ""
) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: ``ok`` (its 200, when not the response model's) and an ``ErrorResponse``
    entry per error status (``Retry-After`` on 429/503); with ``schema``, the error statuses' JSON body is
    that schema instead (stated, not the model's), and their descriptions end with ``more``."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        if status == 200:
            if ok is not None:
                out[200] = ok
            continue
        entry: dict[str, Any] = {"model": ErrorResponse} if schema is None else {}
        entry["description"] = _STATUS_TEXT[status] + more
        if status in (429, 503):
            entry["headers"] = _RETRY_AFTER
        if schema is not None:
            entry["content"] = {"application/json": {"schema": schema}}
        out[status] = entry
    return out

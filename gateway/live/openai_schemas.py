"""Request and response models of the OpenAI-compatible routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``): OpenAI's open shapes, strict in the fields the gateway reads
(``gateway.live.schemas`` says how the models are checked)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from gateway.live.schemas import OPEN, Int, Message, Passed, PosInt, integral, strict


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``."""

    model_config = OPEN

    include_usage: bool | None = Field(None, description="Send a last chunk with the usage.")


class _SamplingRequest(BaseModel):
    """What OpenAI's chat and text completion requests share (fields not listed pass to the worker as sent)."""

    model_config = OPEN

    model: str | None = Field(None, description="A model the cluster serves (``GET /v1/models``); 404 otherwise.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: Annotated[Literal[1], BeforeValidator(integral)] | None = Field(
        None, description="Completions per request: the gateway schedules one."
    )
    stream: bool | None = Field(None, description="Answer server-sent events (``text/event-stream``).")
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = Field(None, description="Up to 4 stop sequences.")
    seed: Int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    user: str | None = None
    priority: Int | None = Field(None, description="Ignored: the gateway sets the priority from its own queue.")


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``: OpenAI's request. Fields not listed here are passed to the worker
    as sent; ``model`` and ``priority`` are not (the gateway picks the worker and sets the priority)."""

    model_config = strict(
        "allow", {"model": "llama-3.1-70b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    )

    messages: list[Message] = Field(min_length=1, description="The conversation so far.")
    max_tokens: PosInt | None = Field(None, description="Most output tokens (default 256 for scheduling).")
    max_completion_tokens: PosInt | None = Field(None, description="OpenAI's newer name of ``max_tokens``.")


class ChatMessageOut(Passed):
    """The message of a choice."""

    role: str
    content: str | None = None


class ChatChoice(Passed):
    """One choice of a chat completion."""

    index: int
    message: ChatMessageOut
    finish_reason: str | None = None


class Usage(Passed):
    """Token counts of a completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _CompletionObject(Passed):
    """What a worker's completion objects share, passed through (vLLM adds fields of its own)."""

    id: str
    object: str
    created: int
    model: str
    usage: Usage | None = None


class ChatCompletion(_CompletionObject):
    """The worker's ``chat.completion`` object, passed through (vLLM adds fields of its own)."""

    object: str = Field(description="``chat.completion``.")
    choices: list[ChatChoice]


TokenIds = Annotated[list[Annotated[int, Field(ge=0), BeforeValidator(integral)]], Field(min_length=1)]
"""A prompt as token ids (non-negative integers)."""


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: OpenAI's legacy completions request, as vLLM serves it. Fields not listed here
    are passed to the worker as sent; ``model`` and ``priority`` are not (the gateway picks the worker and sets
    the priority)."""

    model_config = strict("allow", {"model": "llama-3.1-70b", "prompt": "SELECT", "max_tokens": 8})

    prompt: (
        Annotated[str, Field(min_length=1)]
        | TokenIds
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
    ) = Field(description="One prompt: a text, token ids, or a list holding one text (one call, one answer).")
    max_tokens: PosInt | None = Field(None, description="Most output tokens (default 16, as OpenAI's).")
    echo: bool | None = None


class CompletionChoice(Passed):
    """One choice of a completion."""

    index: int
    text: str
    finish_reason: str | None = None


class Completion(_CompletionObject):
    """The worker's ``text_completion`` object, passed through (vLLM adds fields of its own)."""

    object: str = Field(description="``text_completion``.")
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    """One served model."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"]
    data: list[ModelCard]

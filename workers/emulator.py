"""Emulated vLLM worker: an OpenAI-compatible HTTP server that is a TEST DOUBLE for a GPU.

    python -m workers.emulator --gpu A100 --model llama-3.1-70b --port 8001 [--time-scale 0.05] [--seed N]
        [--max-num-seqs N] [--max-model-len N] [--scheduling-policy fcfs|priority] [--served-model-name NAME]
        [--catalog GPUS_YAML] [--no-enable-prefix-caching] [--enable-prompt-tokens-details]

It serves vLLM's API surface (``/v1/chat/completions`` and ``/v1/completions``, streaming with
``stream_options.include_usage`` too, ``/v1/models``, ``/health``, ``/metrics`` with vLLM's V1 metric
names) and runs every request through the simulator's engine model (continuous batching, chunked
prefill, KV capacity, an engine waiting queue, vLLM's ``priority`` field) in real time scaled by
``--time-scale``. It computes nothing: its text comes from a pluggable ``Responder`` (by default filler
of exactly the requested length), and its token counts follow a documented deterministic rule
(``count_tokens``). Use it to exercise the live gateway on machines without GPUs; never in production.
``--catalog`` reads the profile from another ``gpus.yaml`` (any constants: ``hexflow bench fidelity``
runs workers whose speed is not in the packaged catalogue and calibrates them with ``hexflow calibrate``).

Prefix caching is on by default, as in vLLM V1 (``--no-enable-prefix-caching`` turns it off): the prompt,
as the emulator tokenizes it (one token per word or token id; ``chat_prompt_words`` for chat), is cut into
full 16-token blocks named by a hash of their words (``prompt_chain``); the engine model caches them and a
later prompt with the same leading blocks skips their prefill. ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` count the prompt tokens looked up and served from the cache (both 0 with caching
off, as in vLLM), and ``--enable-prompt-tokens-details`` reports a request's hits as
``usage.prompt_tokens_details.cached_tokens``, as vLLM's flag of that name does.

One concept in one module (about 850 lines): the emulated worker's HTTP surface (``create_app``), the
token rule and responders it answers with, its metrics and its command line belong together, as vLLM's
own ``api_server`` does; the engine model it drives lives in ``workers/engine_rt.py`` and the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.core.prefix import BLOCK_TOKENS, PrefixSeg, prompt_prefix
from gateway.core.profile import PerfProfile
from workers.engine_rt import RealTimeEngine, Ticket

CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 4
CHAT_TEMPLATE_TOKENS_FIXED = 3
DEFAULT_MAX_MODEL_LEN = 32768
KV_BLOCK_SIZE = BLOCK_TOKENS
"""Tokens per KV-cache block (vLLM's default on GPUs): the unit of prefix caching, reported in
``vllm:cache_config_info``."""
CHAT_HEADER = ("<|start_header_id|>", "<|end_header_id|>")
"""The words around a message's role in the emulator's chat template (``chat_prompt_words``)."""
CHAT_END_OF_TURN = "<|eot_id|>"
MAX_BODY_BYTES = 8 * 1024 * 1024


def count_tokens(text: str) -> int:
    """The emulator's tokenizer: one token per whitespace-separated word (deterministic, documented).

    A caller that wants a prompt of exactly N tokens sends N words; the gateway's trace replay does.
    """
    return len(text.split())


def chat_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """Prompt tokens of a chat request: the words of every message plus the chat template's overhead
    (4 per message and 3 for the assistant header, as Llama-3's template roughly adds)."""
    n = CHAT_TEMPLATE_TOKENS_FIXED
    for m in messages:
        n += CHAT_TEMPLATE_TOKENS_PER_MESSAGE + count_tokens(_content_text(m.get("content")))
    return n


def chat_prompt_words(messages: Sequence[dict[str, Any]]) -> list[str]:
    """A chat request's prompt as the emulator tokenizes it: ``chat_prompt_tokens`` words, a Llama-3-like
    rendering (each message as header, role, header end, its words, end of turn; then the assistant's
    header). The prefix cache hashes these words, so the role and the template count as vLLM's would."""
    start, end = CHAT_HEADER
    words: list[str] = []
    for m in messages:
        role = "".join(str(m.get("role", "")).split())  # one word, whatever it holds
        words += (start, role, end)
        words += _content_text(m.get("content")).split()
        words.append(CHAT_END_OF_TURN)
    words += (start, "assistant", end)
    return words


def prompt_chain(words: Sequence[str], max_blocks: int) -> tuple[PrefixSeg, ...]:
    """The prefix chain of a prompt of ``words`` (one token each): a shared segment per full
    ``KV_BLOCK_SIZE``-word block, at most ``max_blocks``, named by a hash of the block's words
    (``gateway.core.prefix.prompt_prefix``). The engine chains the names as vLLM chains its block hashes, so
    two prompts share exactly their equal leading blocks; an incomplete last block is never cached."""
    return prompt_prefix(words, block_tokens=KV_BLOCK_SIZE, max_blocks=max_blocks)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise _ApiError(400, "message content must be a string or a list of parts")


@dataclass(frozen=True)
class GenRequest:
    """What a responder sees of a request."""

    kind: str  # "chat" or "completion"
    prompt_text: str
    messages: list[dict[str, Any]] | None
    prompt_tokens: int
    max_tokens: int
    seed: int | None


class Responder(Protocol):
    """Produces the text of a response of exactly ``n_tokens`` tokens (``count_tokens``)."""

    def text(self, request: GenRequest, n_tokens: int, rng: random.Random) -> str:
        """The response text."""
        ...


class ScriptedResponder(Protocol):
    """A responder that may answer with text of its own length (scripted answers for end-to-end tests)."""

    def answer(self, request: GenRequest) -> str | None:
        """The whole answer, or None to fall back to ``text`` (filler of the requested length)."""
        ...


class FillerResponder:
    """Filler words, exactly ``n_tokens`` of them (the default: trace replay only needs lengths)."""

    WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")

    def text(self, request: GenRequest, n_tokens: int, rng: random.Random) -> str:
        """``n_tokens`` filler words."""
        return " ".join(self.WORDS[i % len(self.WORDS)] for i in range(n_tokens))


class _ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self.param = param


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's OpenAI-style error body."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class LagMonitor:
    """Measures event-loop lag: how late a 10 ms sleep wakes up (the emulator's own health)."""

    def __init__(self, interval_s: float = 0.01, keep: int = 6000) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.keep = keep
        self.max_lag_s = 0.0

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            lag = max(loop.time() - t0 - self.interval_s, 0.0)
            self.max_lag_s = max(self.max_lag_s, lag)
            self.samples.append(lag)
            if len(self.samples) > self.keep:
                del self.samples[: self.keep // 2]

    def quantile(self, q: float) -> float:
        """Lag quantile over the recent samples (0 when none)."""
        if not self.samples:
            return 0.0
        s = sorted(self.samples)
        return s[min(int(q * len(s)), len(s) - 1)]


class _EngineMetrics(Collector):
    """Gauges read from the engine at scrape time, plus the emulator's own (``hexflow_emulator_*``)."""

    def __init__(self, engine: RealTimeEngine, model_name: str, lag: LagMonitor) -> None:
        self.engine = engine
        self.model_name = model_name
        self.lag = lag
        self.created = time.time()

    def collect(self) -> Any:
        for name, doc, v in (
            (
                "hexflow_emulator_event_loop_lag_p99_seconds",
                "Event-loop lag, p99 of recent samples.",
                self.lag.quantile(0.99),
            ),
            ("hexflow_emulator_event_loop_lag_max_seconds", "Largest event-loop lag seen.", self.lag.max_lag_s),
            (
                "hexflow_emulator_model_iterations",
                "Engine iterations modelled so far.",
                self.engine.iterations_advanced,
            ),
            (
                "hexflow_emulator_model_cpu_seconds",
                "CPU seconds spent advancing the engine model.",
                self.engine.advance_cpu_s,
            ),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(v))
            yield g
        labels = ["model_name", "engine"]
        values = [self.model_name, "0"]
        for name, doc, v in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", self.engine.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.engine.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.engine.kv_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, float(v))
            yield g
        # Counted when a request is admitted, from the engine's prefix cache (vLLM counts when it schedules a
        # request; with caching off it looks nothing up and both stay 0).
        caching = self.engine.prefix_caching
        stats = self.engine.engine.stats
        for name, doc, v in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prompt_tokens if caching else 0,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_hit_tokens if caching else 0,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, float(v), created=self.created)
            yield c
        # vLLM's cache config as labels of a constant gauge (vLLM 0.32's label names; older versions have
        # num_gpu_blocks only): the KV capacity in tokens, which ``hexflow calibrate`` reads.
        cap = self.engine.profile.kv_capacity_tokens
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "enable_prefix_caching"],
        )
        block = self.engine.profile.block_tokens  # the profile's: its engine reuses whole blocks of it
        blocks = cap // block
        info.add_metric([str(block), str(blocks), str(blocks * block), str(caching)], 1.0)
        yield info


class _Metrics:
    def __init__(self, engine: RealTimeEngine, model_name: str, lag: LagMonitor) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineMetrics(engine, model_name, lag))
        self.engine = engine
        labels = ["model_name", "engine"]
        self.labels = {"model_name": model_name, "engine": "0"}
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        # vLLM 0.32's bucket edges (tests/vllm_cpu/REAL_VLLM_NOTES.md).
        ttft_buckets = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
        ttft_buckets += [20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
        buckets = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0]
        buckets += [480.0, 960.0, 1920.0, 7680.0]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds.",
            labels,
            buckets=ttft_buckets,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            labels,
            buckets=buckets,
            registry=r,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Time spent in the WAITING phase.", labels, buckets=buckets, registry=r
        )
        for m in (self.prompt_tokens, self.generation_tokens):
            m.labels(**self.labels)
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(**self.labels, finished_reason=reason)
        # The emulator's own: what reached the engine, and what its client abandoned (vLLM aborts a
        # request whose connection closes, and counts it nowhere; tests need to see it).
        self.received = Counter(
            "hexflow_emulator_requests_received", "Generation requests that reached the engine.", registry=r
        )
        self.aborted = Counter(
            "hexflow_emulator_requests_aborted",
            "Generation requests aborted because their client closed the connection first.",
            registry=r,
        )

    def record(self, ticket: Ticket, prompt_tokens: int, output_tokens: int, reason: str) -> None:
        lab = self.labels
        self.prompt_tokens.labels(**lab).inc(prompt_tokens)
        self.generation_tokens.labels(**lab).inc(output_tokens)
        self.success.labels(**lab, finished_reason=reason).inc()
        end = ticket.engine_done_real if ticket.engine_done_real is not None else self.engine.now()
        self.e2e.labels(**lab).observe(end - ticket.arrived_real)
        if ticket.first_token_real is not None:
            self.ttft.labels(**lab).observe(ticket.first_token_real - ticket.arrived_real)
        if ticket.admitted_real is not None:
            self.queue.labels(**lab).observe(max(ticket.admitted_real - ticket.arrived_real, 0.0))


@dataclass
class EmulatorConfig:
    """Settings of one emulated worker."""

    profile: PerfProfile
    served_model_name: str
    time_scale: float = 1.0
    seed: int = 0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    priority_scheduling: bool = False
    add_request_overhead: bool = True
    prefix_caching: bool = True
    """Cache prompt prefixes (vLLM's ``--enable-prefix-caching``, on by default in V1)."""
    prompt_tokens_details: bool = False
    """Report ``usage.prompt_tokens_details.cached_tokens`` (vLLM's ``--enable-prompt-tokens-details``)."""
    refuse_context_overflow: bool = False
    """A request whose prompt plus ``max_tokens`` exceeds ``max_model_len`` is a 400 (the vLLM releases that
    check it) instead of having its ``max_tokens`` cut to what fits (vLLM 0.32.0, observed:
    tests/vllm_cpu/REAL_VLLM_NOTES.md)."""
    clock: Callable[[], float] = time.monotonic
    """The real clock the engine model runs against, and every time the worker reports is read from. It must
    be the event loop's clock (``loop.time``; the default equals it): the engine sleeps on the loop. Tests
    inject a virtual-time loop's ``time``, so latencies are the model's whatever the machine's load."""


class Emulator:
    """The emulated worker's state: engine, metrics, responder."""

    def __init__(self, cfg: EmulatorConfig, responder: Responder | None = None) -> None:
        self.cfg = cfg
        self.engine = RealTimeEngine(
            cfg.profile,
            time_scale=cfg.time_scale,
            priority_scheduling=cfg.priority_scheduling,
            prefix_caching=cfg.prefix_caching,
            clock=cfg.clock,
        )
        self.lag = LagMonitor()
        self.metrics = _Metrics(self.engine, cfg.served_model_name, self.lag)
        self.responder: Responder = responder or FillerResponder()
        self._seed = cfg.seed
        self.created = int(time.time())
        self.fingerprint = f"hexflow-emulator-{uuid.uuid4().hex[:8]}"

    def _rng(self, request_seed: int | None, prompt: str) -> random.Random:
        # Deterministic per (emulator seed, request seed or prompt): the same request gets the same text.
        base = request_seed if request_seed is not None else hash(prompt) & 0xFFFFFFFF
        return random.Random(self._seed * 1_000_003 + base)

    def check_model(self, model: Any) -> None:
        if model is not None and model != self.cfg.served_model_name:
            raise _ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {self.cfg.served_model_name}.",
                "NotFoundError",
                "model",
            )

    def lengths(self, body: dict[str, Any], prompt_tokens: int) -> tuple[int, int]:
        """(output tokens to produce, effective max_tokens) after vLLM's checks (messages as vLLM's).

        As vLLM 0.32.0 does, a request whose prompt plus ``max_tokens`` overflows the context is not an
        error: ``max_tokens`` is cut to what fits; with ``refuse_context_overflow`` it is a 400 in the words
        of the vLLM releases that refuse it.
        """
        max_len = self.cfg.max_model_len
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool)):
            raise _ApiError(400, f"max_tokens must be an integer, got {mt!r}.", param="max_tokens")
        if prompt_tokens > max_len:
            raise _ApiError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your prompt contains at "
                f"least {max_len + 1} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={max_len + 1})",
                param="input_tokens",
            )
        if mt is not None and mt < 1:
            raise _ApiError(
                400, f"max_tokens must be at least 1, got {mt}. (parameter=max_tokens, value={mt})", param="max_tokens"
            )
        if mt is not None and mt > max_len:
            raise _ApiError(
                400,
                f"max_tokens={mt} cannot be greater than max_model_len={max_len}. Please request fewer output "
                f"tokens. (parameter=max_tokens, value={mt})",
                param="max_tokens",
            )
        room = max_len - prompt_tokens
        if room < 1:
            raise _ApiError(
                400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", param="max_tokens"
            )
        if mt is not None and mt > room and self.cfg.refuse_context_overflow:
            raise _ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {mt}. This model's maximum context length "
                f"is {max_len} tokens and your request has {prompt_tokens} input tokens ({mt} > {max_len} - "
                f"{prompt_tokens}). (parameter=max_tokens, value={mt})",
                param="max_tokens",
            )
        max_tokens = room if mt is None else min(mt, room)
        min_t = body.get("min_tokens", 0)
        if not isinstance(min_t, int) or isinstance(min_t, bool) or min_t < 0:
            raise _ApiError(400, f"min_tokens must be greater than or equal to 0, got {min_t}.")
        if mt is not None and min_t > mt:
            raise _ApiError(400, f"min_tokens must be less than or equal to max_tokens={mt}, got {min_t}.")
        # The filler responder never emits EOS early: it always produces max_tokens.
        return max_tokens, max_tokens


def _validation_error(kind: str, loc: str, msg: str, body_items: int, ctx: str | None = None) -> _ApiError:
    """FastAPI-style request validation error in vLLM's envelope (type "Bad Request", param = loc)."""
    detail = f"{{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', 'input': '<dict of {body_items} items>'"
    detail += f", 'ctx': {{'error': '{ctx}'}}}}" if ctx else "}"
    return _ApiError(400, f"1 validation error:\n  {detail}", "Bad Request", loc)


def _parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise _ApiError(413, "Request body too large.", "Bad Request")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _validation_error("json_invalid", f"body.{exc.pos}", "JSON decode error", 0, exc.msg) from None
    except UnicodeDecodeError:
        raise _validation_error("json_invalid", "body.0", "JSON decode error", 0, "invalid UTF-8") from None
    if not isinstance(body, dict):
        raise _validation_error("model_attributes_type", "body", "Input should be a valid dictionary", 0)
    return body


def _priority(body: dict[str, Any], emu: Emulator) -> int:
    p = body.get("priority", 0)
    if not isinstance(p, int) or isinstance(p, bool):
        raise _ApiError(400, "priority must be an integer.", param="priority")
    # Like vLLM, a server started with fcfs accepts the field and ignores it.
    return p if emu.cfg.priority_scheduling else 0


def create_app(cfg: EmulatorConfig, responder: Responder | None = None) -> FastAPI:
    """The emulated worker's ASGI app (the engine driver runs in its lifespan)."""
    emu = Emulator(cfg, responder)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(emu.engine.run(), name="emulator-engine"),
            asyncio.create_task(emu.lag.run(), name="emulator-lag-monitor"),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(title="Emulated vLLM worker (test double)", lifespan=lifespan)
    app.state.emulator = emu

    @app.exception_handler(_ApiError)
    async def api_error(_: Request, exc: _ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.err_type, exc.param), status_code=exc.status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        name = cfg.served_model_name
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": emu.created,
                    "owned_by": "vllm",
                    "root": name,
                    "parent": None,
                    "max_model_len": cfg.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                            "object": "model_permission",
                            "created": emu.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(emu.metrics.registry).decode(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        body = _parse_body(await request.body())
        emu.check_model(body.get("model"))
        messages = body.get("messages")
        if messages is None:
            raise _validation_error("missing", "body.messages", "Field required", len(body))
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _validation_error("list_type", "body.messages", "Input should be a valid list", len(body))
        if not messages:
            raise _ApiError(400, "Cannot apply chat template to an empty conversation. Provide at least one message.")
        for i, m in enumerate(messages):
            # vLLM takes any role its chat template renders (custom roles included; the Llama-3 template renders
            # every one), but its request model requires a string.
            if "role" not in m:
                raise _validation_error("missing", f"body.messages.{i}.role", "Field required", len(body))
            if not isinstance(m["role"], str):
                msg = "Input should be a valid string"
                raise _validation_error("string_type", f"body.messages.{i}.role", msg, len(body))
        prompt_tokens = chat_prompt_tokens(messages)
        text = " ".join(_content_text(m.get("content")) for m in messages)
        words = chat_prompt_words(messages) if cfg.prefix_caching else ()
        req = GenRequest("chat", text, messages, prompt_tokens, 0, body.get("seed"))
        return await _generate(emu, request, body, req, chat=True, prompt_words=words)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        body = _parse_body(await request.body())
        emu.check_model(body.get("model"))
        prompt = body.get("prompt")
        words: list[str]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            text, words = prompt, prompt.split()  # count_tokens: one token per word
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            words = list(map(str, prompt))  # one token per id
            text = " ".join(words)
        else:
            raise _ApiError(
                400, "prompt must be a string, a list with one string, or a list of token ids.", param="prompt"
            )
        req = GenRequest("completion", text, None, len(words), 0, body.get("seed"))
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body = {**body, "max_tokens": 16}  # the OpenAI completions default
        return await _generate(emu, request, body, req, chat=False, prompt_words=words)

    return app


_NULL_TOP = {
    "service_tier": None,
    "system_fingerprint": None,
    "prompt_logprobs": None,
    "prompt_token_ids": None,
    "prompt_text": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}


async def _client_gone(request: Request) -> None:
    """Return when the client closed its connection (ASGI ``http.disconnect``; the body is read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _finished(engine: RealTimeEngine, ticket: Ticket, overhead: float) -> None:
    """Wait until the engine finished the request, plus the request overhead."""
    while not ticket.done:
        ticket.changed.clear()
        await ticket.changed.wait()
    if overhead > 0:
        # The overhead counts from the model's finish time, not from when the driver noticed it,
        # so event-loop lag on a busy machine is absorbed instead of added to every response.
        done_at = ticket.engine_done_real if ticket.engine_done_real is not None else engine.now()
        await asyncio.sleep(max(done_at + overhead - engine.now(), 0.0))


async def _finished_unless_gone(emu: Emulator, request: Request, ticket: Ticket, overhead: float) -> bool:
    """Wait for the request's end while watching its connection, as vLLM's ``with_cancellation`` does;
    False when the client left first."""
    work = asyncio.ensure_future(_finished(emu.engine, ticket, overhead))
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, gone):
            t.cancel()
        await asyncio.wait({work, gone})
    return not work.cancelled() and work.exception() is None


async def _generate(
    emu: Emulator, request: Request, body: dict[str, Any], req: GenRequest, *, chat: bool, prompt_words: Sequence[str]
) -> Response:
    """Run one request through the engine model and answer it (``prompt_words``: the prompt as the emulator
    tokenizes it, hashed into its prefix chain when prefix caching is on)."""
    n_out, max_tokens = emu.lengths(body, req.prompt_tokens)
    priority = _priority(body, emu)
    if body.get("n", 1) != 1:
        raise _ApiError(400, "Only n=1 is supported by the emulated worker.", param="n")
    stream = bool(body.get("stream", False))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    rng = emu._rng(req.seed, req.prompt_text)
    gen = GenRequest(req.kind, req.prompt_text, req.messages, req.prompt_tokens, max_tokens, req.seed)
    scripted = getattr(emu.responder, "answer", None)
    natural = scripted(gen) if callable(scripted) else None
    if isinstance(natural, str):
        # A scripted answer has its own length (the model "stops"): clipped to max_tokens, padded with
        # filler up to min_tokens. Tokens keep their leading whitespace so the text survives exactly.
        toks = re.findall(r"\s*\S+", natural)
        min_t = body.get("min_tokens", 0) or 0
        n_out = min(max_tokens, max(len(toks), min_t, 1))
        reason_override: str | None = "length" if len(toks) >= max_tokens else "stop"
        filler = FillerResponder.WORDS
        toks = toks[:n_out] + [" " + filler[i % len(filler)] for i in range(n_out - len(toks))]
        pieces = toks
        full_text = "".join(toks)
    else:
        words = emu.responder.text(gen, n_out, rng).split()
        pieces = [" " + w for w in words]
        full_text = " ".join(words)
        reason_override = None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
    model = emu.cfg.served_model_name
    fingerprint = emu.fingerprint
    created = int(time.time())
    reason = reason_override or ("length" if n_out >= max_tokens else "stop")
    prefix = prompt_chain(prompt_words, emu.cfg.max_model_len // KV_BLOCK_SIZE) if emu.cfg.prefix_caching else ()
    ticket = emu.engine.submit(req.prompt_tokens, max(n_out, 1), priority, prefix)
    emu.metrics.received.inc()
    overhead = emu.cfg.profile.request_overhead_s * emu.cfg.time_scale if emu.cfg.add_request_overhead else 0.0
    usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + n_out, "completion_tokens": n_out}

    if not stream:
        finished = False
        try:
            finished = await _finished_unless_gone(emu, request, ticket, overhead)
        finally:
            if not finished:  # the client went away (vLLM aborts such a request)
                emu.engine.cancel(ticket)
                emu.metrics.aborted.inc()
        if not finished:
            return Response(status_code=499)
        emu.metrics.record(ticket, req.prompt_tokens, n_out, reason)
        text = full_text
        if chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}  # fmt: skip
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason,
                                      "stop_reason": None, "token_ids": None, "routed_experts": None}  # fmt: skip
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                      "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
                      "routed_experts": None}  # fmt: skip
            obj = "text_completion"
        full_usage = {**usage, "prompt_tokens_details": _prompt_details(emu, ticket), "completion_tokens_details": None}
        doc = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
               **_NULL_TOP, "system_fingerprint": fingerprint, "usage": full_usage}  # fmt: skip
        if not chat:
            doc.pop("prompt_logprobs")
            doc.pop("prompt_token_ids")
            doc.pop("prompt_text")
        return JSONResponse(doc)

    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    def content_chunk(text: str, finish: str | None) -> bytes:
        if chat:
            c: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            c = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if finish is not None or not chat:
            c["stop_reason"] = None
        if not chat:
            c["prompt_token_ids"] = None
        c["token_ids"] = None
        return event({"id": rid, "object": obj, "created": created, "model": model, "choices": [c]})

    async def events() -> AsyncIterator[bytes]:
        sent = 0
        emu.engine.streaming += 1
        try:
            if chat:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}  # fmt: skip
                yield event({"id": rid, "object": obj, "created": created, "model": model, "choices": [first],
                             "prompt_token_ids": None, "prompt_text": None})  # fmt: skip
            while True:
                ticket.changed.clear()
                n = emu.engine.progress(ticket)
                if n > sent:
                    # One chunk per tick with every token produced since the last (vLLM: one per token).
                    piece = "".join(pieces[sent:n])
                    last = n >= n_out and ticket.done
                    if last and overhead > 0:
                        await asyncio.sleep(overhead)
                    sent = n
                    yield content_chunk(piece, reason if last else None)
                    if last:
                        break
                elif ticket.done:
                    if overhead > 0:
                        await asyncio.sleep(overhead)
                    yield content_chunk("", reason)
                    break
                await ticket.changed.wait()
            emu.metrics.record(ticket, req.prompt_tokens, n_out, reason)
            if include_usage:
                details = _prompt_details(emu, ticket)
                final = usage if details is None else {**usage, "prompt_tokens_details": details}
                yield event({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                             "usage": final, "system_fingerprint": fingerprint})  # fmt: skip
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            emu.engine.cancel(ticket)
            emu.metrics.aborted.inc()
            raise
        finally:
            emu.engine.streaming -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


def _prompt_details(emu: Emulator, ticket: Ticket) -> dict[str, int] | None:
    """``usage.prompt_tokens_details`` as vLLM sends it: only with ``--enable-prompt-tokens-details`` and
    only when some prompt tokens came from the prefix cache."""
    if emu.cfg.prompt_tokens_details and ticket.cached_tokens:
        return {"cached_tokens": ticket.cached_tokens}
    return None


def add_context_arguments(p: argparse.ArgumentParser) -> None:
    """The context length and what happens beyond it (``python -m workers.emulator`` and ``workers.cluster``)."""
    from gateway.argtypes import positive_int

    p.add_argument(
        "--max-model-len", type=positive_int, default=DEFAULT_MAX_MODEL_LEN, help="longest prompt + output, tokens"
    )
    p.add_argument(
        "--context-overflow",
        choices=["cut", "refuse"],
        default="cut",
        help="a request whose prompt + max_tokens exceeds --max-model-len: cut max_tokens to what fits (vLLM "
        "0.32.0, observed) or answer 400 as the vLLM releases that refuse it do",
    )


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM's prefix-caching flags (``python -m workers.emulator`` and ``python -m workers.cluster``)."""
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cache prompt prefixes, as vLLM V1 does by default (--no-enable-prefix-caching: off)",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens, as vLLM's flag of that name",
    )


def build_parser(prog: str = "python -m workers.emulator") -> argparse.ArgumentParser:
    """Arguments of ``python -m workers.emulator`` (``hexflow emulate``: ``prog`` names it in usage and errors)."""
    from gateway.argtypes import HelpFormatter, nonneg_int, port, positive_float, positive_int

    p = argparse.ArgumentParser(
        prog=prog,
        description="An emulated vLLM worker: an OpenAI-compatible HTTP server that is a TEST DOUBLE for a GPU "
        "(it runs requests through the simulator's engine model in real time and computes nothing).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--gpu", required=True, help="GPU profile from config/gpus.yaml (A100, H100, A6000, L40S, ...)")
    p.add_argument("--model", default="llama-3.1-70b", help="model profile from config/gpus.yaml")
    p.add_argument(
        "--catalog", default=None, help="GPU catalogue to read the profile from (default: the packaged gpus.yaml)"
    )
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=port, default=8001, help="TCP port, 1-65535")
    p.add_argument(
        "--time-scale", type=positive_float, default=1.0, help="real seconds per modelled second (0.05: 20x faster)"
    )
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="seed of the filler text the worker generates (with each request's seed or prompt)",
    )
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="override the profile's batch limit")
    add_context_arguments(p)
    p.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="vLLM's engine queue order (priority: the request's priority field)",
    )
    p.add_argument(
        "--no-request-overhead",
        action="store_true",
        help="do not add the profile's per-request overhead (API server time) to responses",
    )
    add_answer_arguments(p)
    add_cache_arguments(p)
    return p


def add_answer_arguments(p: argparse.ArgumentParser) -> None:
    """What the workers answer with: ``--answers FILE`` or ``--demo`` (else filler text)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--answers", default=None, help="scripted answers file (question -> gold SQL) for the Text-to-SQL pipeline"
    )
    group.add_argument(
        "--demo",
        action="store_true",
        help="answer the demo questions' Text-to-SQL prompts from a script (as hexflow demo does; pair with "
        "hexflow serve --demo)",
    )


def responder_from_args(args: argparse.Namespace) -> Responder | None:
    """The responder ``--answers`` or ``--demo`` asks for (None: filler text)."""
    from workers.scripted import AnswersResponder

    if args.answers:
        return AnswersResponder.from_file(args.answers)
    if args.demo:
        return AnswersResponder.demo()  # seed 0: the data hexflow serve --demo writes (--seed is the filler text's)
    return None


def answers_label(args: argparse.Namespace) -> str:
    """How the workers answer, for the start-up line."""
    return f"scripted from {args.answers}" if args.answers else ("the demo script" if args.demo else "filler text")


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """Resolve the profile and build the config (raises GatewayError for unknown names)."""
    from dataclasses import replace

    from gateway.config import load_gpu_catalog

    profile = load_gpu_catalog(args.catalog).profile(args.gpu, args.model)
    if args.max_num_seqs is not None:
        profile = replace(profile, max_num_seqs=args.max_num_seqs)
    return EmulatorConfig(
        profile=profile,
        served_model_name=args.served_model_name or args.model,
        time_scale=args.time_scale,
        seed=args.seed,
        max_model_len=args.max_model_len,
        priority_scheduling=args.scheduling_policy == "priority",
        add_request_overhead=not args.no_request_overhead,
        prefix_caching=args.enable_prefix_caching,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        refuse_context_overflow=args.context_overflow == "refuse",
    )


def main(argv: Sequence[str] | None = None, prog: str = "python -m workers.emulator") -> int:
    """Run one emulated worker until interrupted (bad input: one line on stderr, exit 2)."""
    import uvicorn

    from gateway.errors import GatewayError

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        responder = responder_from_args(args)
    except (GatewayError, ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"emulated worker (a test double) {args.gpu}/{cfg.served_model_name} on http://{args.host}:{args.port}: "
        f"time scale {args.time_scale:g}, answers {answers_label(args)}, "
        f"prefix caching {'on' if args.enable_prefix_caching else 'off'}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        create_app(cfg, responder), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the gateway reaches workers: the ``Transport`` interface, its data types, and the HTTP one.

``Transport`` is the one interface behind which all network I/O to workers sits (tests swap in a fake).
``HttpTransport`` sends calls over the gateway's own keep-alive client (``gateway.live.httpclient``, the
per-call hot path), probes and scrapes over a second one (a full call pool never delays a probe). Timeouts
per phase and what is retried: docs/live-gateway.md ("Failure handling"); here, ``WorkerError`` is retried
elsewhere (``refused=True`` marks the worker down at once), ``PriorityRefused`` is sent again without vLLM's
``priority``, any other 4xx is a ``CallFailed`` for the caller. A stream's first chunk is checked before it is
forwarded; once a byte is forwarded the call is no longer retryable (``LiveCall.streamed``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config.gateway import TimeoutsConfig
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call
from gateway.errors import CallFailed, WorkerError
from gateway.live import httpclient

PRIORITY_REFUSAL = b"priority scheduling is not enabled"
"""What vLLM's 400 answer to a ``priority`` it does not schedule by says (lower case)."""


class PriorityRefused(CallFailed):
    """The worker refused the call's ``priority`` field (HTTP 400: it was started without
    ``--scheduling-policy priority``); the same call without the field is fine."""


@dataclass(slots=True)
class CallResult:
    """A worker's answer to one call (``body``: its parse; None for a stream)."""

    body: dict[str, Any] | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    raw: bytes | None = None
    """The worker's answer as the bytes it sent (a non-streaming success; passed to a client unchanged)."""

    def text(self) -> str | None:
        """The generated text of a chat or completions answer (None when the body holds none)."""
        choices = (self.body or {}).get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        ch = choices[0]
        msg = ch.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            return str(msg["content"])
        text = ch.get("text")
        return text if isinstance(text, str) else None


@dataclass(eq=False)
class LiveCall(Call):
    """A call of the live gateway: the scheduler's ``Call`` plus the request to send and its callback.

    ``body`` goes without ``model`` (the worker's is filled in) and must not change once sent (``body_json``
    caches it). ``on_done`` is called exactly once, synchronously, with the result or the final ``CallFailed``,
    before the worker is refilled. ``stream`` receives a streaming pass-through's raw events. ``sent_at``: when
    the last attempt was sent (the scheduler clears ``started_at`` on a failed attempt). ``failed_on``: the
    workers whose attempts failed (a retry goes elsewhere). Not slotted: slots would shadow the compiled
    ``Call``'s fields (native build)."""

    endpoint: str = "/v1/chat/completions"
    body: dict[str, Any] = field(default_factory=dict)
    on_done: Callable[[LiveCall, CallResult | CallFailed], None] | None = None
    stream: asyncio.Queue[bytes | None] | None = None
    streamed: bool = False
    sent_at: float = 0.0
    parked_at: float | None = None
    last_error: str = ""
    priority: int | None = 0
    """vLLM's ``priority`` of the next attempt (lower runs sooner); None sends none (the worker refused it)."""
    task: asyncio.Task[None] | None = None
    worker_name: str = ""
    requeue: bool = False
    failed_on: set[str] = field(default_factory=set)
    body_json: bytes | None = None
    load_marks: tuple[float, float, int] = (0.0, 0.0, 0)
    """The worker's ``load_area``, ``prefill_sent`` and calls in flight when this attempt was sent."""


class Transport(Protocol):
    """How the pool talks to workers (``HttpTransport`` in production; a fake in tests); closed by ``aclose``."""

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        """Run one call on the worker; raise ``WorkerError`` (retryable) or ``CallFailed`` (final)."""
        ...

    async def probe(self, worker: WorkerInfo) -> bool:
        """True when the worker's health endpoint answers OK."""
        ...

    async def scrape(self, worker: WorkerInfo) -> str:
        """The worker's ``/metrics`` text (raise on failure)."""
        ...

    async def aclose(self) -> None:
        """Release connections (idempotent)."""
        ...


class HttpTransport:
    """The production transport: calls over ``httpclient.HttpClient`` (docs/live-gateway.md, "The calls' HTTP
    client"), probes and scrapes over a pool of their own, both created lazily in the running loop. ``timeouts``:
    gateway.yaml's (``call_s``: the longest any call may take here; the pool bounds each call more tightly;
    ``keepalive_expiry_s`` stays below the 5 s after which uvicorn and vLLM close idle connections)."""

    def __init__(
        self, timeouts: TimeoutsConfig | None = None, *, probe_timeout_s: float = 2.0, scrape_timeout_s: float = 2.0
    ) -> None:
        self.timeouts = timeouts if timeouts is not None else TimeoutsConfig()
        self.probe_timeout_s = probe_timeout_s
        self.scrape_timeout_s = scrape_timeout_s
        self._client: httpclient.HttpClient | None = None
        self._monitor: httpclient.HttpClient | None = None  # probes' and scrapes'
        # (worker url, endpoint, served model) -> the prepared request and the model's JSON
        self._targets: dict[tuple[str, str, str], tuple[httpclient.Prepared, bytes]] = {}

    @property
    def client(self) -> httpclient.HttpClient:
        """The calls' connection pool (created on first use, in the running loop)."""
        if self._client is None:
            t = self.timeouts
            self._client = httpclient.HttpClient(
                connect_s=t.connect_s, keepalive_expiry_s=t.keepalive_expiry_s, max_connections=t.max_connections
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connection pools (idempotent)."""
        for client in (self._client, self._monitor):
            if client is not None:
                await client.aclose()
        self._client = self._monitor = None

    def _target(self, worker: WorkerInfo, endpoint: str) -> tuple[httpclient.Prepared, bytes]:
        """The prepared request of ``endpoint`` on ``worker`` and its served model as JSON (cached; a URL
        that is not http(s) is a worker error, as any other failure to reach the worker)."""
        key = (worker.url, endpoint, worker.served_model)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= 4096:  # workers come and go (discovery): never grow without bound
                self._targets.clear()
            try:
                prepared = httpclient.HttpClient.prepare(worker.url, endpoint)
            except ValueError as exc:
                raise WorkerError(f"transport error: {exc}") from exc
            target = self._targets[key] = (prepared, json.dumps(worker.served_model).encode())
        return target

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        """POST the call to the worker; stream it through when ``call.stream`` is set."""
        prepared, model = self._target(worker, call.endpoint)
        streaming = call.stream is not None
        t = self.timeouts
        # A streaming answer's headers come before generation (vLLM sends them at once); a plain
        # answer's come with it, under the pool's whole-call bound.
        headers_s = t.headers_s if streaming else t.call_s
        idle_s = min(t.stream_idle_s, t.call_s)
        try:
            r = await self.client.request(prepared, _payload(call, model), headers_s=headers_s)
            try:
                if streaming and r.status == 200:
                    return await self._relay_stream(r, call, idle_s)
                content = await r.read_all(idle_s, t.max_response_bytes)
            finally:
                r.release()
        except httpclient.ConnectionBroken as exc:
            raise WorkerError(f"transport error: {exc}") from exc
        except httpclient.HttpError as exc:  # its message says what failed (a connection not made: refused)
            raise WorkerError(str(exc), refused=isinstance(exc, httpclient.ConnectError)) from exc
        return _result(r.status, content)

    async def _relay_stream(self, r: httpclient.Response, call: LiveCall, idle_s: float) -> CallResult:
        assert call.stream is not None
        if r.content_type != "text/event-stream":
            raise WorkerError(f"answered a streaming call with {r.content_type!r}, not server-sent events")
        # Nothing goes to the client before the stream's first line is known to be an event: until then a
        # worker that answers garbage loses only its own attempt (the call is still retryable).
        chunk = b""
        while not _sse_head_known(chunk):
            more = await r.read_chunk(idle_s)
            if not more:
                break
            chunk += more
        if chunk and not _looks_like_sse(chunk):
            raise WorkerError(f"answered a streaming call with garbage: {chunk[:60]!r}")
        usage: dict[str, Any] = {}
        pending = b""
        tail = b""
        while chunk:
            call.streamed = True
            await call.stream.put(chunk)
            tail = chunk[-64:] if len(chunk) >= 64 else (tail + chunk)[-64:]
            # Find the usage line (stream_options.include_usage) without holding the whole stream: only
            # the last line, while it is incomplete, is kept (a whole line without "usage" is done with).
            pending = (pending + chunk)[-65536:] if pending else chunk[-65536:]
            if b'"usage"' in chunk or b'"usage"' in pending:
                for line in pending.split(b"\n"):
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        try:
                            data = json.loads(line[6:])
                        except ValueError:
                            continue
                        if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                            usage = data["usage"]
            pending = pending[pending.rfind(b"\n") + 1 :]
            chunk = await r.read_chunk(idle_s)
        if not tail.rstrip().endswith(b"data: [DONE]"):
            raise WorkerError("the stream ended before its last event (data: [DONE]): truncated")
        return CallResult(None, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))

    async def _get(self, worker: WorkerInfo, path: str, timeout_s: float) -> tuple[int, bytes]:
        """The status and body of ``GET path`` on the worker within ``timeout_s`` (the body within
        ``max_response_bytes``)."""
        t = self.timeouts
        if self._monitor is None:
            self._monitor = httpclient.HttpClient(connect_s=t.connect_s, keepalive_expiry_s=t.keepalive_expiry_s)
        prepared = httpclient.HttpClient.prepare(worker.url, path, method="GET")
        async with asyncio.timeout(timeout_s):
            return await self._monitor.fetch(prepared, b"", headers_s=None, idle_s=None, cap=t.max_response_bytes)

    async def probe(self, worker: WorkerInfo) -> bool:
        """GET /health: True on a 200."""
        try:
            status, _ = await self._get(worker, "/health", self.probe_timeout_s)
        except (httpclient.HttpError, TimeoutError, ValueError):
            return False
        return status == 200

    async def scrape(self, worker: WorkerInfo) -> str:
        """GET /metrics (raises on failure, an error status, and a text over ``max_response_bytes``)."""
        status, body = await self._get(worker, "/metrics", self.scrape_timeout_s)
        if status >= 400:
            raise WorkerError(f"/metrics answered {status}")
        return body.decode("utf-8", errors="replace")


def _payload(call: LiveCall, model: bytes) -> bytes:
    """``{"priority": call.priority, **call.body, "model": model}`` as JSON, the body serialised once per call
    and the two keys spliced around it; a ``call.priority`` of None sends no ``priority``, the body's included."""
    body_json = call.body_json
    if body_json is None:
        body = call.body
        if "model" in body:
            body = {k: v for k, v in body.items() if k != "model"}
        body_json = call.body_json = json.dumps(body).encode()
    inner = body_json[1:-1]
    p = call.priority
    if p is None:
        head = b"{"
        if "priority" in call.body:  # rare (the routes set no body priority): serialised again without it
            inner = json.dumps({k: v for k, v in call.body.items() if k not in ("model", "priority")}).encode()[1:-1]
    elif "priority" in call.body:
        head = b"{"
    else:
        head = b'{"priority": %d, ' % p if type(p) is int else b'{"priority": %s, ' % json.dumps(p).encode()
    return b'%s%s%s"model": %s}' % (head, inner, b", " if inner else b"", model)


_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")


def _sse_head_known(head: bytes) -> bool:
    """Whether enough of a stream's start has come to tell whether it is server-sent events."""
    text = head.lstrip(b"\r\n")
    return len(text) >= 6 or b"\n" in text or len(head) > 65536


def _looks_like_sse(chunk: bytes) -> bool:
    """Whether the first chunk of a stream starts like server-sent events (a field or a comment)."""
    head = chunk.lstrip(b"\r\n")
    return not head or head.startswith(_SSE_FIELDS)


def _result(status: int, content: bytes) -> CallResult:
    try:
        data = json.loads(content) if content else None
    except ValueError:
        data = None
    if 400 <= status < 500 and status not in (408, 429):
        msg = _error_message(data) or f"worker answered {status}"
        kind = PriorityRefused if status == 400 and PRIORITY_REFUSAL in content.lower() else CallFailed
        raise kind(msg, status=status, body=data if isinstance(data, dict) else None)
    if status != 200:
        raise WorkerError(
            f"worker answered {status}: {(_error_message(data) or content[:200].decode(errors='replace'))}"
        )
    if not isinstance(data, dict):
        raise WorkerError("worker answered 200 with a body that is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise WorkerError("worker answered 200 without choices (not a completion)")
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    return CallResult(data, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), content)


def _count(v: Any) -> int:
    """A token count from a worker's usage (0 for anything that is not a non-negative integer)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _error_message(data: Any) -> str | None:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None

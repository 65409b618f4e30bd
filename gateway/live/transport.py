"""How the gateway reaches workers: the ``Transport`` interface, its data types, and the HTTP one.

``Transport`` is the one interface behind which all network I/O to workers sits (``send`` a call,
``probe`` ``/health``, ``scrape`` ``/metrics``, ``aclose``); tests swap in a fake. ``LiveCall`` is what
is sent (the scheduler's ``Call`` plus the request and its callback), ``CallResult`` what comes back.
``HttpTransport`` is the production implementation over one shared aiohttp session.

Error classification (what the pool does with it):

* connection refused / reset, timeouts, HTTP 5xx, a malformed response: ``WorkerError`` -> the call is
  retried on another worker (a refused connection marks the worker down at once);
* HTTP 4xx: ``CallFailed`` with the worker's status and OpenAI-style error body -> the caller gets it
  (the request itself is wrong, e.g. longer than the model's context; retrying elsewhere cannot help).

Streaming calls forward the worker's server-sent-event lines into ``LiveCall.stream`` as they arrive;
once a byte has been forwarded the call is no longer retryable (``LiveCall.streamed``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call
from gateway.errors import CallFailed, WorkerError


@dataclass(slots=True)
class CallResult:
    """A worker's answer to one call."""

    body: dict[str, Any] | None
    prompt_tokens: int = 0
    completion_tokens: int = 0

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


@dataclass(slots=True, eq=False)
class LiveCall(Call):
    """A call of the live gateway: the scheduler's ``Call`` plus the request to send and its callback.

    ``endpoint`` is ``/v1/chat/completions`` or ``/v1/completions``; ``body`` the request body without
    ``model`` (the transport fills in the chosen worker's served model). ``on_done`` is called exactly
    once, synchronously, with the result or the final ``CallFailed`` (before the worker is refilled, so
    the successors of a call are queued before its slot is reused, as in the simulator). ``stream``
    receives the worker's raw server-sent-event lines for a streaming pass-through; ``None`` when not
    streaming.

    Times: ``ready_at`` (the core's) is when the call was last queued; ``sent_at`` when its last attempt
    was sent. ``sent_at`` equals the core's ``started_at`` while the call is in flight, but the scheduler
    clears ``started_at`` when an attempt fails, and the call's record still needs the last attempt's
    queue and run time, so the pool keeps ``sent_at`` (0.0: never sent).
    """

    endpoint: str = "/v1/chat/completions"
    body: dict[str, Any] = field(default_factory=dict)
    on_done: Callable[[LiveCall, CallResult | CallFailed], None] | None = None
    stream: asyncio.Queue[bytes | None] | None = None
    streamed: bool = False
    sent_at: float = 0.0
    parked_at: float | None = None
    last_error: str = ""
    priority: int = 0
    task: asyncio.Task[None] | None = None
    worker_name: str = ""
    requeue: bool = False


class Transport(Protocol):
    """How the pool talks to workers (``HttpTransport`` in production; a fake in tests).

    The gateway owns its transport and closes it with ``aclose`` when it stops.
    """

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
    """The production transport: one ``aiohttp`` session with explicit timeouts and pool limits.

    aiohttp rather than httpx for this hot path: profiling the gateway at 200 calls/s showed httpx's
    client machinery (httpcore + anyio) taking most of the gateway's CPU per call; aiohttp's client
    costs a fraction of it. Keep-alive connections expire after ``keepalive_expiry_s``, below the 5 s
    after which uvicorn and vLLM close idle connections (so a request never races a server-side close).
    The session is created lazily inside the running event loop.
    """

    def __init__(
        self,
        *,
        connect_s: float = 2.0,
        call_s: float = 900.0,
        keepalive_expiry_s: float = 4.0,
        max_connections: int = 2048,
        probe_timeout_s: float = 2.0,
        scrape_timeout_s: float = 2.0,
    ) -> None:
        self.connect_s = connect_s
        self.call_s = call_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self.max_connections = max_connections
        self.probe_timeout = aiohttp.ClientTimeout(total=probe_timeout_s)
        self.scrape_timeout = aiohttp.ClientTimeout(total=scrape_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared session (created on first use, in the running loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=self.keepalive_expiry_s
                ),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_s, sock_read=self.call_s),
                json_serialize=json.dumps,
            )
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool (idempotent)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        """POST the call to the worker; stream it through when ``call.stream`` is set."""
        body = {"priority": call.priority, **call.body, "model": worker.served_model}
        url = worker.url.rstrip("/") + call.endpoint
        try:
            async with self.session.post(url, json=body) as r:
                if call.stream is not None and r.status == 200:
                    return await self._relay_stream(r, call)
                content = await r.read()
                return _result(r.status, content)
        except aiohttp.ClientConnectorError as exc:
            raise WorkerError(f"cannot connect: {exc}", refused=True) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise WorkerError(f"timed out ({type(exc).__name__})") from exc
        except aiohttp.ClientError as exc:
            raise WorkerError(f"transport error: {exc!r}") from exc

    async def _relay_stream(self, r: aiohttp.ClientResponse, call: LiveCall) -> CallResult:
        assert call.stream is not None
        usage: dict[str, Any] = {}
        pending = b""
        async for chunk in r.content.iter_any():
            call.streamed = True
            await call.stream.put(chunk)
            # Find the usage line (stream_options.include_usage) without holding the whole stream.
            pending = (pending + chunk)[-65536:]
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
        return CallResult(None, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))

    async def probe(self, worker: WorkerInfo) -> bool:
        """GET /health."""
        try:
            async with self.session.get(worker.url.rstrip("/") + "/health", timeout=self.probe_timeout) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def scrape(self, worker: WorkerInfo) -> str:
        """GET /metrics (raises on failure)."""
        async with self.session.get(worker.url.rstrip("/") + "/metrics", timeout=self.scrape_timeout) as r:
            r.raise_for_status()
            return await r.text()


def _result(status: int, content: bytes) -> CallResult:
    try:
        data = json.loads(content) if content else None
    except ValueError:
        data = None
    if 400 <= status < 500 and status not in (408, 429):
        msg = _error_message(data) or f"worker answered {status}"
        raise CallFailed(msg, status=status, body=data if isinstance(data, dict) else None)
    if status != 200:
        raise WorkerError(
            f"worker answered {status}: {(_error_message(data) or content[:200].decode(errors='replace'))}"
        )
    if not isinstance(data, dict):
        raise WorkerError("worker answered 200 with a body that is not a JSON object")
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    return CallResult(data, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def _error_message(data: Any) -> str | None:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None

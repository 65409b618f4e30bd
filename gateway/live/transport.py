"""HTTP transport to OpenAI-compatible workers (vLLM or the emulated worker) over one shared client.

Error classification (what the pool does with it):

* connection refused / reset, timeouts, HTTP 5xx, a malformed response: ``WorkerError`` -> the call is
  retried on another worker (a refused connection marks the worker down at once);
* HTTP 4xx: ``CallFailed`` with the worker's status and OpenAI-style error body -> the caller gets it
  (the request itself is wrong, e.g. longer than the model's context; retrying elsewhere cannot help).

Streaming calls forward the worker's server-sent-event lines into ``LiveCall.stream`` as they arrive;
once a byte has been forwarded the call is no longer retryable (``LiveCall.streamed``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from gateway.live.pool import CallFailed, CallResult, LiveCall, WorkerEndpoint, WorkerError


class HttpTransport:
    """The production transport: one ``httpx.AsyncClient`` with explicit timeouts and pool limits."""

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
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(call_s, connect=connect_s, pool=call_s),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=keepalive_expiry_s,
            ),
        )
        self.probe_timeout_s = probe_timeout_s
        self.scrape_timeout_s = scrape_timeout_s

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    async def send(self, worker: WorkerEndpoint, call: LiveCall) -> CallResult:
        """POST the call to the worker; stream it through when ``call.stream`` is set."""
        body = {"priority": call.priority, **call.body, "model": worker.served_model}
        url = worker.url.rstrip("/") + call.endpoint
        try:
            if call.stream is not None:
                return await self._send_stream(url, body, call)
            r = await self.client.post(url, json=body)
        except httpx.ConnectError as exc:
            raise WorkerError(f"cannot connect: {exc}", refused=True) from exc
        except httpx.TimeoutException as exc:
            raise WorkerError(f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise WorkerError(f"transport error: {exc!r}") from exc
        return _result(r.status_code, r.content)

    async def _send_stream(self, url: str, body: dict[str, Any], call: LiveCall) -> CallResult:
        assert call.stream is not None
        async with self.client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                content = await r.aread()
                return _result(r.status_code, content)
            usage: dict[str, Any] = {}
            try:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        try:
                            chunk = json.loads(line[6:])
                        except ValueError:
                            chunk = {}
                        if isinstance(chunk.get("usage"), dict):
                            usage = chunk["usage"]
                    call.streamed = True
                    await call.stream.put((line + "\n").encode())
            except httpx.TransportError as exc:
                raise WorkerError(f"stream broken: {exc!r}") from exc
        return CallResult(None, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))

    async def probe(self, worker: WorkerEndpoint) -> bool:
        """GET /health."""
        try:
            r = await self.client.get(worker.url.rstrip("/") + "/health", timeout=self.probe_timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def scrape(self, worker: WorkerEndpoint) -> str:
        """GET /metrics."""
        r = await self.client.get(worker.url.rstrip("/") + "/metrics", timeout=self.scrape_timeout_s)
        r.raise_for_status()
        return r.text


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

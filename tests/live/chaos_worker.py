"""A chaos worker double: an emulated worker behind an ASGI layer that breaks its completions on purpose.

``ChaosWorker`` wraps the emulator's app (``workers.emulator``). ``/health``, ``/metrics`` and
``/v1/models`` always pass through, as they do on a worker whose engine is wedged but whose HTTP server
lives; the completion endpoints behave by ``mode``, which a test may switch at any time:

* ``healthy``: pass through;
* ``blackhole``: read the request and never answer (until the client hangs up);
* ``flaky``: every other completion request answers 500;
* ``garbage``: answer 200 with bytes that are neither JSON nor server-sent events;
* ``truncated``: the emulator's answer, cut after its first chunk (a stream without ``data: [DONE]``,
  half a JSON body), and the response ended;
* ``stall``: the same cut, but the connection stays open and silent (until the client hangs up);
* ``slow_long``: requests of more than ``long_prompt_tokens`` prompt tokens wait ``slow_s`` first.

``calls`` counts completion requests by mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from tests.live.harness import emulator_app, serving
from workers.emulator import chat_prompt_tokens, count_tokens

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MODES = ("healthy", "blackhole", "flaky", "garbage", "truncated", "stall", "slow_long")
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


class ChaosWorker:
    """The ASGI wrapper (see the module doc)."""

    def __init__(self, app: App, mode: str = "healthy", *, long_prompt_tokens: int = 1000, slow_s: float = 0.5) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.app = app
        self.mode = mode
        self.long_prompt_tokens = long_prompt_tokens
        self.slow_s = slow_s
        self.calls: Counter[str] = Counter()
        self._flaky = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in COMPLETIONS or self.mode == "healthy":
            await self.app(scope, receive, send)
            return
        mode = self.mode
        self.calls[mode] += 1
        raw = await read_body(receive)
        if raw is None:
            return
        body = _json(raw)
        if mode == "blackhole":
            await _until_disconnect(receive)
        elif mode == "flaky":
            self._flaky += 1
            if self._flaky % 2 == 1:
                err = {"error": {"message": "chaos: internal error", "type": "InternalServerError", "code": 500}}
                await answer(send, 500, "application/json", json.dumps(err).encode())
            else:
                await self.app(scope, replay_body(raw, receive), send)
        elif mode == "garbage":
            ctype = "text/event-stream" if body.get("stream") else "application/json"
            await answer(send, 200, ctype, b"\x00\xff<html>chaos garbage</html>\n\n")
        elif mode == "truncated":
            await self.app(scope, replay_body(raw, receive), _cut(send, end=True))
        elif mode == "stall":
            await self.app(scope, replay_body(raw, receive), _cut(send, end=False))
            await _until_disconnect(receive)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:  # slow_long
            if _prompt_tokens(body) > self.long_prompt_tokens:
                await asyncio.sleep(self.slow_s)
            await self.app(scope, replay_body(raw, receive), send)


async def read_body(receive: Receive) -> bytes | None:
    """The request's whole body, or None when the client hung up first."""
    parts: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        parts.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(parts)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    if isinstance(prompt, str):
        return count_tokens(prompt)
    messages = body.get("messages")
    return chat_prompt_tokens(messages) if isinstance(messages, list) else 0


def replay_body(raw: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the already-read body ``raw`` again, then what ``receive`` gives."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return again


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def answer(send: Send, status: int, ctype: str, content: bytes) -> None:
    """Send a whole response of ``status`` with ``content`` of type ``ctype``."""
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content, "more_body": False})


def _cut(send: Send, *, end: bool) -> Send:
    """A ``send`` that forwards the response's start and its first chunk (half of it when it is the
    whole body), ends the response when ``end``, and drops the rest."""
    state = {"chunks": 0}

    async def cut(msg: Message) -> None:
        if msg["type"] == "http.response.start":
            headers = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"content-length"]
            await send({**msg, "headers": headers})
            return
        if msg["type"] != "http.response.body" or state["chunks"] > 0:
            return
        state["chunks"] += 1
        chunk = msg.get("body", b"")
        if not msg.get("more_body", False):
            chunk = chunk[: len(chunk) // 2]
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if end:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return cut


@contextlib.asynccontextmanager
async def chaos_worker(
    gpu: str, mode: str, *, time_scale: float = 0.02, **kw: Any
) -> AsyncIterator[tuple[str, ChaosWorker]]:
    """Serve one emulated worker of ``gpu`` behind ``ChaosWorker(mode)`` on a loopback port; yield its URL
    and the wrapper (to switch its mode)."""
    chaos = ChaosWorker(emulator_app(gpu, time_scale=time_scale), mode, **kw)
    async with serving(chaos, what="the chaos worker") as url:
        yield url, chaos

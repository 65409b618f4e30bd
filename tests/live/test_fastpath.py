"""The fast path (``gateway.live.fastpath``) answers as the framework's routes do: every request is sent to a
gateway with the fast path and to the same gateway with it off, and the answers are compared. Plain requests
are served by the fast path (the framework is not called), every other one by the framework."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from gateway.config.gateway import load_gateway_config
from gateway.live import transport
from gateway.live.app import GatewayApp
from gateway.live.server import build_app
from tests.live.harness import INTERACTIVE_KEY, emulators, write_config

CHAT = {"messages": [{"role": "user", "content": "How many singers are there?"}], "max_tokens": 4}
COMPLETION = {"prompt": "SELECT count(*) FROM", "max_tokens": 4}
AUTH = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
JSON = {"Content-Type": "application/json"}

# name: (path, body bytes, headers)
CASES: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "chat": ("/v1/chat/completions", json.dumps(CHAT).encode(), {**AUTH, **JSON}),
    "chat_charset": (
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {**AUTH, "Content-Type": "application/json; charset=utf-8"},
    ),
    "chat_extra_field": (
        "/v1/chat/completions",
        json.dumps({**CHAT, "logprobs": False, "priority": 7}).encode(),
        {**AUTH, **JSON},
    ),
    "chat_nulls": (
        "/v1/chat/completions",
        json.dumps({**CHAT, "temperature": None, "model": None}).encode(),
        {**AUTH, **JSON},
    ),
    "chat_stream": ("/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode(), {**AUTH, **JSON}),
    "chat_deadline": (
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {**AUTH, **JSON, "x-hexflow-deadline-s": "20"},
    ),
    "completion": ("/v1/completions", json.dumps(COMPLETION).encode(), {**AUTH, **JSON}),
    "completion_ids": ("/v1/completions", json.dumps({**COMPLETION, "prompt": [1, 2, 3]}).encode(), {**AUTH, **JSON}),
    "completion_stream": ("/v1/completions", json.dumps({**COMPLETION, "stream": True}).encode(), {**AUTH, **JSON}),
    # refused by the framework (handed to it) or by the shared route functions
    "no_key": ("/v1/chat/completions", json.dumps(CHAT).encode(), JSON),
    "unknown_key": ("/v1/chat/completions", json.dumps(CHAT).encode(), {"Authorization": "Bearer nope", **JSON}),
    "basic_auth": ("/v1/chat/completions", json.dumps(CHAT).encode(), {"Authorization": "Basic eDp5", **JSON}),
    "not_json": ("/v1/chat/completions", b"{not json", {**AUTH, **JSON}),
    "json_array": ("/v1/chat/completions", b"[1, 2]", {**AUTH, **JSON}),
    "empty_body": ("/v1/chat/completions", b"", {**AUTH, **JSON}),
    "text_plain": ("/v1/chat/completions", json.dumps(CHAT).encode(), {**AUTH, "Content-Type": "text/plain"}),
    "no_content_type": ("/v1/chat/completions", json.dumps(CHAT).encode(), AUTH),
    "empty_messages": ("/v1/chat/completions", json.dumps({"messages": []}).encode(), {**AUTH, **JSON}),
    "string_max_tokens": ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": "4"}).encode(), {**AUTH, **JSON}),
    "lone_surrogate": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        {**AUTH, **JSON},
    ),
    "paired_surrogate": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 4}',
        {**AUTH, **JSON},
    ),
    "bad_deadline": (
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {**AUTH, **JSON, "x-hexflow-deadline-s": "soon"},
    ),
    "deadline_out_of_range": (
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {**AUTH, **JSON, "x-hexflow-deadline-s": "0.001"},
    ),
    "deadline_overflow": (
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {**AUTH, **JSON, "x-hexflow-deadline-s": "1e99"},
    ),
    "unknown_model": ("/v1/chat/completions", json.dumps({**CHAT, "model": "gpt-9"}).encode(), {**AUTH, **JSON}),
    "max_tokens_over_limit": (
        "/v1/chat/completions",
        json.dumps({**CHAT, "max_tokens": 10**9}).encode(),
        {**AUTH, **JSON},
    ),
    "n_two": ("/v1/completions", json.dumps({**COMPLETION, "n": 2}).encode(), {**AUTH, **JSON}),
    "prompt_missing": ("/v1/completions", json.dumps({"max_tokens": 4}).encode(), {**AUTH, **JSON}),
    "prompt_negative_ids": ("/v1/completions", json.dumps({"prompt": [-1]}).encode(), {**AUTH, **JSON}),
    "body_over_limit": ("/v1/chat/completions", json.dumps({**CHAT, "pad": "x" * 5000}).encode(), {**AUTH, **JSON}),
    "worker_refuses": ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": 4000}).encode(), {**AUTH, **JSON}),
}
FAST = {
    "chat", "chat_charset", "chat_extra_field", "chat_nulls", "chat_stream", "chat_deadline", "completion",
    "completion_ids", "completion_stream", "deadline_out_of_range", "deadline_overflow", "unknown_model",
    "max_tokens_over_limit", "worker_refuses",
}  # fmt: skip
"""The cases the fast path serves itself (the rest it hands to the framework; a surrogate escape too, even a
valid pair: telling a pair from a lone one needs a parse the framework does anyway)."""


class Counting:
    """An ASGI app that counts the requests passed to it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[tuple[GatewayApp, GatewayApp]]:
    async with emulators(["A100"], time_scale=0.001) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.001, limits={"max_body_bytes": 4096})
        fast = build_app(load_gateway_config(cfg))
        slow = build_app(load_gateway_config(cfg))
        assert isinstance(fast, GatewayApp) and isinstance(slow, GatewayApp) and fast.fast is not None
        slow.fast = None
        async with fast.router.lifespan_context(fast), slow.router.lifespan_context(slow):
            yield fast, slow


async def _post(app: FastAPI, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30) as c:
        return await c.post(path, content=body, headers=headers)


def _shape(r: httpx.Response) -> Any:
    """What must be equal between the two paths: the status, the content type, and the body without the
    worker's per-answer ids and times (an error body entirely)."""
    ctype = r.headers.get("content-type")
    if r.status_code != 200:
        return r.status_code, ctype, r.json(), r.headers.get("retry-after") is not None
    if ctype is not None and ctype.startswith("text/event-stream"):
        events = [line for line in r.text.split("\n") if line.startswith("data: ")]
        kinds = [json.loads(e[6:]).get("object") if e != "data: [DONE]" else "[DONE]" for e in events]
        return r.status_code, ctype, kinds[-1], sorted(set(kinds))
    body = r.json()
    return r.status_code, ctype, sorted(body), body["object"], len(body["choices"]), sorted(body["choices"][0])


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_fast_path_answers_as_the_framework_does(apps: tuple[GatewayApp, GatewayApp], case: str) -> None:
    fast, slow = apps
    assert fast.fast is not None
    framework = Counting(fast.fast.full)
    fast.fast.full = framework
    path, body, headers = CASES[case]
    a = await _post(fast, path, body, headers)
    b = await _post(slow, path, body, headers)
    assert _shape(a) == _shape(b), (a.text, b.text)
    assert a.headers.get("x-request-id") and b.headers.get("x-request-id")
    assert framework.calls == (0 if case in FAST else 1), "served by the wrong path"


async def test_the_answer_is_the_workers_bytes(
    apps: tuple[GatewayApp, GatewayApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion is passed through as the worker sent it: not parsed and re-encoded on the way."""
    sent: list[bytes] = []
    real = transport._result

    def spy(status: int, content: bytes) -> Any:
        sent.append(content)
        return real(status, content)

    monkeypatch.setattr(transport, "_result", spy)
    fast, slow = apps
    for app in (fast, slow):
        path, body, headers = CASES["chat"]
        r = await _post(app, path, body, headers)
        assert r.status_code == 200 and sent and r.content == sent[-1]


async def test_a_client_request_id_is_kept(apps: tuple[GatewayApp, GatewayApp]) -> None:
    fast, _ = apps
    path, body, headers = CASES["chat"]
    r = await _post(fast, path, body, {**headers, "X-Request-Id": "abc-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    r = await _post(fast, path, body, {**headers, "X-Request-Id": "bad id with spaces"})
    assert r.headers["x-request-id"].startswith("req-") and len(r.headers["x-request-id"]) == 20


async def test_a_chunked_body_over_the_limit_is_413(apps: tuple[GatewayApp, GatewayApp]) -> None:
    """A body without Content-Length, streamed past the limit: the fast path stops reading and the framework
    answers 413 from what it was handed (the chunks read so far, then the rest)."""
    fast, _ = apps

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fast), base_url="http://gw", timeout=30) as c:
        r = await c.post("/v1/chat/completions", content=chunks(), headers={**AUTH, **JSON})
    assert r.status_code == 413 and r.json()["error"]["message"].startswith("request body of")

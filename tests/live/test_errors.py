"""One error tree, one handler: every ``GatewayError`` is answered with its own status, type, param and
headers, and no hostile input (lone surrogates, NaN, deep nesting) turns an error answer into a 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from gateway.core.dag import DagError
from gateway.core.scheduler import NoEligibleWorker
from gateway.errors import (
    BadRequest,
    CallFailed,
    ConfigError,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    Rejected,
    ServiceUnavailable,
    Unauthorized,
    UnknownNameError,
    Unprocessable,
    UpstreamError,
    WorkerError,
)
from gateway.live.app import create_app
from gateway.live.deps import lone_surrogate_at
from gateway.live.responses import dumps
from gateway.live.service import Gateway
from gateway.live.tenants import DeadlineOutOfRange, Tenant
from tests.live.harness import emulators, gateway_client, write_config

TENANT = Tenant("t", 10.0, 5.0, 600.0, 1.0, 10)
WORKER_400 = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "param": "max_tokens"}}

# name: (factory, status, type, param, headers)
CASES: dict[str, tuple[Callable[[], GatewayError], int, str, str | None, dict[str, str]]] = {
    "bad_request": (lambda: BadRequest("bad"), 400, "invalid_request_error", None, {}),
    "unknown_name": (lambda: UnknownNameError("policy", "x", ["a"]), 400, "invalid_request_error", None, {}),
    "unprocessable": (lambda: Unprocessable("calls: too many", param="calls"), 422, "invalid_request_error",
                      "calls", {}),
    "dag": (lambda: DagError("calls.1.id", "duplicate call id 'a'"), 422, "invalid_request_error", "calls.1.id", {}),
    "deadline": (lambda: DeadlineOutOfRange(TENANT, 1.0), 422, "invalid_request_error", "deadline_s", {}),
    "unauthorized": (lambda: Unauthorized("unknown API key"), 401, "authentication_error", None,
                     {"www-authenticate": "Bearer"}),
    "not_found": (lambda: NotFound("no such model", param="model"), 404, "not_found_error", "model", {}),
    "too_large": (lambda: PayloadTooLarge("too big"), 413, "invalid_request_error", None, {}),
    "unavailable": (lambda: ServiceUnavailable("starting", retry_after_s=3), 503, "service_unavailable", None,
                    {"retry-after": "3"}),
    "no_worker": (lambda: NoEligibleWorker("no eligible worker"), 503, "service_unavailable", None,
                  {"retry-after": "1"}),
    "rejected_429": (lambda: Rejected("queues full", 429, 2), 429, "rate_limit_error", None, {"retry-after": "2"}),
    "rejected_503": (lambda: Rejected("shutting down", 503, 5), 503, "service_unavailable", None,
                     {"retry-after": "5"}),
    "upstream_answer": (lambda: UpstreamError.answer(CallFailed("worker said 400", 400, WORKER_400)), 400,
                        "BadRequestError", "max_tokens", {}),
    "upstream_4xx": (lambda: UpstreamError.answer(CallFailed("worker said 400", 400)), 400,
                     "invalid_request_error", None, {}),
    "upstream_5xx": (lambda: UpstreamError("every attempt failed", 502), 502, "upstream_error", None, {}),
    "call_failed": (lambda: CallFailed("timed out", 504), 504, "upstream_error", None, {}),
    "worker_error": (lambda: WorkerError("connection refused", refused=True), 502, "upstream_error", None, {}),
    "config": (lambda: ConfigError("f.yaml", "limits", "bad"), 500, "internal_error", None, {}),
}  # fmt: skip


def _test_app(max_body_bytes: int = 1 << 20) -> FastAPI:
    async def never() -> Gateway:
        raise AssertionError("the lifespan does not run in these tests")

    app = create_app(never, max_body_bytes=max_body_bytes)

    async def raise_case(name: str) -> None:
        raise CASES[name][0]()

    async def raise_hostile() -> None:
        ctx = {"error": ValueError("\ud800")}
        loc = ("body", "calls", 0, "id\ud800")
        raise RequestValidationError([{"type": "value_error", "loc": loc, "msg": "bad \ud800", "input": float("nan"),
                                       "ctx": ctx}])  # fmt: skip

    async def raise_surrogate_message() -> None:
        raise Unprocessable("call id '\ud800' is bad", param="calls.0.id\udfff")

    async def raise_with_extra() -> None:
        raise UpstreamError("failed", 400, extra={"workflow": {"id": "wf-1", "status": "failed"}})

    app.add_api_route("/raise/{name}", raise_case)
    app.add_api_route("/hostile", raise_hostile)
    app.add_api_route("/surrogate", raise_surrogate_message)
    app.add_api_route("/extra", raise_with_extra)
    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


@pytest.mark.parametrize("name", list(CASES))
async def test_every_gateway_error_is_answered_with_its_own_status_type_param_and_headers(name: str) -> None:
    make, status, err_type, param, headers = CASES[name]
    async with _client(_test_app()) as client:
        r = await client.get(f"/raise/{name}")
    assert r.status_code == status
    assert r.json() == {"error": {"message": str(make()), "type": err_type, "param": param, "code": status}}
    for k, v in headers.items():
        assert r.headers[k] == v


async def test_extra_fields_are_answered_beside_the_error() -> None:
    async with _client(_test_app()) as client:
        r = await client.get("/extra")
    assert r.status_code == 400
    assert r.json()["workflow"] == {"id": "wf-1", "status": "failed"}
    assert r.json()["error"]["type"] == "invalid_request_error"


async def test_an_error_message_with_lone_surrogates_is_answered_as_valid_json() -> None:
    async with _client(_test_app()) as client:
        r = await client.get("/surrogate")
    assert r.status_code == 422
    assert b"\\ud800" in r.content and b"\\udfff" in r.content
    err = json.loads(r.content)["error"]
    assert (err["message"], err["param"]) == ("call id '\ud800' is bad", "calls.0.id\udfff")


async def test_a_validation_error_with_surrogates_and_nan_is_still_a_422() -> None:
    async with _client(_test_app()) as client:
        r = await client.get("/hostile")
    assert r.status_code == 422
    body = r.json()
    assert body["error"]["message"] == "calls.0.id\ud800: bad \ud800"
    assert body["detail"][0]["input"] == "nan" and body["detail"][0]["ctx"] == {"error": "\ud800"}


@pytest.mark.parametrize("path", ["/v1/workflows", "/v1/chat/completions", "/v1/text2sql"])
@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_a_413_declared_or_streamed(path: str, chunked: bool) -> None:
    parts = [b'{"question": "', *[b"x" * 1000] * 5, b'"}']

    async def stream() -> AsyncIterator[bytes]:
        for p in parts:
            yield p

    async with _client(_test_app(max_body_bytes=4096)) as client:
        content = stream() if chunked else b"".join(parts)
        r = await client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 413
    seen = 5014 if chunked else 5016  # streamed: counted up to the chunk that went over
    assert r.json()["error"] == {
        "message": f"request body of {seen} bytes exceeds the limit of 4096 bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": 413,
    }


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"calls": [{"id": "ok"}, {"id": "\ud800"}]}, "calls.1.id"),
        ({"a": {"b\ud800": 1}}, "a"),
        ("\udc00", "body"),
        ({"messages": [{"content": "\U0001f600 fine"}]}, None),
        ([[[["deep\udfff"]]]], "0.0.0.0"),
    ],
)
def test_lone_surrogate_at_names_the_first_string_that_is_not_text(value: Any, where: str | None) -> None:
    assert lone_surrogate_at(value) == where


@pytest.mark.parametrize("text", ["plain", "é ü 中", "\U0001f600", "\ud800", "a\\\udfffb", "\udfff\ud800"])
def test_dumps_writes_any_string_as_json_that_reads_back_the_same(text: str) -> None:
    assert json.loads(dumps({"k": text})) == {"k": text}


async def test_hostile_requests_get_a_4xx_naming_the_problem_never_a_500(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        chat_ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        cases: list[tuple[str, bytes, dict[str, Any], int, str | None]] = [
            ("/v1/workflows", b'{"calls": [{"id": "\\ud800", "prompt_tokens": 5, "max_tokens": 1}]}', {}, 422,
             "calls.0.id"),
            ("/v1/workflows", b'{"calls": [{"id": "a", "messages": [{"role": "user", "content": "x\\udc00"}]}]}', {},
             422, "calls.0.messages.0.content"),
            ("/v1/workflows", b'{"calls": NaN}', {}, 422, "calls"),
            ("/v1/workflows", b"[" * 100_000, {}, 400, None),
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', {},
             422, "messages.0.content"),
            ("/v1/chat/completions", b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}', {},
             422, "model"),
            ("/v1/chat/completions", b"[" * 100_000, {}, 400, None),  # parsed by the framework, as workflows
            ("/v1/chat/completions", json.dumps(chat_ok).encode(), {"authorization": b"Bearer \xed\xa0\x80"}, 401,
             None),
            ("/v1/text2sql", b'{"question": "how many \\ud800?", "db_id": "x"}', {}, 422, "question"),
            # Sizes are checked before anything is built from them: no 10**12-token prompt, no float overflow.
            ("/v1/workflows", b'{"calls": [{"id": "a", "prompt_tokens": 1000000000000, "max_tokens": 1}]}', {}, 422,
             "calls.0.prompt_tokens"),
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
             + b"0" * 400 + b"}", {}, 422, "max_tokens"),
        ]  # fmt: skip
        for path, content, headers, status, param in cases:
            r = await client.post(path, content=content, headers={"content-type": "application/json", **headers})
            assert r.status_code == status, (path, content[:80], r.text)
            err = r.json()["error"]
            assert (err["code"], err["param"]) == (status, param), (path, err)
        # An escaped surrogate *pair* is ordinary text (an emoji): not refused.
        emoji = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 2}'
        r = await client.post("/v1/chat/completions", content=emoji, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text

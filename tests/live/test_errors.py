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

from gateway.config.tenants import hash_key
from gateway.core.dag import DagError
from gateway.core.scheduler import NoEligibleWorker
from gateway.errors import (
    BadRequest,
    CallFailed,
    ConfigError,
    DomainError,
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
CASES: dict[str, tuple[Callable[[], GatewayError | DomainError], int, str, str | None, dict[str, str]]] = {
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
            ("/v1/workflows", b"[" * 100_000, {}, 422, "body"),
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', {},
             422, "messages.0.content"),
            ("/v1/chat/completions", b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}', {},
             422, "model"),
            ("/v1/chat/completions", b"[" * 100_000, {}, 422, "body"),  # parsed by the framework, as workflows
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


CALL = {"id": "a", "prompt_tokens": 5, "max_tokens": 1}
CHAT = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
FINITE = "must be a finite number (not NaN or Infinity)"
SECONDS = "must be a finite number of seconds written as a JSON number, such as 30 or 2.5"
# name: (path, body, headers, param, message)
WORDS: dict[str, tuple[str, bytes, dict[str, str], str, str]] = {
    "blank_question": ("/v1/text2sql", b'{"question": " \\t ", "db_id": "x"}', {}, "question",
                       "question: must not be blank"),
    "empty_question": ("/v1/text2sql", b'{"question": "", "db_id": "x"}', {}, "question",
                       "question: must not be blank"),
    "header_word": ("/v1/chat/completions", CHAT, {"x-hexflow-deadline-s": "soon"}, "x-hexflow-deadline-s",
                    f"x-hexflow-deadline-s: {SECONDS}"),
    "header_nan": ("/v1/chat/completions", CHAT, {"x-hexflow-deadline-s": "NaN"}, "x-hexflow-deadline-s",
                   f"x-hexflow-deadline-s: {SECONDS}"),
    "header_infinity": ("/v1/chat/completions", CHAT, {"x-hexflow-deadline-s": "Infinity"},
                        "x-hexflow-deadline-s", f"x-hexflow-deadline-s: {SECONDS}"),
    "workflow_nan": ("/v1/workflows", b'{"calls": [%s], "deadline_s": NaN}' % json.dumps(CALL).encode(), {},
                     "deadline_s", f"deadline_s: {FINITE}"),
    "workflow_infinity": ("/v1/workflows", b'{"calls": [%s], "deadline_s": Infinity}' % json.dumps(CALL).encode(),
                          {}, "deadline_s", f"deadline_s: {FINITE}"),
    "text2sql_nan": ("/v1/text2sql", b'{"question": "q", "db_id": "x", "deadline_s": NaN}', {}, "deadline_s",
                     f"deadline_s: {FINITE}"),
    "text2sql_minus_infinity": ("/v1/text2sql", b'{"question": "q", "db_id": "x", "deadline_s": -Infinity}', {},
                                "deadline_s", f"deadline_s: {FINITE}"),
    "kind": ("/v1/workflows", json.dumps({"calls": [{**CALL, "kind": "a b"}]}).encode(), {}, "calls.0.kind",
             "calls.0.kind: must be 1 to 48 letters, digits, '_', '.' or '-'"),
    "not_utf8": ("/v1/workflows", b'{"calls": [{"id": "caf\xe9"}]}', {}, "body",
                 "request body is not valid JSON: not UTF-8 text (byte 0xE9 at line 1 column 23)"),
    "not_utf8_chat": ("/v1/chat/completions", b'{"messages":\n [{"role": "\xff"}]}', {}, "body",
                      "request body is not valid JSON: not UTF-8 text (byte 0xFF at line 2 column 13)"),
    "too_deep": ("/v1/workflows", b"[" * 5000 + b"]" * 5000, {}, "body",
                 "request body is nested too deeply to parse: arrays and objects nested 5000 levels deep "
                 "(the deepest opens at line 1 column 5000)"),
    "too_deep_chat": ("/v1/chat/completions", b'{"a": "[[[",\n"b":' + b'{"c":' * 3000, {}, "body",
                      "request body is nested too deeply to parse: arrays and objects nested 3001 levels deep "
                      "(the deepest opens at line 2 column 15000)"),
}  # fmt: skip


async def test_refusals_say_what_is_expected_in_the_gateways_own_words(tmp_path: Path) -> None:
    """A blank question, a malformed or non-finite deadline (header or body), a body that is not UTF-8 or
    nests too deeply: each a 422 saying what is wrong (never a regular expression, never a bare 400)."""
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        for name, (path, content, headers, param, message) in WORDS.items():
            r = await client.post(path, content=content, headers={"content-type": "application/json", **headers})
            assert r.status_code == 422, (name, r.text)
            err = r.json()["error"]
            assert (err["param"], err["message"]) == (param, message), name


async def test_a_422_lists_every_problem_up_to_twenty(tmp_path: Path) -> None:
    """Every problem is named in the message (the members of a union that failed at one place as one), up to
    twenty; beyond that the message says how many more there are, and ``detail`` holds them all."""
    bad = {"id": 7, "prompt_tokens": "x", "max_tokens": "y"}
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        r = await client.post("/v1/workflows", json={"calls": [bad, bad]})
        assert r.status_code == 422
        err = r.json()["error"]
        assert err["param"] == "calls.0.id"
        assert err["message"] == "; ".join(
            f"calls.{i}.{field}: {words}"
            for i in range(2)
            for field, words in (
                ("id", "Input should be a valid string"),
                ("prompt_tokens", "Input should be a valid integer"),
                ("max_tokens", "Input should be a valid integer"),
            )
        )
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": 1, "content": 2}]})
        assert r.json()["error"]["message"] == (
            "messages.0.role: Input should be a valid string; "
            "messages.0.content: Input should be a valid string or Input should be a valid list"
        )
        r = await client.post("/v1/workflows", json={"calls": [bad] * 10})
        message = r.json()["error"]["message"]
        assert message.count("; ") == 20 and message.endswith("; and 10 more (every problem is under detail)")
        assert message.startswith("calls.0.id: ") and "calls.6.id: " in message
        assert len(r.json()["detail"]) > 30


async def test_the_admin_key_sent_for_a_tenant_is_told_where_it_is_accepted(tmp_path: Path) -> None:
    admin = {"api_key_sha256": [hash_key("ops-key")]}
    async with (
        emulators(["A100"]) as urls,
        gateway_client(write_config(tmp_path, urls, ["A100"], admin=admin), key="ops-key") as (client, _),
    ):
        for path, body in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/workflows", {"calls": [CALL]}),
            ("/v1/text2sql", {"question": "q", "db_id": "x"}),
        ]:
            r = await client.post(path, json=body)
            assert r.status_code == 401, (path, r.text)
            message = r.json()["error"]["message"]
            assert message.startswith("this is the gateway's admin key, not a tenant's API key"), message
            for endpoint in ("/ui", "/v1/status", "/metrics"):
                assert endpoint in message
        r = await client.get("/ui/api/state")
        assert r.status_code == 200
        r = await client.post(path, json=body, headers={"Authorization": "Bearer nobody"})
        assert (r.status_code, r.json()["error"]["message"]) == (401, "unknown API key")

"""The API contract: the OpenAPI document is complete and true, and schemathesis cannot break it.

``test_every_route_keeps_its_contract`` runs schemathesis (every check it has, the schema's examples, its
coverage and fuzzing phases, deterministic) against the gateway's ASGI app in process, over an emulated
worker and a demo SQLite database, authenticated with a tenant's key. One relaxation, stated here and in
docs/live-gateway.md: a request that matches the schema may still be refused 422 for a rule JSON Schema
cannot state (``SEMANTIC_RULES``); the ``refusals_name_a_rule`` check asserts that every such 422 names
one of them. The cases run per route are printed at the end (``-s`` shows them).

The bigger run (``slow``) is the same with more examples per route.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import schemathesis
import yaml
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.core.result import Err, Ok
from schemathesis.pytest.lazy import get_all_tests
from schemathesis.python.asgi import shutdown_lifespans

from gateway.config.gateway import load_gateway_config
from gateway.live.routers.workflows import BENCHMARK_FIELDS
from gateway.live.server import build_app
from gateway.text2sql.demo.schema import DB_ID
from gateway.text2sql.demo.writers import write_sqlite
from tests.emulator_process import emulator_process
from tests.live.fake_transport import FakeTransport, fake_gateway
from tests.live.harness import INTERACTIVE_KEY, write_config

AUTH = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
EXAMPLES_PER_ROUTE = 40
SLOW_EXAMPLES_PER_ROUTE = 400
SEMANTIC_RULES = re.compile(
    r"outside tenant .*'s range"  # a deadline outside the tenant's range (per tenant: not in the schema)
    r"|duplicate call id|unknown call|cycle|depends on itself"  # the DAG of a workflow
    r"|min_tokens=\d+ exceeds max_tokens"  # min_tokens <= max_tokens
    r"|shared_prefix: \d+ tokens exceed prompt_tokens"  # a call's shared segments fit in its prompt
    r"|tokens exceed the limit"  # a prompt's estimated tokens (characters / 4 plus overheads)
    r"|question: must not be empty"  # a question of whitespace only: \S in the schema, stripped text here
    r"|Idempotency-Key '.*' was already used for a different request"  # a key's earlier request: state
    r"|Idempotency-Key header is not supported with stream: true"  # a stream cannot be replayed
)
"""The 422s a request valid under the schema may get: rules that JSON Schema cannot state."""

CASES: Counter[str] = Counter()
STATUSES: Counter[tuple[str, int]] = Counter()


@schemathesis.check
def refusals_name_a_rule(ctx: schemathesis.CheckContext, response: schemathesis.Response, case: Any) -> bool | None:
    """A 422 to data the schema accepts names a rule the schema cannot state (``SEMANTIC_RULES``)."""
    meta = getattr(case, "meta", None)
    positive = (
        meta is not None
        and meta.generation.mode.is_positive
        and all(c.mode.is_positive for c in meta.components.values())
    )
    if positive and response.status_code == 422:
        message = response.json()["error"]["message"]
        if not SEMANTIC_RULES.search(message):
            raise AssertionError(f"valid data refused with 422 for a rule the schema does not state: {message}")
    return None


def _config(examples: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": 20261201,
            "generation": {"max-examples": examples, "deterministic": True, "database": "none"},
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "422", "429"]},
                # A body over limits.max_body_bytes is refused (413) before it is read: a valid refusal.
                "negative_data_rejection": {
                    "expected-statuses": [
                        "400",
                        "401",
                        "403",
                        "404",
                        "405",
                        "406",
                        "409",
                        "413",
                        "415",
                        "422",
                        "428",
                        "429",
                    ]
                },
            },
            "phases": {"stateful": {"enabled": False}},  # no links between the routes: nothing to chain
        }
    )


@pytest.fixture(scope="module")
def gateway_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """The gateway over one emulated worker (a subprocess: schemathesis drives the app from its own event
    loop) and the demo SQLite database, with small limits so every generated call is quick."""
    tmp = tmp_path_factory.mktemp("openapi")
    db = write_sqlite(tmp / f"{DB_ID}.sqlite")
    (tmp / "databases.yaml").write_text(yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{db.name}"}}}))
    with emulator_process(["--gpu", "A100", "--time-scale", "0.0005"], tmp / "emulator.log") as url:
        cfg = write_config(
            tmp,
            [url],
            ["A100"],
            time_scale=0.0005,
            limits={"max_tokens": 48, "max_calls_per_workflow": 6, "max_body_bytes": 65536},
            databases_file="databases.yaml",
            text2sql={"candidates": 1, "max_revisions": 1, "unit_tests": 1, "max_question_chars": 400},
            # A busy machine must not turn the worker "down" mid-run: a 503 would be a (false) failure.
            health={"period_s": 0.5, "timeout_s": 30.0, "failures_to_down": 1000},
            scrape={"period_s": 0.5, "timeout_s": 30.0},
        )
        app = build_app(load_gateway_config(cfg))
        try:
            yield app
        finally:
            shutdown_lifespans()  # the gateway drains and stops before its worker goes
            print("\nschemathesis cases per route:", dict(sorted(CASES.items())))
            print("statuses:", dict(sorted(STATUSES.items())))


ROUTES = [
    "POST /v1/workflows",
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "GET /v1/models",
    "POST /v1/text2sql",
    "GET /v1/status",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
]


T = TypeVar("T")
E = TypeVar("E", bound=Exception)


def _ok(result: Ok[T] | Err[E]) -> T:
    """The value of a schemathesis result; an error (an invalid schema) is raised."""
    if isinstance(result, Err):
        raise result.err()
    return result.ok()


def _case(case: Any) -> None:
    CASES[case.operation.label] += 1
    response = case.call_and_validate(headers=AUTH, additional_checks=[refusals_name_a_rule])
    STATUSES[(case.operation.label, response.status_code)] += 1


def _fuzz(app: FastAPI, label: str, examples: int) -> None:
    """Schemathesis on one route: the schema's examples, its coverage cases, then ``examples`` fuzzed
    cases (the stateful phase is off: the routes have no links to chain), every check on every answer."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=_config(examples))
    ran = 0
    for result in get_all_tests(schema=schema, test_func=_case, settings=SETTINGS, given_kwargs=None):
        operation, test = _ok(result)
        if operation.label == label:
            test()
            ran += 1
    assert ran == 1, f"{label} is not in the document"


SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def test_the_document_lists_every_route(gateway_app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", gateway_app)
    labels = sorted(_ok(r).label for r in schema.get_all_operations())
    assert labels == sorted(ROUTES)


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_the_document_states_what_the_routes_do(gateway_app: FastAPI) -> None:
    """Statuses, media types, security, the one-of rule and the running limits, as the routes have them."""
    doc = gateway_app.openapi()
    paths = doc["paths"]
    statuses = {(m.upper(), p): set(op["responses"]) for p, ops in paths.items() for m, op in ops.items()}
    assert statuses[("GET", "/healthz")] == {"200"}
    assert statuses[("POST", "/v1/workflows")] == {
        "200", "400", "401", "413", "415", "422", "429", "502", "503", "504"
    }  # fmt: skip
    assert {"404", "413", "415", "422", "429", "502", "503"} <= statuses[("POST", "/v1/chat/completions")]
    assert {"404", "413", "415", "422", "429", "502", "503"} <= statuses[("POST", "/v1/completions")]
    assert {"404", "413", "415", "422", "429", "502", "503"} <= statuses[("POST", "/v1/text2sql")]
    assert statuses[("GET", "/readyz")] == {"200", "503"}
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(paths["/metrics"]["get"]["responses"]["503"]["content"]) == {"application/json"}
    assert "text/event-stream" in paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in paths["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert "Retry-After" in paths["/v1/workflows"]["post"]["responses"]["429"]["headers"]
    # The bearer scheme on every authenticated route, and only there.
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The tenant's API key: ``Authorization: Bearer <key>``.",
    }
    secured = {p for p, ops in paths.items() for op in ops.values() if op.get("security") == [{"bearer": []}]}
    assert secured == {"/v1/workflows", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/text2sql"}
    # Request schemas: strict types, exactly one of messages and prompt_tokens, the running limits.
    schemas = doc["components"]["schemas"]
    call = schemas["WorkflowCall"]
    assert call["oneOf"] == [
        {
            "required": ["messages"],
            "not": {"anyOf": [{"required": ["prompt_tokens"]}, {"required": ["shared_prefix"]}]},
        },
        {"required": ["prompt_tokens"], "not": {"required": ["messages"]}},
    ]
    assert call["properties"]["shared_prefix"]["maxItems"] == 8
    segment = schemas["SharedPrefixSegment"]
    assert segment["additionalProperties"] is False and segment["required"] == ["name", "tokens"]
    assert segment["properties"]["tokens"]["maximum"] == 48 and segment["properties"]["name"]["maxLength"] == 128
    assert call["additionalProperties"] is False
    assert call["properties"]["max_tokens"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 48,
        "default": 48,
        "title": "Max Tokens",
        "description": "Most output tokens.",
    }
    expected = call["properties"]["expected_output_tokens"]["anyOf"]
    assert {"type": "integer", "minimum": 1, "maximum": 48} in expected  # unbounded, no deadline would fit
    assert schemas["WorkflowRequest"]["properties"]["calls"]["maxItems"] == 6
    chat = schemas["ChatCompletionRequest"]
    assert chat["additionalProperties"] is True and chat["required"] == ["messages"]
    assert {"type": "integer", "minimum": 1, "maximum": 48} in chat["properties"]["max_tokens"]["anyOf"]
    assert {"type": "boolean"} in chat["properties"]["stream"]["anyOf"]
    completion = schemas["CompletionRequest"]
    assert completion["additionalProperties"] is True and completion["required"] == ["prompt"]
    assert {"type": "integer", "minimum": 1, "maximum": 48} in completion["properties"]["max_tokens"]["anyOf"]
    assert schemas["Text2SqlRequest"]["properties"]["question"]["maxLength"] == 400
    # pydantic writes a bound it cannot place as "ge"/"le": JSON Schema ignores those keys.
    leaked = [n for n in _walk(schemas) if {"ge", "le", "gt", "lt"} & set(n) and "type" in n]
    assert not leaked


def test_swagger_ui_and_redoc_are_served_by_the_gateway(gateway_app: FastAPI) -> None:
    """The documentation pages load their scripts and styles from the gateway: they work offline."""
    # schemathesis types an ASGI app with dict messages, Starlette with MutableMapping ones (the ASGI spec's):
    # the same app, but the two declarations do not match.
    with schemathesis.python.asgi.get_client(gateway_app) as client:  # type: ignore[arg-type]
        for page in ("/docs", "/redoc"):
            r = client.get(page)
            assert r.status_code == 200 and "text/html" in r.headers["content-type"]
            assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
            assert assets and all(a.startswith("/static/docs/") for a in assets), assets
            assert "http://" not in r.text and "https://" not in r.text
            for asset in assets:
                got = client.get(asset)
                assert got.status_code == 200 and len(got.content) > 500, asset
        assert "openapi.json" in client.get("/docs").text
        for licence in ("swagger-ui/LICENSE", "swagger-ui/NOTICE", "redoc/LICENSE"):
            assert client.get(f"/static/docs/{licence}").status_code == 200


def test_the_documentation_pages_let_the_browser_load_nothing_from_outside_the_gateway(gateway_app: FastAPI) -> None:
    """ReDoc's bundle shows Redocly's logo from a CDN: the pages' Content-Security-Policy allows no source
    outside the gateway (only its own origin, inline and ``data:``/``blob:`` content), so nothing is fetched."""
    with schemathesis.python.asgi.get_client(gateway_app) as client:  # type: ignore[arg-type]
        for page in ("/docs", "/redoc"):
            policy: dict[str, list[str]] = {}
            for directive in client.get(page).headers.get("content-security-policy", "").split(";"):
                name, *sources = directive.split()
                policy[name] = sources
            assert policy.get("default-src") == ["'self'"], (page, policy)
            for name in ("img-src", "script-src", "style-src", "font-src", "connect-src"):
                assert name in policy, (page, name)
            outside = [s for v in policy.values() for s in v if not s.startswith("'") and s not in ("data:", "blob:")]
            assert not outside, (page, outside)


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_keeps_its_contract(gateway_app: FastAPI, route: str) -> None:
    _fuzz(gateway_app, route, EXAMPLES_PER_ROUTE)


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_every_route_keeps_its_contract_long_run(gateway_app: FastAPI, route: str) -> None:
    _fuzz(gateway_app, route, SLOW_EXAMPLES_PER_ROUTE)


def test_the_benchmark_only_fields_are_documented_only_in_benchmark_mode(tmp_path: Path) -> None:
    """Off benchmark mode (production) a workflow call is chat ``messages`` only: ``BENCHMARK_FIELDS`` are
    refused, so the document leaves them (and ``SharedPrefixSegment``) out and its examples are chat calls."""
    cfg = write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"], benchmark=False)
    app = build_app(load_gateway_config(cfg))
    app.state.gateway = fake_gateway(cfg, FakeTransport())
    schemas = app.openapi()["components"]["schemas"]
    call = schemas["WorkflowCall"]
    assert not set(BENCHMARK_FIELDS) & set(call["properties"]) and "oneOf" not in call
    assert call["required"] == ["id", "messages"] and "SharedPrefixSegment" not in schemas
    assert call["examples"] and all("messages" in c for c in call["examples"])
    assert not any("SharedPrefixSegment" in str(n.get("$ref", "")) for n in _walk(app.openapi()))

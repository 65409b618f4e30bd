"""The gateway's HTTP face (FastAPI): the app factory ``create_app``.

One router per surface under ``gateway.live.routers`` (docs/live-gateway.md, "API"); the hot pass-through
routes are usually served by ``gateway.live.fastpath``. Routes raise ``GatewayError``s and one handler renders
them; validation, unknown routes and unexpected exceptions have a handler each."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from gateway.errors import DomainError, GatewayError, error_body
from gateway.live.deps import unicode_body
from gateway.live.fastpath import FAST_PATHS, FastPath
from gateway.live.logs import RequestIdMiddleware
from gateway.live.middleware import BodyLimit
from gateway.live.responses import JSONResponse, error_response, internal_error, plain
from gateway.live.routers import chat, ops, text2sql, ui, workflows
from gateway.live.schemas import problem_text
from gateway.live.service import Gateway

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""Swagger UI and ReDoc, vendored from npm (versions and licences: static/README.md)."""
STATIC_URL = "/static/docs"

_TELEMETRY = ("tracing", "metrics", "logs", "operation_spans", "auto_configure")
FASTAPI_TELEMETRY_OFF: dict[str, Any] = (
    {"telemetry": dict.fromkeys(_TELEMETRY, False)}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)
"""FastAPI's own OpenTelemetry instrumentation, off (it reads ``os.environ`` on every request)."""

GC_GEN0_THRESHOLD = 50_000
"""The collector's generation-0 threshold while serving (CPython's: 700; docs/live-gateway.md, "Implementation
notes"). Lower it if pauses matter more than CPU time."""


@contextlib.contextmanager
def serving_gc(gen0_threshold: int = GC_GEN0_THRESHOLD) -> Iterator[None]:
    """While serving: a full collection and ``gc.freeze()``, the generation-0 threshold raised to
    ``gen0_threshold``; unfrozen and restored on exit. Process-wide."""
    before = gc.get_threshold()
    gc.collect()  # no garbage frozen: it would never be freed
    gc.freeze()
    gc.set_threshold(max(gen0_threshold, before[0]), before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


class GatewayApp(FastAPI):
    """FastAPI with the hot routes' fast path (``gateway.live.fastpath``) in front of a ``POST`` to them."""

    fast: FastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection or lifespan."""
        fast = self.fast
        if fast is not None and scope["type"] == "http" and scope["path"] in FAST_PATHS and scope["method"] == "POST":
            await fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    make_gateway: Callable[[], Awaitable[Gateway]], *, max_body_bytes: int = 1 << 20, fast_path: bool = True
) -> FastAPI:
    """The ASGI app; ``make_gateway`` builds the (unstarted) service inside the lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = await make_gateway()
        app.state.gateway = gw
        await gw.start()
        try:
            with serving_gc():  # after start-up: what is alive now lives as long as the process
                yield
        finally:
            await gw.drain(gw.cfg.shutdown_grace_s)
            await gw.stop()

    app = GatewayApp(
        title="HexGen-Flow gateway",
        version="0.1.0",
        description="Deadline- and heterogeneity-aware scheduling of agentic LLM workflows over vLLM workers.",
        lifespan=lifespan,
        default_response_class=JSONResponse,
        dependencies=[Depends(unicode_body)],
        docs_url=None,
        redoc_url=None,
        **FASTAPI_TELEMETRY_OFF,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(RequestIdMiddleware)  # outermost: even a 413 carries the id, and logs of every layer
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(DomainError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)
    for routes in (workflows, chat, ops, text2sql, ui):
        app.include_router(routes.router)
    app.mount(ui.UI_STATIC_URL, StaticFiles(directory=ui.UI_DIR), name="ui-static")
    _serve_docs(app)
    app.openapi = lambda: openapi_with_limits(app)  # type: ignore[method-assign]
    if fast_path and not app.root_path:
        app.fast = FastPath(super(GatewayApp, app).__call__, app.state, max_body_bytes)
    return app


DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'self'; form-action 'self'"
)
"""The ``Content-Security-Policy`` of ``/docs`` and ``/redoc``: nothing loads from outside the gateway (inline
styles, ``eval`` and ``blob:`` workers are what the unmodified bundles need)."""


def _serve_docs(app: FastAPI) -> None:
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="docs-static")
    spec, icon = app.openapi_url or "/openapi.json", f"{STATIC_URL}/swagger-ui/favicon-32x32.png"
    pages = {
        "/docs": get_swagger_ui_html(
            openapi_url=spec,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{STATIC_URL}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=icon,
            swagger_ui_parameters={"validatorUrl": None},  # no call to the public validator
        ).body,
        "/redoc": get_redoc_html(
            openapi_url=spec,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{STATIC_URL}/redoc/redoc.standalone.js",
            redoc_favicon_url=icon,
            with_google_fonts=False,
        ).body,
    }

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(pages[request.scope["route"].path], headers={"Content-Security-Policy": DOCS_CSP})

    for path in pages:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)


def openapi_with_limits(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document with the running gateway's limits, and the benchmark-only call fields only in
    benchmark mode; before the gateway started, without either (and not cached)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
    )
    gw = getattr(app.state, "gateway", None)
    schemas = doc.get("components", {}).get("schemas", {})
    if not (isinstance(gw, Gateway) and gw.cfg.benchmark):
        _hide_benchmark_fields(schemas)
    if not isinstance(gw, Gateway):
        return doc
    lim = gw.cfg.limits

    def props(model: str) -> dict[str, Any]:
        found: dict[str, Any] = schemas.get(model, {}).get("properties", {})
        return found

    call = props("WorkflowCall")
    if "max_tokens" in call:  # the default is capped at the limit too (routers.workflows)
        call["max_tokens"]["default"] = min(call["max_tokens"].get("default", lim.max_tokens), lim.max_tokens)
    limited = {
        "WorkflowCall": ("prompt_tokens", "max_tokens", "min_tokens", "expected_output_tokens"),
        "SharedPrefixSegment": ("tokens",),
        "CompletionRequest": ("max_tokens",),
        "ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
    }
    for model, names in limited.items():
        for name in names:
            _set(props(model).get(name), "integer", "maximum", lim.max_tokens)
    _set(props("WorkflowRequest").get("calls"), "array", "maxItems", lim.max_calls_per_workflow)
    t2s = getattr(app.state, "text2sql", None)
    settings = getattr(t2s, "settings", None)
    if settings is not None:
        t2s_req = props("Text2SqlRequest")
        _set(t2s_req.get("question"), "string", "maxLength", settings.max_question_chars)
        _set(t2s_req.get("evidence"), "string", "maxLength", settings.max_evidence_chars)
    app.openapi_schema = doc
    return doc


def _hide_benchmark_fields(schemas: dict[str, Any]) -> None:
    """Leave ``workflows.BENCHMARK_FIELDS`` out of ``WorkflowCall``: a call then needs ``messages``."""
    call = schemas.get("WorkflowCall")
    if call is None:
        return
    for name in workflows.BENCHMARK_FIELDS:
        call.get("properties", {}).pop(name, None)
    call.pop("oneOf", None)
    call["required"] = sorted({*call.get("required", ()), "messages"})
    request_examples = schemas.get("WorkflowRequest", {}).get("examples", [])
    call["examples"] = [c for ex in request_examples for c in ex.get("calls", ())]
    schemas.pop("SharedPrefixSegment", None)


def _set(schema: dict[str, Any] | None, type_: str, key: str, value: int) -> None:
    """Set ``key`` on ``schema`` where it has type ``type_`` (itself, or its branch of an ``anyOf``)."""
    if schema is None:
        return
    if schema.get("type") == type_:
        schema[key] = value
    for branch in schema.get("anyOf", ()):
        _set(branch, type_, key, value)


async def _gateway_error(_: Request, exc: GatewayError | DomainError) -> JSONResponse:
    """Every error a route raises on purpose (a core error that reached the edge unmapped: ``to_http``'s)."""
    return error_response(exc)


MAX_LISTED_PROBLEMS = 20
"""A 422's message lists at most this many problems (every one is under ``detail``)."""


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 listing the problems in the gateway's words where it has some (all under ``detail``); a body that is
    not JSON gets 422 saying where it breaks, one sent as another content type 415."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx")
        why = str(ctx.get("error", "malformed")) if isinstance(ctx, dict) else "malformed"
        pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
        where = _line_column(exc.body, pos)
        body = error_body(422, f"request body is not valid JSON: {why}{where}", "invalid_request_error", "body")
        return JSONResponse(body, status_code=422)
    if loc == ("body",) and isinstance(first.get("input"), bytes | bytearray):
        sent = request.headers.get("content-type", "")
        msg = (
            f"request body must be JSON: send Content-Type: application/json (got {sent[:100]!r})"
            if sent
            else "request body must be JSON: send Content-Type: application/json"
        )
        return JSONResponse(error_body(415, msg, "invalid_request_error", "body"), status_code=415)
    problems = _problems(errors or [first])
    listed = "; ".join(f"{where}: {text}" for where, text in problems[:MAX_LISTED_PROBLEMS])
    hidden = len(problems) - MAX_LISTED_PROBLEMS
    more = f"; and {hidden} more (every problem is under detail)" if hidden > 0 else ""
    body = error_body(422, listed + more, "invalid_request_error", problems[0][0])
    body["detail"] = plain(errors)
    return JSONResponse(body, status_code=422)


def _problems(errors: Sequence[Any]) -> list[tuple[str, str]]:
    """``(location, words)`` per location: a union's failed members are one problem (an optional field's
    "should be None" left out when others say what was wrong)."""
    by_loc: dict[str, list[tuple[str, str]]] = {}
    for e in errors:
        if not isinstance(e, dict):
            continue
        by_loc.setdefault(_loc(tuple(e.get("loc", ()))), []).append((str(e.get("type")), problem_text(e)))
    out = []
    for where, found in by_loc.items():
        texts = [text for kind, text in found if kind != "none_required"] or [text for _, text in found]
        out.append((where, " or ".join(dict.fromkeys(texts))))
    return out or [("body", "invalid request")]


def _line_column(doc: Any, pos: int | None) -> str:
    """`` at line L column C`` of character ``pos`` of the body (1-based, as ``json`` counts), or ""."""
    if not isinstance(doc, str) or pos is None or not 0 <= pos <= len(doc):
        return ""
    line = doc.count("\n", 0, pos) + 1
    column = pos - doc.rfind("\n", 0, pos)
    return f" at line {line} column {column}"


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (404, 405) in the same shape; a body it could not parse (not UTF-8, nested too
    deeply) is a 422 naming why."""
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError | RecursionError):
        raw = await request.body()
        why = await asyncio.to_thread(_unreadable_json, raw, cause)  # a scan of up to max_body_bytes
        return JSONResponse(error_body(422, why, "invalid_request_error", "body"), status_code=422)
    return JSONResponse(
        error_body(exc.status_code, str(exc.detail), "invalid_request_error"),
        status_code=exc.status_code,
        headers=exc.headers,
    )


_JSON_TOKEN = re.compile(rb'"(?:[^"\\]+|\\.)*"?|[\[\]{}]', re.DOTALL)  # a JSON string or a bracket


def _unreadable_json(raw: bytes, cause: BaseException) -> str:
    """Why ``raw`` could not be parsed (``cause``: ``UnicodeDecodeError`` or ``RecursionError``), where it is."""
    if isinstance(cause, RecursionError):
        depth = deepest = at = 0
        for m in _JSON_TOKEN.finditer(raw):
            c = m.group()
            if c in (b"[", b"{"):
                depth += 1
                if depth > deepest:
                    deepest, at = depth, m.start()
            elif c in (b"]", b"}"):
                depth -= 1
        if deepest == 0:
            return "request body is nested too deeply to parse"
        text = raw[:at].decode("utf-8", "replace")
        return (
            f"request body is nested too deeply to parse: arrays and objects nested {deepest} levels deep "
            f"(the deepest opens{_line_column(text, len(text))})"
        )
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        text = raw[: e.start].decode("utf-8", "replace")
        return (
            f"request body is not valid JSON: not UTF-8 text (byte 0x{raw[e.start]:02X}{_line_column(text, len(text))})"
        )
    return "request body is not valid JSON: it cannot be read as UTF-8 text"


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    """Any other exception: ``internal_error``."""
    return internal_error(exc)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "constrained-int", "constrained-str"})


def _loc(loc: tuple[Any, ...]) -> str:
    """``calls.0.max_tokens``: the location without ``body`` and pydantic's union member tags (a header by
    itself)."""
    if loc and loc[0] in ("header", "query", "path", "cookie"):
        loc = loc[1:]
    parts = [
        str(p)
        for p in loc
        if p != "body" and not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS or p.startswith("function-")))
    ]
    return ".".join(parts) or "body"

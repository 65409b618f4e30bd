"""The gateway's log lines: plain text or JSON, each with the request and workflow ids where known (context
variables set by ``RequestIdMiddleware`` and the routes; tasks inherit them)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import sys
import time
from contextvars import ContextVar
from typing import IO, Any, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LOG_FORMATS",
    "REQUEST_ID",
    "WORKFLOW_ID",
    "ContextFilter",
    "JsonFormatter",
    "LogFormat",
    "RequestIdMiddleware",
    "configure_logging",
    "request_id",
    "with_request_id",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

REQUEST_ID: ContextVar[str | None] = ContextVar("hexflow_request_id", default=None)
"""The id of the HTTP request being served (None outside one)."""
WORKFLOW_ID: ContextVar[str | None] = ContextVar("hexflow_workflow_id", default=None)
"""The id of the workflow (or Text-to-SQL question) being served (None outside one)."""

_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""What a client's ``X-Request-Id`` may be to be kept (anything else is replaced: it goes into logs)."""


_ids = random.Random()  # seeded from the OS; ids need to be unique, not secret
os.register_at_fork(after_in_child=_ids.seed)  # a forked child must not repeat its parent's ids


def request_id(sent: bytes | None) -> str:
    """A request's id: the client's ``X-Request-Id`` (``sent``) when it is sane, else a new ``req-`` + 16 hex
    digits (64 random bits: unique in practice, not a secret; a forked process reseeds)."""
    if sent is not None:
        text = sent.decode("latin-1")
        if _SANE_ID.fullmatch(text):
            return text
    return f"req-{_ids.getrandbits(64):016x}"


class ContextFilter(logging.Filter):
    """Adds ``request_id`` and ``workflow_id`` (None where unknown) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record."""
        record.request_id = REQUEST_ID.get()
        record.workflow_id = WORKFLOW_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, ``request_id``
    and ``workflow_id`` when known, ``exc`` (the traceback) when the record has one."""

    converter = staticmethod(time.gmtime)  # UTC timestamps, as the "Z" says

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (never raises on odd messages: unencodable text is escaped)."""
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "workflow_id"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=True, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs (so that a second call replaces it, and only it)."""


def configure_logging(level: str = "info", fmt: LogFormat = "text", stream: IO[str] | None = None) -> logging.Handler:
    """One handler on the root logger writing to ``stream`` (default stderr) in ``fmt``, in place of the one
    an earlier call installed (handlers installed by others stay); returns it."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


class RequestIdMiddleware:
    """ASGI middleware: sets ``REQUEST_ID`` for each HTTP request and answers it in ``X-Request-Id``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with its id in the context."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = None
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                sent = v
                break
        rid = request_id(sent)
        token = REQUEST_ID.set(rid)
        wf_token = WORKFLOW_ID.set(None)  # a route sets it; reset below, so it never outlives the request
        try:
            await self.app(scope, receive, with_request_id(send, rid.encode()))
        finally:
            WORKFLOW_ID.reset(wf_token)
            REQUEST_ID.reset(token)


def with_request_id(send: Send, rid: bytes) -> Send:
    """``send`` with ``X-Request-Id: rid`` added to the response's headers."""

    async def sender(msg: Message) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", []), (b"x-request-id", rid)]}
        await send(msg)

    return sender

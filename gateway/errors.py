"""The gateway's error tree: every error the project raises on purpose is a ``GatewayError``.

    GatewayError              status 500, internal_error
    ├── ConfigError           a config, cluster, GPU catalogue or trace file is invalid (names file and field)
    ├── UnknownNameError      an unknown policy, GPU, model or workload name was asked for
    ├── BadRequest            a caller's input is invalid (400)
    ├── Rejected              admission refused a workflow (429 over the tenant's limit, 503 overloaded)
    ├── CallFailed            a call could not be completed (its ``status``: 502 upstream, 503, 504, ...)
    └── WorkerError           a worker failed a call (connection, timeout, 5xx): the pool retries elsewhere

Each class knows the HTTP ``status`` and the OpenAI-style ``error_type`` it is answered with (and, where
one applies, the ``param`` and ``headers``), so the server renders every one of them with one handler.
Foreign exceptions (yaml, pydantic, json, aiohttp) are translated into these at the boundary where they
occur, so the CLI can print one clear line and exit with status 2.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose.

    Class attributes (instances may override them): ``status`` (HTTP), ``error_type`` (OpenAI-style
    ``error.type``), ``param`` (the request field at fault) and ``headers`` (e.g. ``Retry-After``).
    """

    status: int = 500
    error_type: str = "internal_error"
    param: str | None = None
    headers: dict[str, str] | None = None


class ConfigError(GatewayError):
    """A file the user gave is invalid. The message names the file and the field."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        where = f"{path}: {field}" if field else path
        super().__init__(f"{where}: {problem}")


class UnknownNameError(GatewayError):
    """A name (policy, GPU, model, workload) is not registered."""

    status = 400
    error_type = "invalid_request_error"

    def __init__(self, what: str, name: str, known: list[str]) -> None:
        self.what = what
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {what} {name!r}; known: {', '.join(self.known)}")


class BadRequest(GatewayError):
    """Invalid input from a caller."""

    status = 400
    error_type = "invalid_request_error"


class Rejected(GatewayError):
    """Admission refused a workflow: 429 (the tenant is over its limit) or 503 (the gateway is overloaded),
    with the seconds after which a retry may succeed."""

    def __init__(self, message: str, status: int, retry_after_s: int) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = "rate_limit_error" if status == 429 else "service_unavailable"
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(retry_after_s)}


class CallFailed(GatewayError):
    """A call could not be completed. ``status`` is the HTTP status to report for it; ``body`` the worker's
    own error answer, when it sent one."""

    error_type = "upstream_error"

    def __init__(self, message: str, status: int = 502, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class WorkerError(GatewayError):
    """The worker failed a call (connection error, timeout, 5xx): retry elsewhere. ``refused``: the
    connection was refused (the worker is down, not slow)."""

    status = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused

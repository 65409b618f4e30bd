"""The gateway's error tree: every error the project raises on purpose is a ``GatewayError`` or, in the core,
a ``DomainError``.

    GatewayError                  500 internal_error
    ├── ConfigError               a config, cluster, GPU catalogue or trace file is invalid (names file and field)
    ├── ListenError               a server cannot listen on its address (names host and port)
    ├── BadRequest                400 invalid_request_error
    │   ├── UnknownNameError      an unknown GPU, model, cluster or workload name
    │   ├── Unprocessable         422: well-formed but invalid (``live.tenants.DeadlineOutOfRange`` is one)
    │   ├── Unauthorized          401 authentication_error, ``WWW-Authenticate: Bearer``
    │   ├── NotFound              404 not_found_error
    │   └── PayloadTooLarge       413
    ├── ServiceUnavailable        503 service_unavailable, ``Retry-After``
    ├── Rejected                  admission refused a workflow (429 or 503), ``Retry-After``
    ├── UpstreamError             a workflow failed on a worker: its 4xx passed through, else 502/503/504
    ├── CallFailed                a call could not be completed (its ``status``)
    └── WorkerError               a worker failed a call: the pool retries elsewhere

    DomainError                   what happened in the core's terms, no HTTP status (``gateway.live.responses.to_http``
    │                             maps each to its answer)
    ├── NoEligibleWorker          every worker is down or draining: 503
    ├── UnknownName               an unknown policy, dispatcher or queue discipline: 400
    ├── core.dag.DagError         a node list that is not a DAG: 422 naming the field
    └── core.admission.AdmissionRefused   not admitted: 429 predicted miss, 422 deadline too short, 503

A ``GatewayError`` knows its ``status``, OpenAI-style ``error_type``, ``param``, ``headers`` and ``extra`` body
fields, so one handler renders them all (``response_body``). Foreign exceptions are translated where they occur,
so the CLI prints one line and exits 2."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose; class attributes ``status``, ``error_type``,
    ``param``, ``headers`` and ``extra`` (body fields beside ``error``) may be overridden per instance."""

    status: int = 500
    error_type: str = "internal_error"
    param: str | None = None
    headers: dict[str, str] | None = None
    extra: dict[str, Any] | None = None

    def __init__(
        self,
        message: str = "",
        *,
        status: int | None = None,
        error_type: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        given = {"status": status, "error_type": error_type, "param": param, "headers": headers, "extra": extra}
        for key, value in given.items():
            if value is not None:
                setattr(self, key, value)

    @property
    def message(self) -> str:
        """The message, as the error body carries it."""
        return str(self)

    def response_body(self) -> dict[str, Any]:
        """The OpenAI-style answer: ``{"error": {"message", "type", "param", "code"}}`` and ``extra``."""
        return error_body(self.status, self.message, self.error_type, self.param) | (self.extra or {})


def error_body(status: int, message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI-style error body, for errors that are not ``GatewayError`` (a framework's own)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


class ConfigError(GatewayError):
    """A file the user gave is invalid. The message names the file and the field."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        super().__init__(f"{path}: {field}: {problem}" if field else f"{path}: {problem}")


class ListenError(GatewayError):
    """A server cannot listen on its address (port in use, not this host's); the message names host and port."""


class _Unknown(Exception):
    """A name that is not registered: ``what``, ``name`` and the sorted ``known`` names."""

    def __init__(self, what: str, name: str, known: list[str], *, hint: str = "") -> None:
        self.what = what
        self.name = name
        self.known = sorted(known)
        super().__init__(unknown_name_message(what, name, self.known, hint))


def unknown_name_message(what: str, name: str, known: Iterable[str], hint: str = "") -> str:
    """``unknown <what> '<name>'; known: a, b`` (``known`` sorted), then ``hint`` as a sentence."""
    return f"unknown {what} {name!r}; known: {', '.join(sorted(known))}" + (f". {hint}" if hint else "")


class BadRequest(GatewayError):
    """Invalid input from a caller."""

    status = 400
    error_type = "invalid_request_error"


class UnknownNameError(_Unknown, BadRequest):
    """A name (policy, GPU, model, workload) is not registered (400)."""


class Unprocessable(BadRequest):
    """A well-formed request that is invalid: a field's value, a limit (422)."""

    status = 422


class Unauthorized(BadRequest):
    """A missing or unknown API key (401)."""

    status = 401
    error_type = "authentication_error"
    headers = {"WWW-Authenticate": "Bearer"}  # noqa: RUF012 (read-only; instances override, never mutate)


class NotFound(BadRequest):
    """Something the request names does not exist (404): a model, a database."""

    status = 404
    error_type = "not_found_error"


class PayloadTooLarge(BadRequest):
    """A request body over the size limit (413)."""

    status = 413


class ServiceUnavailable(GatewayError):
    """The gateway cannot serve now (503); a retry after ``retry_after_s`` seconds may succeed."""

    status = 503
    error_type = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class DomainError(Exception):
    """Something that happened, said in the core's terms, with no HTTP status: the live edge
    (``gateway.live.responses.to_http``) maps each to the answer a client gets."""


class NoEligibleWorker(DomainError, RuntimeError):
    """Every worker is down or draining. Defined here, not in ``core.scheduler`` which raises it: mypyc (the
    native build) cannot compile a class derived from a builtin exception."""


class UnknownName(_Unknown, DomainError, LookupError):
    """A name the core does not know (a policy, a dispatcher, a queue discipline); ``known`` lists the
    registered ones. The live edge answers 400."""


class Rejected(GatewayError):
    """Admission refused a workflow: 429 (the tenant is over its limit) or 503 (the gateway is overloaded),
    with the seconds after which a retry may succeed."""

    def __init__(self, message: str, status: int, retry_after_s: int) -> None:
        error_type = "rate_limit_error" if status == 429 else "service_unavailable"
        super().__init__(message, status=status, error_type=error_type, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class UpstreamError(GatewayError):
    """A workflow failed on a worker: a worker's 4xx is answered with its status, anything else 502/503/504;
    ``error_type`` defaults to ``upstream_error`` for 5xx and ``invalid_request_error`` for 4xx."""

    def __init__(self, message: str, status: int, **given: Any) -> None:
        """``given``: ``GatewayError``'s other keywords (``error_type``, ``param``, ``extra``)."""
        error_type = "upstream_error" if status >= 500 else "invalid_request_error"
        super().__init__(message, status=status, **{"error_type": error_type, **given})

    @classmethod
    def answer(cls, failed: CallFailed) -> UpstreamError:
        """The worker's own error answer (message, type, param) for ``failed``, else its message and status."""
        e = failed.body.get("error") if failed.body is not None else None
        if not isinstance(e, dict):
            return cls(str(failed), failed.status)
        param = None if e.get("param") is None else str(e["param"])
        error_type = str(e.get("type", "upstream_error"))
        return cls(str(e.get("message", failed)), failed.status, error_type=error_type, param=param)


class CallFailed(GatewayError):
    """A call could not be completed. ``status`` is the HTTP status to report for it; ``body`` the worker's
    own error answer, when it sent one."""

    error_type = "upstream_error"

    def __init__(self, message: str, status: int = 502, body: dict[str, Any] | None = None) -> None:
        super().__init__(message, status=status)
        self.body = body


class WorkerError(GatewayError):
    """The worker failed a call (connection error, timeout, 5xx): retry elsewhere. ``refused``: the
    connection was refused (the worker is down, not slow)."""

    status = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused

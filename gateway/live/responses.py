"""JSON answers that cannot fail to encode (Starlette's ``JSONResponse`` raises on a lone surrogate, which
``json.loads`` accepts from a client); ``plain`` makes arbitrary values JSON-safe; ``to_http``, the live edge's
map from the core's domain errors (``gateway.errors.DomainError``) to HTTP answers, here and nowhere else."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from starlette.responses import JSONResponse as StarletteJSONResponse

from gateway.core.admission import AdmissionRefused, DeadlineTooShort, NoWorkerCanRun, PredictedMiss
from gateway.core.dag import DagError
from gateway.errors import (
    BadRequest,
    DomainError,
    GatewayError,
    NoEligibleWorker,
    Rejected,
    ServiceUnavailable,
    UnknownName,
    Unprocessable,
    error_body,
)

log = logging.getLogger("hexflow.app")


def dumps(content: Any) -> bytes:
    """Compact JSON as UTF-8; a lone surrogate is written as its ``\\uXXXX`` escape (``backslashreplace``
    inside a JSON string is exactly that escape), so the result parses back to the same string."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


class JSONResponse(StarletteJSONResponse):
    """Starlette's ``JSONResponse`` (the same bytes) that also encodes a lone surrogate (see ``dumps``)."""

    def render(self, content: Any) -> bytes:
        """The body."""
        return dumps(content)


def plain(value: Any) -> Any:
    """``value`` as JSON-safe data: unknown objects by ``str``, NaN and infinities as strings."""

    def finite(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {str(k): finite(v) for k, v in x.items()}
        if isinstance(x, list):
            return [finite(v) for v in x]
        return x

    return finite(json.loads(json.dumps(value, default=str)))


def to_http(exc: DomainError, *, health_period_s: float = 1.0) -> GatewayError:
    """The HTTP error a client gets for ``exc`` (``health_period_s``: when a worker may be back)."""
    if isinstance(exc, NoEligibleWorker):
        return ServiceUnavailable(str(exc), retry_after_s=1)
    if isinstance(exc, UnknownName):
        return BadRequest(str(exc))
    if isinstance(exc, DagError):
        return Unprocessable(str(exc), param=exc.param)
    if isinstance(exc, DeadlineTooShort):
        return Unprocessable(str(exc), param="deadline_s", extra={"min_deadline_s": exc.min_deadline_s})
    if isinstance(exc, PredictedMiss):
        return Rejected(str(exc), 429, exc.retry_after_s)
    if isinstance(exc, NoWorkerCanRun):
        return Rejected(str(exc), 503, max(1, round(health_period_s)))
    if isinstance(exc, AdmissionRefused):
        return Rejected(str(exc), 503, exc.retry_after_s)
    return GatewayError(str(exc))


def error_response(exc: GatewayError | DomainError) -> JSONResponse:
    """The answer for a ``GatewayError`` (a core ``DomainError`` mapped by ``to_http``): its body, status
    and headers. A 500 is logged: not a refusal or a worker's failure (those are counted elsewhere), a fault."""
    err = exc if isinstance(exc, GatewayError) else to_http(exc)
    if err.status == 500:
        log.error("%s: %s", type(err).__name__, err.message)
    return JSONResponse(err.response_body(), status_code=err.status, headers=err.headers)


def internal_error(exc: Exception) -> JSONResponse:
    """500 naming only the exception's type (its message may hold a prompt); the traceback is logged (call it
    where ``exc`` is handled)."""
    log.exception("unexpected error: %r", exc)
    return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}", "internal_error"), status_code=500)

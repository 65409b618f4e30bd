"""The live edge's map from the core's domain errors (``gateway.errors.DomainError``) to HTTP answers, here and
nowhere else."""

from __future__ import annotations

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
)

__all__ = ["to_http"]


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

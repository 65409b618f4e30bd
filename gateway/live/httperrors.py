"""The live edge's map from the core's domain errors to HTTP answers.

The core says what happened (``gateway.errors.DomainError``: no worker is eligible, a workflow is predicted to
miss its deadline, a deadline is too short, a workflow was shed); the live gateway answers each with a status,
an error type and a ``Retry-After``, here and nowhere else:

    NoEligibleWorker        503 service_unavailable, Retry-After 1
    UnknownName             400 invalid_request_error (an unknown policy or dispatcher)
    DagError                422 invalid_request_error, param: the field at fault
    PredictedMiss           429 rate_limit_error, Retry-After: until the backlog would have drained enough
    DeadlineTooShort        422 invalid_request_error, param deadline_s, body ``min_deadline_s``
    NoWorkerCanRun          503 service_unavailable, Retry-After: the health check's period
    other AdmissionRefused  503 service_unavailable (a shed workflow), its Retry-After
    anything else           500 internal_error
"""

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

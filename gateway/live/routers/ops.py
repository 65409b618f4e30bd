"""Operations: ``GET /v1/status``, ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus); status and metrics
behind an admin key with ``admin.protect_status`` / ``admin.protect_metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from gateway.live.deps import gw_of, metrics_access, status_access
from gateway.live.responses import JSONResponse
from gateway.live.schemas import ERROR_SCHEMA, GatewayStatus, Health, Readiness, route_responses
from gateway.live.service import Gateway

router = APIRouter()


@router.get(
    "/v1/status",
    response_model=GatewayStatus,
    responses=route_responses(401, 503),
    dependencies=[Depends(status_access)],
)
async def status(request: Request) -> dict[str, Any]:
    """Workers, queue depths, in-flight calls, current alpha, estimates and tuning state."""
    return gw_of(request).status()


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "Not ready: starting, shutting down, not the leader (high availability), or no healthy "
            "worker.",
        }
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: configuration loaded, not draining, the leader (with leader election), a healthy worker.

    The workers ejected as outliers, if any, are listed with why and for how long (``ejected_workers``): a
    replica stays ready while others take calls, and this says what capacity it is missing."""
    gw = getattr(request.app.state, "gateway", None)
    reason = gw.unready_reason() if isinstance(gw, Gateway) else "starting"
    if not isinstance(gw, Gateway) or reason in ("starting", "shutting down"):
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)
    if reason == "not the leader":  # a follower replica: the Service must not route to it
        leader = gw.elector.holder if gw.elector is not None else None
        return JSONResponse({"ready": False, "reason": reason, "leader": leader}, status_code=503)
    now = gw.pool.clock()
    ejected = [e for st in gw.pool.workers if (e := st.ejection(now)) is not None]
    extra: dict[str, Any] = {"ejected_workers": ejected} if ejected else {}
    if reason is not None:
        return JSONResponse({"ready": False, "reason": reason, **extra}, status_code=503)
    return JSONResponse({"ready": True, "healthy_workers": gw.pool.healthy, **extra})


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text exposition format 0.0.4.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **route_responses(401, 503, schema=ERROR_SCHEMA),  # as JSON, like every error (the route's is text/plain)
    },
    dependencies=[Depends(metrics_access)],
)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus exposition of the ``hexflow_*`` metrics."""
    gw = gw_of(request)
    return PlainTextResponse(gw.metrics.render(gw.refresh_gauges), media_type="text/plain; version=0.0.4")

"""Operations: ``GET /v1/status``, ``/healthz`` (liveness), ``/readyz`` (readiness), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from gateway.live.deps import gw_of
from gateway.live.responses import JSONResponse
from gateway.live.service import Gateway

router = APIRouter()


@router.get("/v1/status")
async def status(request: Request) -> dict[str, Any]:
    """Workers, queue depths, in-flight calls, current alpha, estimates and tuning state."""
    return gw_of(request).status()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Readiness: configuration loaded, not draining, at least one healthy worker."""
    gw = getattr(request.app.state, "gateway", None)
    if not isinstance(gw, Gateway) or not gw.ready:
        return JSONResponse({"ready": False, "reason": "starting"}, status_code=503)
    if gw.draining:
        return JSONResponse({"ready": False, "reason": "shutting down"}, status_code=503)
    if gw.pool.healthy == 0:
        return JSONResponse({"ready": False, "reason": "no healthy worker"}, status_code=503)
    return JSONResponse({"ready": True, "healthy_workers": gw.pool.healthy})


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus exposition of the ``hexflow_*`` metrics."""
    gw = gw_of(request)
    return PlainTextResponse(gw.metrics.render(gw.refresh_gauges), media_type="text/plain; version=0.0.4")

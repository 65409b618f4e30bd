"""The live status page: ``GET /ui``, ``/ui/static/*``, ``GET /ui/api/state`` (docs/live-gateway.md, "The
status page"). The page is public and holds no data; ``/ui/api/state`` needs the admin key (404 for both
with none configured). Not in the OpenAPI document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse

from gateway.errors import NotFound
from gateway.live.deps import UI_DISABLED, admin_auth, gw_of
from gateway.live.responses import JSONResponse
from gateway.live.statuspage import page_state

UI_DIR = Path(__file__).resolve().parents[1] / "static" / "ui"
"""The page's HTML, script and style."""
UI_STATIC_URL = "/ui/static"
"""Where ``create_app`` serves ``UI_DIR``."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
"""The page's Content-Security-Policy: its own script, style and data endpoint only (nothing inline, no other
origin, not framed)."""

router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def page(request: Request) -> FileResponse:
    """The status page (404 while no admin key is configured)."""
    if not gw_of(request).admin_keys:
        raise NotFound(UI_DISABLED)
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
    return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=headers)


@router.get("/ui/api/state", dependencies=[Depends(admin_auth)])
async def state(request: Request) -> JSONResponse:
    """The page's data (``statuspage.page_state``); never cached."""
    body: dict[str, Any] = page_state(gw_of(request))
    return JSONResponse(body, headers={"Cache-Control": "no-store"})

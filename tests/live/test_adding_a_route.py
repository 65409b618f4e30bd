"""Adding a route, for real (docs/architecture.md, "Adding a route"): a router module that runs its workflows
under its own label, and its registration; the status page shows its workflows under that label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Request

from gateway.config.gateway import load_gateway_config
from gateway.config.tenants import hash_key
from gateway.core.dag import DagNode
from gateway.core.predict import dag_plan
from gateway.live.deps import TenantDep, gw_of
from gateway.live.runner import CallRequest
from gateway.live.server import build_app
from gateway.live.tenants import check_deadline
from tests.live.harness import INTERACTIVE_KEY, emulators, write_config

# ---------------------------------------------------------------- the route's module (file 1 of 2)

ROUTE = "echo"
"""This route's label on the status page."""

router = APIRouter()


@router.post("/v1/echo")
async def echo(request: Request, tenant: TenantDep) -> dict[str, Any]:
    """Ask a worker to say a few words back: a one-call workflow under the tenant's deadline."""
    gw = gw_of(request)
    deadline = check_deadline(tenant, None)
    nodes = [DagNode("say", "echo", 8, 4)]
    admission = gw.admit(tenant, len(nodes), dag_plan(nodes), deadline)
    req = CallRequest("/v1/completions", {"prompt": "say hello", "max_tokens": 4})
    out = await gw.run_workflow(tenant, deadline, nodes, [req], route=ROUTE, admission=admission)
    return {"status": out.status, "worker": out.calls[0].worker_name if out.calls else None}


# ---------------------------------------------------------------- the test

ADMIN_KEY = "ops-secret-key"


async def test_a_new_route_is_labelled_with_its_own_name_on_the_status_page(tmp_path: Path) -> None:
    gpus = ["A100"]
    async with emulators(gpus) as urls:
        cfg = write_config(tmp_path, urls, gpus, admin={"api_key_sha256": [hash_key(ADMIN_KEY)]})
        app = build_app(load_gateway_config(cfg))
        app.include_router(router)  # its registration (file 2 of 2: gateway/live/app.py, ``create_app``)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
                r = await client.post("/v1/echo", headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"})
                assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                state = await client.get("/ui/api/state", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    [wf] = state.json()["slowest"]
    assert wf["route"] == "echo" and wf["tenant"] == "interactive" and wf["outcome"] == "met"
    assert [c["kind"] for c in wf["calls"]] == ["echo"] and wf["calls"][0]["worker"] == r.json()["worker"]

"""In-process test rigs: emulated workers on loopback ports and a gateway app driven through ASGI."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml
from fastapi import FastAPI

from gateway.config import GpuCatalog, load_gpu_catalog
from gateway.config.gateway import load_gateway_config
from gateway.core.worker import WorkerInfo
from gateway.live.httpserver import HttpProtocol
from gateway.live.pool import WorkerPool
from gateway.live.server import build_app
from gateway.live.transport import CallResult, LiveCall
from tests.emulator_process import free_port
from workers.emulator import EmulatorConfig, Responder, create_app

REPO = Path(__file__).resolve().parents[2]
INTERACTIVE_KEY = "demo-interactive-key"
BATCH_KEY = "demo-batch-key"


def emulator_app(
    gpu: str,
    *,
    time_scale: float = 0.02,
    responder: Responder | None = None,
    catalog: GpuCatalog | None = None,
    model: str = "llama-3.1-70b",
    **kw: Any,
) -> FastAPI:
    """An emulated worker of ``gpu`` running llama-3.1-70b (its profile from ``catalog``, default the repo's),
    served as ``model``, at ``time_scale`` (``kw``: more ``EmulatorConfig``)."""
    profile = (catalog or load_gpu_catalog()).profile(gpu, "llama-3.1-70b")
    cfg = EmulatorConfig(profile=profile, served_model_name=model, time_scale=time_scale, **kw)
    return create_app(cfg, responder)


@contextlib.asynccontextmanager
async def serving(app: Callable[..., Any], *, what: str = "the server", **config: Any) -> AsyncIterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a loopback port in this event loop (``config``: more
    ``uvicorn.Config``); yields its base URL, and stops it on exit."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **config)
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"{what} stopped during start-up")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def emulators(
    gpus: Sequence[str],
    *,
    time_scale: float = 0.02,
    responder: Responder | None = None,
    force_exit: bool = False,
    **kw: Any,
) -> AsyncIterator[list[str]]:
    """Start one emulated worker per GPU name on loopback ports in this event loop; yield their URLs.

    ``force_exit``: at the end, do not wait for requests still running (a test that abandoned one).
    """
    catalog = load_gpu_catalog()
    servers: list[uvicorn.Server] = []
    tasks: list[asyncio.Task[None]] = []
    urls: list[str] = []
    for gpu in gpus:
        port = free_port()
        app = emulator_app(gpu, time_scale=time_scale, responder=responder, catalog=catalog, **kw)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
        servers.append(server)
        tasks.append(asyncio.create_task(server.serve()))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for s in servers:
            while not s.started:
                await asyncio.sleep(0.01)
        yield urls
    finally:
        for s in servers:
            s.should_exit = True
            s.force_exit = force_exit
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for(cond: Callable[[], object], timeout_s: float = 60.0) -> bool:
    """Poll ``cond`` every 10 ms until it is true (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def write_config(
    tmp: Path, urls: Sequence[str], gpus: Sequence[str], *, time_scale: float = 0.02, **overrides: Any
) -> Path:
    """A gateway.yaml for the given workers (tenants: a copy of the repo's demo file) in ``tmp``."""
    tenants = tmp / "tenants.yaml"
    if not tenants.exists():
        tenants.write_text((REPO / "config" / "tenants.yaml").read_text())
    cfg: dict[str, Any] = {
        "policy": "hexgen",
        "time_scale": time_scale,
        "tenants_file": "tenants.yaml",
        "tenants_reload_s": 0.1,
        "cluster": {
            "name": "test",
            "workers": [
                {"name": f"{g.lower()}-{i}", "gpu": g, "url": u, "capacity": 4}
                for i, (g, u) in enumerate(zip(gpus, urls, strict=True))
            ],
        },
        # Outlier ejection off unless a test turns it on (the chaos tests do): at time scale 0.02 an emulated
        # call takes milliseconds, host time on a busy machine dominates it, and a healthy worker can look
        # several times slower than predicted; an ejection mid-test re-dispatches calls the test counts.
        "health": {"period_s": 0.2, "timeout_s": 1.0, "failures_to_down": 2, "outlier": {"enabled": False}},
        "scrape": {"period_s": 0.2, "timeout_s": 1.0},
        "tuning": {"enabled": False},
        "shutdown_grace_s": 5,
        "benchmark": True,  # the tests send synthetic prompts (``chain``)
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.asynccontextmanager
async def gateway_client(
    config: Path, *, key: str = INTERACTIVE_KEY
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """The gateway app with its lifespan running, and an ASGI client authenticated as ``key``."""
    app = build_app(load_gateway_config(config))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as client:
            yield client, app


def chain(
    n_stages: int, *, width: int = 1, prompt: int = 200, out: int = 10, kind: str = "step"
) -> list[dict[str, Any]]:
    """A /v1/workflows call list: ``n_stages`` stages of ``width`` parallel synthetic calls."""
    calls: list[dict[str, Any]] = []
    prev: list[str] = []
    for k in range(n_stages):
        ids = [f"s{k}c{j}" for j in range(width)]
        for i in ids:
            calls.append(
                {
                    "id": i,
                    "kind": kind,
                    "depends_on": prev,
                    "prompt_tokens": prompt,
                    "max_tokens": out,
                    "min_tokens": out,
                    "ignore_eos": True,
                }
            )
        prev = ids
    return calls


@contextlib.asynccontextmanager
async def gateway_server(config: Path) -> AsyncIterator[tuple[str, FastAPI]]:
    """The gateway served by uvicorn (with the gateway's own HTTP protocol) on a loopback port in this event
    loop; yields its base URL and app."""
    app = build_app(load_gateway_config(config))
    async with serving(app, what="the gateway server", http=HttpProtocol) as url:
        yield url, app


def worker_at(tmp: Path, url: str) -> WorkerInfo:
    """The ``WorkerInfo`` of an A100 worker at ``url`` (from a gateway.yaml written in ``tmp``)."""
    return load_gateway_config(write_config(tmp, [url], ["A100"])).workers[0]


def record_sends(pool: WorkerPool) -> list[tuple[float, str]]:
    """Record, from now on, every dispatched call ``pool``'s transport is asked to send: (when the pool sent it,
    worker name), in order. Probe calls to ejected workers (``outliers.probe_call``: not dispatched by the pool, no
    ``worker_name``) are left out."""
    log: list[tuple[float, str]] = []
    transport = pool.transport
    send = transport.send

    async def recorded(worker: WorkerInfo, call: LiveCall) -> CallResult:
        if call.worker_name:
            log.append((call.sent_at, worker.name))
        return await send(worker, call)

    transport.send = recorded  # type: ignore[method-assign]
    return log

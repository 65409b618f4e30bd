"""``hexflow serve``: build the gateway from its config and run it under uvicorn with graceful shutdown.

On SIGTERM (or SIGINT) the gateway stops intake at once: ``/readyz`` turns 503 and new workflows get 503
with ``Retry-After``, while the listener stays open, so a client or load balancer that has not yet seen
the change is answered, not refused. In-flight workflows get ``shutdown_grace_s`` to finish; only then
is uvicorn told to exit (it closes the listener and the idle connections), and the worker pool is
stopped. The process exits 0. A second signal skips the rest of the drain; a third SIGINT forces the exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway.config.gateway import LoadedConfig, load_gateway_config
from gateway.errors import ConfigError
from gateway.live.app import create_app
from gateway.live.discovery import default_api_url
from gateway.live.routers.text2sql import install_text2sql
from gateway.live.service import Gateway
from gateway.live.tenants import TenantStore
from gateway.live.transport import HttpTransport
from gateway.text2sql.service import Text2SqlService

log = logging.getLogger("hexflow.server")


def build_app(loaded: LoadedConfig, *, background: bool = True) -> FastAPI:
    """The ASGI app for a loaded config (tenants are loaded now, so a bad file fails before serving)."""
    tenants = TenantStore.load(loaded.tenants_path)
    cfg = loaded.cfg
    kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
    if kube is not None and kube.api_url is None and default_api_url() is None:
        raise ConfigError(
            str(loaded.path),
            "discovery.kubernetes.api_url",
            "not set, and KUBERNETES_SERVICE_HOST is not in the environment (the gateway is not in a pod): "
            "give the API server's URL",
        )
    le = cfg.leader_election
    if le.enabled and le.api_url is None and default_api_url() is None:
        raise ConfigError(
            str(loaded.path),
            "leader_election.api_url",
            "not set, and KUBERNETES_SERVICE_HOST is not in the environment (the gateway is not in a pod): "
            "give the API server's URL, or turn leader_election off for a single replica",
        )
    text2sql = Text2SqlService.from_config(cfg.text2sql, loaded.databases_path)  # a bad databases file fails now

    async def make() -> Gateway:
        t = cfg.timeouts
        transport = HttpTransport(
            connect_s=t.connect_s,
            call_s=t.call_s,
            keepalive_expiry_s=t.keepalive_expiry_s,
            max_connections=t.max_connections,
            probe_timeout_s=cfg.health.timeout_s,
            scrape_timeout_s=cfg.scrape.timeout_s,
            headers_s=t.headers_s,
            stream_idle_s=t.stream_idle_s,
            max_response_bytes=t.max_response_bytes,
        )
        return _GatewayWithTransport(loaded, tenants, transport, background=background)

    app = create_app(make, max_body_bytes=cfg.limits.max_body_bytes)
    install_text2sql(app, text2sql)
    return app


class _GatewayWithTransport(Gateway):
    """A gateway that closes its HTTP transport when stopped."""

    async def stop(self) -> None:
        await super().stop()
        close = getattr(self.transport, "aclose", None)
        if close is not None:
            await close()


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's shutdown: drain first, with the listener open, then exit.

    uvicorn closes its listener as soon as it is told to exit, so new connections would be refused
    during the drain. Here the first stop signal only starts the gateway's drain (intake answers 503
    at once, ``Gateway.begin_drain``); the server's tick (on the event loop, every 0.1 s) starts the
    wait for in-flight workflows, and ``should_exit`` is set when they have finished or the grace
    period is over. uvicorn then waits for the last responses (1 s more when the grace ran out, after
    which it cancels what still runs: those workflows count as ``cancelled``) and the app's lifespan
    stops the gateway.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._draining: Gateway | None = None
        self._drainer: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A stop signal (runs in the signal handler: only sets flags)."""
        gw = getattr(self._app.state, "gateway", None)
        if self._draining is not None or not isinstance(gw, Gateway) or not gw.ready:
            # A second signal (skip the rest of the drain), or one before the gateway serves.
            if self._draining is not None:
                log.warning("signal %d during the drain: stopping now", sig)
            super().handle_exit(sig, frame)
            return
        grace = gw.cfg.shutdown_grace_s
        log.warning("signal %d: draining for up to %.0f s; new requests get 503", sig, grace)
        gw.begin_drain(grace)
        self._draining = gw

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's periodic tick; starts the drain a signal asked for."""
        if self._draining is not None and self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(self._draining), name="shutdown-drain")
        return await super().on_tick(counter)

    async def _drain(self, gw: Gateway) -> None:
        drained = await gw.drain(gw.cfg.shutdown_grace_s)
        if drained:
            log.warning("drained; exiting")
        else:
            self.config.timeout_graceful_shutdown = 1
        self.should_exit = True


def serve(
    config_path: Path | str,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str = "info",
    time_scale: float | None = None,
) -> None:
    """Run the gateway until SIGTERM/SIGINT."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loaded = load_gateway_config(config_path, time_scale=time_scale)
    app = build_app(loaded)
    cfg = loaded.cfg
    config = uvicorn.Config(
        app,
        host=host or cfg.listen.host,
        port=cfg.listen.port if port is None else port,
        log_level=log_level,
        timeout_graceful_shutdown=int(cfg.shutdown_grace_s) + 1,
        timeout_keep_alive=5,
        access_log=False,
    )
    # uvicorn re-raises a signal it handled itself (a second one, during the drain) after its shutdown,
    # under the handler that was in place before it started; this one keeps that exit 0 for SIGTERM
    # (Kubernetes reads it as clean).
    signal.signal(signal.SIGTERM, lambda _sig, _frame: log.warning("exiting"))
    GatewayServer(config, app).run()

"""``hexflow serve``: build the gateway from its config and run it under uvicorn with graceful shutdown.

On SIGTERM (or SIGINT) the gateway stops intake at once (``/readyz`` turns 503, new workflows get 503),
uvicorn stops accepting connections, and in-flight workflows get ``shutdown_grace_s`` to finish before
the worker pool is stopped.
"""

from __future__ import annotations

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
    """uvicorn's server, marking the gateway as draining the moment a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        gw = getattr(self._app.state, "gateway", None)
        if isinstance(gw, Gateway) and not gw.draining:
            log.warning("signal %d: draining (grace %.0f s)", sig, gw.cfg.shutdown_grace_s)
            gw.draining = True
        super().handle_exit(sig, frame)


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
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown, under the handler that was in
    # place before it started; this one makes a drained shutdown exit 0 (Kubernetes reads it as clean).
    signal.signal(signal.SIGTERM, lambda _sig, _frame: log.warning("drained; exiting"))
    GatewayServer(config, app).run()

"""``hexflow serve``: build the gateway from its config and run it under uvicorn with graceful shutdown
(docs/live-gateway.md, "Shutdown"; docs/architecture.md)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import tempfile
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway import __version__
from gateway.config.gateway import LoadedConfig, load_gateway_config
from gateway.errors import ConfigError, ListenError
from gateway.live.app import create_app
from gateway.live.discovery import default_api_url
from gateway.live.httpserver import HttpProtocol
from gateway.live.logs import LOG_FORMATS, LogFormat, configure_logging
from gateway.live.routers.text2sql import install_text2sql
from gateway.live.service import Gateway
from gateway.live.tenants import TenantStore
from gateway.live.transport import HttpTransport
from gateway.text2sql.demo import write_demo_databases
from gateway.text2sql.service import Text2SqlService

log = logging.getLogger("hexflow.server")

LOG_FORMAT_ENV = "HEXFLOW_LOG_FORMAT"
"""The environment variable that chooses the log format (text or json) over the config's ``log_format``."""


def build_app(loaded: LoadedConfig) -> FastAPI:
    """The ASGI app for a loaded config (tenants are loaded now, so a bad file fails before serving)."""
    tenants = TenantStore.load(loaded.existing_tenants_path())
    cfg = loaded.cfg
    kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
    le = cfg.leader_election
    for section, conf, advice in (
        ("discovery.kubernetes", kube, ""),
        ("leader_election", le if le.enabled else None, ", or turn leader_election off for a single replica"),
    ):
        if conf is not None and conf.api_url is None and default_api_url() is None:
            raise ConfigError(
                str(loaded.path),
                f"{section}.api_url",
                "not set, and KUBERNETES_SERVICE_HOST is not in the environment (the gateway is not in a pod): "
                f"give the API server's URL{advice}",
            )
    text2sql = Text2SqlService.from_config(cfg.text2sql, loaded.databases_path)  # a bad databases file fails now

    async def make() -> Gateway:
        transport = HttpTransport(
            cfg.timeouts, probe_timeout_s=cfg.health.timeout_s, scrape_timeout_s=cfg.scrape.timeout_s
        )
        return Gateway(loaded, tenants, transport)

    app = create_app(make, max_body_bytes=cfg.limits.max_body_bytes)
    install_text2sql(app, text2sql)
    app.state.startup_summary = functools.partial(startup_summary, loaded, tenants, text2sql)
    return app


def startup_summary(loaded: LoadedConfig, tenants: TenantStore, text2sql: Text2SqlService, url: str) -> str:
    """What ``hexflow serve`` started, in a few lines: policy, workers, tenants, databases, URL."""
    cfg = loaded.cfg
    alpha = "the policy's default" if cfg.alpha is None else f"{cfg.alpha:g}"
    tuned = "re-tuned in the background" if cfg.tuning.enabled else "fixed"
    lines = [
        f"hexflow serve {__version__}: {loaded.path}",
        f"  policy {cfg.policy}, alpha {alpha} ({tuned}), time scale {cfg.time_scale:g}",
    ]
    if loaded.resolved:
        shown = ", ".join(f"{w.name} {w.gpu} {w.url}" for w in loaded.resolved[:8])
        more = f", and {len(loaded.resolved) - 8} more" if len(loaded.resolved) > 8 else ""
        lines.append(f"  workers: {len(loaded.resolved)} ({shown}{more})")
    kube = cfg.discovery.kubernetes if cfg.discovery is not None else None
    if kube is not None:
        lines.append(f"  workers discovered: Kubernetes pods matching {kube.label_selector!r}")
    names = [t.name for t in tenants.tenants]
    lines.append(f"  tenants: {', '.join(names) or 'none'} ({loaded.tenants_path}, re-read on change)")
    if text2sql.registry is None:
        lines.append("  databases: none (POST /v1/text2sql answers 404; set databases_file, or run with --demo)")
    else:
        lines.append(f"  databases: {', '.join(text2sql.registry.ids())} ({loaded.databases_path})")
    lines.append(f"  listening on {url} (API docs {url}/docs, metrics {url}/metrics)")
    return "\n".join(lines)


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's shutdown: the first stop signal starts the drain with the listener
    open; ``should_exit`` once it finished or the grace ran out."""

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
        log.info("signal %d: draining for up to %.0f s; new requests get 503", sig, grace)
        gw.begin_drain(grace)
        self._draining = gw

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up (the app's lifespan, then the listener); then one block saying what started."""
        await super().startup(sockets=sockets)
        summary = getattr(self._app.state, "startup_summary", None)
        if summary is not None and self.started:
            log.info("%s", summary(self._url()))

    def _url(self) -> str:
        """The URL the server listens on (the bound port, also when the config asked for any free one)."""
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                host, bound = sock.getsockname()[:2]
                host = f"[{host}]" if ":" in str(host) else host
                return f"http://{host}:{bound}"
        return f"http://{self.config.host}:{self.config.port}"

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's periodic tick; starts the drain a signal asked for."""
        if self._draining is not None and self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(self._draining), name="shutdown-drain")
        return await super().on_tick(counter)

    async def _drain(self, gw: Gateway) -> None:
        drained = await gw.drain(gw.cfg.shutdown_grace_s)
        if drained:
            log.info("drained; exiting")
        else:
            self.config.timeout_graceful_shutdown = 1
        self.should_exit = True


def serve(
    config_path: Path | str,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str = "info",
    log_format: LogFormat | None = None,
    time_scale: float | None = None,
    demo: bool = False,
    benchmark: bool = False,
) -> None:
    """Run the gateway until SIGTERM/SIGINT (``log_format`` over ``$HEXFLOW_LOG_FORMAT`` over the config's;
    ``demo``: the demo database in a temporary folder; ``benchmark``: benchmark mode)."""
    loaded = load_gateway_config(config_path, time_scale=time_scale, benchmark=benchmark)
    fmt = log_format or _env_log_format() or loaded.cfg.log_format
    host, port = host or loaded.cfg.listen.host, loaded.cfg.listen.port if port is None else port
    # Bound first: a port in use is one line (ListenError) before anything has started or logged.
    sock = listen_socket(host, port)
    with sock, tempfile.TemporaryDirectory(prefix="hexflow-serve-demo-") as tmp:
        if demo:
            databases = write_demo_databases(Path(tmp) / "databases.yaml")
            loaded.cfg = loaded.cfg.model_copy(update={"databases_file": str(databases)})
        app = build_app(loaded)
        # Only now: a bad config or tenants file has been reported (one line, by the CLI) without touching
        # the process's logging.
        configure_logging(log_level, fmt)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            log_config=None,  # uvicorn's loggers propagate to the handler configure_logging installed
            timeout_graceful_shutdown=int(loaded.cfg.shutdown_grace_s) + 1,
            timeout_keep_alive=5,
            access_log=False,
            http=HttpProtocol,  # uvicorn's httptools protocol, a response's writes sent as one
        )
        # uvicorn re-raises a signal it handled itself (a second one, during the drain) after its shutdown,
        # under the handler that was in place before it started; this one keeps that exit 0 for SIGTERM
        # (Kubernetes reads it as clean).
        signal.signal(signal.SIGTERM, lambda _sig, _frame: log.info("exiting"))
        GatewayServer(config, app).run(sockets=[sock])


def listen_socket(host: str, port: int) -> socket.socket:
    """The gateway's TCP socket, bound to ``host:port`` as uvicorn binds one (uvicorn listens on it);
    ``ListenError`` naming the address when it cannot be bound (a port in use, an address not this host's)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:  # socket.gaierror: a name that does not resolve
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _env_log_format() -> LogFormat | None:
    """``$HEXFLOW_LOG_FORMAT`` (text or json), None when unset; ``ConfigError`` for another value."""
    value = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
    if not value:
        return None
    fmt = next((f for f in LOG_FORMATS if f == value), None)
    if fmt is not None:
        return fmt
    raise ConfigError(LOG_FORMAT_ENV, "", f"expected text or json, got {value!r}")

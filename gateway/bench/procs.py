"""The child processes the bench tools run (an emulated cluster, a gateway), their config files and free
loopback ports. A process that fails to start prints its log's tail to stderr and raises ``StartError``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from gateway.config import REPO_ROOT, ClusterConfig, load_cluster_config
from gateway.config.gateway import LoadedConfig, load_gateway_config
from gateway.errors import GatewayError

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_WORKER_LINE = re.compile(r"^(\S+) (https?://\S+) (\S+)$")


class StartError(GatewayError):
    """A child process (the emulated cluster, the gateway) exited or did not become ready in time."""


def write_gateway_config(
    cluster: ClusterConfig | str | Path,
    urls: Sequence[str],
    path: Path,
    *,
    policy: str,
    alpha: float | None,
    time_scale: float,
    tuning_enabled: bool,
    tenants_file: str | Path,
    port: int = 8080,
    seed: int = 0,
    shutdown_grace_s: float = 5.0,
    databases_file: str | Path | None = None,
    gpu_catalog: str | Path | None = None,
    prefix_caching: bool = True,
    profiles_file: str | Path | None = None,
    admission_share: float | None = None,
    sections: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Write a ``gateway.yaml`` in benchmark mode fronting ``urls`` (worker ``i`` of the expanded cluster, a
    loaded one or a cluster file, at ``urls[i]``), load it back and return it (``ConfigError`` when invalid).

    ``gpu_catalog``, ``profiles_file``: the catalogue and profiles overlay the gateway reads; ``prefix_caching``
    false for workers run with ``--no-enable-prefix-caching``; ``admission_share``:
    ``admission.sustainable_share`` (None: the default); ``sections``: further top-level sections as given.
    """
    cfg = cluster if isinstance(cluster, ClusterConfig) else load_cluster_config(cluster)
    resolved = cfg.expanded()
    if len(resolved) != len(urls):
        raise ValueError(f"the cluster has {len(resolved)} workers but {len(urls)} urls were given")
    workers: list[dict[str, Any]] = []
    for rw, url in zip(resolved, urls, strict=True):
        w: dict[str, Any] = {"name": rw.name, "gpu": rw.gpu, "model": rw.model, "capacity": rw.capacity, "url": url}
        workers.append(w | {k: getattr(rw, k) for k in ("served_model", "profile") if getattr(rw, k) is not None})
    doc: dict[str, Any] = {
        "policy": policy,
        "alpha": alpha,
        "seed": seed,
        "time_scale": time_scale,
        "tenants_file": str(tenants_file),
        "cluster": {"name": cfg.name, "description": cfg.description, "model": cfg.model, "workers": workers},
        "listen": {"host": "127.0.0.1", "port": port},
        "tuning": {"enabled": tuning_enabled},
        "shutdown_grace_s": shutdown_grace_s,
        "prefix_caching": prefix_caching,
        "benchmark": True,
    }
    files = {"databases_file": databases_file, "gpu_catalog": gpu_catalog, "profiles_file": profiles_file}
    doc.update({k: str(v) for k, v in files.items() if v is not None})
    if admission_share is not None:
        doc["admission"] = {"sustainable_share": admission_share}
    doc.update(sections or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_gateway_config(path)


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(f"  | {line}" for line in text.splitlines()[-lines:]) or "  | (empty log)"


class ChildProcess:
    """A child process with its output in a log file; ``stop`` sends SIGTERM, waits, then kills."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path, stdout_path: Path | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self.stdout_path = stdout_path
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self._files: list[IO[bytes]] = [log_path.open("wb")]
        out = self._files[0]
        if stdout_path is not None:
            out = stdout_path.open("wb")
            self._files.append(out)
        self.proc = subprocess.Popen(list(cmd), stdout=out, stderr=self._files[0], stdin=subprocess.DEVNULL, env=env)

    def failed_to_start(self, what: str) -> StartError:
        """Print the log's tail to stderr and build the one-line error."""
        self.stop()
        code = self.proc.returncode
        state = f"exited with status {code}" if code is not None and code != -signal.SIGTERM else "did not start"
        print(f"hexflow: {self.name} {state}; last lines of {self.log_path}:\n{_tail(self.log_path)}", file=sys.stderr)
        return StartError(f"{self.name} {state} ({what}); its log: {self.log_path}")

    def wait_until(self, ready: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        """Poll ``ready()`` until it holds; ``StartError`` (the log's tail printed) when the process exits or
        ``timeout_s`` (default ``START_TIMEOUT_S``) passes first. The process is stopped on error."""
        limit = START_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise self.failed_to_start(f"waited {limit:.0f} s for {what}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; close the log files. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in self._files:
            f.close()
        return self.proc.returncode


@contextlib.contextmanager
def cluster_process(
    cluster: str, time_scale: float, log_dir: Path, tag: str, extra_args: Sequence[str] = ()
) -> Iterator[tuple[ChildProcess, list[str]]]:
    """The emulated cluster on free ports; yields the process and the workers' URLs in cluster order."""
    cmd = [sys.executable, "-m", "workers.cluster", "--cluster", cluster, "--base-port", "0"]
    cmd += ["--time-scale", repr(time_scale), *extra_args]
    out_path = log_dir / f"cluster-{tag}.out"
    proc = ChildProcess("the emulated cluster", cmd, log_dir / f"cluster-{tag}.log", out_path)
    try:
        n = len(load_cluster_config(cluster).expanded())
        urls: list[str] = []

        def listed() -> bool:
            lines = out_path.read_text(errors="replace").splitlines()
            urls[:] = [m.group(2) for m in map(_WORKER_LINE.match, lines) if m]
            return len(urls) >= n

        proc.wait_until(listed, f"{n} workers")
        yield proc, urls[:n]
    finally:
        proc.stop()


def probe(url: str, path: str, ok: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200) -> bool:
    """Whether ``GET url+path`` answers and ``ok`` holds of the answer (False on a transport or JSON error)."""
    try:
        return ok(httpx.get(f"{url}{path}", timeout=2.0))
    except (httpx.HTTPError, ValueError):
        return False


@contextlib.contextmanager
def gateway_process(
    config: Path, port: int, n_workers: int, log_dir: Path, tag: str
) -> Iterator[tuple[ChildProcess, str]]:
    """``hexflow serve`` on ``port``; yields the process and its URL once ``/readyz`` reports every worker
    healthy."""
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    cmd += ["--log-level", "warning"]
    proc = ChildProcess("the gateway", cmd, log_dir / f"gateway-{tag}.log")
    url = f"http://127.0.0.1:{port}"

    def ready(r: httpx.Response) -> bool:
        return r.status_code == 200 and r.json().get("healthy_workers", 0) >= n_workers

    try:
        proc.wait_until(lambda: probe(url, "/readyz", ready), f"/readyz with {n_workers} workers")
        yield proc, url
    finally:
        proc.stop()

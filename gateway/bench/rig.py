"""One live rig for every live benchmark: ``bench_folder`` (``log_dir`` kept, or a temporary folder removed
after a run that went well), ``bench_tenant``, ``LiveSettings`` (what a benchmark's runs share) and its ``rig``
(the emulated cluster or running workers and a gateway in front, tuning off, stopped on the way out), and the
load helpers ``scheduled`` and ``sampling``."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from gateway.bench.procs import ChildProcess, cluster_process, free_port, gateway_process, write_gateway_config
from gateway.config import ClusterConfig, build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import load_profiles_file
from gateway.config.tenants import hash_key
from gateway.core.worker import WorkerInfo

T = TypeVar("T")
BENCH_TENANT = "bench"


def say_stderr(line: str) -> None:
    """The default progress sink of the live benchmarks: one line to stderr."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Rig:
    """A running gateway in front of its workers."""

    url: str
    worker_urls: list[str]
    gateway: ChildProcess

    def completed_per_worker(self) -> dict[str, int]:
        """Calls each worker completed, from ``/v1/status`` (empty if it cannot be read)."""
        try:
            workers = httpx.get(f"{self.url}/v1/status", timeout=5.0).json()["workers"]
            return {str(w["name"]): int(w["completed"]) for w in workers}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return {}

    def rss_mb(self) -> float | None:
        """The gateway process's resident memory in MB (Linux ``/proc``); None where it cannot be read."""
        try:
            for line in Path(f"/proc/{self.gateway.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        except (OSError, ValueError, IndexError):
            return None
        return None


@contextlib.contextmanager
def bench_folder(log_dir: Path | None, prefix: str, say: Callable[[str], None] = say_stderr) -> Iterator[Path]:
    """``log_dir`` (kept), or a temporary folder removed when the block ends without an error; absolute, since
    the gateway resolves the files its config names against the config's own folder. After an error the
    folder is kept and ``say`` names it."""
    keep = log_dir is not None
    folder = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    ok = False
    try:
        yield folder
        ok = True
    finally:
        if not ok:
            say(f"subprocess logs are in {folder}")
        elif not keep:
            shutil.rmtree(folder, ignore_errors=True)


def bench_tenant(
    folder: Path,
    *,
    deadline_s: float,
    max_concurrent_workflows: int,
    name: str = BENCH_TENANT,
    predictive: bool = False,
    **settings: Any,
) -> str:
    """Write ``folder/tenants.yaml`` with one tenant (``name``) under a fresh throw-away key, returned, whose limits
    never bind (any deadline from a millisecond to a year; ``deadline_s`` the default). Predictive admission is
    off unless asked: the simulator a live run is compared with admits every workflow. ``settings``: further
    tenant fields."""
    key = secrets.token_urlsafe(24)
    lo, hi = 1e-3, 3.2e7
    tenant = {
        "name": name,
        "api_key_sha256": [hash_key(key)],
        "default_deadline_s": min(max(deadline_s, lo), hi),
        "min_deadline_s": lo,
        "max_deadline_s": hi,
        "priority_weight": 1,
        "max_concurrent_workflows": max(1, max_concurrent_workflows),
        "predictive_admission": predictive,
        **settings,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tenants.yaml").write_text(yaml.safe_dump({"tenants": [tenant]}, sort_keys=False))
    return key


def cluster_workers(
    cluster: str, gpu_catalog: Path | None = None, profiles_file: Path | None = None
) -> tuple[ClusterConfig, list[WorkerInfo]]:
    """The cluster as the gateway and the simulator read it (with ``gpu_catalog`` and a ``profiles_file``
    overlay): its config and its workers."""
    catalog = load_gpu_catalog(gpu_catalog)
    if profiles_file is not None:
        catalog = catalog.with_profiles(load_profiles_file(profiles_file))
    cluster_cfg = load_cluster_config(cluster, catalog)
    return cluster_cfg, build_workers(cluster_cfg, catalog)


@dataclass(frozen=True)
class LiveSettings:
    """What every run of a live benchmark shares: the emulated ``cluster`` at ``time_scale``, the gateway's (and
    the emulation's) ``seed``, where logs go (``log_dir``: ``bench_folder``) and the progress sink ``say``."""

    cluster: str
    time_scale: float
    seed: int = 0
    log_dir: Path | None = None
    say: Callable[[str], None] = say_stderr

    def folder(self, prefix: str) -> contextlib.AbstractContextManager[Path]:
        """``bench_folder`` of ``log_dir`` (a temporary one named ``prefix...`` without it)."""
        return bench_folder(self.log_dir, prefix, self.say)

    @contextlib.contextmanager
    def rig(self, folder: Path, tag: str, **config: Any) -> Iterator[Rig]:
        """The live rig: this emulated cluster at this time scale (with ``emulator_args``), or the running
        ``worker_urls``, and a gateway in front with this seed, told ``gateway_cluster`` (default: the cluster
        as its file says) and the other ``write_gateway_config`` keywords in ``config`` (``policy`` default
        hexgen, ``alpha`` None, ``tenants_file`` ``tenants.yaml``); logs and configs in ``folder``, named by
        ``tag``. Both processes are stopped when the block ends, however it ends."""
        worker_urls, emulator_args = config.pop("worker_urls", None), config.pop("emulator_args", ())
        told = config.pop("gateway_cluster", None)
        gateway = {"policy": "hexgen", "alpha": None, "tenants_file": "tenants.yaml", **config}
        with contextlib.ExitStack() as stack:
            if worker_urls is None:
                emulated = cluster_process(self.cluster, self.time_scale, folder, tag, emulator_args)
                urls = stack.enter_context(emulated)[1]
            else:
                urls = list(worker_urls)
            port, path = free_port(), folder / f"gateway-{tag}.yaml"
            write_gateway_config(
                told if told is not None else self.cluster,
                urls,
                path,
                time_scale=self.time_scale,
                tuning_enabled=False,
                port=port,
                seed=self.seed,
                **gateway,
            )
            proc, url = stack.enter_context(gateway_process(path, port, len(urls), folder, tag))
            yield Rig(url, urls, proc)


async def scheduled(times: Sequence[float], fn: Callable[[int], Awaitable[T]]) -> list[T]:
    """``fn(i)`` started ``times[i]`` wall seconds from now, for every ``i``; their results in that order."""
    t0 = time.monotonic()

    async def one(i: int) -> T:
        delay = t0 + times[i] - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return await fn(i)

    return list(await asyncio.gather(*(one(i) for i in range(len(times)))))


async def sampling(main: Awaitable[T], sample: Callable[[], Awaitable[None]], period_s: float) -> T:
    """Await ``main`` while ``sample()`` runs every ``period_s`` seconds, the first time at once."""
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            await sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_s)

    task = asyncio.create_task(loop())
    try:
        return await main
    finally:
        stop.set()
        await task

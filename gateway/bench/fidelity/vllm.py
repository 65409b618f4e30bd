"""``hexflow bench fidelity-vllm``: real vLLM servers on the CPU, known only through ``hexflow calibrate``, are
calibrated, a token-scaled trace replayed live and simulated with the fitted profiles, the gap broken down;
target: live P95 within 10% (``TARGET``). Method: docs/benchmarks.md "Against real vLLM on the CPU"."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.bench.fidelity.breakdown import engine_accounting, gap_breakdown, scrape_engines
from gateway.bench.fidelity.vllm_report import VllmFidelityReport, VllmFidelitySeries
from gateway.bench.fidelity.vllm_servers import (
    CHUNK,
    MAX_MODEL_LEN,
    MODEL,
    ServerCalibration,
    VllmServer,
    cluster_doc,
    default_servers,
    start_servers,
)
from gateway.bench.livebench import run_live_bench
from gateway.bench.replay import replay_setup, replay_workload, scale_queries
from gateway.bench.rig import LiveSettings, bench_folder, say_stderr
from gateway.bench.simbench import fluid_bound
from gateway.bench.stats import positive
from gateway.config import build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import load_profiles_file
from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.profiling.fit import workflow_latency
from gateway.profiling.output import profile_entry
from gateway.profiling.plan import CalibrationError, PlanSettings, Probe
from gateway.profiling.probe import CalibrationResult, calibrate
from gateway.profiling.worker import ProbeWorker
from gateway.sim.workload import workload_queries
from workers import cpu_vllm


@dataclass(frozen=True)
class VllmSettings:
    """What every round of one run shares (``run_fidelity_vllm``'s keyword arguments, with their defaults)."""

    trace: str = "chess-bird"
    policies: Sequence[str] = ("hexgen",)
    workflows: int = 30
    token_scale: float = 0.125
    load: float = 0.5
    rate_qps: float | None = None
    budget_s: float = 120.0
    slo_scale: float = 5.0
    calibrate_beside_load: bool = True
    calibration_repeats: int = 2
    progress: bool = True

    def say(self, line: str) -> None:
        """A progress line on stderr (none when quiet)."""
        if self.progress:
            say_stderr(line)

    def check(self, seed: int, rounds: int) -> None:
        """``ValueError`` for a bad setting, or a round's workload that does not fit ``MAX_MODEL_LEN``."""
        positive("token scale", self.token_scale)
        if self.rate_qps is None:
            positive("load", self.load)
        else:
            positive("rate", self.rate_qps)
        positive("budget", self.budget_s)
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        if self.calibration_repeats < 1:
            raise ValueError(f"calibration repeats must be at least 1, got {self.calibration_repeats}")
        for r in range(rounds):  # every round's workload fits, before anything starts
            _, queries = workload_queries(self.trace, self.workflows, seed + r)
            scaled = scale_queries(queries, self.token_scale)
            worst = max(c.input_tokens + c.output_tokens for q in scaled for c in q)
            if worst >= MAX_MODEL_LEN:
                raise ValueError(
                    f"at token scale {self.token_scale:g} a call of seed {seed + r} needs {worst} tokens, over the "
                    f"servers' context of {MAX_MODEL_LEN}; lower --token-scale"
                )


def run_fidelity_vllm(
    *,
    servers: Sequence[VllmServer] | None = None,
    base_port: int = 18160,
    seed: int = 0,
    rounds: int = 1,
    keep_servers: bool = False,
    log_dir: Path | None = None,
    paths: cpu_vllm.Paths | None = None,
    **settings: Any,
) -> VllmFidelitySeries:
    """Start the servers, then ``rounds`` times (seeds ``seed``, ``seed + 1``, ...): calibrate afresh (the
    host's speed drifts), replay live, simulate, break the gap down. ``settings``: the fields of
    ``VllmSettings`` (the workload, the load, the calibration), each defaulting as it does there.

    ``ValueError`` for bad arguments or a scaled call over ``MAX_MODEL_LEN``, ``cpu_vllm.CpuVllmError`` when
    the servers cannot be set up or started. The servers are stopped at the end unless ``keep_servers``; logs,
    the profiles overlay and the cluster file go to ``log_dir`` (kept) or a temporary folder."""
    servers = default_servers() if servers is None else servers
    if len(servers) < 1 or len({s.name for s in servers}) != len(servers):
        raise ValueError("give at least one server, each with its own name")
    cfg = VllmSettings(**settings)
    cfg.check(seed, rounds)
    paths = paths or cpu_vllm.Paths.default()
    ports = [base_port + i for i in range(len(servers))]
    reports: list[VllmFidelityReport] = []
    where = f"; server logs in {paths.run}"
    with bench_folder(log_dir, "hexflow-fidelity-vllm-", lambda m: say_stderr(m + where)) as folder:
        try:
            cfg.say("vLLM venv and tiny model (installed once)")
            cpu_vllm.setup(paths)
            cpu_vllm.build_model(paths)
            urls = start_servers([s.options() for s in servers], base_port, paths, cfg.say)
            for i in range(rounds):
                if rounds > 1:
                    cfg.say(f"round {i + 1} of {rounds} (seed {seed + i})")
                sub = folder / f"round-{i + 1}" if rounds > 1 else folder
                reports.append(_round(servers, urls, sub, cfg, seed=seed + i))
        finally:
            if not keep_servers:
                cpu_vllm.stop_servers(ports, paths=paths)
    return VllmFidelitySeries(reports, seed)


def _write_profiles(path: Path, calibrations: Sequence[ServerCalibration]) -> Path:
    """The calibrated profiles as a profiles overlay (labels ``vllm-cpu-<name>``)."""
    doc = {"profiles": {MODEL: {c.server.label: profile_entry(c.result) for c in calibrations}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _round(
    servers: Sequence[VllmServer],
    urls: Sequence[str],
    folder: Path,
    cfg: VllmSettings,
    *,
    seed: int,
) -> VllmFidelityReport:
    """One round on running servers: calibrate each, replay ``workflows`` of seed ``seed`` live, simulate."""
    folder.mkdir(parents=True, exist_ok=True)
    _, queries = workload_queries(cfg.trace, cfg.workflows, seed)
    calls = sorted({(c.input_tokens, c.output_tokens) for q in scale_queries(queries, cfg.token_scale) for c in q})
    calibrations = _calibrate_all(servers, urls, calls, cfg)
    profiles_path = _write_profiles(folder / "calibrated-profiles.yaml", calibrations)
    cluster_path = folder / "cluster.yaml"
    cluster_path.write_text(yaml.safe_dump(cluster_doc(servers), sort_keys=False))
    catalog = load_gpu_catalog().with_profiles(load_profiles_file(profiles_path))
    workers = build_workers(load_cluster_config(cluster_path, catalog), catalog)
    setup = replay_setup(
        cfg.trace, workers, workflows=cfg.workflows, seed=seed, slo_scale=cfg.slo_scale, token_scale=cfg.token_scale
    )
    bound = fluid_bound(workers, setup.queries)
    rate = cfg.rate_qps if cfg.rate_qps is not None else round(cfg.load * bound, 6)
    cfg.say(f"replaying {cfg.workflows} workflows at {rate:.4g}/s ({rate / bound:.2f} x the calibrated fluid bound)")
    before = scrape_engines(urls)
    live = run_live_bench(
        LiveSettings(str(cluster_path), 1.0, seed, folder / "live"),
        cfg.trace,
        cfg.policies,
        workflows=cfg.workflows,
        rate_qps=rate,
        slo_scale=cfg.slo_scale,
        progress=cfg.progress,
        profiles_file=profiles_path,
        worker_urls=urls,
        token_scale=cfg.token_scale,
    )
    workload = replay_workload(setup, rate)
    engines = engine_accounting([s.name for s in servers], before, scrape_engines(urls), live.runs, workload, workers)
    breakdowns = [gap_breakdown(r, workload, workers, seed=seed) for r in live.runs]
    load = None if cfg.rate_qps is not None else cfg.load
    return VllmFidelityReport(calibrations, live, breakdowns, cfg.token_scale, load, engines)


async def _background_load(
    urls: Sequence[str], calls: Sequence[tuple[int, int]], per_server: int, stop: asyncio.Event, seed: int
) -> int:
    """Keep ``per_server`` requests running on each of ``urls`` (calls drawn from ``calls``) until ``stop``;
    how many completed (errors are not raised: the load only has to be there)."""
    rng = random.Random(seed)
    done = 0

    async def loop(w: ProbeWorker) -> None:
        nonlocal done
        while not stop.is_set():
            n_in, n_out = rng.choice(calls)
            probe = Probe("lone", max(n_in, 1), max(n_out, 1), 1, rng.randrange(1 << 30))
            try:
                await w.complete(probe, time.monotonic, 60.0)
                done += 1
            except (CalibrationError, httpx.HTTPError):
                await asyncio.sleep(0.1)

    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
        workers = [ProbeWorker(client, url, cpu_vllm.SERVED_MODEL_NAME) for url in urls]
        await asyncio.gather(*(loop(w) for w in workers for _ in range(per_server)))
    return done


async def _calibrate_beside(
    url: str,
    others: Sequence[str],
    calls: Sequence[tuple[int, int]],
    label: str,
    budget_s: float,
    settings: PlanSettings,
    progress: bool,
) -> tuple[CalibrationResult, int]:
    """``calibrate`` one server while the ``others`` serve a background load (none when empty)."""
    stop = asyncio.Event()
    load = asyncio.ensure_future(_background_load(others, calls, 2, stop, seed=len(label))) if others else None
    try:
        res = await calibrate(
            url, cpu_vllm.SERVED_MODEL_NAME, gpu=label, budget_s=budget_s, settings=settings, progress=progress
        )
    finally:
        stop.set()
        served = await load if load is not None else 0
    return res, served


def _calibrate_all(
    servers: Sequence[VllmServer],
    urls: Sequence[str],
    calls: Sequence[tuple[int, int]],
    cfg: VllmSettings,
) -> list[ServerCalibration]:
    """Calibrate each server in turn, prompts and outputs up to the workload's longest. With
    ``calibrate_beside_load`` the others meanwhile serve the workload's calls (two at a time each), as in the
    replay (on a CPU one server's work slows the others)."""
    standard = scale_queries([STANDARD_WORKFLOW], cfg.token_scale)[0]
    longest_in = max(c[0] for c in calls)
    longest_out = max(c[1] for c in calls)
    out = []
    for s, url in zip(servers, urls, strict=True):
        settings = PlanSettings(
            max_prompt=max(32, min(longest_in, MAX_MODEL_LEN - longest_out - 1)),
            max_output=max(1, longest_out),
            max_concurrency=s.max_num_seqs,
            max_num_seqs=s.max_num_seqs,
            max_batched_tokens=CHUNK,
            repeats=cfg.calibration_repeats,
        )
        others = [u for u in urls if u != url] if cfg.calibrate_beside_load else []
        cfg.say(
            f"calibrating {s.name} ({s.omp_threads} threads, max-num-seqs {s.max_num_seqs}, "
            f"{'CPUs ' + ','.join(map(str, s.cpus)) if s.cpus else 'unpinned'}) at {url} "
            f"within {cfg.budget_s:g} s{', the others under load' if others else ''}"
        )
        res, served = asyncio.run(_calibrate_beside(url, others, calls, s.label, cfg.budget_s, settings, cfg.progress))
        prof = res.profile()
        out.append(ServerCalibration(s, url, res, prof, workflow_latency(prof, standard), served))
        cfg.say(f"{s.name}: standard workflow (tokens x {cfg.token_scale:g}) {out[-1].standard_s:.2f} s alone")
    return out

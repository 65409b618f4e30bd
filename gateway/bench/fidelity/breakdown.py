"""What the gap of ``hexflow bench fidelity-vllm`` is made of: per worker, each call's time on it live and
simulated and the profile's lone prediction; per workflow, its latency along its chain of stages; per
server, vLLM's own histograms and prefix-cache counters over the live run."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.bench.livebench import PolicyRun
from gateway.bench.replay import ReplayWorkflow, WorkflowResult
from gateway.bench.stats import json_safe
from gateway.core.profile import PerfProfile
from gateway.live.schemas import CallReport
from gateway.profiling.promparse import MetricsParseError, parse_families
from gateway.sim.simulator import Simulator


class _JsonView:
    def to_json(self) -> dict[str, Any]:
        """The JSON view (non-finite numbers as null)."""
        return json_safe(self.__dict__)


@dataclass
class WorkerTimes(_JsonView):
    """Calls one worker served: how many, mean time queued at the gateway, mean time on the worker, and the
    mean of the profile's lone-call prediction for the same calls (seconds)."""

    calls: int = 0
    queued_s: float = math.nan
    on_worker_s: float = math.nan
    lone_predicted_s: float = math.nan


@dataclass
class PathTimes(_JsonView):
    """Mean seconds of a workflow's latency along its chain of stages (per stage, its last call).
    ``between_stages_s``: gateway time outside calls (live: the gateway's latency less its calls' chain; sim:
    0); ``client_s``: client time outside the gateway (live: client latency less the gateway's; sim: 0)."""

    workflows: int = 0
    latency_s: float = math.nan
    queued_s: float = math.nan
    on_worker_s: float = math.nan
    between_stages_s: float = math.nan
    client_s: float = math.nan


ENGINE_PHASES = (
    ("queue", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:request_prefill_time_seconds"),
    ("decode", "vllm:request_decode_time_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
)
"""vLLM's per-request histograms: in the engine's queue, prompt (to the first token), output, end to end."""
PREFIX_COUNTERS = (
    ("prefix_queries", "vllm:prefix_cache_queries_total"),
    ("prefix_hits", "vllm:prefix_cache_hits_total"),
)
"""vLLM's prefix-cache counters, in prompt tokens: looked up in the cache, and found there."""


def engine_sums(text: str) -> dict[str, float]:
    """``{phase: sum, phase_count: count}`` of ``ENGINE_PHASES`` and the ``PREFIX_COUNTERS`` in a ``/metrics``
    text, summed over series (what is not exported is left out); ``MetricsParseError`` on bad text."""
    samples = parse_families(text)
    out: dict[str, float] = {}
    for phase, name in ENGINE_PHASES:
        sums, counts = samples.get(f"{name}_sum"), samples.get(f"{name}_count")
        if sums is not None and counts is not None:
            out[phase] = sum(v for _, v in sums)
            out[f"{phase}_count"] = sum(v for _, v in counts)
    for key, name in PREFIX_COUNTERS:
        if (values := samples.get(name)) is not None:
            out[key] = sum(v for _, v in values)
    return out


@dataclass
class EngineTimes(_JsonView):
    """A server's own histograms over the live run: requests finished, the mean seconds of each of
    ``ENGINE_PHASES`` (NaN where not exported), the profile's lone prediction of the same calls split into
    prompt and output, and the prompt tokens looked up in its prefix cache and found there (NaN: unknown)."""

    requests: float = 0.0
    mean_s: dict[str, float] = field(default_factory=dict)
    lone_prefill_s: float = math.nan
    lone_decode_s: float = math.nan
    prefix_queries: float = math.nan
    prefix_hits: float = math.nan

    @property
    def prefix_hit_share(self) -> float:
        """Share of prompt tokens served from the server's prefix cache (NaN: none looked up, or unknown)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries > 0 else math.nan

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> EngineTimes:
        """The requests finished between two ``engine_sums`` readings."""
        out = cls()

        def delta(key: str) -> float:
            return after.get(key, math.nan) - before.get(key, 0.0)

        for phase, _ in ENGINE_PHASES:
            n = delta(f"{phase}_count")
            out.mean_s[phase] = delta(phase) / n if n > 0 else math.nan
            if phase == "e2e" and n > 0:
                out.requests = n
        out.prefix_queries, out.prefix_hits = delta("prefix_queries"), delta("prefix_hits")
        return out


def scrape_engines(urls: Sequence[str]) -> list[dict[str, float]]:
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
        for _, c, (_, n_in, n_out) in _live_calls(run, wanted):
            if (prof := profiles.get(c.worker or "")) is not None:
                split[c.worker or ""].append(lone_split(prof, n_in, n_out))
    out = {}
    for name, b, a in zip(names, before, after, strict=True):
        out[name] = t = EngineTimes.between(b, a)
        t.lone_prefill_s = _mean([x[0] for x in split.get(name, [])])
        t.lone_decode_s = _mean([x[1] for x in split.get(name, [])])
    return out


@dataclass
class KindTimes(_JsonView):
    """Calls of one kind matched between the live run and its simulation (the same workflow and node): how
    many, the mean time on the worker of each, and the share that went to the same worker in both."""

    calls: int = 0
    live_run_s: float = math.nan
    sim_run_s: float = math.nan
    same_worker: float = math.nan


@dataclass
class GapBreakdown:
    """What a policy's live run and its simulation spent their time on. ``token_mismatches``: live calls whose
    reported tokens differ from the requested ones; ``workflows_*``: every workflow accounted for (live:
    completed, rejected or failed; sim: finished or not); ``kinds``: per call kind, the calls matched between
    the two; ``prefix_sim``: per worker, the simulated engine's prompt tokens and prefix-cache hits."""

    policy: str
    workers_live: dict[str, WorkerTimes] = field(default_factory=dict)
    workers_sim: dict[str, WorkerTimes] = field(default_factory=dict)
    path_live: PathTimes = field(default_factory=PathTimes)
    path_sim: PathTimes = field(default_factory=PathTimes)
    calls_live: int = 0
    calls_sim: int = 0
    token_mismatches: int = 0
    workflows_live: int = 0
    workflows_sim: int = 0
    kinds: dict[str, KindTimes] = field(default_factory=dict)
    prefix_sim: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        workers = sorted(set(self.workers_live) | set(self.workers_sim))
        sides = (("live", self.workers_live), ("sim", self.workers_sim))
        return {
            "policy": self.policy,
            "workflows_live": self.workflows_live,
            "workflows_sim": self.workflows_sim,
            "calls_live": self.calls_live,
            "calls_sim": self.calls_sim,
            "token_mismatches": self.token_mismatches,
            "per_worker": {
                name: {side: times.get(name, WorkerTimes()).to_json() for side, times in sides} for name in workers
            },
            "per_workflow_mean": {"live": self.path_live.to_json(), "sim": self.path_sim.to_json()},
            "per_kind": {k: v.to_json() for k, v in sorted(self.kinds.items())},
            "prefix_sim": {name: {"prompt_tokens": q, "hit_tokens": h} for name, (q, h) in self.prefix_sim.items()},
        }


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _requested(workload: Sequence[ReplayWorkflow]) -> dict[int, dict[str, tuple[int, int, int]]]:
    """Per workflow, each call id's node index in the workflow's DAG (``ReplayWorkflow.calls`` order, as the
    simulator's ``CallOutcome.node``) and the prompt and output tokens it asked for."""
    return {
        w.wid: {c["id"]: (i, int(c["prompt_tokens"]), int(c["max_tokens"])) for i, c in enumerate(w.calls())}
        for w in workload
    }


def _live_calls(
    run: PolicyRun, wanted: Mapping[int, Mapping[str, tuple[int, int, int]]]
) -> Iterator[tuple[WorkflowResult, CallReport, tuple[int, int, int]]]:
    """Each call of ``run``'s completed workflows, with its workflow's result and what ``_requested`` says of it
    (node -1 and the reported tokens where it says nothing)."""
    for res in run.live.results:
        for c in res.calls if res.completed else ():
            yield res, c, wanted.get(res.wid, {}).get(c.id, (-1, c.prompt_tokens, c.completion_tokens))


@dataclass
class _Side:
    """One side's calls (live or simulated): per worker (queued, on worker, lone prediction), and per
    workflow and stage the call that ended the stage last (queued, on worker)."""

    per_worker: dict[str, list[tuple[float, float, float]]] = field(default_factory=lambda: defaultdict(list))
    chains: dict[int, dict[int, tuple[float, float]]] = field(default_factory=lambda: defaultdict(dict))

    def add(self, wid: int, stage: int, worker: str, queued: float, run: float, lone: float) -> None:
        self.per_worker[worker].append((queued, run, lone))
        st = self.chains[wid]
        if stage not in st or queued + run > sum(st[stage]):
            st[stage] = (queued, run)

    def workers(self) -> dict[str, WorkerTimes]:
        return {
            name: WorkerTimes(len(v), *(_mean([x[i] for x in v]) for i in range(3)))
            for name, v in self.per_worker.items()
        }

    def path(self, latencies: Mapping[int, float], outside: Mapping[int, float], client: float | None) -> PathTimes:
        """Means over ``latencies``' workflows; ``outside``: each one's latency not spent on calls (the
        gateway's for live, the simulated one's for sim), ``client``: None live (client less gateway)."""
        ws = list(latencies)
        q = [sum(x for x, _ in self.chains[w].values()) for w in ws]
        r = [sum(x for _, x in self.chains[w].values()) for w in ws]
        between = [outside[w] - a - b for w, a, b in zip(ws, q, r, strict=True)]
        extra = _mean([latencies[w] - outside[w] for w in ws]) if client is None else client
        return PathTimes(len(ws), _mean([latencies[w] for w in ws]), _mean(q), _mean(r), _mean(between), extra)


def gap_breakdown(
    run: PolicyRun, workload: Sequence[ReplayWorkflow], workers: Sequence[Any], *, seed: int
) -> GapBreakdown:
    """The breakdown of one policy's live run against its simulation (rerun with call timelines: the same
    workload, policy, alpha and seed as ``run_live_bench``'s prediction)."""
    out = GapBreakdown(run.policy)
    wanted = _requested(workload)
    _live_side(out, run, wanted, {w.name: w.profile for w in workers})
    sim = Simulator(workers, run.policy, alpha=run.alpha, seed=seed, prefix_caching=True, record_calls=True)
    res_sim = sim.run([w.dag() for w in workload])
    _sim_side(out, res_sim, workload, workers)
    # Call by call: the same workflow's same node, live and simulated.
    sim_call = {(t.wid, t.node): (t.run_s, workers[t.worker].name) for t in res_sim.calls}
    matched: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    for res, c, (node, _, _) in _live_calls(run, wanted):
        if (sim_c := sim_call.get((res.wid, node))) is not None:
            matched[c.kind].append((c.run_s, sim_c[0], c.worker == sim_c[1]))
    out.kinds = {
        kind: KindTimes(len(v), _mean([x[0] for x in v]), _mean([x[1] for x in v]), sum(x[2] for x in v) / len(v))
        for kind, v in matched.items()
    }
    return out


def _live_side(
    out: GapBreakdown,
    run: PolicyRun,
    wanted: Mapping[int, Mapping[str, tuple[int, int, int]]],
    profiles: Mapping[str, PerfProfile],
) -> None:
    """The live half of the breakdown, from the gateway's report of each call."""
    side = _Side()
    latency, gateway = {}, {}
    out.workflows_live = run.live.completed + run.live.rejected + run.live.failed
    for res, c, (_, n_in, n_out) in _live_calls(run, wanted):
        out.calls_live += 1
        out.token_mismatches += (c.prompt_tokens, c.completion_tokens) != (n_in, n_out)
        prof = profiles.get(c.worker or "")
        lone = prof.single_latency(n_in, n_out) if prof is not None else math.nan
        # A chain node id is ``c{stage}.{index}`` (``gateway.core.dag.chain_nodes``).
        side.add(res.wid, int(c.id[1:].split(".", 1)[0]), c.worker or "?", c.queued_s, c.run_s, lone)
        latency[res.wid] = res.latency_s if res.latency_s is not None else math.nan
        gateway[res.wid] = res.gateway_latency_s if res.gateway_latency_s is not None else math.nan
    out.workers_live = side.workers()
    out.path_live = side.path(latency, gateway, None)


def _sim_side(out: GapBreakdown, res_sim: Any, workload: Sequence[ReplayWorkflow], workers: Sequence[Any]) -> None:
    """The simulated half of the breakdown, from the simulation's call timelines."""
    out.workflows_sim = len(res_sim.workflows) + res_sim.unfinished
    out.prefix_sim = {
        w.name: (st.prompt_tokens, st.prefix_hit_tokens) for w, st in zip(workers, res_sim.engine_stats, strict=True)
    }
    specs = {w.wid: [(k, c) for k, stage in enumerate(w.stage_calls()) for c in stage] for w in workload}
    side = _Side()
    for t in res_sim.calls:
        out.calls_sim += 1
        wk = workers[t.worker]
        k, spec = specs[t.wid][t.node]
        lone = wk.profile.single_latency(spec.input_tokens, spec.output_tokens)
        side.add(t.wid, k, wk.name, t.queued_s, t.run_s, lone)
    out.workers_sim = side.workers()
    latency = {r.wid: r.latency for r in res_sim.workflows}
    out.path_sim = side.path(latency, latency, 0.0 if latency else math.nan)

"""The report of ``hexflow bench fidelity-vllm``: one round (its calibrations, the live-against-simulated runs,
the breakdown of the gap) and a series of rounds, as JSON and as text."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.bench.fidelity.breakdown import EngineTimes, GapBreakdown, PathTimes, WorkerTimes
from gateway.bench.fidelity.compare import LiveGaps, gap_cells, within
from gateway.bench.fidelity.vllm_servers import CHUNK, FITTED, MAX_MODEL_LEN, TARGET, ServerCalibration
from gateway.bench.livebench import LiveBenchReport, format_live_report
from gateway.bench.stats import finite_or_none, fmt, json_safe, table


@dataclass
class VllmFidelityReport(LiveGaps):
    """The calibrations, the live-vs-simulated runs and the breakdown of each policy's gap (the target: P95).
    ``load``: the rate as a share of the calibrated fluid bound (None: ``--rate`` given); ``engines``: each
    server's own histograms."""

    TARGET: ClassVar[float] = TARGET
    GAP_KEYS: ClassVar[tuple[str, ...]] = ("p95",)

    calibrations: list[ServerCalibration]
    live: LiveBenchReport
    breakdowns: list[GapBreakdown]
    token_scale: float
    load: float | None
    engines: dict[str, EngineTimes] = field(default_factory=dict)

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
            "max_model_len": MAX_MODEL_LEN,
            "max_batched_tokens": CHUNK,
            "servers": [c.to_json() for c in self.calibrations],
            "speed_ratio": finite_or_none(self.speed_ratio()),
            "gaps": json_safe(self.gaps()),
            "breakdown": [b.to_json() for b in self.breakdowns],
            "engines": {name: t.to_json() for name, t in self.engines.items()},
            "live_bench": self.live.to_json(),
        }


def _share(x: float | None) -> str:
    return f"{x:.0%}" if x is not None and math.isfinite(x) else "-"


def _ratio(a: float, b: float, digits: int = 2) -> str:
    return fmt(a / b if b else math.nan, digits)


def _pair(a: float, b: float, digits: int = 3) -> str:
    return f"{fmt(a, digits)}/{fmt(b, digits)}"


def format_vllm_fidelity_report(rep: VllmFidelityReport) -> str:
    """The tables ``hexflow bench fidelity-vllm`` prints."""
    lines = [
        f"calibrated profiles of the real vLLM servers (wall seconds; tokens x {rep.token_scale:g}):",
        _calibration_table(rep),
        f"slowest / fastest standard workflow (calibrated): {fmt(rep.speed_ratio(), 2)}x",
        "",
        format_live_report(rep.live),
        "",
    ]
    for b in rep.breakdowns:
        lines += _breakdown_lines(b)
    lines += _engine_lines(rep)
    title = f"live against the simulator with the calibrated profiles (target: P95 within {TARGET:.0%}):"
    lines += rep.gap_lines(title, 2, lambda _: [], [])
    return "\n".join(lines)


def _calibration_table(rep: VllmFidelityReport) -> str:
    """One row per server: its options and fitted constants, the fit's error and the standard workflow."""
    rows = []
    for c in rep.calibrations:
        p, (median, largest) = c.profile, c.result.error_spread()
        s = c.server
        consts = [f"{getattr(p, k):{'.4g' if k in ('iter_base_s', 'token_s') else '.3g'}}" for k in FITTED]
        fit = f"{median:.1%} / {largest:.1%}" if c.result.fitted else "-"
        probes = f"{len(c.result.measurements)} in {c.result.wall_s:.0f} s"
        cpus = ",".join(map(str, s.cpus)) or "-"
        rows.append([s.name, f"{s.omp_threads}", f"{s.max_num_seqs}", cpus, *consts, f"{p.kv_capacity_tokens}"])
        rows[-1] += [fit, probes, fmt(c.standard_s, 2)]
    head = ["server", "threads", "seqs", "cpus", "iter_base_s", "token_s", "ctx_s", "attn_s", "seq_s", "admit_s"]
    return table([*head, "overhead_s", "kv_tokens", "fit |err| med/max", "probes", "std wf s"], rows)


def _breakdown_lines(b: GapBreakdown) -> list[str]:
    """Where one policy's time went: per worker, along the workflows' chains, call by call."""
    lines = [
        f"{b.policy}: where the time went (seconds; live {b.workflows_live} workflows, {b.calls_live} calls; "
        f"sim {b.workflows_sim} workflows, {b.calls_sim} calls; calls with other token counts than sent: "
        f"{b.token_mismatches})"
    ]
    wrows = []
    for name in sorted(set(b.workers_live) | set(b.workers_sim)):
        lv, sm = b.workers_live.get(name, WorkerTimes()), b.workers_sim.get(name, WorkerTimes())
        cells = [f"{lv.calls}/{sm.calls}", _pair(lv.queued_s, sm.queued_s), _pair(lv.on_worker_s, sm.on_worker_s)]
        lone = [fmt(lv.lone_predicted_s, 3), _ratio(lv.on_worker_s, lv.lone_predicted_s)]
        wrows.append([name, *cells, _ratio(lv.on_worker_s, sm.on_worker_s), *lone])
    head = ["worker", "calls live/sim", "queued live/sim", "on worker live/sim", "live/sim", "lone pred", "live/lone"]
    lines += [table(head, wrows), "mean workflow latency along its chain of stages:", _path_table(b)]
    if b.kinds:
        krows = []
        for kind, k in sorted(b.kinds.items()):
            times = [fmt(k.live_run_s, 3), fmt(k.sim_run_s, 3), _ratio(k.live_run_s, k.sim_run_s)]
            krows.append([kind, str(k.calls), *times, _share(k.same_worker)])
        lines.append("call by call (the same workflow's same call, live and simulated; time on the worker):")
        lines.append(table(["kind", "calls", "live", "sim", "live/sim", "same worker"], krows))
    return [*lines, ""]


def _path_table(b: GapBreakdown) -> str:
    """Mean workflow latency along its chain of stages, live, simulated and their difference."""
    keys = ("latency_s", "queued_s", "on_worker_s", "between_stages_s", "client_s")

    def values(p: PathTimes) -> list[float]:
        return [getattr(p, k) for k in keys]

    rows = [[run, *(fmt(v, 3) for v in values(p))] for run, p in (("live", b.path_live), ("sim", b.path_sim))]
    diffs = [a - s for a, s in zip(values(b.path_live), values(b.path_sim), strict=True)]
    rows.append(["live - sim", *(f"{d:+.3f}" if math.isfinite(d) else "-" for d in diffs)])
    return table(["run", "latency", "queued", "on worker", "gateway between", "client"], rows)


def _engine_lines(rep: VllmFidelityReport) -> list[str]:
    """The servers' own histograms over the live run, beside the profile's lone prediction."""
    if not rep.engines:
        return []
    erows = []
    sim_hits = rep.sim_prefix_hit_share()
    for name, t in rep.engines.items():
        m = t.mean_s
        hit = f"{_share(t.prefix_hit_share)}/{_share(sim_hits.get(name, math.nan))}"
        cells = [_pair(m.get("prefill", math.nan), t.lone_prefill_s), _pair(m.get("decode", math.nan), t.lone_decode_s)]
        erows.append([name, f"{t.requests:.0f}", fmt(m.get("queue", math.nan), 3), *cells])
        erows[-1] += [fmt(m.get("e2e", math.nan), 3), hit]
    head = ["server", "requests", "engine queue", "prompt/lone", "output/lone", "end to end", "prefix hit"]
    return [
        "the servers' own histograms over the live run (mean seconds per request; prompt = to the first "
        "token, output = the rest; /lone: the profile's prediction of the same calls alone; prefix hit: share "
        "of prompt tokens served from the prefix cache, vLLM's counters / the simulated engine's):",
        table(head, erows),
        "",
    ]


@dataclass
class VllmFidelitySeries:
    """Rounds of the benchmark on the same servers, each a calibration and the replay right after it. On a
    shared CPU host one round is one draw (the host's speed drifts over minutes); the series' figure is the
    median over its rounds of each round's live/simulated P95 gap."""

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
        return {p: sum(within([g], TARGET) for g in gs) for p, gs in self.p95_gaps().items()}

    def within_target(self) -> bool:
        """Every policy's median P95 gap within ``TARGET`` (one round: that round's gap)."""
        med = self.median_p95_gap()
        return bool(med) and within(med.values(), TARGET)

    def to_json(self) -> dict[str, Any]:
        """One round: that round's document plus the summary; several: the summary and every round's."""
        summary = {
            p: {
                "p95_gaps": [finite_or_none(g) for g in gs],
                "median_p95_gap": finite_or_none(self.median_p95_gap()[p]),
                "rounds_within": self.rounds_within()[p],
            }
            for p, gs in self.p95_gaps().items()
        }
        head = {"target_p95": TARGET, "within_target": self.within_target(), "seed": self.seed, "summary": summary}
        if len(self.rounds) == 1:
            return {**self.rounds[0].to_json(), **head}
        return {**head, "rounds": [r.to_json() for r in self.rounds]}


def format_vllm_fidelity_series(series: VllmFidelitySeries) -> str:
    """Every round's report (``format_vllm_fidelity_report``), then the rounds side by side."""
    n = len(series.rounds)
    if n == 1:
        return format_vllm_fidelity_report(series.rounds[0])
    parts = []
    rows = []
    for i, rep in enumerate(series.rounds):
        parts += [f"=== round {i + 1} of {n} (seed {series.seed + i})", format_vllm_fidelity_report(rep), ""]
        for r in rep.live.runs:
            rows.append([str(i + 1), str(series.seed + i), r.policy, *gap_cells(r, rep.gaps()[r.policy], 2)[:5]])
    parts.append(
        f"the rounds side by side (each: a fresh calibration, then its replay; target: P95 within {TARGET:.0%}):"
    )
    parts.append(table(["round", "seed", "policy", "live p95", "sim p95", "gap", "live slo", "sim slo"], rows))
    med, within_n = series.median_p95_gap(), series.rounds_within()
    for p in med:
        parts.append(f"{p}: median P95 gap {med[p]:+.1%} over {n} rounds; {within_n[p]} of them within {TARGET:.0%}")
    parts.append("within target (median)" if series.within_target() else "NOT within target (median)")
    return "\n".join(parts)

"""``hexflow bench overload``: does admission keep its promises under overload? A live rig (one tenant, predictive
admission on unless ``--no-predictive``): a capacity phase at ``capacity_fraction`` x the fluid bound, then
``bursts`` bursts at ``factor`` x that rate; per phase sent, accepted, rejected, shed, met, goodput and the
gateway's RSS. The goals checked are ``OverloadReport.checks``. Figures: docs/live-gateway.md."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.replay import replay_setup, replay_workload
from gateway.bench.rig import LiveSettings, Rig, bench_tenant, cluster_workers, sampling, scheduled
from gateway.bench.simbench import fluid_bound
from gateway.bench.stats import cells, fmt, json_safe, positive, pyplot, save_figure, table
from gateway.core.predict import SUSTAINABLE_SHARE

RSS_PERIOD_S = 0.25
TENANT = "overload"


@dataclass(slots=True)
class Answer:
    """One workflow as the client saw it (wall seconds from the start of the run)."""

    phase: str
    sent_at: float
    status: int = 0
    met: bool = False
    shed: bool = False
    retry_after: int | None = None
    latency_s: float = math.nan


@dataclass
class PhaseReport:
    """The figures of one phase (capacity, or one burst)."""

    name: str
    start_s: float
    rate_wall: float
    window_s: float
    sent: int
    accepted: int
    rejected: int
    shed: int
    met: int
    failed: int
    retry_after_min: int | None
    retry_after_max: int | None
    rss_start_mb: float | None
    rss_peak_mb: float | None
    rss_end_mb: float | None

    @property
    def met_of_accepted(self) -> float:
        """Share of accepted workflows that met their deadline (NaN when none was accepted)."""
        return self.met / self.accepted if self.accepted else math.nan

    @property
    def goodput(self) -> float:
        """Met workflows per wall second of the phase's arrival window."""
        return self.met / self.window_s if self.window_s > 0 else math.nan


@dataclass
class OverloadReport:
    """The run: its setting (``admission_share``: the gateway's ``admission.sustainable_share``), every phase,
    the gateway's RSS samples ((wall seconds since the start, MB)) and the goal checks."""

    cluster: str
    time_scale: float
    fluid_bound_qps: float
    capacity_rate_qps: float
    factor: float
    deadline_wall_s: float
    predictive: bool
    admission_share: float = SUSTAINABLE_SHARE
    phases: list[PhaseReport] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def bursts(self) -> list[PhaseReport]:
        """The overload phases."""
        return [p for p in self.phases if p.name.startswith("burst")]

    @property
    def overload_met_of_accepted(self) -> float:
        """Share of the accepted workflows of every burst that met their deadline."""
        acc = sum(p.accepted for p in self.bursts)
        return sum(p.met for p in self.bursts) / acc if acc else math.nan

    @property
    def goodput_ratio(self) -> float:
        """Mean goodput over the bursts divided by goodput at capacity."""
        cap = self.phases[0].goodput if self.phases else math.nan
        b = self.bursts
        mean = sum(p.goodput for p in b) / len(b) if b else math.nan
        return mean / cap if cap > 0 else math.nan

    @property
    def rss_bounded(self) -> bool:
        """The last burst's RSS peak is within 1.5x the first burst's (no growth from burst to burst)."""
        b = [p for p in self.bursts if p.rss_peak_mb is not None]
        if len(b) < 2:
            return True
        first, last = b[0].rss_peak_mb, b[-1].rss_peak_mb
        assert first is not None and last is not None
        return last <= 1.5 * first

    def checks(self) -> dict[str, bool]:
        """The goals of issue 12, item 5."""
        return {
            "accepted_met_ge_95pct": self.overload_met_of_accepted >= 0.95,
            "goodput_ge_90pct_of_capacity": self.goodput_ratio >= 0.90,
            "rss_bounded": self.rss_bounded,
        }

    def to_json(self) -> dict[str, Any]:
        """The report as strict JSON (NaN as null)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("phases", "rss", "wall_s")}
        return json_safe(
            {
                **doc,
                "phases": [
                    {**asdict(p), "met_of_accepted": p.met_of_accepted, "goodput": p.goodput} for p in self.phases
                ],
                "overload_met_of_accepted": self.overload_met_of_accepted,
                "goodput_ratio": self.goodput_ratio,
                "checks": self.checks(),
                "rss_mb": [[round(t, 3), round(m, 2)] for t, m in self.rss],
                "wall_s": self.wall_s,
            }
        )


@dataclass(frozen=True)
class Phase:
    """Arrivals at ``rate`` (wall, per second) from ``start`` for ``length`` wall seconds."""

    name: str
    start: float
    length: float
    rate: float


def arrivals(phases: Sequence[Phase], rng: random.Random) -> list[tuple[float, str]]:
    """Poisson arrival times (wall seconds from the start) of every phase, with its name."""
    out: list[tuple[float, str]] = []
    for p in phases:
        t = p.start + rng.expovariate(p.rate)
        while t < p.start + p.length:
            out.append((t, p.name))
            t += rng.expovariate(p.rate)
    return out


async def _drive(
    rig: Rig, api_key: str, bodies: Sequence[bytes], schedule: Sequence[tuple[float, str]], timeout_s: float
) -> tuple[list[Answer], list[tuple[float, float]], float]:
    """Send every workflow at its time, sample RSS meanwhile; returns answers, RSS samples, wall seconds."""
    answers = [Answer(phase, t) for t, phase in schedule]
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()

    async def sample() -> None:
        m = rig.rss_mb()
        if m is not None:
            samples.append((time.monotonic() - t0, m))

    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=rig.url, limits=limits, timeout=timeout_s, headers=headers) as client:

        async def one(i: int) -> None:
            a = answers[i]
            start = time.monotonic()
            try:
                r = await client.post("/v1/workflows", content=bodies[i % len(bodies)])
            except httpx.HTTPError:
                return
            a.latency_s = time.monotonic() - start
            a.status = r.status_code
            ra = r.headers.get("retry-after")
            a.retry_after = int(ra) if ra is not None and ra.isdigit() else None
            try:
                data = r.json()
            except ValueError:
                return
            if r.status_code == 200:
                a.met = bool(data.get("deadline_met"))
            elif r.status_code == 503:
                msg = str((data.get("error") or {}).get("message", ""))
                a.shed = msg.startswith("shed")

        await sampling(scheduled([a.sent_at for a in answers], one), sample, RSS_PERIOD_S)
    return answers, samples, time.monotonic() - t0


def _phase_report(p: Phase, answers: Sequence[Answer], rss: Sequence[tuple[float, float]], end: float) -> PhaseReport:
    mine = [a for a in answers if a.phase == p.name]
    refused = [a for a in mine if a.status == 429 or (a.status == 503 and not a.shed)]
    accepted = [a for a in mine if a not in refused]
    retry = [a.retry_after for a in refused if a.retry_after is not None]
    window = [m for t, m in rss if p.start <= t <= end]
    counts = (len(mine), len(accepted), len(refused), sum(a.shed for a in mine), sum(a.met for a in mine))
    failed = sum(1 for a in accepted if a.status != 200 and not a.shed)
    retry_range = (min(retry), max(retry)) if retry else (None, None)
    rss_mb = (window[0], max(window), window[-1]) if window else (None, None, None)
    return PhaseReport(p.name, p.start, p.rate, p.length, *counts, failed, *retry_range, *rss_mb)


def run_overload(
    live: LiveSettings,
    *,
    capacity_fraction: float = 0.75,
    factor: float = 5.0,
    capacity_s: float = 40.0,
    burst_s: float = 30.0,
    quiet_s: float = 15.0,
    bursts: int = 3,
    slo_scale: float = 5.0,
    predictive: bool = True,
    admission_share: float | None = None,
) -> OverloadReport:
    """Run the capacity phase and the bursts on ``live``'s rig and return its report."""
    time_scale, seed = live.time_scale, live.seed
    for name, v in (("time_scale", time_scale), ("capacity_fraction", capacity_fraction), ("factor", factor)):
        positive(name, v)
    if admission_share is not None and not 0.0 < admission_share <= 1.0:
        raise ValueError(f"the admission share must be in (0, 1], got {admission_share}")
    if bursts < 1 or capacity_s <= 0 or burst_s <= 0 or quiet_s < 0:
        raise ValueError("bursts >= 1, capacity_s > 0, burst_s > 0 and quiet_s >= 0 are required")
    cluster_cfg, workers = cluster_workers(live.cluster)
    probe = replay_setup("chess-bird", workers, workflows=50, seed=seed, slo_scale=slo_scale)
    bound = fluid_bound(workers, probe.queries)
    rate_cap_model = capacity_fraction * bound
    cap_rate_wall = rate_cap_model / time_scale
    phases = [Phase("capacity", 0.0, capacity_s, cap_rate_wall)]
    t = capacity_s + quiet_s
    for k in range(bursts):
        phases.append(Phase(f"burst{k + 1}", t, burst_s, factor * cap_rate_wall))
        t += burst_s + quiet_s
    schedule = arrivals(phases, random.Random(seed))
    setup = replay_setup(
        "chess-bird", workers, workflows=min(max(len(schedule), 1), 2000), seed=seed, slo_scale=slo_scale
    )
    bodies = [json.dumps(w.body(time_scale)).encode() for w in replay_workload(setup, rate_cap_model)]
    deadline_wall = setup.slo_s * time_scale
    live.say(
        f"fluid bound {bound:.4g} wf/s (modelled); capacity rate {rate_cap_model:.4g} wf/s "
        f"= {cap_rate_wall:.3g}/s wall; "
        f"overload {factor:g}x in {bursts} bursts of {burst_s:g} s; deadline {deadline_wall:.3g} s wall; "
        f"{len(schedule)} workflows"
    )
    share = admission_share if admission_share is not None else SUSTAINABLE_SHARE
    setting = (time_scale, bound, rate_cap_model, factor, deadline_wall, predictive, share)
    report = OverloadReport(cluster_cfg.name, *setting)
    with live.folder("hexflow-overload-") as folder:
        key = bench_tenant(
            folder, deadline_s=deadline_wall, max_concurrent_workflows=100_000, name=TENANT, predictive=predictive,
            on_predicted_miss="reject",
        )  # fmt: skip
        with live.rig(folder, "overload", admission_share=admission_share) as rig:
            answers, rss, wall = asyncio.run(_drive(rig, key, bodies, schedule, timeout_s=4 * deadline_wall + 60.0))
    ends = [p.start for p in phases[1:]] + [wall]
    report.phases = [_phase_report(p, answers, rss, end) for p, end in zip(phases, ends, strict=True)]
    report.rss = rss
    report.wall_s = wall
    return report


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def format_report(rep: OverloadReport) -> str:
    """What ``hexflow bench overload`` prints."""
    rows = []
    for p in rep.phases:
        ra = "-" if p.retry_after_min is None else f"{p.retry_after_min}-{p.retry_after_max}"
        rss = "/".join(_mb(x) for x in (p.rss_start_mb, p.rss_peak_mb, p.rss_end_mb))
        counts = cells(p, "name rate_wall:.2f sent accepted rejected shed met")
        rows.append([*counts, fmt(p.met_of_accepted * 100, 1), f"{p.goodput:.3f}", ra, rss])
    mode = f"predictive (share {rep.admission_share:g})" if rep.predictive else "concurrency only"
    head = (
        f"cluster {rep.cluster}, time scale {rep.time_scale:g}, admission "
        f"{mode}; fluid bound {rep.fluid_bound_qps:.4g} wf/s, "
        f"capacity rate {rep.capacity_rate_qps:.4g} wf/s (modelled), overload {rep.factor:g}x; "
        f"deadline {rep.deadline_wall_s:.3g} s wall; {rep.wall_s:.0f} s wall"
    )
    heads = ["phase", "rate/s", "sent", "accepted", "rejected", "shed", "met", "met% of acc", "goodput/s"]
    t = table([*heads, "Retry-After", "RSS MB start/peak/end"], rows, left=1)
    checks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in rep.checks().items())
    tail = (
        f"overload: {fmt(rep.overload_met_of_accepted * 100, 1)}% of accepted met their deadline; goodput "
        f"{fmt(rep.goodput_ratio * 100, 1)}% of goodput at capacity. Goals: {checks}"
    )
    return "\n".join([head, t, tail])


def plot_report(rep: OverloadReport, path: Path) -> None:
    """RSS of the gateway over time, with the phases shaded, as a PNG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    if rep.rss:
        ts, ms = zip(*rep.rss, strict=True)
        ax.plot(ts, ms, lw=1.2, color="tab:blue", label="gateway RSS")
    for p in rep.phases:
        color = "tab:red" if p.name != "capacity" else "tab:green"
        ax.axvspan(p.start_s, p.start_s + p.window_s, alpha=0.15, color=color)
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"gateway memory: capacity (green), {rep.factor:g}x overload bursts (red)")
    save_figure(fig, path)

"""``hexflow bench burst --live``: degradation under a recorded burst, live through the Text-to-SQL pipeline on
emulated workers answering from the demo script, beside the simulator's run of the same recorded workload
(``record_demo``), accuracy model, arrivals and deadlines. Method: docs/benchmarks.md "Live, beside
the simulator"."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.burst import (
    Outcome,
    Pattern,
    _setup_for,
    is_baseline,
    outcome,
    parse_variant,
    simulate_once,
    tuned_queue_limit,
)
from gateway.bench.demo import write_demo_files
from gateway.bench.quality import FAR, FULL, ScriptedStageRunner, demo_items, run_quality
from gateway.bench.rig import LiveSettings, bench_tenant, scheduled
from gateway.bench.simbench import Setup, standard_latency
from gateway.bench.text2sql_eval import post_question, question_body
from gateway.config.databases import DatabaseConfig
from gateway.core.degrade import QualityModel
from gateway.core.shapes import MIN_QUESTIONS
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, WorkflowTemplate
from gateway.sim.simulator import SimResult
from gateway.text2sql.answers import build_demo_answers
from gateway.text2sql.db import open_database
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from gateway.text2sql.evaluate import execute_sqlite, matches_gold
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.prompt_templates import Prompts
from workers.scripted import AnswersResponder

TENANT = "default"


def record_demo(seed: int = 0, wrong_fraction: float = 0.25) -> tuple[list[list[CallSpec]], WorkflowTemplate]:
    """Every demo question's calls at full quality, as the emulator runs them, and the template the live
    pipeline predicts with once it has answered every demo question (its ``plan_for``)."""
    template: list[WorkflowTemplate] = []

    async def record(db_path: Path) -> list[list[CallSpec]]:
        responder = AnswersResponder(dict(build_demo_answers(seed=seed, wrong_fraction=wrong_fraction)))
        db = open_database(DB_ID, DatabaseConfig.model_validate({"url": f"sqlite:///{db_path.resolve().as_posix()}"}))
        pipe = Text2SqlPipeline(PipelineConfig(), Prompts.load())
        out: list[list[CallSpec]] = []
        try:
            for it in demo_items(db_path):
                runner = ScriptedStageRunner(responder)
                await pipe.answer(runner, db, it.question, it.evidence or "", FAR, request_id="record")
                out.append(runner.calls)
        finally:
            await db.close()
        template.append(pipe.plan_for(DB_ID).template)
        return out

    with tempfile.TemporaryDirectory(prefix="hexflow-burst-record-") as tmp:
        queries = asyncio.run(record(write_sqlite(Path(tmp) / "demo.sqlite", seed)))
    return queries, template[0]


def demo_quality(seeds: Sequence[int] = (0, 1, 2), wrong_fraction: float = 0.25) -> QualityModel:
    """Accuracy per knob setting on the demo questions alone (``run_quality``), as a ``QualityModel``."""
    rep = run_quality(seeds=seeds, wrong_fraction=wrong_fraction)
    return QualityModel({k: rep.accuracy(k, "demo") for k in rep.settings}, f"demo questions: {rep.source_text()}")


@dataclass
class LiveVariant:
    """One variant's outcome per seed, live and simulated."""

    variant: str
    live: list[Outcome] = field(default_factory=list)
    sim: list[Outcome] = field(default_factory=list)


@dataclass
class LiveBurstReport:
    """A live burst run beside its simulated prediction."""

    pattern: str
    load: float
    rate_qps: float
    slo_s: float
    time_scale: float
    cluster: str
    workflows: int
    seeds: list[int]
    variants: list[LiveVariant]

    def goodput(self, v: LiveVariant, world: str) -> float:
        """Correct answers within the deadline over arrivals, over every seed, in ``world`` (live or sim)."""
        outs: list[Outcome] = v.live if world == "live" else v.sim
        arrived = sum(o.arrived for o in outs)
        return sum(o.correct_met for o in outs) / arrived if arrived else 0.0

    def ratio(self, v: LiveVariant, world: str) -> float | None:
        """``v``'s goodput over the best baseline's (the baselines at full quality, with or without their
        admission), in one world."""
        base = [b for b in self.variants if is_baseline(b.variant)]
        if not base:
            return None
        best = max(self.goodput(b, world) for b in base)
        return self.goodput(v, world) / best if best > 0 else None

    def to_json(self) -> dict[str, Any]:
        """Everything, for ``--json``."""

        def fig(outs: list[Outcome]) -> dict[str, float]:
            n = sum(o.arrived for o in outs) or 1
            return {
                "slo_attainment": sum(o.met for o in outs) / n,
                "goodput_correct_share": sum(o.correct_met for o in outs) / n,
                "accuracy": sum(o.accuracy * o.arrived for o in outs) / n,
                "degraded_share": sum(o.degraded for o in outs) / n,
                "refused_share": sum(o.refused + o.shed for o in outs) / n,
            }

        worlds = ("live", "sim")
        variants = [
            {"variant": v.variant, **{w: fig(getattr(v, w)) for w in worlds}}
            | {f"ratio_{w}": self.ratio(v, w) for w in worlds}
            for v in self.variants
        ]
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "variants"}, "variants": variants}


def format_live_report(rep: LiveBurstReport) -> str:
    """A table: per variant, live and simulated attainment, goodput, accuracy, degraded and refused shares and
    ratio."""
    doc = rep.to_json()
    lines = [
        f"{rep.pattern} at {rep.load:g} of the fluid bound ({rep.rate_qps:.3f} questions/s modelled), "
        f"deadline {rep.slo_s:.1f} s modelled, {rep.workflows} questions x {len(rep.seeds)} seeds, "
        f"{rep.cluster} emulated at time scale {rep.time_scale:g}",
        f"  {'variant':<22} {'world':<5} {'SLO':>6} {'goodput':>8} {'accuracy':>8} {'degraded':>8} {'refused':>8} "
        f"{'vs best':>8}",
    ]
    for v, lv in zip(doc["variants"], rep.variants, strict=True):
        for world in ("live", "sim"):
            if world == "live" and not lv.live:
                continue  # simulated only
            f = v[world]
            r = v[f"ratio_{world}"]
            lines.append(
                f"  {v['variant']:<22} {world:<5} {f['slo_attainment']:6.3f} {f['goodput_correct_share']:8.3f} "
                f"{f['accuracy']:8.3f} {f['degraded_share']:8.3f} {f['refused_share']:8.3f} "
                f"{'' if r is None else f'{r:7.2f}x':>8}"
            )
    return "\n".join(lines)


async def _ask_all(
    url: str, key: str, questions: Sequence[Any], arrivals_wall: Sequence[float], deadline_wall: float, db_path: Path
) -> list[tuple[bool, bool, bool, dict[str, Any]]]:
    """Ask each question at its arrival time; per question (met, correct, degraded, what the answer said:
    status, latency, the degradation decisions and each call's queueing and running time)."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=256, keepalive_expiry=4.0)
    gold = {sql: execute_sqlite(db_path, sql) for sql in {q.query for q in questions}}

    async def one(client: httpx.AsyncClient, q: Any) -> tuple[bool, bool, bool, dict[str, Any]]:
        r, data = await post_question(client, question_body(q.question, DB_ID, q.evidence, deadline_wall), key)
        if r is None or not data:
            why = data.get("error") if r is None else f"HTTP {r.status_code}: not a JSON object"
            return False, False, False, {"error": why}
        ok = data.get("status") == "ok"
        met = ok and bool(data.get("deadline_met"))
        correct = ok and matches_gold(q.query, gold[q.query], data.get("rows") or [])
        rec = {k: data.get(k) for k in ("status", "latency_s", "local_s", "deadline_met", "revisions", "degraded")}
        if r.status_code in (429, 503):  # refused at admission or shed: an arrival not answered
            rec["refused"] = r.status_code
        rec["correct"] = correct
        rec["calls"] = [
            [c.get("kind"), c.get("worker"), c.get("queued_s"), c.get("run_s")] for c in data.get("stages") or []
        ]
        return met, correct, bool(data.get("degraded")), rec

    async with httpx.AsyncClient(base_url=url, timeout=max(120.0, 4 * deadline_wall), limits=limits) as client:
        # Warm-up, not counted: the pipeline predicts with its prior until it has answered MIN_QUESTIONS
        # questions on the database; the simulator predicts with the fitted template from
        # the start. A few questions one at a time, with a deadline that never binds, close that gap.
        for q in questions[:MIN_QUESTIONS]:
            await post_question(client, question_body(q.question, DB_ID, q.evidence, 100 * deadline_wall), key)
        return await scheduled(arrivals_wall, lambda i: one(client, questions[i]))


def run_live_burst(
    base: Setup,
    pattern: tuple[str, Pattern],
    load: float,
    variants: Sequence[str],
    quality: QualityModel,
    *,
    cluster: str,
    time_scale: float,
    answers_seed: int = 0,
    progress: Callable[[str], None] | None = None,
    dump: list[dict[str, Any]] | None = None,
    log_dir: Path | None = None,
    simulate_only: bool = False,
) -> LiveBurstReport:
    """Run every variant live (one emulated cluster and gateway per run) and in the simulator, per seed of
    ``base`` (whose ``queries`` are ``record_demo(answers_seed)``'s), at ``load`` of the fluid bound.

    ``dump``: when a list, one entry per variant and seed is appended with every question side by side
    (``question_records``): what the simulator and the live gateway each did with it. ``log_dir``: keep each
    run's configuration and the cluster's and gateway's logs there (one folder per variant and seed).
    ``simulate_only``: the simulator's side alone (seconds, where the live side takes the arrival span)."""
    name, path = pattern
    rate = load * base.bound.rate_qps
    if len(demo_questions()) != len(base.queries):
        raise ValueError("base.queries must be the recorded demo queries (one per demo question)")
    acc_full = quality.accuracy(FULL)
    report = LiveBurstReport(name, load, rate, base.slo_s, time_scale, cluster, base.n_workflows, base.seeds, [])
    for variant in variants:
        v = parse_variant(variant)
        if v.admission == "saturation":
            raise ValueError(f"{variant}: llm-d's flow control (saturation shedding) runs in the simulator only")
        policy, mode = v.policy, v.mode
        lv = LiveVariant(variant)
        st = _setup_for(base, path, mode, quality)
        # A queue-length 429 runs at the limit best in the simulator's tuning seed, live as simulated.
        limit = tuned_queue_limit(st, v, rate, quality, base.tune_seed)
        for s in base.seeds:
            wfs, res, span = simulate_once(st, v, rate, s, queue_limit=limit, log=dump is not None)
            lv.sim.append(outcome(res, len(wfs), span, quality, acc_full))
            if simulate_only:
                continue
            folder = None if log_dir is None else log_dir / f"{variant.replace('+', '-')}-seed{s}"
            live = LiveSettings(cluster, time_scale, s, folder)
            run = _LiveRun(variant, policy, mode, live, base.slo_s * time_scale, answers_seed, v.admission, limit)
            asked, got = run.ask(wfs, base.seed, progress or (lambda _m: None))
            if dump is not None:
                records = question_records(wfs, res, [q.question for q in asked], [g[3] for g in got])
                dump.append({"variant": variant, "seed": s, "time_scale": time_scale, "questions": records})
            met, correct = sum(m for m, *_ in got), sum(c for _, c, _, _ in got)
            correct_met = float(sum(m and c for m, c, _, _ in got))
            refused = sum(1 for *_, rec in got if "refused" in rec)
            accuracy = correct / max(len(got) - refused, 1)  # (of the answered, as the simulator counts it)
            degraded = sum(d for *_, d, _ in got)
            lv.live.append(Outcome(len(got), met, correct_met, accuracy, degraded, span, refused))
        report.variants.append(lv)
    return report


@dataclass(frozen=True)
class _LiveRun:
    """One variant and seed live: the questions asked in the simulator's order, on a rig of its own."""

    variant: str
    policy: str
    mode: str
    live: LiveSettings
    deadline_wall: float
    answers_seed: int
    admission: str | None = None
    """``Variant.admission``: ``predictive`` turns the tenant's on; ``queue`` sets ``limits.max_queued_calls``."""
    max_queued: int | None = None

    def ask(
        self, wfs: Sequence[Any], base_seed: int, say: Callable[[str], None]
    ) -> tuple[list[Any], list[tuple[bool, bool, bool, dict[str, Any]]]]:
        """The questions asked (the k-th the one the simulator's k-th workflow replays) and their answers."""
        questions = demo_questions()
        order = list(range(len(questions)))
        seed, time_scale = self.live.seed, self.live.time_scale
        if seed != base_seed:
            random.Random(seed).shuffle(order)
        asked = [questions[order[i % len(order)]] for i in range(len(wfs))]
        arrivals = [(w.arrival - wfs[0].arrival) * time_scale for w in wfs]
        say(f"{self.variant} seed {seed}: {len(wfs)} questions live over {arrivals[-1]:.0f} s")
        with self.live.folder("hexflow-burst-live-") as folder:
            answers = write_demo_files(folder, self.answers_seed)
            key = bench_tenant(
                folder,
                deadline_s=self.deadline_wall,
                max_concurrent_workflows=100_000,
                name=TENANT,
                quality=self.mode,
                predictive=self.admission == "predictive",
            )
            # Engines without prefix caching, as the simulator runs them here (the recorded calls carry no
            # prefix chains; the emulator caches prompt prefixes by default, as vLLM does).
            emu_args = ["--answers", str(answers), "--no-enable-prefix-caching"]
            config: dict[str, Any] = {"databases_file": "databases.yaml", "prefix_caching": False}
            if self.max_queued is not None:
                config["sections"] = {"limits": {"max_queued_calls": self.max_queued}}
            with self.live.rig(folder, "burst", policy=self.policy, emulator_args=emu_args, **config) as rig:
                db = folder / f"{DB_ID}.sqlite"
                return asked, asyncio.run(_ask_all(rig.url, key, asked, arrivals, self.deadline_wall, db))


def question_records(
    wfs: Sequence[Any], res: SimResult, asked: Sequence[str], live: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per question, side by side: the simulated workflow (arrival, latency, deadline met, knobs used, and
    each degradation decision: when, after which stage, the time left, the predicted remaining duration and
    the knobs) and the live answer's record (``_ask_all``; its times are wall seconds)."""
    by_wid = {r.wid: r for r in res.workflows}
    out: list[dict[str, Any]] = []
    for i, w in enumerate(wfs):
        r = by_wid.get(w.wid)
        sim: dict[str, Any] = {"arrival": w.arrival - wfs[0].arrival}
        if r is not None:
            sim.update(
                latency=r.latency, met=r.met, calls=r.ncalls, knobs=None if r.knobs is None else astuple(r.knobs)
            )
        log = getattr(w, "log", None)
        if log:
            sim["decisions"] = [
                [round(t - w.arrival, 4), at, round(d.time_left_s, 4), round(d.predicted_s, 4), astuple(d.knobs)]
                for t, at, d in log
            ]
        out.append({"index": i, "question": asked[i], "sim": sim, "live": live[i]})
    return out


def live_setup(
    workers: list[WorkerInfo], *, workflows: int, slo_scale: float, seed: int, n_seeds: int, answers_seed: int = 0
) -> Setup:
    """The simulator's scenario for a live burst run: the recorded demo queries on ``workers``."""
    queries, template = record_demo(answers_seed)
    unit = demo_latency(workers, queries)
    scenario: dict[str, Any] = {"n_workflows": workflows, "slo_scale": slo_scale, "seed": seed, "n_seeds": n_seeds}
    return Setup(workers, queries, "demo", **scenario, slo_unit_s=unit, plan_template=template, deadline_rule=True)


def demo_latency(workers: Sequence[WorkerInfo], queries: Sequence[Sequence[CallSpec]]) -> float:
    """The cluster-mean single-request latency of a recorded demo question (``standard_latency``), averaged over
    the questions: the unit of a live burst run's deadline."""
    return sum(standard_latency(workers, q) for q in queries) / len(queries)

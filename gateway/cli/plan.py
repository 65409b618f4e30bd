"""``hexflow plan``: the cheapest (or smallest) mix of workers from the GPU catalogue that meets an SLO at an
arrival rate, found on the simulator, with its margin (``gateway.bench.plan`` has the method)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from gateway.argtypes import nonneg_int, positive_float, positive_int
from gateway.bench.stats import fmt, table
from gateway.cli.common import (
    ALPHA,
    POLICY,
    QUIET,
    REL_TOL,
    SLO_SCALE,
    Command,
    UsageError,
    flag,
    listed,
    opt,
    pick,
    setup_from_args,
    show,
    usage_errors,
    workload_opts,
)
from gateway.core.policy import get_policy
from gateway.errors import UnknownNameError

if TYPE_CHECKING:
    from gateway.bench.plan import Candidate, PlanReport

__all__ = ["PLAN", "PLAN_WORKFLOWS", "ProgressLines", "format_plan_report"]

PLAN_WORKFLOWS = 1000
"""Workflows per simulated run of ``plan`` (default)."""


class ProgressLines:
    """Progress as plain lines (``... `` first) for a stream that is not a terminal: one per step and, within a
    long step, one every ``every_s`` seconds."""

    def __init__(self, stream: TextIO, *, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.t0 = self.last = clock()
        self.runs = 0
        self.step = "starting"

    def describe(self, step: str) -> None:
        """A new step: say so at once."""
        self.step = step
        self._line()

    def update(self, n: int = 1) -> None:
        """``n`` more runs done: a line when ``every_s`` has passed since the last one."""
        self.runs += n
        if self.clock() - self.last >= self.every_s:
            self._line()

    def _line(self) -> None:
        now = self.last = self.clock()
        runs = f"{self.runs} simulated run{'' if self.runs == 1 else 's'}"
        print(f"... {now - self.t0:.0f} s, {runs} done: {self.step}", file=self.stream, flush=True)


def cmd_plan(args: argparse.Namespace) -> int:
    """Run the plan; print the table; write ``--json``; exit 1 when no mix meets the SLO."""
    from tqdm import tqdm

    from gateway.bench.plan import PlanSpec, gpu_options, reference_slo, run_plan
    from gateway.config.gpus import load_gpu_catalog

    gpus = listed("--gpus", args.gpus, "GPU type, e.g. --gpus A100,L40S")
    if not 0 < args.target <= 1:
        raise UsageError(f"--target: must be in (0, 1], got {args.target}")
    get_policy(args.policy)
    catalog = load_gpu_catalog(args.catalog)
    if args.model not in catalog.models:
        raise UsageError(f"--model: unknown model {args.model!r}; known: {', '.join(sorted(catalog.models))}")
    with usage_errors("--gpus: ", UnknownNameError):
        gpu_options(catalog, args.model, gpus)
    if args.slo_s is not None:
        slo_s, slo_ref = args.slo_s, "given (--slo-s)"
    else:
        slo_s, ref = reference_slo(catalog, args.model, gpus, args.slo_scale)
        slo_ref = f"{args.slo_scale:g} x the standard workflow alone on one {ref} worker"
    workload = setup_from_args(args, n_seeds=args.seeds)
    with usage_errors():
        spec = PlanSpec(
            gpus=tuple(gpus),
            rate_qps=args.rate,
            slo_s=slo_s,
            slo_reference=slo_ref,
            max_workers=args.max_workers,
            budget_usd_per_hour=args.budget,
            find_margin=not args.no_margin,
            **pick(args, "model", "policy", "alpha", "objective", "target", "rel_tol"),
        )
        if args.quiet:
            report = run_plan(catalog, workload, spec)
        elif sys.stderr.isatty():
            with tqdm(desc="plan", unit="run", leave=False) as bar:
                report = run_plan(catalog, workload, spec, progress=bar.update, describe=bar.set_postfix_str)
        else:  # a pipe or a log: a bar would draw nothing there for minutes
            lines = ProgressLines(sys.stderr)
            report = run_plan(catalog, workload, spec, progress=lines.update, describe=lines.describe)
    return show(args, format_plan_report(report, show=args.show), report.to_json, ok=report.answer is not None)


def _usd(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


_VERDICTS = {"pruned": "pruned: bound < rate", "failed": "missed the SLO", "met": "meets the SLO"}


def _row(c: Candidate, answer: bool) -> list[str]:
    verdict = _VERDICTS[c.verdict] + ("  <- answer" if answer else "")
    att = "-" if c.min_attainment is None else f"{c.min_attainment:.3f}"
    p95 = fmt(max(c.p95_s)) if c.p95_s else "-"
    return [c.label, verdict, str(c.workers), _usd(c.usd_per_hour), f"{c.bound_qps:.4f}", att, p95]


def format_plan_report(report: PlanReport, *, show: int = 5) -> str:
    """The question, the table (the ``show`` mixes just cheaper than the answer, then the answer), the answer
    with its margin, or why there is none."""
    s = report.spec
    alpha = f" (alpha {report.alpha:g})" if report.alpha is not None else ""
    seeds = len(report.seeds)
    lines = [
        f"plan: {report.trace}, {report.n_workflows} workflows x {seeds} seed{'s' if seeds > 1 else ''}, "
        f"{s.model} at {s.rate_qps:g} workflows/s; SLO {s.slo_s:.1f} s ({s.slo_reference}), attainment >= "
        f"{s.target:.0%} on every seed; policy {s.policy}{alpha}; prefix caching "
        f"{'on' if report.prefix_caching else 'off'}",
    ]
    per_worker = ", ".join(
        f"{o.gpu} x{o.tp} GPUs" + (f" ${o.usd_per_hour:.2f}/h" if o.usd_per_hour is not None else "")
        for o in report.options
    )
    budget = (
        f"; {report.over_budget} over the ${s.budget_usd_per_hour:g}/h budget not tried"
        if s.budget_usd_per_hour is not None
        else ""
    )
    lines.append(
        f"mixes: {report.total_mixes} of up to {s.max_workers} workers, by {report.objective} "
        f"(a worker: {per_worker}){budget}"
    )
    rows = [_row(c, False) for c in report.next_cheaper(show)]
    if report.answer is not None:
        rows.append(_row(report.answer, True))
    if rows:
        lines += ["", table(["mix", "verdict", "workers", "usd/h", "bound_qps", "slo_min", "p95_s"], rows, left=2)]
    lines.append("")
    a = report.answer
    if a is not None:
        gpus = sum(n * o.tp for n, o in zip(a.counts, report.options, strict=True))
        price = f", ${a.usd_per_hour:.2f}/h" if a.usd_per_hour is not None else ""
        lines.append(f"answer: {a.label} ({a.workers} worker{'s' if a.workers > 1 else ''}, {gpus} GPUs{price})")
        if report.capacity_per_seed:
            per_seed = ", ".join(f"{c:.4g}" for c in report.capacity_per_seed)
            lines.append(
                f"margin: {report.margin:.2f}x: meets the SLO up to {report.capacity_qps:.4g} workflows/s on every "
                f"seed (per seed {per_seed}); fluid bound {a.bound_qps:.4g} ({a.bound_qps / s.rate_qps:.2f}x)"
            )
        else:
            lines.append(f"margin: not searched; fluid bound {a.bound_qps:.4g} ({a.bound_qps / s.rate_qps:.2f}x)")
    else:
        where = (
            f"within the ${s.budget_usd_per_hour:g}/h budget"
            if s.budget_usd_per_hour is not None
            else f"of up to {s.max_workers} workers"
        )
        best = report.best_failed
        if best is not None and best.min_attainment is not None:
            why = f"best attainment {best.min_attainment:.3f} ({best.label})"
        elif report.considered:
            top = max(report.considered, key=lambda c: c.bound_qps)
            why = f"every fluid bound is below the rate (highest {top.bound_qps:.4g}: {top.label})"
        else:
            why = "every mix costs more" if report.over_budget else "no mix to try"
        lines.append(f"no mix {where} meets the SLO at {s.rate_qps:g} workflows/s: {why}")
    lines.append(
        f"searched {len(report.considered)} mixes: {report.programs_solved} fluid-bound programs, "
        f"{report.simulations} simulated runs, {report.seconds:.1f} s"
    )
    return "\n".join(lines)


PLAN = Command(
    "plan",
    cmd_plan,
    "the cheapest mix of workers from the GPU catalogue that meets an SLO at a rate (simulated)",
    "Search mixes of the given GPU types (each worker one engine of the model, as config/gpus.yaml sizes it), "
    "cheapest first; skip those whose fluid bound is below the rate; simulate the rest at the rate until one meets "
    "the SLO on every seed. Prints that mix, its margin (its own capacity over the rate) and the cheaper mixes that "
    "did not make it. Exit 0: found; 1: no mix within the budget or --max-workers meets the SLO; 2: bad input.",
    (
        *workload_opts(
            PLAN_WORKFLOWS,
            cluster=False,
            slo=SLO_SCALE(
                "SLO = this x the standard workflow's lone latency on one worker of the catalogue's reference GPU "
                "(calibration.reference_gpu; the first of --gpus when the model has no profile there); the same "
                "deadline for every mix"
            ),
        ),
        opt("--rate", positive_float, None, "arrival rate to plan for, workflows/s", required=True),
        opt("--gpus", str, None, "GPU types the mix may use, comma-separated (e.g. A100,L40S)", required=True),
        opt("--model", str, "llama-3.1-70b", "served model"),
        opt("--slo-s", positive_float, None, "SLO in seconds (overrides --slo-scale)"),
        opt(
            "--budget",
            positive_float,
            None,
            "most USD per hour the mix may cost (worker price: the GPU's usd_per_hour x its tp); mixes above it are "
            "not tried",
        ),
        opt(
            "--objective",
            str,
            None,
            "order mixes by cost (USD/h) or worker count (default: cost when every GPU has a price)",
            choices=("cost", "workers"),
        ),
        opt("--max-workers", positive_int, 16, "most workers in a mix"),
        POLICY,
        ALPHA("WB alpha (default: the policy's)"),
        opt("--seeds", positive_int, 3, "seeds per mix; a mix must meet the SLO on every one"),
        opt("--target", positive_float, 0.95, "SLO attainment a mix must reach"),
        REL_TOL("relative precision of the margin"),
        flag("--no-margin", "skip the answer's capacity search"),
        opt("--show", nonneg_int, 5, "cheaper mixes listed before the answer"),
        opt("--catalog", str, None, "GPU catalogue file (default: the packaged config/gpus.yaml)"),
        QUIET("no progress on stderr (a bar on a terminal, else a line per step and every few seconds)"),
    ),
)

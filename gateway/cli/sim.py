"""The simulator's commands: ``simulate`` (one policy, one run), ``bench`` (policies side by side, or with
``--live`` on the live gateway next to the simulator; the other ``bench`` subcommands are in ``gateway.cli.bench``),
``tune`` and ``sim-speed`` (how many calls per second the simulator itself runs)."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from gateway.argtypes import fractions, positive_float, positive_floats, positive_int
from gateway.bench.stats import cells, fmt, table
from gateway.cli import bench, calibrate, text2sql
from gateway.cli.common import (
    ALPHA,
    BENCH_WORKFLOWS,
    JOBS,
    LOG_DIR,
    PLOT,
    POLICY,
    POLICY_LIST,
    QUIET,
    REL_TOL,
    SEEDS,
    TIME_SCALE,
    Command,
    UsageError,
    flag,
    listed,
    live_settings,
    opt,
    pick,
    policy_names,
    setup_from_args,
    show,
    workload_opts,
    write_json,
)
from gateway.core.policy import POLICIES, get_policy

if TYPE_CHECKING:
    from gateway.bench.sidebyside import BenchReport
    from gateway.core.workflow import StagedWorkflow
    from gateway.sim.simulator import SimResult

__all__ = ["BENCH", "LIVE_BENCH_WORKFLOWS", "SIMULATE", "SIM_SPEED"]

LIVE_BENCH_WORKFLOWS = 150
"""Workflows per policy of ``bench --live`` (default): each is replayed in real time."""
RATE = opt("--rate", positive_float, None, "arrival rate, workflows/s (default 0.6 x fluid bound)")


def cmd_simulate(args: argparse.Namespace) -> int:
    """One policy, one run: headline figures, per tenant when there are several."""
    from gateway.bench.bound import solve_fluid_bound
    from gateway.bench.enginetime import bound_engine_time, engine_time_of, format_engine_time
    from gateway.config import load_cluster_config
    from gateway.sim.simulator import Simulator

    get_policy(args.policy)
    setup = setup_from_args(args)
    net = load_cluster_config(args.cluster).interconnect()
    solved = solve_fluid_bound(setup.workers, setup.queries, prefix_caching=setup.prefix_caching)
    bound = solved.rate_qps
    links = net.matrix([w.name for w in setup.workers])
    split = solve_fluid_bound(
        setup.workers, setup.queries, prefix_caching=setup.prefix_caching, split=True, links=links
    )
    rate = args.rate if args.rate is not None else round(0.6 * bound, 4)
    wfs = setup.workflows(rate)
    t0 = time.perf_counter()
    run_with = pick(args, "alpha", "seed", "admission")
    sim = Simulator(setup.workers, args.policy, **run_with, prefix_caching=setup.prefix_caching, interconnect=net)
    res = sim.run(wfs)
    wall = time.perf_counter() - t0
    rows, summaries = _tenant_summaries(res, wfs)
    print(
        f"{setup.trace} on {args.cluster} [{', '.join(w.profile.gpu for w in setup.workers)}], policy {args.policy}"
        f", rate {rate:g} qps (fluid bound {bound:.4f}), SLO {setup.slo_s:.1f} s"
    )
    print(
        f"fluid bound with split calls (prefill/decode disaggregation within the cluster file's roles and links): "
        f"{split.rate_qps:.4f} ({split.rate_qps / bound:.3f}x; {split.split_share:.0%} of the calls split)"
    )
    print(table(["tenant", "workflows", "p50_s", "p95_s", "p99_s", "slo", "tput_qps"], rows))
    print(f"simulated {res.num_calls} calls in {wall:.2f} s wall ({res.num_calls / max(wall, 1e-9):,.0f} calls/s)")
    engines = None
    run_time = engine_time_of(sim, res)
    if run_time:
        at_bound = bound_engine_time(setup.workers, solved)
        engines = {"run": [e.to_json() for e in run_time], "bound": [e.to_json() for e in at_bound]}
        if args.engines:
            print(format_engine_time(run_time, at_bound))
    admitted = _admission_summary(res, wfs) if args.admission else None
    if args.json:
        out = {
            "policy": args.policy,
            "trace": setup.trace,
            "cluster": args.cluster,
            "rate_qps": rate,
            "alpha": args.alpha,
            "slo_s": setup.slo_s,
            "fluid_bound_qps": bound,
            "fluid_bound_split_qps": split.rate_qps,
            "summary": summaries,
            "admission": admitted,
            "engines": engines,
            "calls_per_s": res.num_calls / max(wall, 1e-9),
        }
        _write_run(args.json, out)
    return 0


def _write_run(path: str, doc: dict[str, Any]) -> None:
    """``simulate``'s and ``tune``'s ``--json``, silently: what JSON cannot hold as null."""
    write_json(path, doc, say=False, allow_nan=True, default=lambda _: None)


def _tenant_summaries(res: SimResult, wfs: list[StagedWorkflow]) -> tuple[list[list[str]], dict[str, dict[str, Any]]]:
    """The table rows and the JSON summaries of a run: all workflows, then each tenant's when there are several."""
    from gateway.sim.metrics import summarize

    tenants = sorted({w.tenant for w in wfs})
    rows = []
    summaries = {}
    for t in [None, *tenants] if len(tenants) > 1 else [None]:
        s = summarize(res, total=sum(1 for w in wfs if t is None or w.tenant == t), tenant=t)
        summaries[t or "all"] = s.as_dict()
        rows.append(
            [t or "all", *cells(s, "workflows p50_s:.1f p95_s:.1f p99_s:.1f slo_attainment:.3f throughput_qps:.4f")]
        )
    return rows, summaries


def _admission_summary(res: SimResult, wfs: list[StagedWorkflow]) -> dict[str, Any]:
    """What admission refused and what the accepted workflows met (printed, and for the JSON)."""
    met = sum(1 for r in res.workflows if r.met)
    span = max(w.arrival for w in wfs) - min(w.arrival for w in wfs) if len(wfs) > 1 else 0.0
    share = met / max(len(wfs) - len(res.rejected), 1)
    goodput = met / span if span > 0 else math.nan
    print(
        f"admission: {len(res.rejected)} of {len(wfs)} refused; {met} met their deadline "
        f"({share:.1%} of accepted); goodput {fmt(goodput, 4)}/s"
    )
    return {
        "arrived": len(wfs),
        "rejected": len(res.rejected),
        "met": met,
        "met_share_of_accepted": share,
        "goodput_qps": goodput if math.isfinite(goodput) else None,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    """Policies side by side over several seeds: capacities (mean, spread, per seed), the best baseline, the
    ratio to it, the fluid bound, and P95 at the best baseline's capacity; the same in ``--json``."""
    if args.live:
        return cmd_bench_live(args)
    if args.workflows is None:
        args.workflows = BENCH_WORKFLOWS
    from tqdm import tqdm

    from gateway.bench.sidebyside import GRID_FRACTIONS, bench_steps, plot_report, run_bench

    policies = policy_names(args.policies)
    setup = setup_from_args(args, n_seeds=args.seeds)
    rates: list[float] | None = args.rate
    if args.no_capacity and rates is None:
        shares = ", ".join(f"{f:g}" for f in GRID_FRACTIONS)
        print(
            f"--no-capacity without --rate: measuring at {shares} x the fluid bound "
            "(give --rate R1,R2,... for other rates, in workflows/s)"
        )
    steps = bench_steps(policies, find_capacity=not args.no_capacity, fixed_alpha=args.alpha)
    with tqdm(total=steps, desc="bench", unit="policy-phase", disable=args.quiet or None, leave=False) as bar:
        report = run_bench(
            setup,
            policies,
            rates=rates,
            fixed_alpha=args.alpha,
            find_capacity=not args.no_capacity,
            **pick(args, "rel_tol", "jobs"),
            progress=bar.update,
        )
    return show(
        args, format_bench_report(report, args.cluster), write=report.write_json, plot=partial(plot_report, report)
    )


def format_bench_report(report: BenchReport, cluster: str) -> str:
    """The printed form of a bench report: the same figures as its JSON."""
    bound = report.fluid_bound_qps
    seeds = report.seeds
    tuning = (
        f"alpha tuned once on seed {report.tune_seed} at {report.tune_rate_qps:.4f} qps"
        if report.tune_rate_qps is not None
        else "alpha fixed"
    )
    lines = [
        f"{report.trace} on {cluster} [{', '.join(report.cluster)}], SLO {report.slo_scale:g}x = {report.slo_s:.1f} s, "
        f"{report.n_workflows} workflows per run, seeds {', '.join(map(str, seeds))}; {tuning}",
        f"fluid bound (LP at the engines' limits): {bound:.4f} workflows/s",
    ]
    best = report.best_baseline
    ref = report.reference_rate_qps
    if report.capacity_qps:
        rows = []
        for p, r in report.policies.items():
            cap = r.capacity
            if cap is None:
                continue
            ratio = report.ratio_vs_best_baseline(p)
            p95 = report.p95_at(p, ref) if ref is not None else None
            rows.append(
                [
                    p,
                    r.role,
                    f"{cap.mean:.4f}",
                    f"{cap.min:.4f}-{cap.max:.4f}",
                    " ".join(f"{v:.4f}" for v in cap.values),
                    f"{cap.mean / bound:.1%}" if bound > 0 else "-",
                    f"{ratio[0]:.3f}x" if ratio else "-",
                    "-" if r.alpha is None else f"{r.alpha:.1f}",
                    fmt(p95.mean) if p95 else "-",
                ]
            )
        headers = ["policy", "role", "capacity_qps", "min-max", "per_seed", "of_bound", "vs_best", "alpha", "p95@ref_s"]
        lines.append(table(headers, rows, left=2))
        if best is not None and ref is not None:
            lines.append(
                f"best baseline: {best}, capacity {ref:.4f} qps (mean of {len(seeds)} seeds; "
                f"ablations are not baselines)"
            )
            for p, r in report.policies.items():
                ratio = report.ratio_vs_best_baseline(p)
                if r.role != "ours" or ratio is None:
                    continue
                per_seed = ", ".join(f"{x:.3f}x" for x in ratio[1])
                gain = report.p95_gain_vs_best(p, ref)
                p95_text = f"; P95 at {ref:.4f} qps {gain:.2f}x lower than the best baseline's" if gain else ""
                lines.append(f"{p} vs best baseline: capacity {ratio[0]:.3f}x (per seed {per_seed}){p95_text}")
            if report.engine_time:
                from gateway.bench.enginetime import format_engine_time_summary

                lines.append(
                    f"engine time per completed workflow at {ref:.4f} qps (seed {seeds[0]}; all engines; base: "
                    "iteration base, tokens: token_s per batched token, other: context, attention, per-call host "
                    "work; batch: the engines' mean calls per iteration), against the fluid bound's solution:"
                )
                lines.append(format_engine_time_summary(report.engine_time, report.bound_time))
    for rate in report.rates:  # the rates asked for (or the grid), each in a table of its own
        lines += _rate_table(report, rate, f"at {rate:.4f} qps:")
    lines.append(f"({report.seconds:.0f} s)")
    return "\n".join(lines)


def _rate_table(report: BenchReport, rate: float, title: str) -> list[str]:
    """Latency and SLO attainment of every policy at one rate (means over seeds), with the P95 gain over
    the best baseline at that rate (the baseline with the lowest mean P95 there)."""
    rows = []
    for p in report.policies:
        runs = report.policies[p].at(rate)
        if not runs:
            continue
        mean = [fmt(statistics.fmean(getattr(x.summary, k) for x in runs)) for k in ("p50_s", "p95_s", "p99_s")]
        slo = statistics.fmean(x.summary.slo_attainment for x in runs)
        gain = report.p95_gain_vs_best(p, rate)
        rows.append([p, *mean, f"{slo:.3f}", f"{gain:.2f}x" if gain else "-"])
    return [title, table(["policy", "p50_s", "p95_s", "p99_s", "slo", "p95_gain_vs_best"], rows)]


def cmd_bench_live(args: argparse.Namespace) -> int:
    """``bench --live``: each policy on the live gateway over an emulated cluster, and its simulation."""
    from gateway.bench.livebench import format_live_report, plot_live_report, run_live_bench

    policies = policy_names(args.policies)
    if args.tenants:
        raise UsageError("--tenants: not supported with --live (the replay uses one tenant)")
    rate: float | None = None
    if args.rate:
        if len(args.rate) > 1:
            raise UsageError(f"--rate: with --live give one rate in workflows/s, got {len(args.rate)}")
        rate = args.rate[0]
    report = run_live_bench(
        live_settings(args),
        args.trace,
        policies,
        workflows=args.workflows if args.workflows is not None else LIVE_BENCH_WORKFLOWS,
        rate_qps=rate,
        arrivals_csv=args.arrivals,
        progress=not args.quiet,
        **pick(args, "slo_scale", "alpha", "cv"),
    )
    return show(args, format_live_report(report), write=report.write_json, plot=partial(plot_live_report, report))


def cmd_sim_speed(args: argparse.Namespace) -> int:
    """Simulated calls per second (wall and CPU time) of each policy on each cluster, under load."""
    from gateway.bench.simspeed import measure_speed

    policies = policy_names(args.policies)
    clusters = listed("--clusters", args.clusters, "cluster")
    repeats = args.repeats
    results = []
    for cluster in clusters:
        args.cluster = cluster
        results += measure_speed(cluster, setup_from_args(args), policies, **pick(args, "load", "repeats", "rate"))
    columns = "cluster workers policy rate_qps:.4f calls wall_s:.2f calls_per_s:,.0f calls_per_cpu_s:,.0f"
    rows = [cells(r, columns) for r in results]
    from gateway.bench.simspeed import build_kind

    print(
        f"{args.trace}, {args.workflows} workflows at "
        f"{f'{args.rate:g}/s' if args.rate is not None else f'{args.load:g} x the fluid bound'}, fastest of {repeats} "
        f"run{'s' if repeats > 1 else ''}; build: {build_kind()} (`make native` compiles the hot modules)"
    )
    print(table(["cluster", "workers", "policy", "rate_qps", "calls", "wall_s", "calls/s", "calls/cpu_s"], rows))
    if args.json:
        write_json(args.json, [r.as_dict() for r in results], allow_nan=True)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune alpha on a window of traffic; print the table of all grid points."""
    from gateway.bench.simbench import fluid_bound
    from gateway.config.operations import TuningConfig
    from gateway.sim.tune import ALPHA_GRID, tune_alpha

    policy = get_policy(args.policy)
    if not policy.uses_alpha:
        raise UsageError(f"--policy: {policy.name} does not use alpha")
    setup = setup_from_args(args)
    rate = args.rate
    if rate is None:
        rate = round(0.6 * fluid_bound(setup.workers, setup.queries, prefix_caching=setup.prefix_caching), 4)
    window = setup.workflows(rate)[: TuningConfig().window_workflows if args.window is None else args.window]
    t0 = time.perf_counter()
    res = tune_alpha(
        setup.workers,
        policy.name,
        window,
        grid=ALPHA_GRID if not args.grid else tuple(args.grid),
        seed=args.seed,
        smooth=not args.no_smooth,
        prefix_caching=setup.prefix_caching,
    )
    wall = time.perf_counter() - t0
    columns = "p50_s:.1f p95_s:.1f slo_attainment:.3f"
    rows = [[f"{p.alpha:.2f}", *cells(p.summary, columns), "<-" if p.alpha == res.alpha else ""] for p in res.points]
    span = window[-1].arrival - window[0].arrival
    print(f"window: {len(window)} workflows over {span:.0f} s at {rate:g} qps on {args.cluster}")
    print(table(["alpha", "p50_s", "p95_s", "slo", "chosen"], rows))
    print(f"alpha = {res.alpha:.2f}  (tuned in {wall:.2f} s)")
    if args.json:
        points = [{"alpha": p.alpha, **p.summary.as_dict()} for p in res.points]
        doc = {"alpha": res.alpha, "rate_qps": rate, "window_workflows": len(window), "seconds": wall, "points": points}
        _write_run(args.json, doc)
    return 0


SIMULATE = Command(
    "simulate",
    cmd_simulate,
    "one policy, one run on the simulator",
    "Run one scheduling policy on the cluster simulator for one workload (a trace or the built-in chess-bird "
    "generator) at one arrival rate, and print P50/P95/P99 latency, SLO attainment and the cluster's fluid bound, "
    "per tenant when there are several; --engines adds each engine's time per workflow.",
    (
        *workload_opts(400),
        POLICY,
        RATE,
        ALPHA("WB alpha in [0, 1] (default: the policy's)"),
        flag(
            "--admission",
            "admit each workflow as the live gateway does (predicted completion within 90%% of the deadline)",
        ),
        flag(
            "--engines",
            "print where each engine's time went per completed workflow (iteration base, tokens, the rest), its "
            "busy share and mean batch, beside the fluid bound's solution (always in --json)",
        ),
    ),
)
BENCH = Command(
    "bench",
    cmd_bench,
    "policies side by side: P50/P95/P99, SLO attainment, capacity",
    "Run several policies side by side on the cluster simulator over several seeds: P50/P95/P99 latency and SLO "
    "attainment at a grid of rates, each policy's capacity (the highest rate with >= 95 percent SLO attainment, "
    "found by bisection) and the cluster's fluid bound; --live runs them on a live gateway over emulated workers "
    "instead. The subcommands below are the other benchmarks.",
    (
        *workload_opts(None),
        POLICY_LIST(f"comma-separated, from: {', '.join(POLICIES)} (default: all)", default=",".join(POLICIES)),
        SEEDS("seeds per point, each a capacity search"),
        REL_TOL,
        opt(
            "--rate",
            positive_floats,
            None,
            "also measure at these rates, workflows/s, comma-separated (with --no-capacity: only these; without "
            "--rate a grid of 0.2-0.7 x the fluid bound); with --live: one rate",
        ),
        ALPHA("fixed alpha (default: tuned once, on a separate seed, at the best baseline's capacity)"),
        PLOT("write a PNG of P95 and SLO attainment against rate"),
        flag("--no-capacity", "skip the capacity bisection"),
        QUIET,
        JOBS("policies run in parallel"),
        flag(
            "--live",
            "run each policy on the live gateway over an emulated cluster and compare with the simulator "
            f"(default {LIVE_BENCH_WORKFLOWS} workflows, rate 0.55 x the fluid bound)",
        ),
        TIME_SCALE("--live: real seconds per modelled second"),
        LOG_DIR("--live: keep subprocess logs and configs here (default: a temporary folder)"),
    ),
    (
        bench.OVERLOAD,
        bench.ADMISSION,
        bench.TUNER,
        calibrate.FIDELITY,
        calibrate.FIDELITY_VLLM,
        calibrate.OPEN_LOOP,
        calibrate.MISLABEL,
        text2sql.QUALITY,
        bench.BURST,
        text2sql.REFUSALS,
    ),
)
SIM_SPEED = Command(
    "sim-speed",
    cmd_sim_speed,
    "the simulator's own speed: simulated calls/s per cluster and policy",
    "Measure the simulator itself: simulated LLM calls per second of wall and CPU time for each policy on each "
    "cluster, under load (compare a native build's with `make native`).",
    (
        *workload_opts(1000),
        opt("--clusters", str, "paper-4gpu,mixed-64", "comma-separated cluster files or names (--cluster is ignored)"),
        POLICY_LIST(default="hexgen,lw-fcfs"),
        opt("--load", positive_float, 0.7, "arrival rate as a fraction of the fluid bound"),
        opt(
            "--rate",
            positive_float,
            None,
            "arrival rate in workflows/s instead of --load (no fluid bound solved: what a run under valgrind's "
            "instruction counter wants, docs/benchmarks.md)",
        ),
        opt("--repeats", positive_int, 3, "runs per point; the fastest counts"),
    ),
)
TUNE = Command(
    "tune",
    cmd_tune,
    "tune alpha on a window of traffic by simulation",
    "Replay a window of workflows in the simulator once per alpha of a grid (what the gateway's background tuner "
    "does with its recent traffic) and print each alpha's P50, P95 and SLO attainment, and the alpha chosen.",
    (
        *workload_opts(400),
        POLICY("the policy whose alpha is tuned"),
        RATE,
        opt(
            "--window",
            positive_int,
            None,
            "workflows in the window: the first N of the run (default: the gateway's tuning.window_workflows)",
        ),
        opt("--grid", fractions, None, "alphas in [0, 1] to try, comma-separated (default 0, 0.1, ..., 1)"),
        flag("--no-smooth", "pick the raw minimum P95, not the neighbourhood mean"),
    ),
)

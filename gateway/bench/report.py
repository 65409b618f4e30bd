"""The full simulated benchmark: every hexgen trace, several SLO scales, every policy (``make bench-full``).

    python -m gateway.bench.report --out out/bench [--traces trace1,...] [--slo-scales 3,5,8]
        [--cluster paper-4gpu] [--workflows 1000] [--jobs 2]

For each (trace, SLO scale) it runs ``hexflow bench`` (JSON and plot per run) and then writes
``summary.md`` and ``summary.json`` with, per run: every policy's capacity, hexgen's capacity against
rr-fcfs and against the best baseline, hexgen's share of the fluid bound, P95 at rr-fcfs's capacity
rate, and the tuned alpha against the best fixed alpha in hindsight. Traces are looked up in
``../shared/data/hexgen-traces``; missing ones are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gateway.bench.simbench import BenchReport, Setup, plot_report, run_bench
from gateway.config import load_cluster
from gateway.core.policy import POLICIES
from gateway.errors import GatewayError
from gateway.sim.metrics import summarize
from gateway.sim.simulator import Simulator
from gateway.sim.tune import ALPHA_GRID, tune_alpha
from gateway.sim.workload import load_queries

TRACES = ("trace1", "trace2", "trace3", "financial", "formula1")
BASELINES = ("rr-fcfs", "p2c-fcfs", "lw-fcfs", "llf", "edf", "vtc")


def hindsight(setup: Setup, rate: float) -> dict[str, Any]:
    """Alpha tuned on another window (seed + 1) against the best fixed alpha on the evaluated run."""
    tuned = tune_alpha(setup.workers, "hexgen", setup.workflows(rate, seed=setup.seed + 1)).alpha
    p95 = {}
    for a in ALPHA_GRID:
        res = Simulator(setup.workers, "hexgen", alpha=a, seed=setup.seed).run(setup.workflows(rate))
        p95[a] = summarize(res, total=setup.n_workflows).p95_s
    best = min(p95, key=lambda a: p95[a])
    return {
        "rate_qps": rate,
        "tuned_alpha": tuned,
        "tuned_p95_s": p95[tuned],
        "best_alpha": best,
        "best_p95_s": p95[best],
        "gap": p95[tuned] / p95[best] - 1.0,
    }


def summarise(report: BenchReport, hs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one (trace, SLO scale) run that the closing note quotes."""
    cap = report.capacity_qps
    base = {p: cap[p] for p in BASELINES if p in cap}
    best_name = max(base, key=lambda p: base[p])
    ref = report.reference_rate_qps
    at_ref = {p.policy: p.summary.p95_s for p in report.results if ref is not None and p.rate_qps == ref}
    base_p95 = {p: v for p, v in at_ref.items() if p in BASELINES}
    best_p95_name = min(base_p95, key=lambda p: base_p95[p]) if base_p95 else None
    hx = at_ref.get("hexgen")
    return {
        "trace": report.trace,
        "slo_scale": report.slo_scale,
        "slo_s": report.slo_s,
        "fluid_bound_qps": report.fluid_bound_qps,
        "capacity_qps": cap,
        "hexgen_vs_rr_capacity": cap["hexgen"] / cap["rr-fcfs"] if cap.get("rr-fcfs") else None,
        "best_baseline": best_name,
        "hexgen_vs_best_capacity": cap["hexgen"] / base[best_name] if base[best_name] else None,
        "hexgen_share_of_bound": cap["hexgen"] / report.fluid_bound_qps,
        "best_baseline_share_of_bound": base[best_name] / report.fluid_bound_qps,
        "reference_rate_qps": ref,
        "p95_at_ref_s": at_ref,
        "hexgen_vs_rr_p95": (at_ref["rr-fcfs"] / hx) if hx and "rr-fcfs" in at_ref else None,
        "best_p95_baseline": best_p95_name,
        "hexgen_vs_best_p95": (base_p95[best_p95_name] / hx) if hx and best_p95_name else None,
        "alphas": report.alphas,
        "hindsight": hs,
    }


def _md(rows: list[dict[str, Any]]) -> str:
    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    out = [
        "| trace | SLO | rr-fcfs cap | best baseline (cap) | hexgen cap | vs rr | vs best | hexgen / bound |"
        " P95 gain vs rr | P95 gain vs best (who) | tuned vs hindsight |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cap = r["capacity_qps"]
        gaps = ", ".join(f"{h['gap']:+.1%}" for h in r["hindsight"])
        out.append(
            f"| {r['trace']} | {r['slo_scale']:g}x | {cap.get('rr-fcfs', 0):.4f} | {r['best_baseline']} "
            f"({cap[r['best_baseline']]:.4f}) | {cap['hexgen']:.4f} | {f(r['hexgen_vs_rr_capacity'])}x | "
            f"{f(r['hexgen_vs_best_capacity'])}x | {r['hexgen_share_of_bound']:.1%} | {f(r['hexgen_vs_rr_p95'])}x | "
            f"{f(r['hexgen_vs_best_p95'])}x ({r['best_p95_baseline']}) | {gaps} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the full benchmark and write the summary."""
    ap = argparse.ArgumentParser(prog="python -m gateway.bench.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--slo-scales", default="3,5,8")
    ap.add_argument("--cluster", default="paper-4gpu")
    ap.add_argument("--workflows", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = [p for p in args.policies.split(",") if p]
    scales = [float(x) for x in args.slo_scales.split(",")]
    try:
        workers = load_cluster(args.cluster)
        rows: list[dict[str, Any]] = []
        combos = [(t, s) for t in args.traces.split(",") for s in scales]
        for trace, scale in tqdm(combos, desc="bench-full", unit="run"):
            try:
                queries = load_queries(trace, None, random.Random(args.seed))
            except GatewayError as exc:
                print(f"skipping {trace}: {exc}", file=sys.stderr)
                continue
            setup = Setup(workers, queries, trace, n_workflows=args.workflows, slo_scale=scale, seed=args.seed)
            t0 = time.perf_counter()
            report = run_bench(setup, policies, jobs=args.jobs)
            stem = f"{trace}-slo{scale:g}"
            report.write_json(out / f"{stem}.json")
            plot_report(report, out / f"{stem}.png")
            hs = []
            if report.reference_rate_qps:
                hs.append(hindsight(setup, report.reference_rate_qps))
            hs.append(hindsight(setup, 0.8 * report.fluid_bound_qps))
            row = summarise(report, hs)
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
            (out / "summary.md").write_text(_md(rows))
    except GatewayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(_md(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Smoke-sized bench and tuner: the report's shape, capacity search, and the ordering the model gives."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.bench.simbench import Bench, Setup, fluid_bound, plot_report, run_bench, standard_latency
from gateway.config import load_cluster
from gateway.sim.tune import ALPHA_GRID, tune_alpha
from gateway.sim.workload import generate_chess_bird


@pytest.fixture(scope="module")
def setup() -> Setup:
    cluster = load_cluster("paper-4gpu")
    return Setup(cluster, generate_chess_bird(150, random.Random(4)), "chess-bird", n_workflows=150, slo_scale=5.0)


def test_slo_is_scale_times_cluster_mean_standard_workflow_latency(setup: Setup) -> None:
    # paper-4gpu: A100 37.5, A100 37.5, A6000 78.0, L40S (calibrated from L40, faster prefill).
    assert 50.0 < standard_latency(setup.workers) < 57.0
    assert setup.slo_s == pytest.approx(5.0 * standard_latency(setup.workers))


def test_no_policy_sustains_more_than_the_fluid_bound(setup: Setup) -> None:
    bound = fluid_bound(setup.workers, setup.queries)
    s = Setup(setup.workers, setup.queries, "chess-bird", n_workflows=600)
    from gateway.sim.simulator import Simulator

    wfs = s.workflows(2.0 * bound)
    res = Simulator(s.workers, "hexgen").run(wfs)
    span = max(r.finish for r in res.workflows) - min(w.arrival for w in wfs)
    assert len(res.workflows) / span <= bound * 1.02


def test_capacity_bisection_brackets_the_95_percent_point(setup: Setup) -> None:
    bench = Bench(setup, fixed_alpha=0.3)
    bound = fluid_bound(setup.workers, setup.queries)
    cap = bench.capacity("lw-fcfs", bound)
    assert 0.0 < cap <= 1.05 * bound
    assert bench.point("lw-fcfs", cap).summary.slo_attainment >= 0.95
    above = [p for p in bench.points() if p.rate_qps > cap * 1.0001]
    assert above and min(above, key=lambda p: p.rate_qps).summary.slo_attainment < 0.95


def test_smoke_bench_report_json_and_plot(setup: Setup, tmp_path: Path) -> None:
    report = run_bench(setup, ["hexgen", "lw-fcfs", "rr-fcfs"], fixed_alpha=0.3, jobs=1)
    out = tmp_path / "bench.json"
    report.write_json(out)
    doc = json.loads(out.read_text())
    assert set(doc["capacity_qps"]) == {"hexgen", "lw-fcfs", "rr-fcfs"}
    assert doc["fluid_bound_qps"] > 0
    for row in doc["results"]:
        assert {"policy", "trace", "rate_qps", "p50_s", "p95_s", "p99_s", "slo_attainment"} <= set(row)
    rates = {r["rate_qps"] for r in doc["results"] if r["policy"] == "hexgen"}
    assert doc["reference_rate_qps"] in rates
    # On a mixed cluster, round-robin saturates the slow GPUs first.
    assert doc["capacity_qps"]["hexgen"] > 1.2 * doc["capacity_qps"]["rr-fcfs"]
    plot_report(report, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_parallel_bench_gives_the_same_results_as_serial(setup: Setup) -> None:
    small = Setup(setup.workers, setup.queries, "chess-bird", n_workflows=60)
    a = run_bench(small, ["lw-fcfs", "p2c-fcfs"], rates=[0.05, 0.1], find_capacity=False, jobs=1)
    b = run_bench(small, ["lw-fcfs", "p2c-fcfs"], rates=[0.05, 0.1], find_capacity=False, jobs=2)
    assert a.to_json() == b.to_json()


def test_tuner_picks_lowest_p95_and_reports_every_grid_point(setup: Setup) -> None:
    wfs = setup.workflows(0.8 * fluid_bound(setup.workers, setup.queries))
    raw = tune_alpha(setup.workers, "hexgen", wfs, smooth=False)
    assert [p.alpha for p in raw.points] == list(ALPHA_GRID)
    assert raw.best().summary.p95_s <= min(p.summary.p95_s for p in raw.points) * 1.001
    assert all(w._index == -1 for w in wfs)  # the caller's workflows are untouched


def test_smoothed_tuner_minimises_the_neighbourhood_mean(setup: Setup) -> None:
    wfs = setup.workflows(0.8 * fluid_bound(setup.workers, setup.queries))
    res = tune_alpha(setup.workers, "hexgen", wfs)
    p95 = [p.summary.p95_s for p in res.points]
    means = [sum(p95[max(i - 1, 0) : i + 2]) / len(p95[max(i - 1, 0) : i + 2]) for i in range(len(p95))]
    assert means[ALPHA_GRID.index(res.alpha)] <= min(means) * 1.001


def test_tuning_a_five_minute_window_tries_every_grid_point(setup: Setup) -> None:
    # How long it takes is machine-dependent: `hexflow tune` prints it ("tuned in X s") and writes it to
    # its JSON ("seconds"); no test bounds it.
    rate = 0.7 * fluid_bound(setup.workers, setup.queries)
    window = [w for w in setup.workflows(rate) if w.arrival <= 300.0]
    res = tune_alpha(setup.workers, "hexgen", window)
    assert [p.alpha for p in res.points] == list(ALPHA_GRID) and res.alpha in ALPHA_GRID
    assert all(p.summary.workflows == len(window) for p in res.points)

"""``hexflow bench tuner`` at smoke size: the live tuner's window, trigger and rule driven in virtual time,
the best fixed alpha in hindsight, and the report. The figures themselves are in docs/benchmarks.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gateway.bench.simbench import Setup
from gateway.bench.tuner import (
    TARGET_GAP,
    bench_steps,
    format_tuner_report,
    run_fixed,
    run_tuned,
    run_tuner_bench,
)
from gateway.cli import main
from gateway.config import load_cluster
from gateway.config.operations import TuningConfig
from gateway.core.policy import get_policy
from gateway.sim.tune import ALPHA_GRID

WARMUP = 20


@pytest.fixture(scope="module")
def setup() -> Setup:
    return Setup.of_trace("chess-bird", load_cluster("paper-4gpu"), n_workflows=80, slo_scale=3.0, seed=0, n_seeds=1)


RATE = 0.09


def test_a_tuned_run_whose_tuner_never_fires_is_the_fixed_run_at_the_default_alpha(setup: Setup) -> None:
    never = TuningConfig(window_workflows=10, min_workflows=5, every_workflows=10_000)
    tuned = run_tuned(setup, "hexgen", RATE, never, WARMUP)
    fixed = run_fixed(setup, "hexgen", RATE, get_policy("hexgen").default_alpha, WARMUP)
    assert tuned.retunes == () and tuned.summary == fixed.summary


def test_the_tuned_run_re_tunes_every_k_workflows_on_at_most_n_of_them(setup: Setup) -> None:
    cfg = TuningConfig(window_workflows=15, every_workflows=10, min_workflows=5, interval_s=1.0, hysteresis=0.0)
    run = run_tuned(setup, "hexgen", RATE, cfg, WARMUP)
    assert len(run.retunes) >= 3
    assert all(5 <= r.window <= 15 for r in run.retunes) and run.retunes[-1].window == 15
    assert all(r.chosen in ALPHA_GRID for r in run.retunes)
    times = [r.time_s for r in run.retunes]
    assert times == sorted(times)
    # An applied choice is the alpha in force from then on; a kept one leaves the alpha unchanged.
    alpha = run.initial_alpha
    for r in run.retunes:
        assert r.alpha == (r.chosen if r.applied else alpha)
        assert not (r.applied and r.chosen == alpha)
        alpha = r.alpha
    assert any(r.applied for r in run.retunes)
    assert run.summary.workflows == setup.n_workflows - WARMUP


def test_the_report_compares_each_window_with_the_best_fixed_alpha_in_hindsight(setup: Setup, tmp_path: Path) -> None:
    grid = [0.0, 0.5, 1.0]
    cfg = TuningConfig(every_workflows=10, min_workflows=5, grid=grid)
    report = run_tuner_bench([setup], warmup=WARMUP, windows=[10, 20], tuning=cfg, rel_tol=0.1, jobs=1)
    (t,) = report.traces
    assert [f.alpha for f in t.fixed] == grid and [r.window for r in t.tuned] == [10, 20]
    assert t.best.summary.p95_s == min(f.summary.p95_s for f in t.fixed)
    assert 0 < t.rate_qps == pytest.approx(0.85 * t.capacity_qps) and t.capacity_qps <= t.fluid_bound_qps
    for r in t.tuned:
        assert t.gap(r.summary.p95_s) >= -1.0 and math.isfinite(t.gap(r.summary.p95_s))
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    (trace,) = doc["traces"]
    assert trace["best_alpha"] == t.best.alpha and trace["default_alpha"] == 0.3
    assert [x["window_workflows"] for x in trace["tuned"]] == [10, 20]
    for x in trace["tuned"]:
        assert x["within_target"] == (x["gap_vs_best"] <= TARGET_GAP)
        assert x["retune_seconds"]["count"] <= x["retunes"]
    assert set(doc["by_window"]) == {"10", "20"}
    text = format_tuner_report(report, "paper-4gpu")
    assert "best fixed alpha in hindsight" in text and "window 20: mean gap" in text
    assert bench_steps(1, 1, len(grid), 2) == 1 + 3 + 2


def test_parallel_runs_give_the_same_report_as_serial(setup: Setup) -> None:
    cfg = TuningConfig(every_workflows=10, min_workflows=5, grid=[0.0, 1.0])
    a = run_tuner_bench([setup], warmup=WARMUP, windows=[10], tuning=cfg, rel_tol=0.1, jobs=1).to_json()
    b = run_tuner_bench([setup], warmup=WARMUP, windows=[10], tuning=cfg, rel_tol=0.1, jobs=2).to_json()
    for doc in (a, b):
        doc.pop("seconds"), doc.pop("jobs")
        for t in doc["traces"]:
            for x in t["tuned"]:
                x.pop("retune_seconds")
    assert a == b


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"policy": "rr-fcfs"}, "alpha"),
        ({"windows": []}, "window"),
        ({"load": 0.0}, "load"),
        ({"warmup": 80}, "warmup"),
    ],
)
def test_bad_bench_parameters_are_refused(setup: Setup, kwargs: dict[str, object], problem: str) -> None:
    args: dict[str, object] = {"warmup": WARMUP, **kwargs}
    with pytest.raises(ValueError, match=problem):
        run_tuner_bench([setup], **args)  # type: ignore[arg-type]


def test_the_command_falls_back_to_the_built_in_workload_without_the_trace_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tuner.json"
    argv = ["bench", "tuner", "--trace-dir", str(tmp_path / "absent"), "--windows", "10", "--warmup", "10"]
    argv += ["--measured", "30", "--every", "10", "--jobs", "1", "--quiet", "--json", str(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "chess-bird" in stdout and "no trace folder" in stdout
    doc = json.loads(out.read_text())
    assert [t["trace"] for t in doc["traces"]] == ["chess-bird"] and doc["measured_workflows"] == 30


def test_the_command_refuses_an_unknown_trace_when_the_folder_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "tuner", "--trace-dir", str(tmp_path), "--traces", "nope", "--quiet"]
    assert main(argv) == 2
    assert "nope" in capsys.readouterr().err

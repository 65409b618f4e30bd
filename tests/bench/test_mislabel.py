"""``hexflow bench mislabel``: a worker labelled with another GPU's profile is corrected online (simulated)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.bench.mislabel import Scenario, run_mislabel
from gateway.cli import main


def test_in_the_simulator_a_mislabelled_worker_is_refitted_and_its_dispatch_share_falls_back() -> None:
    scenario = Scenario(cluster="paper-4gpu", worker="L40S-3", label="A100", rate=0.2)
    rep = run_mislabel(scenario, n_workflows=150, window=400)
    truth, label = rep.engine_constants, rep.label_constants
    assert label[0] / truth[0] < 0.6  # the label's decode step is about half the engine's
    fixed = rep.runs["mislabel+refit"]
    # The refit moved the mislabelled worker's profile most of the way to what its engine runs, within a
    # bounded number of calls.
    assert abs(np.log(fixed.final_constants[0] / truth[0])) < 0.5 * abs(np.log(label[0] / truth[0]))
    assert fixed.converged_after_calls is not None and fixed.converged_after_calls <= 1500
    assert any(e.result == "applied" and e.worker == "L40S-3" for e in fixed.refits)
    assert rep.runs["mislabel"].converged_after_calls is None and not rep.runs["mislabel"].refits
    # Without the refit the worker takes more than its share; with it, its late share is closer to the right one.
    right = rep.runs["correct"].late_share
    assert rep.runs["mislabel"].late_share > right
    assert abs(fixed.late_share - right) < abs(rep.runs["mislabel"].late_share - right)
    assert rep.refit_helped()


def test_hexflow_bench_mislabel_prints_the_windows_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.json"
    rc = main(["bench", "mislabel", "--workflows", "60", "--window", "200", "--min-calls", "50", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc in (0, 1)
    assert "share of L40S-3 per window of 200 calls" in text and "mislabel+refit" in text
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"correct", "correct+refit", "mislabel", "mislabel+refit"}
    assert doc["refit_helped"] == (rc == 0)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--worker", "nope"], "unknown worker 'nope'"),
        (["--label", "X9"], "known: A100"),
        (["--min-calls", "900", "--window-calls", "600"], "min_calls"),
    ],
)
def test_hexflow_bench_mislabel_bad_input_is_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "mislabel", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_live_windows_and_late_share_come_from_the_polled_completions() -> None:
    from gateway.bench.mislabel import _late_share, _live_windows

    def pt(t: float, mine: int, other: int) -> dict[str, object]:
        return {"t_s": t, "completed": {"w": mine, "v": other}}

    points = [pt(0, 0, 0), pt(25, 1, 1), pt(50, 2, 8), pt(75, 2, 8), pt(100, 6, 10), pt(110, 10, 10)]
    # Windows of 50 modelled seconds: 2 of 10 calls, then 4 of 6, then the tail 4 of 4.
    assert _live_windows(points, "w", 50.0) == [(50, 0.2, 10), (100, 0.6667, 6), (110, 1.0, 4)]
    # 20 calls in all; the first poll with at least 10 is t=50 (2 of them w's): 8 of the last 10 are w's.
    assert _late_share(points, "w") == 0.8


@pytest.mark.slow
def test_the_live_mislabel_benchmark_runs_three_gateways_and_reports_each(tmp_path: Path) -> None:
    from gateway.bench.mislabel import run_mislabel_live
    from gateway.profiling.refit import RefitSettings

    settings = RefitSettings(interval_s=20, min_calls=20, window_calls=200)
    rep = run_mislabel_live(Scenario(settings=settings), n_workflows=20, window_s=50.0, say=print)
    assert list(rep.runs) == ["correct", "mislabel", "mislabel+refit"]
    for name, run in rep.runs.items():
        assert run.windows and run.points, name
        assert run.final_profile["name"] == ("L40S/llama-3.1-70b" if name == "correct" else "A100/llama-3.1-70b")
    assert rep.runs["mislabel"].refit_attempts == 0
    assert json.dumps(rep.to_json(), allow_nan=True)

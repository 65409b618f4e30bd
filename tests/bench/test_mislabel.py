"""``hexflow bench mislabel``: a worker labelled with another GPU's profile is corrected online (simulated)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.bench.mislabel import run_mislabel
from gateway.cli import main


def test_in_the_simulator_a_mislabelled_worker_is_refitted_and_its_dispatch_share_falls_back() -> None:
    rep = run_mislabel(cluster="paper-4gpu", worker="L40S-3", label="A100", rate=0.2, n_workflows=150, window=400)
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

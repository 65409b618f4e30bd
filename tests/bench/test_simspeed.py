"""``hexflow sim-speed``: the simulator's speed per cluster and policy (figures only; no timing asserted)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.bench.simbench import Setup
from gateway.bench.simspeed import measure_speed
from gateway.cli import main
from gateway.config import load_cluster
from gateway.sim.workload import load_queries


def small_setup(n: int = 20) -> Setup:
    queries = load_queries("chess-bird", n, random.Random(0))
    return Setup(workers=load_cluster("paper-4gpu"), queries=queries, trace="chess-bird", n_workflows=n)


def test_measure_speed_reports_every_policy_with_the_calls_the_run_simulated() -> None:
    setup = small_setup()
    results = measure_speed("paper-4gpu", setup, ["hexgen", "rr-fcfs"], load=0.5, repeats=2)
    assert [r.policy for r in results] == ["hexgen", "rr-fcfs"]
    calls = sum(len(q) for q in setup.queries)
    for r in results:
        assert r.cluster == "paper-4gpu" and r.workers == 4
        assert r.rate_qps == pytest.approx(0.5 * setup.bound.rate_qps)
        assert r.calls == calls  # every workflow ran to the end
        assert r.wall_s > 0 and r.calls_per_s == pytest.approx(r.calls / r.wall_s)
        assert set(r.as_dict()) >= {"calls_per_s", "calls_per_cpu_s", "wall_s", "cpu_s"}


def test_measure_speed_at_a_given_rate_solves_no_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = small_setup()

    def no_bound(*_: object, **__: object) -> None:
        raise AssertionError("the fluid bound was solved")

    monkeypatch.setattr("gateway.bench.simbench.solve_fluid_bound", no_bound)
    (r,) = measure_speed("paper-4gpu", setup, ["hexgen"], rate=0.05, repeats=1)
    assert r.rate_qps == 0.05 and r.calls == sum(len(q) for q in setup.queries)
    with pytest.raises(ValueError, match="rate"):
        measure_speed("paper-4gpu", setup, ["hexgen"], rate=0.0, repeats=1)


@pytest.mark.parametrize(("load", "repeats"), [(0.0, 1), (0.5, 0)])
def test_measure_speed_rejects_a_non_positive_load_or_no_repeats(load: float, repeats: int) -> None:
    with pytest.raises(ValueError):
        measure_speed("paper-4gpu", small_setup(), ["hexgen"], load=load, repeats=repeats)


def test_sim_speed_command_prints_a_row_per_cluster_and_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "speed.json"
    argv = ["sim-speed", "--workflows", "20", "--repeats", "1", "--clusters", "paper-4gpu,mixed-12"]
    code = main([*argv, "--policies", "hexgen,lw-fcfs", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    rows = [ln.split() for ln in stdout.splitlines() if ln.split()[:1] in (["paper-4gpu"], ["mixed-12"])]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("paper-4gpu", "4", "hexgen"),
        ("paper-4gpu", "4", "lw-fcfs"),
        ("mixed-12", "12", "hexgen"),
        ("mixed-12", "12", "lw-fcfs"),
    ]
    doc = json.loads(out.read_text())
    assert [(d["cluster"], d["policy"]) for d in doc] == [(r[0], r[2]) for r in rows]
    assert all(d["calls"] > 0 and d["calls_per_s"] > 0 for d in doc)


def test_sim_speed_rejects_bad_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sim-speed", "--workflows", "5", "--repeats", "0", "--clusters", "paper-4gpu"])
    assert info.value.code == 2 and "argument --repeats: expected an integer >= 1" in capsys.readouterr().err

"""Where the engines' time goes: the engine's counters, the bound's split, the report and ``simulate --engines``."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.bench.bound import solve_fluid_bound
from gateway.bench.enginetime import EngineTime, bound_engine_time, format_engine_time, run_engine_time
from gateway.bench.simbench import Setup
from gateway.cli import main
from gateway.config import load_cluster
from gateway.core.profile import PerfProfile
from gateway.core.workflow import CallSpec
from gateway.sim.engine import EngineStats
from gateway.sim.simulator import Simulator
from gateway.sim.workload import generate_chess_bird
from tests.bench.test_simbench import tiny_worker
from tests.sim.test_engine import random_arrivals, run_engine_with

# No context or attention cost: an engine's busy time is exactly its iterations' base plus its tokens.
LINEAR = PerfProfile("X", "m", 0.02, 2e-4, 0.0, 0.0, 60_000, 6, 512)


@pytest.mark.parametrize("seed", range(4))
def test_engine_counts_every_batched_token_and_iteration_of_its_busy_time(seed: int) -> None:
    arrivals = random_arrivals(seed)
    done, eng = run_engine_with(LINEAR, arrivals)
    assert len(done) == len(arrivals)
    st = eng.stats
    # Every prompt token once (no prefix caching here), then one token per further output token.
    assert st.batched_tokens == sum(max(i, 1) + max(o, 1) - 1 for _, i, o in arrivals)
    assert st.busy_s == pytest.approx(LINEAR.iter_base_s * st.iterations + LINEAR.token_s * st.batched_tokens)
    assert st.iterations <= st.seq_iterations <= LINEAR.max_num_seqs * st.iterations


def test_batch_per_iteration_counts_the_calls_that_share_it() -> None:
    # 50 prompt + 11 output tokens: one prefill iteration (it yields the first token), then 10 decodes.
    _, alone = run_engine_with(LINEAR, [(0.0, 50, 11)])
    assert (alone.stats.iterations, alone.stats.seq_iterations) == (11, 11)
    _, pair = run_engine_with(LINEAR, [(0.0, 50, 11), (0.0, 50, 11)])
    assert (pair.stats.iterations, pair.stats.seq_iterations) == (11, 22)


@pytest.mark.parametrize(("kv_capacity", "iterations_per_call"), [(10**9, 11 / 4), (122, 61 * 11 / 122)])
def test_the_bounds_time_split_is_its_program_solution(kv_capacity: int, iterations_per_call: float) -> None:
    # The hand-computed program of tests/bench/test_simbench.py: one 50 + 11 call type, one worker.
    b = solve_fluid_bound([tiny_worker(kv_capacity)], [[CallSpec("x", 50, 11)]])
    base, tokens, other = b.time_split[0]
    assert base == pytest.approx(0.01 * iterations_per_call * b.rate_qps)
    assert tokens == pytest.approx(0.001 * 60 * b.rate_qps)
    assert other == pytest.approx(1e-5 * 545 * b.rate_qps)
    assert base + tokens + other == pytest.approx(b.gpu_busy[0]) and b.gpu_busy[0] == pytest.approx(1.0)
    assert b.seqs_per_iteration[0] == pytest.approx(11 / iterations_per_call)


def test_a_runs_engine_time_adds_up_to_its_engines_busy_time() -> None:
    cluster = load_cluster("paper-4gpu")
    queries = generate_chess_bird(120, random.Random(3))
    setup = Setup(cluster, queries, "chess-bird", n_workflows=120, n_seeds=1, prefix_caching=True)
    bound = setup.bound
    wfs = setup.workflows(0.6 * bound.rate_qps)
    sim = Simulator(cluster, "hexgen", prefix_caching=True)
    res = sim.run(wfs)
    n = len(res.workflows)
    assert n == len(wfs)
    names = [w.name for w in cluster]
    rows = run_engine_time(names, sim.engine_profiles, res.engine_stats, res.dispatch_counts, n, res.end_time)
    for row, st in zip(rows, res.engine_stats, strict=True):
        assert row.total_s * n == pytest.approx(st.busy_s)
        assert row.base_s > 0 and row.token_s > 0 and row.other_s >= 0
        assert 0 < row.busy < 1 and row.batch >= 1
        assert row.prefix_hit is not None and 0 <= row.prefix_hit < 1
    assert sum(r.calls for r in rows) * n == pytest.approx(res.num_calls)
    at_bound = bound_engine_time(cluster, bound)
    for row, busy in zip(at_bound, bound.gpu_busy, strict=True):
        assert row.total_s * bound.rate_qps == pytest.approx(busy)
    assert sum(r.calls for r in at_bound) == pytest.approx(res.num_calls / n, rel=0.02)
    text = format_engine_time(rows, at_bound)
    assert all(name in text for name in names)
    spent = sum(r.total_s for r in rows) / sum(r.total_s for r in at_bound)
    assert f"the engines spent {spent:.2f}x the bound's engine time per workflow" in text


def test_engine_time_refuses_what_it_cannot_report() -> None:
    p = LINEAR
    with pytest.raises(ValueError, match="one entry per engine"):
        run_engine_time(["a", "b"], [p], [EngineStats()], [{}], 1, 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        run_engine_time(["a"], [p], [EngineStats()], [{}], 0, 1.0)
    b = solve_fluid_bound([tiny_worker(10**9)], [[CallSpec("x", 50, 11)]])
    with pytest.raises(ValueError, match="no time split"):
        bound_engine_time([tiny_worker(10**9), tiny_worker(10**9, "b")], b)
    with pytest.raises(ValueError, match="positive and finite"):
        bound_engine_time([tiny_worker(10**9)], replace(b, rate_qps=float("inf")))
    one = EngineTime("a", 1.0, 0.1, 0.2, 0.3, 0.5, 2.0)
    with pytest.raises(ValueError, match="2 engines in the run, 1 at the bound"):
        format_engine_time([one, one], [one])


def test_simulate_prints_and_writes_the_engines_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    code = main(["simulate", "--workflows", "30", "--trace", "chess-bird", "--engines", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "engine time per completed workflow" in stdout and "x the bound's engine time per workflow" in stdout
    engines = json.loads(out.read_text())["engines"]
    assert (
        [e["name"] for e in engines["run"]]
        == [e["name"] for e in engines["bound"]]
        == [w.name for w in load_cluster("paper-4gpu")]
    )
    for e in engines["run"]:
        assert e["total_s"] == pytest.approx(e["base_s"] + e["token_s"] + e["other_s"])
    # Without --engines the table is not printed (the JSON still has it).
    assert main(["simulate", "--workflows", "30", "--trace", "chess-bird"]) == 0
    assert "engine time per completed workflow" not in capsys.readouterr().out


def test_bench_reports_ours_and_the_best_baselines_engine_time_at_the_reference_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "--policies", "hexgen,rr-fcfs", "--workflows", "30", "--trace", "chess-bird", "--alpha", "0.3"]
    assert main([*argv, "--quiet", "--jobs", "1", "--seeds", "1", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "engine time per completed workflow at" in stdout and "fluid bound" in stdout
    doc = json.loads(out.read_text())
    at_ref = doc["engine_time_at_reference"]
    names = [w.name for w in load_cluster("paper-4gpu")]
    assert at_ref["seed"] == 0 and set(at_ref["policies"]) == {"hexgen", doc["best_baseline"]}
    assert [e["name"] for e in at_ref["bound"]] == names
    for rows in at_ref["policies"].values():
        assert [e["name"] for e in rows] == names and all(e["total_s"] > 0 for e in rows)
    # Without a capacity search there is no reference rate, and nothing to report there.
    plain = tmp_path / "plain.json"
    assert (
        main([*argv, "--quiet", "--jobs", "1", "--seeds", "1", "--no-capacity", "--rate", "0.1", "--json", str(plain)])
        == 0
    )
    assert json.loads(plain.read_text())["engine_time_at_reference"] is None

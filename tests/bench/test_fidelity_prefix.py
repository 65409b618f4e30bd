"""fidelity-vllm's prefix-cache accounting: vLLM's counters over the live run beside the simulated engines'."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.bench.fidelity.breakdown import EngineTimes, GapBreakdown, engine_sums, gap_breakdown
from gateway.bench.fidelity.vllm_report import VllmFidelityReport
from gateway.bench.livebench import PolicyRun, simulate_workload
from gateway.bench.replay import ReplayReport, replay_setup, replay_workload
from gateway.config import build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import load_profiles_file
from gateway.sim.simulator import Simulator
from tests.bench.test_fidelity_vllm import _calibrated


def _counters(queries: float, hits: float) -> str:
    lines = []
    for name, value in (("vllm:prefix_cache_queries", queries), ("vllm:prefix_cache_hits", hits)):
        lines += [f"# HELP {name} x", f"# TYPE {name} counter", f'{name}_total{{engine="0",model_name="m"}} {value}']
    return "\n".join(lines) + "\n"


def test_the_servers_prefix_hits_are_counted_between_two_scrapes() -> None:
    t = EngineTimes.between(engine_sums(_counters(1000, 200)), engine_sums(_counters(5000, 2200)))
    assert (t.prefix_queries, t.prefix_hits) == (4000, 2000)
    assert t.prefix_hit_share == 0.5
    assert t.to_json()["prefix_hits"] == 2000
    # A server without the counters (or with caching off and nothing looked up): unknown, not zero.
    assert math.isnan(EngineTimes.between({}, engine_sums("# nothing\n")).prefix_hit_share)
    assert math.isnan(
        EngineTimes.between(engine_sums(_counters(10, 0)), engine_sums(_counters(10, 0))).prefix_hit_share
    )


def test_the_breakdown_keeps_each_simulated_engines_prefix_hits(tmp_path: Path) -> None:
    profiles, cluster = _calibrated(tmp_path)
    catalog = load_gpu_catalog().with_profiles(load_profiles_file(profiles))
    workers = build_workers(load_cluster_config(cluster, catalog), catalog)
    setup = replay_setup("chess-bird", workers, workflows=6, seed=0, token_scale=0.125)
    workload = replay_workload(setup, 0.05)
    sim, _ = simulate_workload(workers, workload, "hexgen", alpha=None, seed=0)
    live = ReplayReport.from_results([], gateway="-", trace="chess-bird", rate_qps=0.05, time_scale=1.0, wall_s=1)
    b = gap_breakdown(PolicyRun("hexgen", None, live, sim), workload, workers, seed=0)
    again = Simulator(workers, "hexgen", seed=0, prefix_caching=True).run([w.dag() for w in workload])
    want = {w.name: (st.prompt_tokens, st.prefix_hit_tokens) for w, st in zip(workers, again.engine_stats, strict=True)}
    assert b.prefix_sim == want
    assert sum(h for _, h in want.values()) > 0  # the replay's calls share prefixes
    assert b.to_json()["prefix_sim"]["a"]["prompt_tokens"] == want["a"][0]


def test_the_reports_simulated_hit_share_adds_up_every_policys_simulation() -> None:
    rep = object.__new__(VllmFidelityReport)
    rep.breakdowns = [
        GapBreakdown("hexgen", prefix_sim={"a": (1000, 400), "b": (500, 0)}),
        GapBreakdown("llf", prefix_sim={"a": (1000, 600), "b": (0, 0)}),
    ]
    shares = rep.sim_prefix_hit_share()
    assert shares["a"] == pytest.approx(0.5) and shares["b"] == 0.0
    rep.breakdowns = [GapBreakdown("hexgen", prefix_sim={"a": (0, 0)})]
    assert math.isnan(rep.sim_prefix_hit_share()["a"])

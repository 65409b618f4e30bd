"""``hexflow calibrate --check-interleaved``: staggered requests against the fitted profile's simulated engine."""

from __future__ import annotations

import json
import random
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.bench.fidelity.compare import simulate_arrivals
from gateway.bench.fidelity.interleave import (
    REQUESTS,
    InterleaveReport,
    ScenarioResult,
    check_interleaved,
    format_interleave_report,
    make_scenarios,
)
from gateway.cli import main
from gateway.config import load_gpu_catalog
from gateway.core.profile import PerfProfile, time_scaled
from gateway.profiling.plan import PlanSettings
from tests.emulator_process import emulated_client, emulator_process

MODEL = "llama-3.1-70b"
TIME_SCALE = 0.25


def a100() -> PerfProfile:
    return load_gpu_catalog().profile("A100", MODEL)


def test_a_lone_request_is_predicted_at_its_lone_latency() -> None:
    p = a100()
    assert simulate_arrivals(p, [(0.0, 900, 40)]) == pytest.approx([p.single_latency(900, 40)])
    # Far apart, each is alone.
    far = simulate_arrivals(p, [(0.0, 900, 40), (1000.0, 300, 10)])
    assert far == pytest.approx([p.single_latency(900, 40), p.single_latency(300, 10)])


def test_overlapping_requests_slow_each_other_and_one_slot_queues_them() -> None:
    p = a100()
    lone = [p.single_latency(2000, 100), p.single_latency(1500, 50)]
    both = simulate_arrivals(p, [(0.0, 2000, 100), (0.5, 1500, 50)])
    assert both[0] > lone[0] and both[1] > lone[1]  # the second's prompt stalls the first's decoding
    one_slot = simulate_arrivals(replace(p, max_num_seqs=1), [(0.0, 2000, 100), (0.5, 1500, 50)])
    # With one slot the second waits for the first to finish, then runs alone.
    assert one_slot[0] == pytest.approx(lone[0])
    assert one_slot[1] == pytest.approx(lone[0] - 0.5 + lone[1] - p.request_overhead_s, rel=1e-6)


def test_scenarios_stay_within_the_plan_and_overlap() -> None:
    p = a100()
    s = PlanSettings(max_prompt=2048, max_output=128)
    scenarios = make_scenarios(p, s, 4, random.Random(1), concurrency=4)
    assert len(scenarios) == 4 and all(len(sc) == REQUESTS for sc in scenarios)
    for sc in scenarios:
        times = [a[0] for a in sc]
        assert times[0] == 0.0 and times == sorted(times)
        assert all(2048 // 20 <= a[1] <= 2048 and 128 // 12 <= a[2] <= 128 for a in sc)
        predicted = simulate_arrivals(p, sc)
        # Overlap: requests take longer than alone.
        assert sum(predicted) > 1.05 * sum(p.single_latency(a[1], a[2]) for a in sc)
    assert make_scenarios(p, s, 4, random.Random(1), concurrency=4) == scenarios  # seeded


def test_report_ratios_json_and_text() -> None:
    sc = ScenarioResult(((0.0, 100, 10), (0.1, 200, 5)), (1.2, 2.0), (1.0, 2.0), (0.9, 1.5))
    assert sc.ratio == pytest.approx(3.2 / 3.0) and sc.request_ratios == pytest.approx([1.2, 1.0])
    rep = InterleaveReport(4, (sc,), skipped=1)
    assert rep.median_ratio == pytest.approx(3.2 / 3.0)
    doc = rep.to_json()
    assert doc["median_ratio"] == pytest.approx(3.2 / 3.0) and doc["skipped"] == 1
    assert doc["scenarios"][0]["live_s"] == [1.2, 2.0]
    text = format_interleave_report(rep)
    assert "1 skipped" in text and "1.067" in text and "1.00-1.20" in text
    assert InterleaveReport(4, (), 0).median_ratio is None


def emulated(profile: PerfProfile) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    return emulated_client(profile, MODEL, TIME_SCALE)


async def test_an_emulated_worker_runs_as_its_profile_predicts_under_interleaving() -> None:
    """The emulator runs the engine model itself, so with its true profile (in wall seconds) every scenario
    comes out near 1; a profile twice as fast as the truth reads near 2."""
    truth = a100()
    wall = time_scaled(truth, TIME_SCALE)
    s = PlanSettings(max_prompt=2048, max_output=32, max_concurrency=4, max_num_seqs=4)
    async with emulated(truth) as client:
        rep = await check_interleaved("http://emulator", MODEL, wall, s, n=2, budget_s=120.0, client=client)
        fast = await check_interleaved(
            "http://emulator", MODEL, time_scaled(wall, 0.5), s, n=1, budget_s=120.0, client=client, seed=1
        )
    assert rep.concurrency == 4 and len(rep.scenarios) == 2 and rep.skipped == 0
    assert rep.median_ratio is not None and 0.85 <= rep.median_ratio <= 1.2, rep.to_json()
    assert fast.median_ratio is not None and fast.median_ratio >= 1.6, fast.to_json()


async def test_a_budget_too_short_for_any_scenario_skips_them_all() -> None:
    truth = a100()
    s = PlanSettings(max_prompt=2048, max_output=32, max_concurrency=4, max_num_seqs=4)
    async with emulated(truth) as client:
        rep = await check_interleaved(
            "http://emulator", MODEL, time_scaled(truth, TIME_SCALE), s, n=3, budget_s=0.01, client=client
        )
    assert rep.scenarios == () and rep.skipped == 3
    with pytest.raises(ValueError, match="at least one scenario"):
        await check_interleaved("http://x", MODEL, truth, s, n=0, budget_s=1.0)


def test_the_cli_runs_the_check_after_the_fit_and_writes_it_to_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "fit.json"
    with emulator_process(["--gpu", "A100", "--time-scale", str(TIME_SCALE)], tmp_path / "emu.log") as url:
        head = ["calibrate", "--worker", url, "--model", MODEL, "--gpu", "A100", "--quiet", "--json", str(js)]
        plan = [
            "--max-prompt",
            "1024",
            "--max-output",
            "32",
            "--max-concurrency",
            "4",
            "--max-num-seqs",
            "4",
            "--step-output",
            "32",
        ]
        code = main([*head, *plan, "--repeats", "1", "--check-interleaved", "1", "--check-budget-s", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "interleaved check: 1 scenarios" in out and "median live/predicted" in out
    doc = json.loads(js.read_text())
    assert len(doc["interleaved"]["scenarios"]) == 1 and doc["interleaved"]["median_ratio"] > 0

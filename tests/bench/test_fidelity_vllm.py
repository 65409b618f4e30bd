"""``hexflow bench fidelity-vllm`` without vLLM: its arguments, the servers' options, the cluster it writes and
the breakdown of a live run against its simulation (the real run is tests/vllm_cpu/test_fidelity_vllm.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gateway.bench.fidelity import vllm_report
from gateway.bench.fidelity.breakdown import (
    EngineTimes,
    engine_sums,
    gap_breakdown,
    lone_split,
)
from gateway.bench.fidelity.vllm import run_fidelity_vllm
from gateway.bench.fidelity.vllm_report import VllmFidelityReport, VllmFidelitySeries, format_vllm_fidelity_series
from gateway.bench.fidelity.vllm_servers import (
    CHUNK,
    MAX_MODEL_LEN,
    MODEL,
    VllmServer,
    cluster_doc,
    default_servers,
    parse_server,
)
from gateway.bench.livebench import PolicyRun, simulate_workload
from gateway.bench.replay import ReplayReport, WorkflowResult, replay_setup, replay_workload
from gateway.config import build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import load_profiles_file
from gateway.live.schemas import CallReport
from gateway.sim.simulator import Simulator
from workers.cpu_vllm import SERVED_MODEL_NAME, server_argv
from workers.cpu_vllm.base import Paths


def test_parse_server_reads_threads_max_num_seqs_and_cpus() -> None:
    assert parse_server("2:4", "a") == VllmServer("a", 2, 4)
    cpu = min(os.sched_getaffinity(0))
    pinned = parse_server(f"1:2@{cpu}", "b")
    assert pinned == VllmServer("b", 1, 2, (cpu,))
    for bad in ("2", "2:x", "0:4", "2:4:1", "", "1:2@", "1:2@x", f"1:2@{cpu},{cpu}", "1:2@100000"):
        with pytest.raises(ValueError, match="--server"):
            parse_server(bad, "a")


def test_default_servers_get_a_cpu_each_where_there_are_two() -> None:
    a, b = default_servers([3, 5, 7])
    assert (a.cpus, b.cpus) == ((3,), (5,))
    assert a.max_num_seqs != b.max_num_seqs
    assert a.options().cpus == (3,)
    assert all(not s.cpus for s in default_servers([0]))


def test_servers_run_the_chunk_and_context_the_profiles_assume(tmp_path: Path) -> None:
    fast, slow = VllmServer("a", 2, 4), VllmServer("b", 1, 2)
    argv = server_argv(Paths(tmp_path), 18160, fast.options())
    assert argv[argv.index("--max-num-batched-tokens") + 1] == str(CHUNK)
    assert argv[argv.index("--max-model-len") + 1] == str(MAX_MODEL_LEN)
    assert argv[argv.index("--max-num-seqs") + 1] == str(fast.max_num_seqs)
    assert "--no-enable-prefix-caching" not in argv
    assert fast.options().omp_threads != slow.options().omp_threads


def test_bad_arguments_fail_before_anything_starts(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="context"):
        run_fidelity_vllm(token_scale=1.0, workflows=3, progress=False, paths=paths)
    with pytest.raises(ValueError, match="token scale"):
        run_fidelity_vllm(token_scale=-1.0, progress=False, paths=paths)
    with pytest.raises(ValueError, match="own name"):
        run_fidelity_vllm(servers=[VllmServer("a", 1, 2)] * 2, progress=False, paths=paths)
    with pytest.raises(ValueError, match="rounds"):
        run_fidelity_vllm(rounds=0, progress=False, paths=paths)
    with pytest.raises(ValueError, match="calibration repeats"):
        run_fidelity_vllm(calibration_repeats=0, progress=False, paths=paths)
    assert not (tmp_path / "nowhere").exists()  # nothing installed, nothing started


def _calibrated(tmp_path: Path) -> tuple[Path, Path]:
    """A profiles overlay and a cluster file as the benchmark writes them, with made-up constants."""
    entry = {
        "tp": 1,
        "iter_base_s": 0.004,
        "token_s": 2e-5,
        "ctx_s": 1e-8,
        "request_overhead_s": 0.01,
        "kv_capacity_tokens": 262144,
        "max_num_seqs": 4,
        "max_batched_tokens": CHUNK,
    }
    slow = {**entry, "iter_base_s": 0.008, "token_s": 4e-5, "max_num_seqs": 2}
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(yaml.safe_dump({"profiles": {MODEL: {"vllm-cpu-a": entry, "vllm-cpu-b": slow}}}))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(cluster_doc(default_servers())))
    return profiles, cluster


def test_gap_breakdown_accounts_every_call_live_and_simulated(tmp_path: Path) -> None:
    profiles, cluster = _calibrated(tmp_path)
    catalog = load_gpu_catalog().with_profiles(load_profiles_file(profiles))
    cfg = load_cluster_config(cluster, catalog)
    assert [(w.profile, w.served_model) for w in cfg.expanded()] == [
        ("vllm-cpu-a", SERVED_MODEL_NAME),
        ("vllm-cpu-b", SERVED_MODEL_NAME),
    ]
    workers = build_workers(cfg, catalog)
    setup = replay_setup("chess-bird", workers, workflows=3, seed=0, token_scale=0.125)
    workload = replay_workload(setup, 0.05)
    sim, _ = simulate_workload(workers, workload, "hexgen", alpha=None, seed=0)
    # A made-up live run: every call on worker "a", 0.1 s queued and 0.2 s on it; one call of the first
    # workflow came back with one prompt token more than sent.
    results = []
    for w in workload:
        calls = []
        for c in w.calls():
            extra = 1 if (w.wid, c["id"]) == (workload[0].wid, "c0.0") else 0
            n_in, n_out = c["prompt_tokens"] + extra, c["max_tokens"]
            calls.append(
                CallReport(
                    id=c["id"],
                    kind=c["kind"],
                    worker="a",
                    queued_s=0.1,
                    run_s=0.2,
                    attempts=1,
                    prompt_tokens=n_in,
                    completion_tokens=n_out,
                )
            )
        stages = len(w.stages)
        results.append(
            WorkflowResult(
                w.wid,
                w.arrival_s,
                w.deadline_s,
                200,
                latency_s=stages * 0.3 + 0.05 + 0.01,
                gateway_latency_s=stages * 0.3 + 0.05,
                calls=tuple(calls),
            )
        )
    live = ReplayReport.from_results(results, gateway="-", trace="chess-bird", rate_qps=0.05, time_scale=1.0, wall_s=1)
    b = gap_breakdown(PolicyRun("hexgen", None, live, sim), workload, workers, seed=0)
    n_calls = sum(len(s.calls) for w in workload for s in w.stages)
    assert (b.workflows_live, b.workflows_sim, b.calls_live, b.calls_sim) == (3, 3, n_calls, n_calls)
    assert b.token_mismatches == 1
    assert set(b.workers_live) == {"a"} and b.workers_live["a"].calls == n_calls
    assert b.workers_live["a"].on_worker_s == pytest.approx(0.2)
    assert sum(t.calls for t in b.workers_sim.values()) == n_calls
    assert b.path_live.between_stages_s == pytest.approx(0.05)
    assert b.path_live.client_s == pytest.approx(0.01)
    # The simulation's chain explains its whole latency.
    ps = b.path_sim
    assert ps.queued_s + ps.on_worker_s + ps.between_stages_s == pytest.approx(ps.latency_s)
    assert math.isfinite(ps.latency_s) and ps.client_s == 0.0
    doc = b.to_json()
    assert set(doc["per_worker"]) >= {"a"} and set(doc["per_workflow_mean"]) == {"live", "sim"}
    # Call by call: every live call matched to its simulated self, per kind.
    kinds = {c["kind"] for w in workload for c in w.calls()}
    assert set(b.kinds) == kinds and sum(k.calls for k in b.kinds.values()) == n_calls
    resim = Simulator(workers, "hexgen", seed=0, prefix_caching=True, record_calls=True)
    again = resim.run([w.dag() for w in workload])
    on_a = sum(1 for t in again.calls if workers[t.worker].name == "a")
    assert sum(k.calls * k.same_worker for k in b.kinds.values()) == pytest.approx(on_a)
    sim_mean = sum(t.run_s for t in again.calls) / n_calls
    assert sum(k.calls * k.sim_run_s for k in b.kinds.values()) / n_calls == pytest.approx(sim_mean)
    assert all(k.live_run_s == pytest.approx(0.2) for k in b.kinds.values())
    assert set(doc["per_kind"]) == kinds


def _histograms(n: int, queue: float, prefill: float, decode: float, e2e: float) -> str:
    lines = []
    for name, total in (
        ("vllm:request_queue_time_seconds", queue),
        ("vllm:request_prefill_time_seconds", prefill),
        ("vllm:request_decode_time_seconds", decode),
        ("vllm:e2e_request_latency_seconds", e2e),
    ):
        lines += [
            f"# HELP {name} x",
            f"# TYPE {name} histogram",
            f'{name}_bucket{{le="+Inf",model_name="tiny-llama"}} {n}',
            f'{name}_count{{model_name="tiny-llama"}} {n}',
            f'{name}_sum{{model_name="tiny-llama"}} {total}',
        ]
    return "\n".join(lines) + "\n"


def test_engine_times_are_the_means_of_the_requests_finished_between_two_scrapes() -> None:
    before = engine_sums(_histograms(10, 0.5, 1.0, 2.0, 4.0))
    after = engine_sums(_histograms(30, 0.5, 3.0, 8.0, 14.0))
    t = EngineTimes.between(before, after)
    assert t.requests == 20
    assert t.mean_s["queue"] == 0.0
    assert math.isclose(t.mean_s["prefill"], 0.1) and math.isclose(t.mean_s["decode"], 0.3)
    assert math.isclose(t.mean_s["e2e"], 0.5)
    # A server that exports none of them: no requests, every mean unknown.
    empty = EngineTimes.between({}, engine_sums("# nothing\n"))
    assert empty.requests == 0 and all(math.isnan(v) for v in empty.mean_s.values())
    assert empty.to_json()["mean_s"]["decode"] is None


def test_the_lone_split_adds_up_to_the_lone_latency() -> None:
    profile = load_gpu_catalog().profile("A100", "llama-3.1-8b")
    first, rest = lone_split(profile, 900, 40)
    assert math.isclose(first + rest, profile.single_latency(900, 40))
    assert first == profile.single_latency(900, 1) and rest > 0
    assert lone_split(profile, 900, 1)[1] == 0.0


class _Round(VllmFidelityReport):
    """A round whose only content is its policies' live and simulated P95 (what the series summarises)."""

    def __init__(self, p95: dict[str, tuple[float, float]]) -> None:
        runs = [
            SimpleNamespace(
                policy=policy,
                p95_ratio=live / sim,
                slo_ratio=1.0,
                live=SimpleNamespace(p95_s=live, slo_attainment=1.0),
                simulated=SimpleNamespace(p95_s=sim, slo_attainment=1.0),
            )
            for policy, (live, sim) in p95.items()
        ]
        self.live = SimpleNamespace(runs=runs)  # type: ignore[assignment]
        self.calibrations = []

    def to_json(self) -> dict[str, object]:
        return {"gaps": self.gaps()}


def test_a_series_reports_every_round_and_judges_the_median_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each round's own report is tested with the real run; here it stands for itself.
    monkeypatch.setattr(vllm_report, "format_vllm_fidelity_report", lambda rep: f"<round {id(rep)}>")
    rounds: list[VllmFidelityReport] = [
        _Round({"hexgen": (12.3, 10.0), "llf": (10.0, 10.0)}),
        _Round({"hexgen": (9.0, 10.0), "llf": (13.0, 10.0)}),
        _Round({"hexgen": (10.5, 10.0), "llf": (12.0, 10.0)}),
    ]
    series = VllmFidelitySeries(list(rounds), seed=4)
    gaps = series.p95_gaps()
    assert [round(g, 3) for g in gaps["hexgen"]] == [0.23, -0.1, 0.05]
    assert series.median_p95_gap()["hexgen"] == pytest.approx(0.05)
    assert series.median_p95_gap()["llf"] == pytest.approx(0.2)
    assert series.rounds_within() == {"hexgen": 2, "llf": 1}
    assert not series.within_target()  # llf's median is 20% off
    assert VllmFidelitySeries(rounds[:1] + rounds[2:], seed=0).median_p95_gap()["hexgen"] == pytest.approx(0.14)
    only_hexgen = VllmFidelitySeries([_Round({"hexgen": (11.0, 10.0)}), _Round({"hexgen": (9.5, 10.0)})])
    assert only_hexgen.within_target()
    doc = series.to_json()
    assert doc["within_target"] is False and doc["seed"] == 4 and len(doc["rounds"]) == 3
    assert doc["summary"]["hexgen"]["rounds_within"] == 2
    assert doc["summary"]["hexgen"]["median_p95_gap"] == pytest.approx(0.05)
    text = format_vllm_fidelity_series(series)
    assert all(f"<round {id(r)}>" in text for r in rounds)
    assert "median P95 gap +5.0% over 3 rounds; 2 of them within 10%" in text
    assert "NOT within target (median)" in text
    # One round: that round's own document with the summary beside it.
    one = VllmFidelitySeries(rounds[:1]).to_json()
    assert "gaps" in one and one["summary"]["hexgen"]["p95_gaps"] == [pytest.approx(0.23)]
    # A round without a finite gap cannot pass.
    assert not VllmFidelitySeries([_Round({"hexgen": (math.nan, 10.0)})]).within_target()

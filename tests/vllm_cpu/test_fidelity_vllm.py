"""``hexflow bench fidelity-vllm`` at smoke size against real vLLM on the CPU: two servers of their own
(ports ``HEXFLOW_VLLM_CPU_FIDELITY_PORT`` and the next, default 18170), each calibrated within a short
budget, a handful of workflows replayed through the gateway and simulated. Behaviour only: both servers
calibrated, every workflow and call accounted for live and simulated, the JSON fields. No timing is
asserted (the figures are the benchmark's output, docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gateway.bench.fidelity.vllm import run_fidelity_vllm
from gateway.bench.fidelity.vllm_report import format_vllm_fidelity_report
from gateway.bench.fidelity.vllm_servers import MODEL
from gateway.config.gpus import load_profiles_file
from workers import cpu_vllm

pytestmark = pytest.mark.vllm_cpu

PORT = int(os.environ.get("HEXFLOW_VLLM_CPU_FIDELITY_PORT", "18170"))
WORKFLOWS = 4


def test_fidelity_against_real_vllm_calibrates_both_servers_and_accounts_every_workflow(tmp_path: Path) -> None:
    try:
        series = run_fidelity_vllm(
            base_port=PORT,
            workflows=WORKFLOWS,
            token_scale=0.05,
            budget_s=30.0,
            log_dir=tmp_path,
            progress=False,
        )
    except cpu_vllm.CpuVllmError as exc:
        pytest.fail(f"could not start the real vLLM servers: {exc}", pytrace=False)
    (rep,) = series.rounds  # one round by default
    # Both servers calibrated, with the capacity vLLM exports, and filed under their labels.
    assert [c.server.name for c in rep.calibrations] == ["a", "b"]
    overlay = load_profiles_file(tmp_path / "calibrated-profiles.yaml")
    for c in rep.calibrations:
        assert len(c.result.measurements) >= 4
        assert c.result.kv_source == "vllm:cache_config_info"
        spec = overlay.profiles[MODEL][c.server.label]
        assert spec.max_num_seqs == c.server.max_num_seqs and spec.basis.startswith("measured")
        assert c.background_requests > 0  # the other server served the workload meanwhile
    # The gateway's workers named those profiles, and the servers were stopped.
    gw = yaml.safe_load((tmp_path / "live" / "gateway-hexgen.yaml").read_text())
    assert [w["profile"] for w in gw["cluster"]["workers"]] == ["vllm-cpu-a", "vllm-cpu-b"]
    assert Path(gw["profiles_file"]).name == "calibrated-profiles.yaml"
    assert not any(s.port in (PORT, PORT + 1) for s in cpu_vllm.status())
    # Every workflow accounted for live and simulated; every completed workflow's calls reported.
    (run,) = rep.live.runs
    assert run.live.workflows == WORKFLOWS
    (b,) = rep.breakdowns
    assert b.workflows_live == WORKFLOWS and b.workflows_sim == WORKFLOWS
    done = [r for r in run.live.results if r.completed]
    assert b.calls_live == sum(len(r.calls) for r in done) > 0
    assert b.token_mismatches == 0  # token-id prompts: the servers counted what was sent
    assert set(b.workers_live) <= {"a", "b"}
    doc = json.loads(json.dumps(rep.to_json(), allow_nan=False))
    assert {"target_p95", "within_target", "servers", "speed_ratio", "gaps", "breakdown", "live_bench"} <= set(doc)
    assert [s["name"] for s in doc["servers"]] == ["a", "b"]
    # vLLM's CPU backend keeps 128-token KV blocks: read by the calibration, in each profile the simulator used.
    assert [s["profile"]["block_tokens"] for s in doc["servers"]] == [128, 128]
    assert all(len(s["probe_fits"]) == s["probes"] > 0 for s in doc["servers"])
    assert set(doc["gaps"]["hexgen"]) == {"p95", "slo"}
    assert set(doc["breakdown"][0]["per_workflow_mean"]) == {"live", "sim"}
    assert "live against the simulator with the calibrated profiles" in format_vllm_fidelity_report(rep)
    series_doc = json.loads(json.dumps(series.to_json(), allow_nan=False))
    assert series_doc["summary"]["hexgen"]["p95_gaps"] == [doc["gaps"]["hexgen"]["p95"]]
    assert series_doc["within_target"] == series.within_target() == rep.within_target()
    # The servers' own histograms cover the live run: at least the calls the gateway reported on each.
    reported = {name: sum(1 for r in done for c in r.calls if c.worker == name) for name in ("a", "b")}
    for name, times in rep.engines.items():
        assert times.requests >= reported[name]
        if reported[name]:
            assert times.mean_s["e2e"] > 0 and times.lone_prefill_s > 0
            # vLLM's prefix-cache counters over the replay, beside the simulated engines' hits.
            assert times.prefix_queries > 0 and 0 <= times.prefix_hits <= times.prefix_queries
    assert set(rep.sim_prefix_hit_share()) == {"a", "b"}
    # Pinned where there are two CPUs: each server on its own.
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) >= 2:
        assert [c.server.cpus for c in rep.calibrations] == [(usable[0],), (usable[1],)]

"""Metrics, status, tenants hot reload and background tuning of a running gateway."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.config.tenants import hash_key
from gateway.live.statuspage import page_state
from gateway.profiling.promparse import parse_families
from tests.live.harness import chain, emulators, gateway_client, write_config

GPUS = ["A100", "L40S"]


async def test_metrics_cover_the_required_families_with_bounded_labels(tmp_path: Path) -> None:
    # Outlier ejection off: on a busy machine one emulator can lag, and an ejection re-dispatches the calls
    # queued on it, which this test would count as extra dispatches (ejection has its own tests).
    health = {"period_s": 0.2, "timeout_s": 1.0, "failures_to_down": 2, "outlier": {"enabled": False}}
    async with (
        emulators(GPUS) as urls,
        gateway_client(write_config(tmp_path, urls, GPUS, health=health)) as (
            client,
            app,
        ),
    ):
        for _ in range(3):
            r = await client.post("/v1/workflows", json={"calls": chain(2, width=2, kind="schema_linking")})
            assert r.status_code == 200
        # Client-chosen kinds are bounded: the 33rd distinct kind and later become "other".
        many = [{"id": f"k{i}", "kind": f"kind{i}", "prompt_tokens": 5, "max_tokens": 1} for i in range(40)]
        assert (await client.post("/v1/workflows", json={"calls": many})).status_code == 200
        await app.state.gateway.pool.monitor.scrape_all()
        text = (await client.get("/metrics")).text
        fam = parse_families(text)
        for name in (
            "hexflow_workflow_latency_seconds_bucket",
            "hexflow_stage_latency_seconds_bucket",
            "hexflow_call_run_seconds_bucket",
            "hexflow_queue_wait_seconds_bucket",
            "hexflow_workflows_total",
            "hexflow_slo_attainment_ratio",
            "hexflow_queue_depth",
            "hexflow_inflight",
            "hexflow_dispatch_total",
            "hexflow_estimate_ratio_bucket",
            "hexflow_worker_up",
            "hexflow_alpha",
            "hexflow_worker_vllm_waiting",
            "hexflow_worker_kv_cache_usage_ratio",
            "hexflow_active_workflows",
        ):
            assert name in fam, name
        met = [
            v for labels, v in fam["hexflow_workflows_total"] if labels == {"tenant": "interactive", "outcome": "met"}
        ]
        assert met == [4.0]
        assert [v for _, v in fam["hexflow_slo_attainment_ratio"]] == [1.0]
        kinds = {labels["kind"] for labels, _ in fam["hexflow_dispatch_total"]}
        assert "schema_linking" in kinds and "other" in kinds and len(kinds) <= 33
        assert sum(v for _, v in fam["hexflow_dispatch_total"]) == 3 * 4 + 40
        assert {labels["worker"] for labels, _ in fam["hexflow_worker_up"]} == {"a100-0", "l40s-1"}
        assert [v for _, v in fam["hexflow_alpha"]] == [0.3]
        # Estimates were corrected online: every worker has a fresh ratio for the kind it served.
        status = (await client.get("/v1/status")).json()
        assert any(w["estimate_ratios"] for w in status["workers"])
        assert all(w["vllm"] is not None and w["vllm"]["running"] == 0.0 for w in status["workers"])


async def test_tenants_file_reloads_without_dropping_traffic(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="hexflow")
    async with emulators(GPUS) as urls, gateway_client(write_config(tmp_path, urls, GPUS)) as (client, app):
        gw = app.state.gateway
        tenants = tmp_path / "tenants.yaml"
        original = tenants.read_text()
        body = {"calls": chain(3, prompt=1000, out=20)}
        running = [asyncio.create_task(client.post("/v1/workflows", json=body)) for _ in range(4)]
        # A new key for tenant batch: valid file, picked up while workflows run.
        new_hash = hash_key("rotated-key")
        tenants.write_text(original.replace("api_key_sha256:\n", f"api_key_sha256:\n      - {new_hash}\n", 1))
        os.utime(tenants, ns=(1, 10**18))
        for _ in range(50):
            if gw.tenants.generation > 0:
                break
            await asyncio.sleep(0.05)
        assert gw.tenants.generation == 1
        r = await client.post("/v1/workflows", json=body, headers={"Authorization": "Bearer rotated-key"})
        assert r.status_code == 200
        # A broken file is rejected; the old tenants stay in force.
        tenants.write_text("tenants: [ {name: broken")
        os.utime(tenants, ns=(1, 10**18 + 10**9))
        for _ in range(50):
            if gw.tenants.reload_failures:
                break
            await asyncio.sleep(0.05)
        assert gw.tenants.reload_failures == 1 and gw.tenants.last_error
        assert (await client.post("/v1/workflows", json=body)).status_code == 200
        for r in await asyncio.gather(*running):
            assert r.status_code == 200
        m = (await client.get("/metrics")).text
        assert 'hexflow_tenant_reloads_total{result="failed"} 1.0' in m
        assert 'hexflow_tenant_reloads_total{result="ok"} 1.0' in m
        reloaded = [r for r in caplog.records if "tenants reloaded" in r.getMessage()]
        assert [r.levelname for r in reloaded] == ["INFO"], "one reload, logged once"


async def test_background_tuner_replays_the_window_in_another_process(tmp_path: Path) -> None:
    cfg = {"min_workflows": 3, "interval_s": 3600, "hysteresis": 0.0, "grid": [0.0, 0.5, 1.0], "enabled": True}
    async with emulators(GPUS) as urls, gateway_client(write_config(tmp_path, urls, GPUS, tuning=cfg)) as (client, app):
        gw = app.state.gateway
        assert gw.tuner is not None
        assert await gw.tuner.tune_once() == "skipped"
        body = {"calls": chain(3, width=2, prompt=2000, out=20), "template": "chess"}
        for r in await asyncio.gather(*(client.post("/v1/workflows", json=body) for _ in range(4))):
            assert r.status_code == 200
        result = await gw.tuner.tune_once()
        assert result in ("applied", "kept")
        last = gw.tuner.last
        assert last is not None and last["window_workflows"] == 4 and last["chosen"] in (0.0, 0.5, 1.0)
        assert gw.scheduler.alpha == (last["chosen"] if result == "applied" else 0.3)
        status = (await client.get("/v1/status")).json()
        assert status["tuning"]["runs"] == 2 and status["alpha"] == gw.scheduler.alpha
        # The status page's tuning history: both runs, newest first, with their age instead of a clock reading.
        history = page_state(gw)["tuning"]["history"]
        assert [run["result"] for run in history] == [result, "skipped"]
        assert history[0]["chosen"] == last["chosen"] and history[0]["alpha"] == gw.scheduler.alpha
        assert all(run["age_s"] >= 0 and "at" not in run for run in history)


async def test_an_ejected_worker_shows_with_its_reason_and_back_off_in_readyz_and_status(tmp_path: Path) -> None:
    async with (
        emulators(GPUS) as urls,
        gateway_client(write_config(tmp_path, urls, GPUS)) as (client, app),
    ):
        r = await client.get("/readyz")
        assert r.status_code == 200 and "ejected_workers" not in r.json()
        pool = app.state.gateway.pool
        st = pool.workers[1]
        pool.outliers.cfg = pool.outliers.cfg.model_copy(update={"base_ejection_s": 60.0, "max_ejection_s": 300.0})
        pool.eject(st, "its last 20 calls took 4x their predicted latency (peers: 1x)")
        r = await client.get("/readyz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["healthy_workers"] == 1
        (entry,) = body["ejected_workers"]
        assert entry["name"] == st.name and entry["reason"].startswith("its last 20 calls took 4x")
        assert 0 < entry["ejected_for_s"] <= 60.0
        status = {w["name"]: w for w in (await client.get("/v1/status")).json()["workers"]}
        mine = status[st.name]
        assert mine["ejected"] is True and mine["ejected_reason"] == entry["reason"]
        assert 0 < mine["ejected_for_s"] <= 60.0
        other = status[pool.workers[0].name]
        assert other["ejected"] is False and other["ejected_reason"] is None and other["ejected_for_s"] is None

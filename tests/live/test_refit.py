"""The live profile refit: completed calls are kept, a refit is applied through the scheduler, counted in
metrics and shown in /v1/status; a worker and a pod can name their profile."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gateway.config.gateway import load_gateway_config
from gateway.core.latency import LatencyModel
from gateway.core.samples import CallSample
from gateway.errors import ConfigError
from gateway.live.service import Gateway
from gateway.profiling.refit import RESULTS, constants_of, sample_rows
from tests.live.harness import chain, emulators, gateway_client, write_config

MODEL = "llama-3.1-70b"


def refit_cfg(**over: object) -> dict[str, object]:
    return {"enabled": True, "interval_s": 3600, "min_calls": 20, "window_calls": 200, **over}


async def test_a_mislabelled_worker_names_its_profile_and_its_calls_feed_a_refit(tmp_path: Path) -> None:
    async with emulators(["L40S", "A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["L40S", "A100"], refit=refit_cfg())
        doc = cfg.read_text().replace("gpu: L40S", "gpu: L40S\n    profile: A100")
        cfg.write_text(doc)
        async with gateway_client(cfg) as (client, app):
            gw: Gateway = app.state.gateway
            for _ in range(6):
                r = await client.post("/v1/workflows", json={"calls": chain(4, width=2, prompt=300, out=8)})
                assert r.status_code == 200, r.text
            assert gw.scheduler.samples is not None
            kept = sum(len(gw.scheduler.samples.samples(w)) for w in gw.scheduler.members())
            assert kept == 48
            assert gw.refit is not None
            results = await gw.refit.refit_once()
            assert results and set(results) <= set(RESULTS)
            status = (await client.get("/v1/status")).json()
            by_name = {w["name"]: w for w in status["workers"]}
            prof = by_name["l40s-0"]["profile"]
            assert prof["name"].endswith(f"/{MODEL}") and prof["source"] in ("catalogue", "refit")
            assert prof["refit"]["attempts"] >= (1 if by_name["l40s-0"]["completed"] >= 20 else 0)
            fitted = {"iter_base_s", "token_s", "ctx_s", "request_overhead_s"}
            assert set(prof["constants"]) == {*fitted, "attn_s", "seq_s", "admit_s"}
            text = (await client.get("/metrics")).text
            assert 'hexflow_profile_constant{constant="token_s",worker="l40s-0"}' in text
            if results:
                assert "hexflow_profile_refits_total{" in text


async def test_an_accepted_refit_changes_the_profile_restarts_ratios_and_shows_in_status(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], refit=refit_cfg())
        async with gateway_client(cfg) as (client, app):
            gw: Gateway = app.state.gateway
            r = await client.post("/v1/workflows", json={"calls": chain(2, prompt=300, out=8)})
            assert r.status_code == 200
            sched = gw.scheduler
            assert sched.samples is not None
            sched.samples.clear(0)
            # A worker 1.4x slower than its profile, as the calls it completed show.
            old = sched.workers[0].profile
            truth = replace(old, iter_base_s=old.iter_base_s * 1.4, token_s=old.token_s * 1.4)
            rng = random.Random(3)
            raw = [
                CallSample(
                    rng.randint(50, 6000), rng.randint(1, 200), rng.randint(1, 4), rng.uniform(0, 9000), 0.0, 1.0, 0.0
                )
                for _ in range(100)
            ]
            a, _ = sample_rows(raw, LatencyModel(old))
            for s, y in zip(raw, a @ np.array(constants_of(truth)), strict=True):
                sched.samples.add(0, replace(s, observed_s=float(y)))
            assert sched.estimator.ratios(0, gw.clock())  # learned from the workflow above
            assert await gw.refit.refit_once() == ["applied"]  # type: ignore[union-attr]
            new = sched.workers[0].profile
            assert new.iter_base_s == pytest.approx(truth.iter_base_s, rel=0.05)
            assert sched.estimator.ratios(0, gw.clock()) == {}
            [w] = (await client.get("/v1/status")).json()["workers"]
            assert w["profile"]["source"] == "refit" and w["profile"]["refit"]["applied"] == 1
            assert w["profile"]["refit"]["fit_error"] < 0.01
            text = (await client.get("/metrics")).text
            assert 'hexflow_profile_refits_total{result="applied",worker="a100-0"} 1.0' in text


@pytest.mark.parametrize(
    ("refit", "field"),
    [
        ({"min_calls": 500, "window_calls": 100}, "refit.min_calls"),
        ({"max_step": 3.0, "max_drift": 2.0}, "refit.max_drift"),
        ({"max_step": 1.0}, "refit.max_step"),
        ({"interval_s": 0}, "refit.interval_s"),
    ],
)
def test_bad_refit_settings_are_config_errors_naming_the_field(
    tmp_path: Path, refit: dict[str, object], field: str
) -> None:
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"], refit=refit)
    with pytest.raises(ConfigError) as err:
        load_gateway_config(cfg)
    assert err.value.field == field

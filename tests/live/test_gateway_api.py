"""The gateway's HTTP API against in-process emulated workers: results, timings, and every error code."""

from __future__ import annotations

from pathlib import Path

from tests.live.harness import chain, emulators, gateway_client, write_config

GPUS = ["A100", "L40S"]


async def test_workflow_runs_every_call_in_dependency_order(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls, gateway_client(write_config(tmp_path, urls, GPUS)) as (client, _):
        r = await client.post("/v1/workflows", json={"calls": chain(3, width=2), "deadline_s": 60})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["deadline_met"]
        assert [c["id"] for c in body["calls"]] == ["s0c0", "s0c1", "s1c0", "s1c1", "s2c0", "s2c1"]
        for c in body["calls"]:
            assert c["completion_tokens"] == 10 and c["prompt_tokens"] == 200
            assert c["worker"] in ("a100-0", "l40s-1")
            assert c["output"] is not None and len(c["output"].split()) == 10
        status = (await client.get("/v1/status")).json()
        assert status["policy"] == "hexgen" and len(status["workers"]) == 2
        assert sum(w["completed"] for w in status["workers"]) == 6

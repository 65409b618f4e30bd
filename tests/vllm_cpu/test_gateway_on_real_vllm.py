"""The live gateway in front of the real vLLM server on the CPU (tiny random model).

Workflows complete, the worker's real ``vllm:*`` series are scraped, and with a queue formed at the
gateway the urgency order is visible: a tight-deadline call submitted after loose ones starts first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import CONFIG_DIR
from gateway.profiling.promparse import parse_families
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, gateway_client, wait_for
from workers.cpu_vllm import SERVED_MODEL_NAME

pytestmark = pytest.mark.vllm_cpu


def _config(tmp: Path, url: str, *, capacity: int, policy: str = "hexgen") -> Path:
    # Tenants admitted by their concurrency bounds only: the profile is a GPU stand-in for a CPU server, so
    # until the estimator has learned the real speed its completion predictions would refuse the tests'
    # deliberately queued work (deadline-based admission has its own tests on emulated workers).
    tenants = yaml.safe_load((CONFIG_DIR / "tenants.yaml").read_text())
    for t in tenants["tenants"]:
        t["predictive_admission"] = False
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    cfg: dict[str, Any] = {
        "policy": policy,
        "tenants_file": "tenants.yaml",
        "cluster": {
            "name": "cpu",
            # The profile is a stand-in (a GPU profile for a CPU server): the estimator's online
            # correction learns the real speed from observed latencies.
            "model": "llama-3.1-8b",
            "workers": [
                {"name": "cpu-0", "gpu": "L4", "url": url, "capacity": capacity, "served_model": SERVED_MODEL_NAME}
            ],
        },
        "health": {"period_s": 0.5, "timeout_s": 2.0, "failures_to_down": 3},
        "scrape": {"period_s": 0.25, "timeout_s": 2.0},
        "tuning": {"enabled": False},
        "shutdown_grace_s": 10,
        "benchmark": True,  # synthetic prompts (prompt_tokens) of exact sizes
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _call(i: str, deps: list[str], n_in: int = 40, n_out: int = 8) -> dict[str, Any]:
    return {
        "id": i,
        "kind": "step",
        "depends_on": deps,
        "prompt_tokens": n_in,
        "max_tokens": n_out,
        "min_tokens": n_out,
        "ignore_eos": True,
    }


async def test_workflows_complete_and_real_vllm_metrics_are_scraped(tmp_path: Path, vllm_url: str) -> None:
    async with gateway_client(_config(tmp_path, vllm_url, capacity=2)) as (client, app):
        body = {
            "calls": [_call("a", []), _call("b", ["a"]), _call("c", ["a"]), _call("d", ["b", "c"])],
            "deadline_s": 300,
        }
        results = await asyncio.gather(*(client.post("/v1/workflows", json=body) for _ in range(3)))
        for r in results:
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["status"] == "ok"
            assert [c["completion_tokens"] for c in out["calls"]] == [8, 8, 8, 8]
            assert all(c["prompt_tokens"] == 40 for c in out["calls"])
        # Chat pass-through against the real server.
        r = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
        # Text completions, plain (text and token ids) and streamed, against the real server.
        for prompt in ("SELECT", [1, 2, 3]):
            r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3})
            assert r.status_code == 200, r.text
            assert r.json()["object"] == "text_completion" and r.json()["usage"]["completion_tokens"] <= 3
        r = await client.post("/v1/completions", json={"prompt": "SELECT", "max_tokens": 3, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.text.rstrip().endswith("data: [DONE]")
        gw = app.state.gateway
        await gw.pool.monitor.scrape_all()
        st = gw.pool.workers[0]
        assert st.metrics is not None and st.metrics.running is not None and st.metrics.kv_cache_usage is not None
        assert st.metrics.generation_tokens_total is not None and st.metrics.generation_tokens_total >= 3 * 4 * 8
        fam = parse_families((await client.get("/metrics")).text)
        assert [v for _, v in fam["hexflow_worker_up"]] == [1.0]
        assert "hexflow_worker_kv_cache_usage_ratio" in fam
        ratios = (await client.get("/v1/status")).json()["workers"][0]["estimate_ratios"]
        assert "step" in ratios


# Long enough to outlast the test's own queueing on a loaded machine (3000 tokens did not always), within the
# server's 16384-token context (tests/vllm_cpu/conftest.py).
BLOCKER = 10_000


async def test_tight_deadline_call_submitted_last_starts_first(tmp_path: Path, vllm_url: str) -> None:
    # Capacity 1: one call in vLLM at a time; the rest wait in the gateway's urgency queue.
    async with gateway_client(_config(tmp_path, vllm_url, capacity=1)) as (client, app):
        gw = app.state.gateway
        sent: list[int] = []  # max_tokens of each call, in the order calls leave the gateway
        orig = gw.transport.send

        async def spy(worker: Any, call: Any) -> Any:
            sent.append(int(call.body["max_tokens"]))
            return await orig(worker, call)

        gw.transport.send = spy

        async def post(key: str, deadline: float, n_out: int) -> None:
            body = {"calls": [_call("x", [], n_out=n_out)], "deadline_s": deadline}
            r = await client.post("/v1/workflows", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text

        # Calls are told apart by length: the blocker 10000 tokens, loose ones 8, the urgent one 9. The order
        # only means something on a run where all five calls were queued while the blocker still ran; the
        # tiny model can finish the blocker first on an idle CPU, so such a run is repeated (at most 3 runs),
        # never counted as a pass.
        runs: list[list[int]] = []
        for _ in range(3):
            sent.clear()
            blocker = asyncio.create_task(post(BATCH_KEY, 3600, BLOCKER))
            assert await wait_for(lambda: len(sent) == 1, 10), f"the blocker was not sent: {sent}"
            loose = [asyncio.create_task(post(BATCH_KEY, 3600, 8)) for _ in range(4)]
            queued = await wait_for(lambda: gw.scheduler.queue_len(0) == 4 or len(sent) > 1, 10)
            if not (queued and len(sent) == 1):
                await asyncio.gather(blocker, *loose)
                runs.append(list(sent))
                continue
            urgent = asyncio.create_task(post(INTERACTIVE_KEY, 30, 9))
            # Valid only if the urgent call was queued while the blocker still ran (it may finish meanwhile).
            queued = await wait_for(lambda: gw.scheduler.queue_len(0) == 5 or len(sent) > 1, 10)
            valid = queued and len(sent) == 1
            await asyncio.gather(blocker, *loose, urgent)
            if valid:
                break
            runs.append(list(sent))
        else:
            raise AssertionError(f"the blocker finished before the calls were queued in every run: {runs}")
        assert sent == [BLOCKER, 9, 8, 8, 8, 8], f"the urgent call did not start first after the blocker: {sent}"

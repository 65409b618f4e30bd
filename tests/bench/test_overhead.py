"""The overhead bench: a smoke-sized measurement, and unit tests of its pure parts (added latency, errors by
kind, the bracket rate search)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.bench.overhead import (
    Measurement,
    StreamStats,
    added_latency,
    bracket_search,
    build_report,
    error_kind,
    format_report,
    merge_errors,
    process_cpu_s,
    run_overhead,
    shortfalls,
    write_json,
)
from gateway.bench.stats import percentile
from gateway.errors import GatewayError


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_process_cpu_s_reads_this_process() -> None:
    x = sum(i * i for i in range(300_000))  # some CPU time of our own
    t = os.times()
    assert x > 0 and process_cpu_s(os.getpid()) == pytest.approx(t.user + t.system, abs=0.05)


def test_overhead_smoke() -> None:
    rep = run_overhead(rate=40.0, duration_s=2.0, rates=[60.0])
    assert rep.errors == 0 and rep.worker == "null" and rep.endpoint == "chat"
    assert rep.gateway_calls >= 40 and rep.direct_calls >= 40
    for v in (rep.direct_p50_ms, rep.gateway_p50_ms, rep.gateway_p99_ms, rep.gateway_cpu_ms_per_call):
        assert math.isfinite(v) and v > 0
    # The gateway path includes the direct path's work plus its own: slower at the median.
    assert rep.gateway_p50_ms > rep.direct_p50_ms
    [row] = rep.table
    assert row["rate"] == 60.0 and row["gateway_calls"] >= 60 and row["added_p99_ms"] >= row["added_p50_ms"] >= 0
    text = format_report(rep)
    assert "added" in text and "CPU ms/call" in text


@pytest.mark.parametrize("worker", ["null", "emulator"])
def test_overhead_smoke_of_completions(worker: str) -> None:
    rep = run_overhead(rate=30.0, duration_s=1.5, endpoint="completions", worker=worker)
    assert rep.errors == 0 and rep.gateway_calls >= 20 and rep.direct_calls >= 20
    assert rep.endpoint == "completions" and rep.worker == worker


def test_unknown_endpoint_or_worker_is_refused() -> None:
    with pytest.raises(GatewayError, match="unknown endpoint"):
        run_overhead(endpoint="embeddings")
    with pytest.raises(GatewayError, match="unknown worker"):
        run_overhead(worker="vllm")


# --- the pure parts: added latency, errors by kind, the rate search -----------------------------------


def _ramp(lo: float, hi: float, n: int = 1000) -> list[float]:
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def test_added_latency_is_the_quantile_shift_when_it_is_monotone() -> None:
    direct = _ramp(1.0, 3.0)
    gateway = [x + 2.0 for x in direct]  # the gateway adds exactly 2 ms to every quantile
    added = added_latency(gateway, direct)
    assert added.p50_ms == pytest.approx(2.0)
    assert added.p99_ms == pytest.approx(2.0)
    assert added.p50_raw_ms == pytest.approx(2.0) and added.p99_raw_ms == pytest.approx(2.0)


def test_added_p99_never_below_added_p50_when_the_direct_tail_is_saturated() -> None:
    # The direct stream fell behind: its tail (queueing on the machine) is far above the gateway's.
    direct = _ramp(1.0, 2.0, 900) + _ramp(50.0, 200.0, 100)
    gateway = [x + 3.0 for x in _ramp(1.0, 2.0, 950)] + _ramp(10.0, 20.0, 50)
    raw_p99 = percentile(sorted(gateway), 99) - percentile(sorted(direct), 99)
    assert raw_p99 < 0  # what plain subtraction would have reported
    added = added_latency(gateway, direct)
    assert added.p99_raw_ms == pytest.approx(raw_p99)
    assert added.p50_ms == pytest.approx(3.0, abs=0.1)
    # Plain subtraction gives added p99 < 0 < added p50; the envelope keeps the largest gap from the median
    # up (about 3 ms, below the 90th percentile, where the direct stream was not yet queueing).
    assert added.p99_ms >= added.p50_ms >= 0.0
    assert added.p99_ms == pytest.approx(3.0, abs=0.1)


def test_added_latency_is_floored_at_zero_and_nan_without_data() -> None:
    added = added_latency(_ramp(1.0, 2.0), _ramp(3.0, 9.0))  # "gateway" faster at every quantile
    assert added.p50_ms == 0.0 and added.p99_ms == 0.0
    assert added.p50_raw_ms < 0 and added.p99_raw_ms < 0
    empty = added_latency([], _ramp(1.0, 2.0))
    assert math.isnan(empty.p50_ms) and math.isnan(empty.p99_ms)


def _stream(sent: int, ok: int, latency_ms: float, wall_s: float, errors: dict[str, int] | None = None) -> StreamStats:
    s = StreamStats(sent=sent, ok=ok, wall_s=wall_s, latencies_ms=[latency_ms] * ok)
    for kind, n in (errors or {}).items():
        for _ in range(n):
            s.record_error(kind)
    return s


def test_shortfalls_name_why_a_stream_did_not_keep_up() -> None:
    assert shortfalls(_stream(100, 100, 2.0, 1.0), 1.0, 20.0) == []
    slow = shortfalls(_stream(100, 90, 2.0, 1.0), 1.0, 20.0)
    assert len(slow) == 1 and "achieved 90.0/s" in slow[0]
    assert any("p99" in r for r in shortfalls(_stream(100, 100, 30.0, 1.0), 1.0, 20.0))
    assert any("backlog" in r for r in shortfalls(_stream(100, 100, 2.0, 3.0), 1.0, 20.0))
    errs = shortfalls(_stream(100, 99, 2.0, 1.0, {"503": 1}), 1.0, 20.0)
    assert errs[0] == "1 errors"
    assert "no successful calls" in shortfalls(_stream(10, 0, 0.0, 1.0, {"timeout": 10}), 1.0, 20.0)


def test_report_marks_added_latency_unreliable_when_the_direct_stream_is_saturated() -> None:
    gateway = StreamStats(sent=1000, ok=1000, wall_s=10.0, latencies_ms=_ramp(2.0, 6.0))
    direct = StreamStats(sent=1000, ok=1000, wall_s=10.0, latencies_ms=_ramp(1.0, 3.0))
    fine = build_report(Measurement(gateway, direct, cpu_s=5.0, wall_s=10.0), 100.0, 10.0, 20.0)
    assert fine.added_reliable and fine.direct_shortfalls == []
    assert fine.gateway_cpu_ms_per_call == pytest.approx(5.0)
    assert fine.gateway_cpu_util == pytest.approx(0.5)
    assert "UNRELIABLE" not in format_report(fine)

    saturated = StreamStats(sent=1000, ok=900, wall_s=10.0, latencies_ms=_ramp(1.0, 300.0, 900))
    saturated.record_error("timeout")
    rep = build_report(Measurement(gateway, saturated, cpu_s=5.0, wall_s=10.0), 100.0, 10.0, 20.0)
    assert not rep.added_reliable
    assert rep.added_p99_ms >= rep.added_p50_ms >= 0.0
    text = format_report(rep)
    assert "added latency UNRELIABLE" in text and "timeout x1" in text
    assert rep.direct_errors == {"timeout": 1} and rep.gateway_errors == {}


def test_errors_are_counted_by_status_and_kind() -> None:
    assert error_kind(status=503) == "503"
    assert error_kind(exc=TimeoutError()) == "timeout"
    assert error_kind(exc=aiohttp.ServerTimeoutError()) == "timeout"  # a ClientError and a TimeoutError
    assert error_kind(exc=aiohttp.ServerDisconnectedError()) == "connection"
    assert error_kind(exc=aiohttp.ClientPayloadError("truncated")) == "protocol"
    with pytest.raises(ValueError):
        error_kind()
    s = StreamStats()
    for kind in ("503", "timeout", "429", "503", "connection"):
        s.record_error(kind)
    assert s.errors == 5
    assert merge_errors(s.errors_by_kind, {"503": 1, "500": 2, "timeout": 0}) == {
        "429": 1,
        "500": 2,
        "503": 3,
        "connection": 1,
        "timeout": 1,
    }


def test_json_report_has_errors_by_kind_and_no_nan(tmp_path: Path) -> None:
    gateway = _stream(10, 8, 2.0, 1.0, {"502": 2})
    rep = build_report(Measurement(gateway, StreamStats(sent=10, wall_s=1.0), cpu_s=0.1, wall_s=1.0), 10.0, 1.0, 20.0)
    rep.search.append({"rate": 10.0, "ok": False, "reasons": ["no successful calls"], "p99_ms": math.nan})
    write_json(rep, tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())  # strict: NaN would not be valid JSON
    assert data["gateway_errors"] == {"502": 2}
    assert data["direct_p50_ms"] is None and data["added_reliable"] is False
    assert data["search"][0]["p99_ms"] is None


def test_bracket_search_goes_below_a_failing_start_rate() -> None:
    limit = 137.0
    calls: list[float] = []

    def passes(rate: float) -> bool:
        calls.append(rate)
        return rate <= limit

    res = bracket_search(passes, 400.0, max_steps=12)
    assert res.tried[0] == (400.0, False)
    assert res.tried[1] == (200.0, False) and res.tried[2] == (100.0, True)  # halved until a pass
    assert [r for r, _ in res.tried] == calls and len(calls) <= 12
    assert res.best is not None and limit / 1.05 <= res.best <= limit
    assert all(ok == (r <= limit) for r, ok in res.tried)


def test_bracket_search_goes_up_from_a_passing_start_and_respects_the_step_budget() -> None:
    res = bracket_search(lambda r: r <= 1000.0, 100.0, max_steps=4)
    assert [r for r, _ in res.tried] == [100.0, 200.0, 400.0, 800.0]
    assert res.best == 800.0
    up = bracket_search(lambda r: r <= 1000.0, 100.0, max_steps=20)
    assert up.tried[4] == (1600.0, False) and up.best is not None and 950.0 <= up.best <= 1000.0


def test_bracket_search_reports_none_when_even_the_floor_fails() -> None:
    res = bracket_search(lambda r: False, 8.0, max_steps=10, floor=1.0)
    assert res.best is None
    assert [r for r, _ in res.tried] == [8.0, 4.0, 2.0, 1.0]  # stops at the floor, within the budget
    capped = bracket_search(lambda r: True, 3000.0, max_steps=10, ceiling=5000.0)
    assert [r for r, _ in capped.tried] == [3000.0, 5000.0] and capped.best == 5000.0
    with pytest.raises(ValueError):
        bracket_search(lambda r: True, 1.0, max_steps=0)

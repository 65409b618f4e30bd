"""Smoke-sized overhead measurement: gateway and direct streams side by side, CPU per call."""

from __future__ import annotations

import math

from gateway.bench.overhead import format_report, run_overhead


def test_overhead_smoke() -> None:
    rep = run_overhead(rate=40.0, duration_s=2.0)
    assert rep.errors == 0
    assert rep.gateway_calls >= 40 and rep.direct_calls >= 40
    for v in (rep.direct_p50_ms, rep.gateway_p50_ms, rep.gateway_p99_ms, rep.gateway_cpu_ms_per_call):
        assert math.isfinite(v) and v > 0
    # The gateway path includes the direct path's work plus its own: slower at the median.
    assert rep.gateway_p50_ms > rep.direct_p50_ms
    assert "added" in format_report(rep)

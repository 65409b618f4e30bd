"""Prefill/decode disaggregation's links: transfer times, presets, the per-pair lookup, and bad values."""

from __future__ import annotations

import math

import pytest

from gateway.core.profile import PerfProfile
from gateway.core.transfer import LINK_PRESETS, Interconnect, Link
from gateway.core.worker import WorkerInfo


def test_a_transfer_takes_its_latency_plus_its_bytes_over_the_bandwidth() -> None:
    link = Link(100.0, 0.002)
    assert link.seconds(0.0) == 0.0
    assert link.seconds(12.5e9) == pytest.approx(1.002), "100 Gb/s moves 12.5 GB a second"
    kv = 80 * 8 * 128 * 2 * 2  # Llama-3.1-70B in BF16
    assert link.seconds(10_000 * kv) == pytest.approx(0.002 + 10_000 * kv * 8 / 100e9)
    assert link.per_byte_s == pytest.approx(8 / 100e9)
    assert LINK_PRESETS["nvlink"].seconds(1e9) < LINK_PRESETS["pcie4"].seconds(1e9)
    assert LINK_PRESETS["pcie4"].seconds(1e9) < LINK_PRESETS["network-100g"].seconds(1e9)


def test_pairs_come_first_then_the_node_then_the_network() -> None:
    fast, slow, pinned = Link(1000.0), Link(10.0), Link(55.0)
    net = Interconnect({"a": "n1", "b": "n1", "c": "n2"}, fast, slow, {frozenset(("a", "d")): pinned})
    assert net.link("a", "b") is fast and net.link("a", "c") is slow
    assert net.link("d", "a") is pinned and net.link("a", "d") is pinned
    assert net.link("d", "e") is slow, "workers without a node share none"
    assert net.matrix(["a", "b"]) == [[None, fast], [fast, None]]


@pytest.mark.parametrize(("gbps", "latency"), [(0.0, 0.0), (-1.0, 0.0), (math.inf, 0.0), (1.0, -0.1), (1.0, math.nan)])
def test_a_bad_link_is_refused(gbps: float, latency: float) -> None:
    with pytest.raises(ValueError, match="link"):
        Link(gbps, latency)


def test_a_worker_has_a_known_role(fast: PerfProfile) -> None:
    assert WorkerInfo("w", fast, 4).role == "colocated"
    with pytest.raises(ValueError, match="role"):
        WorkerInfo("w", fast, 4, role="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        WorkerInfo("w", fast, 4, kv_bytes_per_token=-1)

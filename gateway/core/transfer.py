"""Prefill/decode disaggregation's links: the ``Link`` a split call's KV blocks cross between two workers, the
``Interconnect`` that answers it per pair, and the ``transfer_table`` the scheduler times transfers by
(docs/architecture.md, "Prefill/decode disaggregation"; a worker's role is ``WorkerInfo.role``). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gateway.core.worker import WorkerInfo


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a path between two workers: ``gbps`` gigabits per second of payload, and ``latency_s``
    per transfer (the connector's handshake and the first byte's flight)."""

    gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.gbps > 0.0 and math.isfinite(self.gbps)):
            raise ValueError(f"a link's bandwidth must be positive and finite, got {self.gbps} Gb/s")
        if not (self.latency_s >= 0.0 and math.isfinite(self.latency_s)):
            raise ValueError(f"a link's latency must be >= 0 and finite, got {self.latency_s} s")

    @property
    def per_byte_s(self) -> float:
        """Seconds per byte of payload."""
        return 8.0 / (self.gbps * 1e9)

    def seconds(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over the link (latency included; nothing to move: 0)."""
        if nbytes <= 0.0:
            return 0.0
        return self.latency_s + nbytes * self.per_byte_s


LINK_PRESETS: dict[str, Link] = {
    "nvlink": Link(2400.0, 0.0005),
    "pcie4": Link(200.0, 0.001),
    "pcie5": Link(400.0, 0.001),
    "network-100g": Link(100.0, 0.002),
    "network-200g": Link(200.0, 0.002),
    "network-400g": Link(400.0, 0.002),
}
"""Named links, at the effective payload rates a KV connector reaches rather than the headline figures: NVLink
(A100's NVLink 3: 300 GB/s per direction), PCIe 4.0 and 5.0 x16 (about 25 and 50 GB/s after protocol overhead),
and RDMA networks of 100, 200 and 400 Gb/s; the latencies are a transfer's setup (connector handshake, first
byte), not a wire's."""
SAME_NODE: Final = "nvlink"
"""The default link between two workers on one node."""
BETWEEN_NODES: Final = "network-100g"
"""The default link between two workers on different nodes (or whose node is not said)."""


@dataclass(frozen=True)
class Interconnect:
    """The link between each pair of workers (by name): ``pairs`` (either order) first, then ``same_node`` for
    two workers of one named node, else ``between_nodes``."""

    nodes: Mapping[str, str] = field(default_factory=dict)
    """Worker name -> node name (a worker not listed shares a node with no one)."""
    same_node: Link = LINK_PRESETS[SAME_NODE]
    between_nodes: Link = LINK_PRESETS[BETWEEN_NODES]
    pairs: Mapping[frozenset[str], Link] = field(default_factory=dict)

    def link(self, a: str, b: str) -> Link | None:
        """The link from worker ``a`` to worker ``b`` (None: the same worker, nothing moves)."""
        if a == b:
            return None
        pinned = self.pairs.get(frozenset((a, b)))
        if pinned is not None:
            return pinned
        na, nb = self.nodes.get(a), self.nodes.get(b)
        return self.same_node if na is not None and na == nb else self.between_nodes

    def matrix(self, names: Sequence[str]) -> list[list[Link | None]]:
        """``link(a, b)`` for every ordered pair of ``names`` (the diagonal None)."""
        return [[self.link(a, b) for b in names] for a in names]


def transfer_table(workers: Sequence[WorkerInfo], net: Interconnect | None = None) -> list[list[tuple[float, float]]]:
    """Per (source, destination) worker: a transfer's (latency s, s per prompt token) at the source's KV bytes per
    token (``net`` None: ``Interconnect`` over the workers' nodes, its default links)."""
    if net is None:
        net = Interconnect({w.name: w.node for w in workers if w.node})
    matrix = net.matrix([w.name for w in workers])
    return [
        [(0.0, 0.0) if link is None else (link.latency_s, w.kv_bytes_per_token * link.per_byte_s) for link in row]
        for w, row in zip(workers, matrix, strict=True)
    ]

"""The simulator's event heap pops in exactly the order ``heapq`` pops (time, seq) tuples."""

from __future__ import annotations

import heapq
import random

import pytest

from gateway.sim.events import Event, EventHeap


@pytest.mark.parametrize("seed", range(5))
def test_the_event_heap_pops_in_heapqs_order_with_ties_first_in_first_out(seed: int) -> None:
    rng = random.Random(seed)
    seq = 0
    initial = []
    for _ in range(rng.randint(0, 300)):
        seq += 1
        initial.append((rng.choice([0.0, 1.0, rng.uniform(0, 100)]), seq))
    ref = list(initial)
    heapq.heapify(ref)
    heap = EventHeap([Event(t, s, 0, None, -1, 0) for t, s in initial])
    got: list[tuple[float, int]] = []
    want: list[tuple[float, int]] = []
    for _ in range(3000):
        if ref and rng.random() < 0.45:
            e = heap.pop()
            got.append((e.t, e.seq))
            want.append(heapq.heappop(ref))
        else:
            seq += 1
            t = rng.choice([0.0, 5.0, rng.uniform(0, 100)])  # many equal times: the seq decides
            heapq.heappush(ref, (t, seq))
            heap.push(Event(t, seq, 1, None, 3, 7))
        assert len(heap) == len(ref)
    while ref:
        e = heap.pop()
        got.append((e.t, e.seq))
        want.append(heapq.heappop(ref))
    assert got == want
    with pytest.raises(IndexError):
        heap.pop()

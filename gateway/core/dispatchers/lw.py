"""``lw``: least predicted wait (AIBrix's least-busy-time, llm-d's load-aware scorer): the smallest ``t_queue`` wins;
ties go to the lower ``t_comp``, then the lower position."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, register_dispatcher


class LeastWork:
    """AIBrix least-busy-time / llm-d load-aware: least predicted wait before the call's prompt runs; ``finish``:
    least predicted finish ``t_queue + t_comp`` instead (``eft``)."""

    def __init__(self, finish: bool = False) -> None:
        self.finish = finish

    def choose(self, view: DispatchView) -> int:
        """Minimum ``t_queue`` (``finish``: ``t_queue + t_comp``); ties to the lower ``t_comp``, then the lower
        position. Comparisons written out (no tuples built per worker)."""
        with_comp = self.finish
        rows = view.rows
        workers = view.workers
        r = rows[workers[0]]
        best = 0
        bc = r.t_comp
        bk = r.t_queue + bc if with_comp else r.t_queue
        for i in range(1, len(workers)):
            r = rows[workers[i]]
            c = r.t_comp
            key = r.t_queue + c if with_comp else r.t_queue
            if key < bk or (key == bk and c < bc):
                best, bk, bc = i, key, c
        return best


register_dispatcher("lw", lambda _rng: LeastWork(), Capabilities())

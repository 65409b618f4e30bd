"""``p2c``: power of two choices on queue length (queued + in flight), Ray Serve's default request router."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, Rng, register_dispatcher


class PowerOfTwo:
    """Ray Serve's router: sample two distinct workers, send to the one with the shorter queue."""

    def __init__(self, rng: Rng) -> None:
        self._rng = rng

    def choose(self, view: DispatchView) -> int:
        """The shorter of two random distinct workers (queued + in flight); ties to the first sample."""
        workers = view.workers
        n = len(workers)
        if n == 1:
            return 0
        a = int(self._rng.random() * n) % n
        b = int(self._rng.random() * (n - 1)) % (n - 1)
        if b >= a:
            b += 1
        ra = view.rows[workers[a]]
        rb = view.rows[workers[b]]
        return b if rb.queued + rb.inflight < ra.queued + ra.inflight else a


register_dispatcher("p2c", PowerOfTwo, Capabilities(queue_len=True))

"""``rr``: round-robin over the workers, ignoring load and speed (a plain Kubernetes Service; the vLLM baseline)."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, register_dispatcher


class RoundRobin:
    """vLLM behind a plain load balancer: the next worker in turn."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, view: DispatchView) -> int:
        """The first eligible worker at or after the turn pointer, by worker index (wrapping around)."""
        workers = view.workers
        pos = 0
        for i in range(len(workers)):
            if workers[i] >= self._next:
                pos = i
                break
        self._next = workers[pos] + 1
        return pos


register_dispatcher("rr", lambda _rng: RoundRobin(), Capabilities())

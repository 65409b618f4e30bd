"""Completed calls kept per worker (the last ``window``) for the slow profile refit (``gateway.profiling.refit``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gateway.core.latency import prefill_token_s
from gateway.core.pickled import field_values
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call


@dataclass(frozen=True, slots=True)
class CallSample:
    """One completed call, in the terms of ``LatencyModel.sample_terms`` (the batch and the prompt tokens ahead of
    it at start), with its observed latency and when it returned."""

    prefill_tokens: int
    output_tokens: int
    batch_n: int
    batch_ctx: float
    wait_tokens: float
    observed_s: float
    at: float

    def __reduce__(self) -> tuple[type[CallSample], tuple[object, ...]]:
        return type(self), field_values(self)


def sample_of(call: Call, profile: PerfProfile, observed_s: float, now: float) -> CallSample:
    """The sample of a call that returned after ``observed_s``, on the worker whose profile is ``profile``."""
    per_token = prefill_token_s(profile)
    wait_tokens = call.wait_s / per_token if per_token > 0.0 and call.wait_s > 0.0 else 0.0
    s = call.spec
    return CallSample(
        prefill_tokens=max(s.input_tokens - call.cached, 1),
        output_tokens=s.output_tokens,
        batch_n=max(call.batch_n, 1),
        batch_ctx=call.batch_ctx,
        wait_tokens=wait_tokens,
        observed_s=observed_s,
        at=now,
    )


class SampleLog:
    """The last ``window`` completed calls of every worker slot; ``total`` counts every one ever added."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"the sample window must hold at least one call, got {window}")
        self.window = window
        self._by_worker: list[deque[CallSample]] = []
        self.total: list[int] = []

    def _slot(self, worker: int) -> deque[CallSample]:
        while len(self._by_worker) <= worker:
            self._by_worker.append(deque(maxlen=self.window))
            self.total.append(0)
        return self._by_worker[worker]

    def add(self, worker: int, sample: CallSample) -> None:
        """Keep ``sample`` for ``worker`` (the oldest one beyond the window is dropped)."""
        self._slot(worker).append(sample)
        self.total[worker] += 1

    def samples(self, worker: int) -> list[CallSample]:
        """A copy of the worker's window, oldest first."""
        return list(self._slot(worker))

    def added(self, worker: int) -> int:
        """Samples ever added for the worker's slot (since it was last cleared)."""
        self._slot(worker)
        return self.total[worker]

    def clear(self, worker: int) -> None:
        """Forget a slot's samples (a new worker took it)."""
        self._slot(worker).clear()
        self.total[worker] = 0

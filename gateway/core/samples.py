"""Completed calls kept per worker for the slow profile refit (``gateway.profiling.refit``).

A ``CallSample`` holds a call's token counts, the batch the estimator assumed at its start (so its predicted latency is
linear in the profile's constants) and its observed latency; ``SampleLog`` keeps the last ``window`` per worker."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gateway.core.latency import prefill_token_s
from gateway.core.pickled import field_values
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call


@dataclass(frozen=True, slots=True)
class CallSample:
    """One completed call, in the terms of the latency model (``LatencyModel.sample_terms``).

    Attributes:
        prefill_tokens: prompt tokens the engine processed (input less the tokens expected cached).
        output_tokens: generated tokens.
        batch_n: calls in the decode batch at start, the call included.
        batch_ctx: context tokens that batch read per decode step at start.
        wait_tokens: prompt tokens ahead of the call in the engine at start (the prefill clock's wait,
            converted to tokens with the profile in force then).
        observed_s: latency from sent to returned, seconds.
        at: when the call returned (the driver's clock).
    """

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

"""The tests' one fake clock: time that moves only when the test moves it.

Pass the clock itself where the code takes a monotonic ``clock`` (it is callable), ``clock.wall`` where it
takes a wall clock (a ``datetime`` that moves with the monotonic time, from ``epoch``), and ``clock.sleep``
where it takes an async ``sleep``: a sleep that returns at once and moves the time on (the code under
test is then the only one moving it). Without ``sleep``, the time is manual: the test sets ``t``.

``virtual_time_loop`` runs a whole event loop on such a clock, moved on by the loop's own timers.
"""

from __future__ import annotations

import asyncio
import selectors
from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
"""The wall time of a ``FakeClock`` at monotonic time 0."""


class FakeClock:
    """A monotonic clock: ``clock()`` is ``clock.t``; the test sets ``t`` or calls ``advance``, and ``sleep``
    advances it.

    Args:
        t: the starting monotonic time in seconds.
        epoch: the wall time at monotonic time 0.
    """

    def __init__(self, t: float = 0.0, epoch: datetime = EPOCH) -> None:
        self.t = t
        self.epoch = epoch
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        """The monotonic time now."""
        return self.t

    def advance(self, dt: float) -> float:
        """Move the time on by ``dt`` seconds; returns the new time."""
        self.t += dt
        return self.t

    async def sleep(self, s: float) -> None:
        """A sleep on this clock: records ``s`` in ``sleeps`` and moves the time on by it, at once."""
        self.sleeps.append(s)
        self.t += s

    def wall(self) -> datetime:
        """The wall time now: ``epoch`` plus the monotonic time."""
        return self.epoch + timedelta(seconds=self.t)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that never waits for a timer: where the loop would sleep ``timeout`` seconds with no I/O
    ready, it moves the loop's virtual clock on by ``timeout`` and returns at once."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer at all: only I/O can wake the loop
            return super().select(None)
        self.clock.advance(timeout)
        return []


def virtual_time_loop() -> asyncio.AbstractEventLoop:
    """An event loop on a virtual clock (``loop.time``, from 0): time moves only while every task waits on a
    timer, and then jumps to the earliest one. CPU work takes no time on it, so a model in real time (an
    emulated worker on ``loop.time``) and what measures it see the model's latencies on any machine, busy or
    not. For ``asyncio.Runner(loop_factory=virtual_time_loop)``; only in-process I/O (no threads)."""
    clock = FakeClock()
    loop = asyncio.SelectorEventLoop(_JumpingSelector(clock))
    loop.time = clock  # type: ignore[method-assign]
    return loop

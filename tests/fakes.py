"""The tests' one fake clock: time that moves only when the test moves it.

Pass the clock itself where the code takes a monotonic ``clock`` (it is callable), ``clock.wall`` where it
takes a wall clock (a ``datetime`` that moves with the monotonic time, from ``epoch``), and ``clock.sleep``
where it takes an async ``sleep``: a sleep that returns at once and moves the time on (the code under
test is then the only one moving it). Without ``sleep``, the time is manual: the test sets ``t``.
"""

from __future__ import annotations

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

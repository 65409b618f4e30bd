"""The tests' one fake clock: time that moves only when the test moves it.

Pass the clock itself where the code takes a monotonic ``clock`` (it is callable), and ``clock.wall``
where it takes a wall clock (a ``datetime`` that moves with the monotonic time, from ``epoch``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
"""The wall time of a ``FakeClock`` at monotonic time 0."""


class FakeClock:
    """A manual monotonic clock: ``clock()`` is ``clock.t``; the test sets ``t`` or calls ``advance``.

    Args:
        t: the starting monotonic time in seconds.
        epoch: the wall time at monotonic time 0.
    """

    def __init__(self, t: float = 0.0, epoch: datetime = EPOCH) -> None:
        self.t = t
        self.epoch = epoch

    def __call__(self) -> float:
        """The monotonic time now."""
        return self.t

    def advance(self, dt: float) -> float:
        """Move the time on by ``dt`` seconds; returns the new time."""
        self.t += dt
        return self.t

    def wall(self) -> datetime:
        """The wall time now: ``epoch`` plus the monotonic time."""
        return self.epoch + timedelta(seconds=self.t)

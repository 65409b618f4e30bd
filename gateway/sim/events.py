"""The simulator's event queue: a binary min-heap of events by (time, unique sequence number), written out so the
native build compares attributes, not tuples; it pops the order ``heapq`` would."""

from __future__ import annotations


class Event:
    """One event: fires at ``t``; ``seq`` breaks ties (first pushed, first out) and must be unique per heap."""

    __slots__ = ("kind", "payload", "seq", "t", "version", "worker")

    def __init__(self, t: float, seq: int, kind: int, payload: object, worker: int, version: int) -> None:
        self.t = t
        self.seq = seq
        self.kind = kind
        self.payload = payload
        self.worker = worker
        self.version = version


def _before(a: Event, b: Event) -> bool:
    return a.t < b.t or (a.t == b.t and a.seq < b.seq)


class EventHeap:
    """Events, earliest (time, seq) first."""

    def __init__(self, events: list[Event] | None = None) -> None:
        self._a: list[Event] = list(events) if events else []
        for i in range(len(self._a) // 2 - 1, -1, -1):
            self._down(i)

    def __len__(self) -> int:
        return len(self._a)

    def push(self, e: Event) -> None:
        """Add an event."""
        a = self._a
        a.append(e)
        i = len(a) - 1
        while i > 0:
            parent = (i - 1) >> 1
            p = a[parent]
            if not _before(e, p):
                break
            a[i] = p
            i = parent
        a[i] = e

    def pop(self) -> Event:
        """Remove and return the earliest event; ``IndexError`` when empty."""
        a = self._a
        last = a.pop()
        if not a:
            return last
        top = a[0]
        a[0] = last
        self._down(0)
        return top

    def _down(self, i: int) -> None:
        a = self._a
        n = len(a)
        e = a[i]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            c = a[child]
            right = child + 1
            if right < n:
                r = a[right]
                if _before(r, c):
                    child, c = right, r
            if not _before(c, e):
                break
            a[i] = c
            i = child
        a[i] = e

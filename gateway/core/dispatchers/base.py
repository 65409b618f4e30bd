"""The one dispatcher interface: what a dispatcher sees (``DispatchView``), declares (``Capabilities``: the row
fields it needs beyond ``t_comp``, ``t_queue``, ``harm``, ``inflight``) and is registered as (``DISPATCHERS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import UnknownName


class Rng(Protocol):
    """The part of ``random.Random`` a dispatcher may use; injected, never created here."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


@dataclass(slots=True)
class WorkerEstimate:
    """One worker's row of a dispatch snapshot, refreshed in place for every call (kept per worker instead of in
    lists built for every call: the dispatch hot path of a large cluster)."""

    t_comp: float = 0.0
    """The call's predicted compute time on the worker (``Estimator.scan``)."""
    t_queue: float = 0.0
    """How long the call would wait there before its prompt is processed (``Estimator.scan``)."""
    harm: float = 0.0
    """The delay the call's prompt would impose on the calls in flight there (``Estimator.scan``)."""
    inflight: int = 0
    """Calls sent to the worker and not yet returned (``Estimator.scan``)."""
    cached: int = 0
    """Prompt tokens of the call the worker is believed to hold (prefix-aware policies; else 0)."""
    credit: int = 0
    """The cached tokens the estimates count (``cached`` scaled by the policy's prefix credit)."""
    queued: int = 0
    """Calls waiting in the worker's gateway queue: filled only for ``Capabilities.queue_len``."""
    kv_util: float = 0.0
    """The worker's KV-cache use in [0, 1]: filled only for ``Capabilities.kv_util``."""


@dataclass(slots=True)
class DispatchView:
    """What a dispatcher sees for one call: ``rows[workers[i]]`` for position ``i`` of the eligible workers, and the
    call's figures (``t_comp_min`` over ``workers``; ``prefix``: the rows' ``cached`` are filled)."""

    rows: list[WorkerEstimate]
    workers: list[int]
    alpha: float = 0.0
    budget: float = 0.0
    t_comp_min: float = 0.0
    input_tokens: int = 0
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a dispatcher reads beyond the scan's estimates (the scheduler fills exactly that, nothing more)."""

    uses_alpha: bool = False
    """Reads ``view.alpha``: its policies are tuned by the alpha tuner."""
    queue_len: bool = False
    """Reads each row's ``queued``."""
    kv_util: bool = False
    """Reads each row's ``kv_util``."""
    prefix_index: bool = False
    """Reads each row's ``cached`` itself (not only through the estimates): its policies must be prefix-aware
    (``Policy.prefix_aware``), so that the scheduler keeps the prefix index that fills it."""


class Dispatcher(Protocol):
    """Chooses a worker for a call."""

    def choose(self, view: DispatchView) -> int:
        """Position (in ``view.workers``) of the chosen worker."""
        ...


@dataclass(frozen=True, slots=True)
class DispatcherEntry:
    """A registered dispatcher: how to make one (given the scheduler's RNG) and what it reads."""

    name: str
    make: Callable[[Rng], Dispatcher]
    capabilities: Capabilities


DISPATCHERS: dict[str, DispatcherEntry] = {}
"""Registered dispatchers by name, in registration order."""


def register_dispatcher(name: str, make: Callable[[Rng], Dispatcher], capabilities: Capabilities) -> None:
    """Register a dispatcher: ``make(rng)`` builds one per scheduler; a duplicate name raises."""
    if name in DISPATCHERS:
        raise ValueError(f"dispatcher {name!r} already registered")
    DISPATCHERS[name] = DispatcherEntry(name, make, capabilities)


def get_dispatcher(name: str) -> DispatcherEntry:
    """The registered dispatcher ``name``; unknown names raise ``UnknownName``."""
    try:
        return DISPATCHERS[name]
    except KeyError:
        raise UnknownName("dispatcher", name, list(DISPATCHERS)) from None

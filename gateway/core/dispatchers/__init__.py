"""Dispatchers as plugins, one module each, registered on import (docs/architecture.md, "Adding a dispatcher")."""

from __future__ import annotations

from gateway.core.dispatchers import eft, llmd, lw, p2c, rr, wb
from gateway.core.dispatchers.base import (
    DISPATCHERS,
    Capabilities,
    DispatchView,
    Rng,
    WorkerEstimate,
    get_dispatcher,
    register_dispatcher,
)

__all__ = [
    "DISPATCHERS",
    "Capabilities",
    "DispatchView",
    "Rng",
    "WorkerEstimate",
    "eft",
    "get_dispatcher",
    "llmd",
    "lw",
    "p2c",
    "register_dispatcher",
    "rr",
    "wb",
]

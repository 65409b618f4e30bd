"""Dispatchers as plugins: one module per dispatcher, one interface (``base``), one registry.

Registered dispatchers (each module's docstring has its rule):

``rr``    round-robin (``rr.py``)
``p2c``   power of two choices on queue length (``p2c.py``)
``lw``    least predicted wait (``lw.py``)
``eft``   earliest finish time (``eft.py``)
``wb``    HexGen-Flow's workload-balanced score, as the paper has it (``wb.py``)
``wbi``   ``wb`` with the call's interference in the queue term: what ``hexgen`` runs (``wb.py``)
``llmd``  llm-d's inference scheduler, default profile (``llmd.py``)

A dispatcher module defines a class with ``choose(view) -> position`` and calls ``register_dispatcher`` with its
``Capabilities``; the import below is its registration (``docs/architecture.md``, "Adding a dispatcher").
"""

from __future__ import annotations

from gateway.core.dispatchers import eft, llmd, lw, p2c, rr, wb
from gateway.core.dispatchers.base import (
    DISPATCHERS,
    Capabilities,
    Dispatcher,
    DispatcherEntry,
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
    "Dispatcher",
    "DispatcherEntry",
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

"""Workloads for the simulator and the benchmarks: queries, arrival times and tenants.

A workload is three independent choices, combined by ``build_workload`` (``build.py``):

* **queries**, each a flat list of ``CallSpec`` in the order the CHESS workflow issues them: loaded from
  a hexgen trace file (``load_trace``, ``traces.py``) or drawn from the ``chess-bird`` generator
  (``generate_chess_bird``, ``generator.py``), which is calibrated on the five hexgen traces;
* **arrival times** in seconds (``arrivals.py``): Poisson, Gamma (burstiness set by the coefficient of
  variation) or replayed from a CSV trace such as the Azure LLM inference trace 2023 (``replay_arrivals``);
* **tenants** (``TenantSpec``, ``tenants.py``): each arrival is assigned to one by share; a tenant sets
  the deadline and whether its requests are Text-to-SQL workflows or single chat calls.

Everything random takes a ``random.Random`` instance; nothing here touches the global generator, so the
same seed always gives the same workload. This package re-exports every public name of its modules.
"""

from __future__ import annotations

from gateway.sim.workload.arrivals import gamma_arrivals, poisson_arrivals, replay_arrivals
from gateway.sim.workload.build import build_workload
from gateway.sim.workload.generator import generate_chess_bird, sample_chat_call
from gateway.sim.workload.tenants import TenantKind, TenantSpec, parse_tenants
from gateway.sim.workload.traces import (
    CHESS_BIRD,
    SHARED_TRACE_DIR,
    load_queries,
    load_trace,
    normalise_step,
    repeat_to,
    resolve_trace,
    to_stages,
    trace_names,
)

__all__ = [
    "CHESS_BIRD",
    "SHARED_TRACE_DIR",
    "TenantKind",
    "TenantSpec",
    "build_workload",
    "gamma_arrivals",
    "generate_chess_bird",
    "load_queries",
    "load_trace",
    "normalise_step",
    "parse_tenants",
    "poisson_arrivals",
    "repeat_to",
    "replay_arrivals",
    "resolve_trace",
    "sample_chat_call",
    "to_stages",
    "trace_names",
]

"""Workloads for the simulator and the benchmarks: queries, arrival times and tenants (``build_workload``); a seed
gives one workload. Re-exports its modules' public names."""

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

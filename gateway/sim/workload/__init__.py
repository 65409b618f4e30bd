"""Workloads for the simulator and the benchmarks: queries, arrival times and tenants (``build_workload``); a seed
gives one workload. Re-exports the names its users import from the package (the rest: from its modules)."""

from __future__ import annotations

from gateway.sim.workload.arrivals import gamma_arrivals, poisson_arrivals
from gateway.sim.workload.build import build_workload
from gateway.sim.workload.generator import generate_chess_bird
from gateway.sim.workload.tenants import TenantSpec, parse_tenants
from gateway.sim.workload.traces import CHESS_BIRD, load_queries, resolve_trace, to_stages, workload_queries

__all__ = [
    "CHESS_BIRD",
    "TenantSpec",
    "build_workload",
    "gamma_arrivals",
    "generate_chess_bird",
    "load_queries",
    "parse_tenants",
    "poisson_arrivals",
    "resolve_trace",
    "to_stages",
    "workload_queries",
]

"""How fast the simulator runs: simulated calls per second of wall and CPU time, per cluster and policy.

Each measurement runs ``workflows`` workflows at ``load`` x the fluid bound (the regime a capacity search
spends its time in), ``repeats`` times, and keeps the fastest run (the least disturbed)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.bench.simbench import Setup
from gateway.bench.stats import positive
from gateway.sim.simulator import Simulator

NATIVE_PROBES = ("gateway.core.estimates", "gateway.core.scheduler", "gateway.sim.engine", "gateway.sim.simulator")
"""Modules the native build compiles (setup.py's ``NATIVE_MODULES`` holds them): how the build is told."""


def build_kind() -> str:
    """``"native"`` when the simulator's hot modules are compiled (``make native``), ``"python"`` when not."""
    compiled = [m for m in NATIVE_PROBES if not str(importlib.import_module(m).__file__).endswith(".py")]
    if not compiled:
        return "python"
    if len(compiled) == len(NATIVE_PROBES):
        return "native"
    return "partly native: " + ", ".join(compiled)


@dataclass(frozen=True)
class SpeedResult:
    """One (cluster, policy) measurement: the fastest of its repeats."""

    cluster: str
    policy: str
    workers: int
    rate_qps: float
    calls: int
    wall_s: float
    cpu_s: float
    build: str = "python"

    @property
    def calls_per_s(self) -> float:
        """Simulated calls per second of wall time."""
        return self.calls / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def calls_per_cpu_s(self) -> float:
        """Simulated calls per second of this process's CPU time (less sensitive to a busy machine)."""
        return self.calls / self.cpu_s if self.cpu_s > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """The fields and both rates, for JSON."""
        return {**asdict(self), "calls_per_s": self.calls_per_s, "calls_per_cpu_s": self.calls_per_cpu_s}


def measure_speed(
    cluster: str,
    setup: Setup,
    policies: Sequence[str],
    *,
    load: float = 0.7,
    repeats: int = 3,
    rate: float | None = None,
) -> list[SpeedResult]:
    """Time ``policies`` on ``setup`` (its workers, queries and base seed) at ``load`` x the fluid bound, or at
    ``rate`` workflows/s when given (the fluid bound's linear program is then not solved)."""
    if not load > 0:
        raise ValueError(f"load must be positive, got {load}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    rate = positive("rate", rate) if rate is not None else load * setup.bound.rate_qps
    out = []
    for policy in policies:
        runs: list[tuple[float, float, int]] = []
        for _ in range(repeats):
            wfs = setup.workflows(rate)
            sim = Simulator(setup.workers, policy, seed=setup.seed, prefix_caching=setup.prefix_caching)
            w0, c0 = time.perf_counter(), time.process_time()
            res = sim.run(wfs)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            runs.append((wall, cpu, res.num_calls))
        wall, cpu, calls = min(runs)
        out.append(SpeedResult(cluster, policy, len(setup.workers), rate, calls, wall, cpu, build_kind()))
    return out

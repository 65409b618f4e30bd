"""What the host's CPUs did over an interval, from Linux ``/proc``: each CPU's busy, steal, I/O-wait and idle
shares, and the CPU seconds of named process groups (a process must be alive at both samples, or start
between them, to count). ``sample`` returns None where ``/proc`` is missing."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_BUSY = ("user", "nice", "system", "irq", "softirq")
_TOP_OTHERS = 4


def _tick_s() -> float:
    try:
        return 1.0 / float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 0.01


@dataclass(frozen=True)
class HostSample:
    """One reading of ``/proc`` at ``time.monotonic()`` ``at``: CPU number -> state (``_FIELDS``) -> seconds
    since boot, and pid -> (process group, command name, user + system seconds)."""

    at: float
    cpus: dict[int, dict[str, float]]
    procs: dict[int, tuple[int, str, float]]


def _read_cpus(root: Path, tick: float) -> dict[int, dict[str, float]]:
    cpus: dict[int, dict[str, float]] = {}
    for line in (root / "stat").read_text().splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        with contextlib.suppress(ValueError):
            values = [int(v) * tick for v in rest.split()]
            cpus[int(name[3:])] = dict(zip(_FIELDS, values + [0.0] * (len(_FIELDS) - len(values)), strict=False))
    return cpus


def _read_procs(root: Path, tick: float) -> dict[int, tuple[int, str, float]]:
    procs: dict[int, tuple[int, str, float]] = {}
    for entry in (e for e in root.iterdir() if e.name.isdigit()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            procs[int(entry.name)] = _proc_stat(entry / "stat", tick)
    return procs


def _proc_stat(path: Path, tick: float) -> tuple[int, str, float]:
    """(process group, command name, user + system seconds) from a ``/proc/PID/stat`` file."""
    head, _, tail = path.read_text().rpartition(")")
    fields = tail.split()
    # After the command: state, ppid, pgrp, ..., utime (field 14 of the line), stime (15).
    return int(fields[2]), head.partition("(")[2], (int(fields[11]) + int(fields[12])) * tick


def process_cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds (all its threads), from ``/proc``."""
    return _proc_stat(Path(f"/proc/{pid}/stat"), _tick_s())[2]


def sample(root: Path = Path("/proc")) -> HostSample | None:
    """Read the CPUs' and processes' times now; None where ``root`` cannot be read (not Linux)."""
    tick = _tick_s()
    try:
        cpus, procs = _read_cpus(root, tick), _read_procs(root, tick)
    except OSError:
        return None
    return HostSample(time.monotonic(), cpus, procs) if cpus else None


@dataclass(frozen=True)
class CpuShare:
    """One CPU over an interval: each state's share of the wall time (they sum to about 1)."""

    busy: float
    steal: float
    iowait: float
    idle: float


@dataclass(frozen=True)
class HostUsage:
    """What the host did between two samples: each CPU's shares, the CPU seconds of the named process groups
    (``usage``'s ``named``) and of the busiest others (command of one member, CPU seconds; most first)."""

    wall_s: float
    cpus: dict[int, CpuShare]
    groups: dict[str, float]
    others: list[tuple[str, float]] = field(default_factory=list)

    def cores(self, name: str) -> float:
        """A named group's CPU seconds per wall second (1.0: one CPU's worth)."""
        return self.groups.get(name, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def beside(self, name: str, cpus: tuple[int, ...]) -> float:
        """The share of ``cpus``' time (1.0: all of them, all the time) that went to anything but the group
        ``name``: what else ran on the CPUs that group is pinned to (0 when ``cpus`` is empty or unknown)."""
        known = [c for c in cpus if c in self.cpus]
        if not known or self.wall_s <= 0:
            return 0.0
        busy = sum(self.cpus[c].busy for c in known) * self.wall_s
        return max(busy - self.groups.get(name, 0.0), 0.0) / (self.wall_s * len(known))

    def steal(self, cpus: tuple[int, ...]) -> float:
        """The mean steal share of ``cpus`` (0 when empty or unknown)."""
        known = [c for c in cpus if c in self.cpus]
        return sum(self.cpus[c].steal for c in known) / len(known) if known else 0.0

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        return {
            "wall_s": self.wall_s,
            "cpus": {str(c): asdict(s) for c, s in sorted(self.cpus.items())},
            "groups_cpu_s": dict(self.groups),
            "others_cpu_s": [{"command": c, "cpu_s": s} for c, s in self.others],
        }


def usage(before: HostSample, after: HostSample, named: Mapping[str, int]) -> HostUsage:
    """The interval from ``before`` to ``after``; ``named``: a name for each process group (pgid) to count
    apart (a server's group, the benchmark's own). Every other group is ranked in ``others``."""
    wall = max(after.at - before.at, 1e-9)
    cpus: dict[int, CpuShare] = {}
    for c, a in after.cpus.items():
        b = before.cpus.get(c)
        if b is None:
            continue
        d = {k: max(a[k] - b[k], 0.0) for k in _FIELDS}
        total = sum(d.values())
        if total <= 0:
            continue
        # Shares of the CPU's own accounted time (it can differ from the wall clock by a tick or so).
        cpus[c] = CpuShare(sum(d[k] for k in _BUSY) / total, d["steal"] / total, d["iowait"] / total, d["idle"] / total)
    per_group: dict[int, float] = {}
    names: dict[int, str] = {}
    for pid, (pgid, comm, cpu_s) in after.procs.items():
        prev = before.procs.get(pid)
        # A pid seen before in another group (reused) or not seen: its whole time counts.
        spent = cpu_s - prev[2] if prev is not None and prev[0] == pgid else cpu_s
        per_group[pgid] = per_group.get(pgid, 0.0) + max(spent, 0.0)
        if pid == pgid or pgid not in names:
            names[pgid] = "kernel threads" if pgid == 0 else comm
    groups = {name: per_group.get(pgid, 0.0) for name, pgid in named.items()}
    mine = set(named.values())
    others = sorted(((names[g], s) for g, s in per_group.items() if g not in mine and s > 0), key=lambda x: -x[1])
    return HostUsage(wall, cpus, groups, others[:_TOP_OTHERS])

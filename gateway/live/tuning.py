"""Background alpha re-tuning: replay the last finished workflows in the simulator, off the event loop
(docs/live-gateway.md, "Alpha re-tuning"). ``WindowRecorder`` keeps the window, ``Retuner`` decides (no I/O;
shared with ``hexflow bench tuner``), ``AlphaTuner`` runs it in a one-worker ``spawn`` process pool."""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config.workflows import TEMPLATES
from gateway.core.dag import DagNode, DagWorkflow, chain_nodes
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import OnlineWorkflow, StagedWorkflow
from gateway.live.monitor import stopped_within

if TYPE_CHECKING:
    from gateway.config.operations import TuningConfig
    from gateway.live.service import Gateway

log = logging.getLogger("hexflow.tuning")

TUNING_HISTORY = 50
"""Tuning runs ``AlphaTuner.history`` keeps (the status page's tuning history)."""


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One recorded workflow, picklable for the tuning process: its nodes and its template's name."""

    arrival: float
    deadline: float
    tenant: str
    nodes: tuple[DagNode, ...]
    template: str | None


class WindowRecorder:
    """The tuner's window: the last ``size`` finished workflows in finishing order; a snapshot leaves out (and
    forgets) entries older than ``max_age_s``; ``total`` counts every workflow recorded."""

    def __init__(self, size: int, max_age_s: float = math.inf) -> None:
        if size < 1:
            raise ValueError(f"the window must hold at least one workflow, got {size}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        self.size = size
        self.max_age_s = max_age_s
        self.total = 0
        self._entries: deque[WindowEntry] = deque(maxlen=size)

    def record(self, wf: DagWorkflow | OnlineWorkflow | StagedWorkflow) -> None:
        """Record a finished workflow (one of stages, online or staged in a simulation, as the chain of its
        stages; one that ran none is left out)."""
        nodes = wf.nodes if isinstance(wf, DagWorkflow) else tuple(chain_nodes([st.calls for st in wf.stages]))
        if nodes:
            name = wf.template.name if wf.template is not None else None
            self._entries.append(WindowEntry(wf.arrival, wf.deadline, wf.tenant, nodes, name))
            self.total += 1

    def snapshot(self, now: float) -> list[WindowEntry]:
        """The window at ``now``, oldest arrival first (the replay's order); stale entries are dropped."""
        cutoff = now - self.max_age_s
        if any(e.arrival < cutoff for e in self._entries):
            self._entries = deque((e for e in self._entries if e.arrival >= cutoff), maxlen=self.size)
        return sorted(self._entries, key=lambda e: e.arrival)

    def __len__(self) -> int:
        return len(self._entries)


def rebuild(entries: Sequence[WindowEntry]) -> list[DagWorkflow]:
    """Workflows for the simulator from recorded entries (arrivals relative to the first)."""
    if not entries:
        return []
    t0 = entries[0].arrival
    out = []
    for i, e in enumerate(entries):
        template = TEMPLATES.get(e.template) if e.template is not None else None
        out.append(DagWorkflow.build(i, e.tenant, e.arrival - t0, e.deadline - t0, e.nodes, template))
    return out


@dataclass(frozen=True)
class TuneOutcome:
    """What a tuning run found: the tuner's choice and each grid point's simulated P95."""

    chosen: float
    p95_by_alpha: dict[float, float]
    workflows: int
    seconds: float


def tune_window(
    workers: Sequence[WorkerInfo],
    policy: str,
    entries: Sequence[WindowEntry],
    grid: Sequence[float],
    seed: int,
    current: float,
    prefix_caching: bool = False,
) -> TuneOutcome:
    """Run in the tuning process (and by ``hexflow bench tuner``): the simulator's tuner on the window.
    ``prefix_caching``: the replay's engines cache prefixes (only the recorded ``shared_prefix`` ones)."""
    from gateway.sim.tune import tune_alpha

    t = time.perf_counter()
    res = tune_alpha(
        workers, policy, rebuild(entries), grid=grid, seed=seed, current=current, prefix_caching=prefix_caching
    )
    return TuneOutcome(res.alpha, {p.alpha: p.summary.p95_s for p in res.points}, len(entries), time.perf_counter() - t)


class Retuner:
    """The tuner's decisions, without I/O or clock: when a run is due, what it replays, whether to apply."""

    def __init__(self, cfg: TuningConfig, recorder: WindowRecorder) -> None:
        self.cfg = cfg
        self.recorder = recorder
        self.last_total = 0
        """``recorder.total`` when the last run took its window."""

    def due(self) -> bool:
        """Whether ``every_workflows`` more workflows finished since the last run took its window."""
        return self.recorder.total - self.last_total >= self.cfg.every_workflows

    def take_window(self, now: float) -> list[WindowEntry]:
        """The window to replay now; the next run is due ``every_workflows`` workflows from here."""
        self.last_total = self.recorder.total
        return self.recorder.snapshot(now)

    def enough(self, entries: Sequence[WindowEntry]) -> bool:
        """Whether the window is big enough to tune on (``min_workflows``)."""
        return len(entries) >= self.cfg.min_workflows

    def grid(self) -> list[float]:
        """The alphas each run tries."""
        from gateway.sim.tune import ALPHA_GRID

        return list(self.cfg.grid) if self.cfg.grid is not None else list(ALPHA_GRID)

    def should_apply(self, out: TuneOutcome, current: float) -> bool:
        """Apply the chosen alpha only if its simulated P95 beats the current alpha's by ``hysteresis``."""
        cur_p95 = _nearest(out.p95_by_alpha, current)
        new_p95 = out.p95_by_alpha[out.chosen]
        return out.chosen != current and new_p95 < cur_p95 * (1.0 - self.cfg.hysteresis)


class AlphaTuner:
    """The background task: re-tunes alpha in a separate process when a run is due, and applies it."""

    def __init__(self, gateway: Gateway, cfg: TuningConfig) -> None:
        self.gw = gateway
        self.cfg = cfg
        self.retuner = Retuner(cfg, gateway.recorder)
        self._executor: ProcessPoolExecutor | None = None
        self.last: dict[str, Any] | None = None
        self.runs = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=TUNING_HISTORY)
        """The last ``TUNING_HISTORY`` runs, oldest first, each with ``at`` (the gateway clock): the status page's."""

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._executor

    def close(self) -> None:
        """Shut the tuning process down."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def run(self, stop: asyncio.Event) -> None:
        """Every ``interval_s`` until ``stop`` is set: tune when a run is due (``Retuner.due``)."""
        while not await stopped_within(stop, self.cfg.interval_s):
            if self.retuner.due():
                await self.tune_once()

    async def tune_once(self) -> str:
        """One tuning run now, due or not; returns its result label (applied, kept, skipped, failed)."""
        gw = self.gw
        entries = self.retuner.take_window(gw.clock())
        if not self.retuner.enough(entries):
            return self._count("skipped", {"reason": f"{len(entries)} workflows in the window"})
        workers = [gw.scheduler.workers[i] for i in gw.scheduler.members()]
        if not workers:
            return self._count("skipped", {"reason": "no workers"})
        current = gw.scheduler.alpha
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(
                self._pool(),
                tune_window,
                workers,
                gw.scheduler.policy.name,
                entries,
                self.retuner.grid(),
                gw.cfg.seed,
                current,
                gw.cfg.prefix_caching,
            )
        except Exception as exc:
            log.error("alpha tuning failed: %r", exc)
            self.close()
            return self._count("failed", {"error": repr(exc)})
        cur_p95 = _nearest(out.p95_by_alpha, current)
        new_p95 = out.p95_by_alpha[out.chosen]
        info = {
            "window_workflows": out.workflows,
            "seconds": round(out.seconds, 3),
            "current": current,
            "chosen": out.chosen,
            "current_p95_s": cur_p95,
            "chosen_p95_s": new_p95,
        }
        if self.retuner.should_apply(out, current):
            gw.scheduler.alpha = out.chosen
            gw.metrics.alpha.set(out.chosen)
            log.info("alpha %.2f -> %.2f (simulated P95 %.2f s -> %.2f s)", current, out.chosen, cur_p95, new_p95)
            return self._count("applied", info)
        log.debug(  # every tuning interval (a minute): not news
            "alpha kept at %.2f (tuner chose %.2f; simulated P95 %.2f s vs %.2f s)",
            current,
            out.chosen,
            cur_p95,
            new_p95,
        )
        return self._count("kept", info)

    def _count(self, result: str, info: dict[str, Any]) -> str:
        self.runs += 1
        self.gw.metrics.tuning_runs.labels(result=result).inc()
        self.last = {"result": result, **info}
        self.history.append({"at": self.gw.clock(), "alpha": self.gw.scheduler.alpha, **self.last})
        return result

    def status(self) -> dict[str, Any]:
        """For ``/v1/status``."""
        rec = self.gw.recorder
        return {
            "runs": self.runs,
            "last": self.last,
            "window_workflows": len(rec),
            "finished_since_last_run": rec.total - self.retuner.last_total,
        }


def _nearest(p95: dict[float, float], alpha: float) -> float:
    key = min(p95, key=lambda a: abs(a - alpha))
    return p95[key]

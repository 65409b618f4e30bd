"""Background alpha re-tuning: replay the recent window of workflows in the simulator, off the loop.

Every finished workflow is recorded as a ``WindowEntry``: arrival, deadline, tenant, its ``DagNode``s
(frozen dataclasses: the calls with their token counts and dependencies) and its budgeting template's
name. Every ``tuning.interval_s`` the window is pickled to a separate process (a one-worker
``ProcessPoolExecutor`` with the ``spawn`` start method, so no event-loop state is forked) that rebuilds
the workflows and runs ``gateway.sim.tune.tune_alpha`` on the gateway's own cluster model and policy. The
chosen alpha is applied only if its simulated P95 beats the current alpha's by ``hysteresis`` (so the
gateway does not flap between equivalent values); every run is logged and counted in
``hexflow_tuning_runs_total{result=applied|kept|skipped|failed}``.
"""

from __future__ import annotations

import asyncio
import logging
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
from gateway.core.workflow import OnlineWorkflow

if TYPE_CHECKING:
    from gateway.config.gateway import TuningConfig
    from gateway.live.service import Gateway

log = logging.getLogger("hexflow.tuning")


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One recorded workflow, picklable for the tuning process: its nodes and its template's name."""

    arrival: float
    deadline: float
    tenant: str
    nodes: tuple[DagNode, ...]
    template: str | None


class WindowRecorder:
    """The recent window of finished workflows (bounded by age and count)."""

    def __init__(self, window_s: float, max_workflows: int) -> None:
        self.window_s = window_s
        self._entries: deque[WindowEntry] = deque(maxlen=max_workflows)

    def record(self, wf: DagWorkflow) -> None:
        """Record a finished workflow."""
        name = wf.template.name if wf.template is not None else None
        self._entries.append(WindowEntry(wf.arrival, wf.deadline, wf.tenant, wf.nodes, name))

    def record_online(self, wf: OnlineWorkflow) -> None:
        """Record a finished online workflow as the chain of the stages it ran."""
        nodes = tuple(chain_nodes([st.calls for st in wf.stages]))
        name = wf.template.name if wf.template is not None else None
        if nodes:
            self._entries.append(WindowEntry(wf.arrival, wf.deadline, wf.tenant, nodes, name))

    def snapshot(self, now: float) -> list[WindowEntry]:
        """Entries that arrived within ``window_s`` of ``now``, oldest first (older ones are dropped)."""
        while self._entries and self._entries[0].arrival < now - self.window_s:
            self._entries.popleft()
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
) -> TuneOutcome:
    """Run in the tuning process: the simulator's tuner on the recorded window."""
    from gateway.sim.tune import ALPHA_GRID, tune_alpha

    t = time.perf_counter()
    res = tune_alpha(workers, policy, rebuild(entries), grid=grid or ALPHA_GRID, seed=seed, current=current)
    return TuneOutcome(res.alpha, {p.alpha: p.summary.p95_s for p in res.points}, len(entries), time.perf_counter() - t)


class AlphaTuner:
    """The background task: periodically tunes alpha in a separate process and applies it."""

    def __init__(self, gateway: Gateway, cfg: TuningConfig) -> None:
        self.gw = gateway
        self.cfg = cfg
        self._executor: ProcessPoolExecutor | None = None
        self.last: dict[str, Any] | None = None
        self.runs = 0

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
        """Tune every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.interval_s)
                return
            except TimeoutError:
                pass
            await self.tune_once()

    async def tune_once(self) -> str:
        """One tuning run; returns its result label (applied, kept, skipped, failed)."""
        gw = self.gw
        entries = gw.recorder.snapshot(gw.clock())
        if len(entries) < self.cfg.min_workflows:
            return self._count("skipped", {"reason": f"{len(entries)} workflows in the window"})
        workers = [gw.scheduler.workers[i] for i in gw.scheduler.members()]
        if not workers:
            return self._count("skipped", {"reason": "no workers"})
        current = gw.scheduler.alpha
        grid = list(self.cfg.grid) if self.cfg.grid else []
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(
                self._pool(),
                tune_window,
                workers,
                gw.scheduler.policy.name,
                entries,
                grid,
                gw.cfg.seed,
                current,
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
        if out.chosen != current and new_p95 < cur_p95 * (1.0 - self.cfg.hysteresis):
            gw.scheduler.alpha = out.chosen
            gw.metrics.alpha.set(out.chosen)
            log.info("alpha %.2f -> %.2f (simulated P95 %.2f s -> %.2f s)", current, out.chosen, cur_p95, new_p95)
            return self._count("applied", info)
        log.info(
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
        return result

    def status(self) -> dict[str, Any]:
        """For ``/v1/status``."""
        return {"runs": self.runs, "last": self.last, "window_workflows": len(self.gw.recorder)}


def _nearest(p95: dict[float, float], alpha: float) -> float:
    key = min(p95, key=lambda a: abs(a - alpha))
    return p95[key]

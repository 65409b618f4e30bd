"""The discrete-event simulator: workflows arrive, the shared scheduler dispatches, engines batch.

The event loop is SimPy-style: a heap of events by ``(time, seq)`` (``gateway.sim.events``) with a per-run
counter, so ties are FIFO and runs are deterministic. It drives exactly the ``gateway.core.Scheduler`` the live
gateway drives, with virtual time:

    arrival      -> workflow.start() -> Scheduler.submit() each ready call -> fill the worker
    fill worker  -> while in flight < capacity: Scheduler.pop_next() -> engine.add(); engine.kick()
    engine wake  -> finished calls leave the engine -> result event after the profile's per-request
                    overhead (API server time, off the GPU)
    result       -> Scheduler.on_finish() (the gateway's slot frees when it sees the response, as
                    live) -> workflow.complete() -> submit the calls that became ready -> fill the
                    worker that returned the call

The only randomness is the injected ``random.Random(seed)`` (used by ``p2c``); workloads are built
before the run from their own seeds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from gateway.core.degrade import Knobs
from gateway.core.policy import Policy
from gateway.core.predict import SUSTAINABLE_SHARE, CompletionPredictor, calls_plan
from gateway.core.profile import PerfProfile
from gateway.core.scheduler import BEST_EFFORT_SHARE, Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, StagedWorkflow, Workflow, deadline_met
from gateway.sim.degrade import KnobbedWorkflow
from gateway.sim.engine import EngineStats, SimEngine
from gateway.sim.events import Event, EventHeap
from gateway.sim.refit import FitOutcome, RefitSettings, Refitter

_ARRIVAL = 0
_WAKE = 1
_RESULT = 2
_HEDGE = 3


@dataclass(frozen=True)
class HedgeSettings:
    """Hedging a straggling critical-path call (issue 13's mechanism; off unless ``Simulator(hedge=...)``).

    A call is checked once, when it has run ``after`` times its predicted time on its worker
    (``Call.t_comp``, the estimate it was dispatched with). It is hedged when it is still running, its
    workflow waits on nothing else (the call is the critical path now), and another worker with a free
    slot and an empty queue is predicted to finish a fresh copy (``t_queue + t_comp`` there) in under
    ``gain`` times what the original has left. What it has left: once decoding, its remaining output
    tokens at the pace it has decoded so far; before its first token, as long again as it has run.
    The first copy to answer wins; the other is taken off its queue or aborted in its engine at the next
    iteration boundary (``SimEngine.cancel``), and the scheduler forgets it without learning from it.
    """

    after: float = 1.5
    gain: float = 0.7

    def __post_init__(self) -> None:
        if not (self.after > 0 and math.isfinite(self.after)):
            raise ValueError(f"hedge after must be a positive number, got {self.after}")
        if not 0 < self.gain <= 1:
            raise ValueError(f"hedge gain must be in (0, 1], got {self.gain}")

    def __reduce__(self) -> tuple[type[HedgeSettings], tuple[float, float]]:
        # Pickled by its fields (to a bench's worker processes): a frozen dataclass compiled by mypyc (the
        # native build) cannot be unpickled by setting attributes.
        return (
            type(self),
            (
                self.after,
                self.gain,
            ),
        )


@dataclass(slots=True)
class WorkflowRecord:
    """Outcome of one workflow."""

    wid: int
    tenant: str
    arrival: float
    deadline: float
    finish: float
    calls: int
    knobs: Knobs | None = None
    """The setting a degradable workflow ran at (``KnobbedWorkflow.used``); None: full quality."""
    full_knobs: Knobs | None = None
    """Its full-quality setting (None for a workflow that cannot degrade)."""

    @property
    def degraded(self) -> bool:
        """Whether degradation removed work of this workflow."""
        return self.knobs is not None and self.knobs != self.full_knobs

    @property
    def latency(self) -> float:
        """End-to-end latency in seconds."""
        return self.finish - self.arrival

    @property
    def met(self) -> bool:
        """Whether the workflow finished by its deadline."""
        return deadline_met(self.finish, self.deadline)


@dataclass(slots=True)
class CallTimeline:
    """Timeline of one simulated call (kept when ``record_calls`` is set): absolute virtual times.

    Not the live gateway's ``gateway.live.service.CallRecord``, on purpose: this one holds the moments
    of one call in virtual time (with ``engine_done``, when the engine finished it, which only the
    simulator knows) for invariant tests and timelines; the live record holds what a caller is told
    about a call (worker name, queue and run seconds, attempts, and the worker's answer or error).
    """

    wid: int
    kind: str
    worker: int
    ready: float
    start: float
    engine_done: float
    result: float
    node: int = -1
    """The call's node index in a ``DagWorkflow`` (-1 for other workflows)."""


@dataclass
class SimResult:
    """Everything a run produced."""

    workflows: list[WorkflowRecord]
    calls: list[CallTimeline] = field(default_factory=list)
    engine_stats: list[EngineStats] = field(default_factory=list)
    dispatch_counts: list[dict[str, int]] = field(default_factory=list)
    num_calls: int = 0
    end_time: float = 0.0
    unfinished: int = 0
    rejected: list[int] = field(default_factory=list)
    """Ids of the workflows refused at admission (``Simulator(admission=True)``)."""
    demoted: list[int] = field(default_factory=list)
    """Ids of the workflows admitted at the lowest urgency (``admission_miss="best_effort"``)."""


class Simulator:
    """One simulated run of a workload on a cluster under one policy.

    Args:
        workers: the cluster (profiles and gateway capacities).
        policy: policy name or object.
        alpha: the WB balance parameter (None: the policy's default).
        seed: seed of the scheduler's RNG.
        record_calls: keep a ``CallTimeline`` per call (for invariant tests and timelines).
        horizon_s: stop after this much virtual time (unfinished workflows are counted).
        admission: admit each arriving workflow as the live gateway does (``gateway.core.predict``: refused
            when its predicted completion is beyond ``admission_headroom`` of the time to its deadline, with
            the work of admitted workflows committed until submitted). Refused workflows are listed in
            ``SimResult.rejected`` and have no record (they count as missed). Workflows other than
            ``StagedWorkflow`` are always admitted.
        admission_headroom: the share of the deadline a prediction must fit in (the live gateway's 0.9).
        admission_share: the share of the engines' full-batch throughput that admission forecasts the work
            ahead of a workflow at (``CompletionPredictor``'s ``efficiency``; the live gateway's
            ``admission.sustainable_share``).
        admission_miss: what happens to a workflow predicted to miss: ``"reject"`` (refused, listed in
            ``SimResult.rejected``) or ``"best_effort"`` (admitted at the lowest urgency, its calls behind every
            other call: the live ``on_predicted_miss: best_effort``; listed in ``SimResult.demoted``).
        best_effort_share: a worker starts a best-effort call only while fewer than this share of its slots are
            in flight (``Scheduler``'s; the live ``admission.best_effort_share``).
        prefix_caching: the engines cache prompt prefixes (vLLM's automatic prefix caching, ``SimEngine``),
            and prefix-aware policies track them.
        engine_profiles: what the engines really run, per worker (default: the workers' profiles). A
            profile that differs from its worker's is a mislabelled worker: the scheduler plans with the
            label, the engine runs at its own speed (``hexflow bench mislabel``).
        refit: refit the workers' profiles online (``gateway.sim.refit``; settings, or a ``Refitter`` whose
            ``step`` is called), every ``interval_s`` of virtual time, checked when a call returns;
            ``refits`` lists what each attempt did.
        hedge: hedge straggling critical-path calls (``HedgeSettings``); ``hedges`` counts the copies sent
            and ``hedges_won`` those that answered first.
    """

    def __init__(
        self,
        workers: Sequence[WorkerInfo],
        policy: str | Policy,
        *,
        alpha: float | None = None,
        seed: int = 0,
        record_calls: bool = False,
        horizon_s: float = float("inf"),
        admission: bool = False,
        admission_headroom: float = 0.9,
        admission_share: float = SUSTAINABLE_SHARE,
        admission_miss: str = "reject",
        best_effort_share: float = BEST_EFFORT_SHARE,
        prefix_caching: bool = False,
        engine_profiles: Sequence[PerfProfile] | None = None,
        refit: RefitSettings | Refitter | None = None,
        hedge: HedgeSettings | None = None,
    ) -> None:
        if not 0.0 < admission_headroom <= 1.0:
            raise ValueError(f"admission_headroom must be in (0, 1], got {admission_headroom}")
        self.admission = admission
        self.admission_headroom = admission_headroom
        if admission_miss not in ("reject", "best_effort"):
            raise ValueError(f"admission_miss must be 'reject' or 'best_effort', got {admission_miss!r}")
        self.admission_miss = admission_miss
        if not 0.0 < admission_share <= 1.0:
            raise ValueError(f"admission_share must be in (0, 1], got {admission_share}")
        self.admission_share = admission_share
        self.workers = list(workers)
        self.prefix_caching = prefix_caching
        self.scheduler = Scheduler(
            self.workers,
            policy,
            random.Random(seed),
            alpha=alpha,
            prefix_caching=prefix_caching,
            best_effort_share=best_effort_share,
        )
        truth = [w.profile for w in self.workers] if engine_profiles is None else list(engine_profiles)
        if len(truth) != len(self.workers):
            raise ValueError(f"engine_profiles: {len(truth)} profiles for {len(self.workers)} workers")
        self.engine_profiles = truth
        self.engines = [SimEngine(p, i, prefix_caching=prefix_caching) for i, p in enumerate(truth)]
        self.refitter: Refitter | None = None
        self.refits: list[tuple[float, str, FitOutcome]] = []
        """``(time, result, outcome)`` of every refit attempt (``refit`` given)."""
        if refit is not None:
            self.refitter = refit if isinstance(refit, Refitter) else Refitter(refit)
            self.refitter.attach(self.scheduler)
        self.record_calls = record_calls
        self.horizon_s = horizon_s
        self.hedge = hedge
        self.hedges = 0
        self.hedges_won = 0

    def run(self, workflows: Sequence[Workflow]) -> SimResult:
        """Simulate until every workflow finished (or the horizon); return the records."""
        sched = self.scheduler
        engines = self.engines
        caps = [w.capacity for w in self.workers]
        overhead = [p.request_overhead_s for p in self.engine_profiles]
        refitter = self.refitter
        next_refit = refitter.s.interval_s if refitter is not None else math.inf
        hedge = self.hedge
        # Events by (time, seq): seq makes ties FIFO and deterministic.
        seq = 0
        initial: list[Event] = []
        for wf in workflows:
            seq += 1
            initial.append(Event(wf.arrival, seq, _ARRIVAL, wf, -1, 0))
        heap = EventHeap(initial)
        records: list[WorkflowRecord] = []
        call_records: list[CallTimeline] = []
        ncalls: dict[int, int] = {}
        call_id = 0
        pending = len(workflows)
        now = 0.0

        def fill(w: int, t: float) -> None:
            nonlocal seq
            eng = engines[w]
            added = False
            while sched.inflight(w) < caps[w]:
                c = sched.pop_next(w, t)
                if c is None:
                    break
                eng.add(c)
                added = True
                if hedge is not None and c.twin is None:
                    seq += 1
                    heap.push(Event(t + hedge.after * max(c.t_comp, 1e-6), seq, _HEDGE, c, w, 0))
            if added and eng.kick(t):
                seq += 1
                heap.push(Event(eng.wake_at, seq, _WAKE, None, w, eng.version))

        # Admission (off by default): cluster seconds of work admitted workflows have still to submit.
        committed = 0.0
        work_left: dict[int, float] = {}
        demoted: set[int] = set()
        demoted_ids: list[int] = []
        rejected: list[int] = []

        def admit(wf: Workflow, t: float) -> bool:
            nonlocal committed
            if not isinstance(wf, StagedWorkflow):
                return True
            plan = calls_plan([st.calls for st in wf.stages])
            pred = CompletionPredictor(sched, t, committed_s=committed, efficiency=self.admission_share)
            if pred.duration(plan) > self.admission_headroom * (wf.deadline - t):
                return False
            work = pred.plan_work(plan)
            if math.isfinite(work):
                committed += work
                work_left[wf.wid] = work
            return True

        def submit(wf: Workflow, specs: list[CallSpec], t: float) -> None:
            nonlocal call_id, committed
            touched: list[int] = []
            left = work_left.get(wf.wid)
            pred = CompletionPredictor(sched, t) if left is not None else None
            low = wf.wid in demoted
            for spec in specs:
                call_id += 1
                c = Call(call_id, wf, spec, t, best_effort=low)
                if pred is not None and left is not None:  # submitted: in the queues now, no longer committed
                    done = min(pred.cluster_call_time(spec), left)
                    left -= done
                    committed = max(committed - done, 0.0)
                w = sched.submit(c, t)
                if w not in touched:
                    touched.append(w)
            ncalls[wf.wid] = ncalls.get(wf.wid, 0) + len(specs)
            if left is not None:
                work_left[wf.wid] = left
            for w in touched:
                fill(w, t)

        def remaining_of(c: Call, t: float) -> float:
            """What a running call has left (``HedgeSettings``)."""
            produced, first = engines[c.worker].progress(c, t)
            elapsed = t - (c.started_at if c.started_at is not None else t)
            if first is None or produced < 1:
                return elapsed
            left = c.spec.output_tokens - produced
            return left * (t - first) / max(produced - 1, 1)

        def try_hedge(c: Call, t: float) -> None:
            nonlocal call_id, seq
            assert hedge is not None
            if c.finished_at is not None or c.abandoned or c.twin is not None:
                return
            if c.workflow.pending_calls != 1:
                return
            spec = c.spec
            free = [
                v
                for v in sched.eligible_workers()
                if v != c.worker and sched.inflight(v) < caps[v] and sched.queue_len(v) == 0
            ]
            if not free:
                return
            t_comp, t_queue, _, _ = sched.estimator.snapshot(free, spec.kind, spec.input_tokens, spec.output_tokens, t)
            best = min(range(len(free)), key=lambda i: t_queue[i] + t_comp[i])
            if t_queue[best] + t_comp[best] >= hedge.gain * remaining_of(c, t):
                return
            call_id += 1
            copy = Call(call_id, c.workflow, spec, t)
            copy.twin, c.twin = c, copy
            sched.submit_to(copy, free[best], t)
            self.hedges += 1
            fill(free[best], t)

        def settle(c: Call, t: float) -> None:
            """``c`` answered first: abandon its twin and free the twin's slot."""
            nonlocal seq
            twin = c.twin
            if twin is None or twin.abandoned or twin.finished_at is not None:
                return
            if c.id > twin.id:
                self.hedges_won += 1
            was_running = twin.started_at is not None
            sched.abandon(twin, t)
            if was_running:
                eng = engines[twin.worker]
                if eng.cancel(twin, t):
                    seq += 1
                    heap.push(Event(eng.wake_at, seq, _WAKE, None, twin.worker, eng.version))
                fill(twin.worker, t)

        while len(heap) and pending:
            ev = heap.pop()
            now, kind, payload, w, version = ev.t, ev.kind, ev.payload, ev.worker, ev.version
            if now > self.horizon_s:
                break
            if kind == _WAKE:
                eng = engines[w]
                if version != eng.version or not eng.busy:
                    continue
                finished = eng.on_wake(now)
                o = overhead[w]
                for c in finished:
                    seq += 1
                    heap.push(Event(now + o, seq, _RESULT, c, w, 0))
                    if self.record_calls:
                        started = c.started_at if c.started_at is not None else now
                        node = getattr(c.spec, "node", -1)
                        call_records.append(
                            CallTimeline(c.workflow.wid, c.kind, w, c.ready_at, started, now, now + o, node)
                        )
                if not eng.busy and eng.kick(now):
                    seq += 1
                    heap.push(Event(eng.wake_at, seq, _WAKE, None, w, eng.version))
            elif kind == _HEDGE:
                try_hedge(cast(Call, payload), now)
            elif kind == _RESULT:
                # The gateway sees the call return only now (after the per-request overhead): the slot
                # frees and the estimator learns here, exactly as in the live gateway.
                c = cast(Call, payload)
                if c.abandoned:
                    continue  # its twin answered first; its slot was freed then
                if c.twin is not None:
                    settle(c, now)
                sched.on_finish(c, now)
                if now >= next_refit and refitter is not None:
                    next_refit = now + refitter.s.interval_s
                    self.refits.extend((now, r, out) for r, out in refitter.step(sched, now))
                wf = c.workflow
                if isinstance(wf, KnobbedWorkflow):
                    wf.clock = now
                    if wf.degrader is not None and wf.last_of_stage:
                        wf.decide(CompletionPredictor(sched, now))
                nxt = wf.complete(c.spec)
                if nxt:
                    submit(wf, nxt, now)
                fill(w, now)
                if not nxt and wf.done:
                    pending -= 1
                    committed = max(committed - work_left.pop(wf.wid, 0.0), 0.0)
                    demoted.discard(wf.wid)
                    rec = WorkflowRecord(wf.wid, wf.tenant, wf.arrival, wf.deadline, now, ncalls.get(wf.wid, 0))
                    if isinstance(wf, KnobbedWorkflow):
                        rec.knobs, rec.full_knobs = wf.used, wf.full
                    records.append(rec)
            else:
                wf = cast(Workflow, payload)
                if self.admission and not admit(wf, now):
                    if self.admission_miss == "reject":
                        rejected.append(wf.wid)
                        pending -= 1
                        continue
                    demoted.add(wf.wid)  # behind every other call; it commits no work ahead of others
                    demoted_ids.append(wf.wid)
                if isinstance(wf, KnobbedWorkflow) and wf.degrader is not None:
                    wf.decide(CompletionPredictor(sched, now))
                first = wf.start()
                if first:
                    submit(wf, first, now)
                else:
                    pending -= 1
                    records.append(WorkflowRecord(wf.wid, wf.tenant, wf.arrival, wf.deadline, now, 0))
        return SimResult(
            workflows=records,
            calls=call_records,
            engine_stats=[e.stats for e in engines],
            dispatch_counts=sched.dispatch_counts,
            num_calls=call_id,
            end_time=now,
            unfinished=pending,
            rejected=rejected,
            demoted=demoted_ids,
        )

"""The discrete-event simulator: the live gateway's ``Scheduler`` and ``Admitter`` on virtual time, events by
``(time, seq)`` (deterministic); a slot frees when the result event arrives, after the per-request overhead."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from gateway.core.admission import (
    ADMISSION_HEADROOM,
    SHED_PERIOD_S,
    AdmissionRefused,
    Admitter,
    QueueGate,
    SaturationGate,
)
from gateway.core.degrade import BURST_CAPACITY, BurstRegime, QuestionPlan
from gateway.core.policy import Policy
from gateway.core.predict import SUSTAINABLE_SHARE, CompletionPredictor, calls_plan
from gateway.core.profile import PerfProfile
from gateway.core.records import CallOutcome, WorkflowOutcome
from gateway.core.scheduler import BEST_EFFORT_SHARE, Scheduler
from gateway.core.transfer import Interconnect
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, StagedWorkflow, Workflow
from gateway.profiling.refit import FitOutcome, RefitSettings, Refitter
from gateway.sim.degrade import KnobbedWorkflow, knobbed_stages
from gateway.sim.engine import EngineStats, SimEngine
from gateway.sim.events import Event, EventHeap

_ARRIVAL = 0
_WAKE = 1
_RESULT = 2
_CHECK = 4
_LOADED = 5


@dataclass
class SimResult:
    """Everything a run produced."""

    workflows: list[WorkflowOutcome[None]]
    calls: list[CallOutcome[None]] = field(default_factory=list)
    """One outcome per call returned (``record_calls``)."""
    engine_stats: list[EngineStats] = field(default_factory=list)
    dispatch_counts: list[dict[str, int]] = field(default_factory=list)
    num_calls: int = 0
    end_time: float = 0.0
    unfinished: int = 0
    rejected: list[int] = field(default_factory=list)
    """Ids of the workflows refused at admission."""
    demoted: list[int] = field(default_factory=list)
    """Ids of the workflows run best effort (at admission or by the re-check)."""
    shed: list[int] = field(default_factory=list)
    """Ids of the admitted workflows shed by the overload re-check (no record: they count as missed)."""


class Simulator:
    """One simulated run of a workload on a cluster under one policy.

    ``admission``: the live gateway's admission and re-check, with the live settings' counterparts (``admission_*``,
    ``best_effort_*``; ``admission_warm=False``: lenient until verified). ``engine_profiles``: what the engines
    really run (mislabelled workers). ``refit``: online profile refits. ``gate``: the admission of the system a
    baseline stands for, asked at each arrival (``SaturationGate``, ``QueueGate``). ``burst_capacity``: with
    admission, degrade ahead of the backlog (``BurstRegime`` at that capacity; None: off). ``interconnect``: the
    links split calls' KV crosses (prefill/decode disaggregation: the workers' roles and the policy's
    ``split_threshold``; default: NVLink within a worker's node, 100 Gb/s between nodes).
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
        admission_headroom: float = ADMISSION_HEADROOM,
        admission_share: float = SUSTAINABLE_SHARE,
        admission_miss: str = "reject",
        best_effort_share: float = BEST_EFFORT_SHARE,
        best_effort_max_age: float | None = 4.0,
        admission_warm: bool = True,
        prefix_caching: bool = False,
        engine_profiles: Sequence[PerfProfile] | None = None,
        refit: RefitSettings | Refitter | None = None,
        gate: SaturationGate | QueueGate | None = None,
        burst_capacity: float | None = BURST_CAPACITY,
        interconnect: Interconnect | None = None,
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
        self.best_effort_max_age = best_effort_max_age
        self.admission_warm = admission_warm
        self.burst_capacity = burst_capacity
        self.workers = list(workers)
        self.prefix_caching = prefix_caching
        self.scheduler = Scheduler(
            self.workers,
            policy,
            random.Random(seed),
            alpha=alpha,
            prefix_caching=prefix_caching,
            best_effort_share=best_effort_share,
            interconnect=interconnect,
        )
        truth = [w.profile for w in self.workers] if engine_profiles is None else list(engine_profiles)
        if len(truth) != len(self.workers):
            raise ValueError(f"engine_profiles: {len(truth)} profiles for {len(self.workers)} workers")
        self.engine_profiles = truth
        self.engines = [SimEngine(p, i, prefix_caching=prefix_caching) for i, p in enumerate(truth)]
        self.refitter: Refitter | None = None
        self.refits: list[tuple[float, str, FitOutcome]] = []
        if refit is not None:
            self.refitter = refit if isinstance(refit, Refitter) else Refitter(refit)
            self.refitter.attach(self.scheduler)
        self.record_calls = record_calls
        self.horizon_s = horizon_s
        self.gate = gate

    def run(self, workflows: Sequence[Workflow]) -> SimResult:
        """Simulate until every workflow finished (or the horizon); return the records."""
        return _Run(self, workflows).loop()


class _Run:
    """One run's state (the event heap, the records, the admission) and a handler per kind of event."""

    def __init__(self, sim: Simulator, workflows: Sequence[Workflow]) -> None:
        self.sim = sim
        self.sched = sim.scheduler
        self.engines = sim.engines
        self.caps = [w.capacity for w in sim.workers]
        self.overhead = [p.request_overhead_s for p in sim.engine_profiles]
        self.refitter = sim.refitter
        self.next_refit = self.refitter.s.interval_s if self.refitter is not None else math.inf
        # The ids of the calls taken back (a shed workflow's), whose answers are ignored.
        self.abandoned: set[int] = set()
        self.record_calls = sim.record_calls
        self.seq = 0
        initial: list[Event] = []
        for wf in workflows:
            self.seq += 1
            initial.append(Event(wf.arrival, self.seq, _ARRIVAL, wf, -1, 0))
        self.heap = EventHeap(initial)
        self.names = [w.name for w in sim.workers]
        self.records: list[WorkflowOutcome[None]] = []
        self.call_records: list[CallOutcome[None]] = []
        self.ncalls: dict[int, int] = {}
        self.call_id = 0
        self.pending = len(workflows)
        self.now = 0.0
        self.admitter: Admitter | None = None
        if sim.admission:
            cap = sim.burst_capacity
            self.admitter = Admitter(
                self.sched,
                headroom=sim.admission_headroom,
                sustainable_share=sim.admission_share,
                best_effort_max_age=sim.best_effort_max_age,
                retry_after=False,
                lenient_start=not sim.admission_warm,
                regime=None if cap is None else BurstRegime(cap),
            )
        self.watched: dict[Workflow, list[Call]] = {}  # admitted workflows' calls not yet returned
        self.legs: dict[int, Call] = {}  # split calls by id: the leg running now (prefill, then decode)
        self.held: dict[int, tuple[int, Call]] = {}  # split calls by id: (worker, prefill leg) holding its KV
        self.link_free: dict[tuple[int, int], float] = {}  # when each link (``link_keys``) is next free
        nodes = [w.node for w in sim.workers]
        # The two ends a transfer from worker a to worker b occupies: within a node the pair's link (once), between
        # nodes a's outgoing and b's incoming network interface.
        self.link_keys = [
            [((a, b), (a, b)) if nodes[a] and nodes[a] == nodes[b] else ((a, -1), (-2, b)) for b in range(len(nodes))]
            for a in range(len(nodes))
        ]
        self.checking = False
        self.rejected: list[int] = []
        self.demoted: list[int] = []
        self.shed: list[int] = []

    def push(self, t: float, kind: int, payload: object, worker: int, version: int) -> None:
        """Schedule an event."""
        self.seq += 1
        self.heap.push(Event(t, self.seq, kind, payload, worker, version))

    def loop(self) -> SimResult:
        """Run the events until every workflow is done (or the horizon)."""
        heap = self.heap
        horizon = self.sim.horizon_s
        while len(heap) and self.pending:
            ev = heap.pop()
            now = self.now = ev.t
            if now > horizon:
                break
            kind = ev.kind
            if kind == _WAKE:
                self.on_wake(ev.worker, ev.version, now)
            elif kind == _RESULT:
                self.on_result(cast(Call, ev.payload), ev.worker, now)
            elif kind == _CHECK:
                self.on_check(now)
            elif kind == _LOADED:
                self.on_loaded(cast(Call, ev.payload), ev.worker, now)
            else:
                self.on_arrival(cast(Workflow, ev.payload), now)
        return SimResult(
            workflows=self.records,
            calls=self.call_records,
            engine_stats=[e.stats for e in self.engines],
            dispatch_counts=self.sched.dispatch_counts,
            num_calls=self.call_id,
            end_time=self.now,
            unfinished=self.pending,
            rejected=self.rejected,
            demoted=self.demoted,
            shed=self.shed,
        )

    def fill(self, w: int, t: float) -> None:
        """Start queued calls on worker ``w`` while it has free slots; plan the engine's next wake-up."""
        sched = self.sched
        eng = self.engines[w]
        cap = self.caps[w]
        added = False
        while sched.inflight(w) < cap:
            c = sched.pop_next(w, t)
            if c is None:
                break
            if c.leg:
                if c.leg == 1 and c.parent is not None:
                    c.parent.started_at = t  # (the call as asked is running: what the overload re-check reads)
                self.add_leg(eng, c)
            else:
                eng.add(c)
            added = True
        if added:
            self.kick(w, t)

    def kick(self, w: int, t: float) -> None:
        """Replan engine ``w`` at ``t`` (``SimEngine.kick``): its next wake-up and the KV loads it started."""
        eng = self.engines[w]
        if eng.kick(t):
            self.push(eng.wake_at, _WAKE, None, w, eng.version)
        self.loads(w)

    def loads(self, w: int) -> None:
        """Schedule the arrival of the KV of the split decodes engine ``w`` admitted: one transfer at a time per
        link, first come first served (a link between nodes is each side's network interface, in and out; one
        within a node the pair's own)."""
        eng = self.engines[w]
        for c, until in eng.started_loads():
            src = self.held[c.id][0]
            start = eng.call_state(c)[0]
            if start is None:  # (always set: the engine admitted it)
                start = until
            a, b = self.link_keys[src][w]
            begin = max(start, self.link_free.get(a, 0.0), self.link_free.get(b, 0.0))
            done = begin + (until - start)
            self.link_free[a] = self.link_free[b] = done
            self.push(done, _LOADED, c, w, 0)

    def add_leg(self, eng: SimEngine, c: Call) -> None:
        """A split call's leg into its engine: a prefill keeps its KV; a decode's arrives from its prefill's."""
        if c.leg == 1:
            eng.add(c, prefill_only=True)
        else:
            pw = self.held[c.id][0]
            eng.add(c, remote=self.sched.links[pw][c.worker])

    def on_loaded(self, c: Call, w: int, now: float) -> None:
        """A split decode's KV arrived: it joins its batch; its prefill engine frees the KV it kept."""
        eng = self.engines[w]
        if eng.loaded(c, now):
            self.push(eng.wake_at, _WAKE, None, w, eng.version)
        self.loads(w)
        self.release(c.id, now)

    def release(self, cid: int, now: float) -> None:
        """The KV a split call's prefill leg kept is freed (transferred, or the call taken back)."""
        held = self.held.pop(cid, None)
        if held is not None and self.engines[held[0]].release(held[1]):
            self.kick(held[0], now)

    def on_wake(self, w: int, version: int, now: float) -> None:
        """An engine's iteration boundary: its finished calls return after the per-request overhead."""
        eng = self.engines[w]
        if version != eng.version or not eng.busy:
            return
        finished = eng.on_wake(now)
        o = self.overhead[w]
        for c in finished:
            self.push(now + o, _RESULT, c, w, 0)
            if self.record_calls and c.leg != 1:
                self.call_records.append(self.outcome(c, w, now, now + o))
        if not eng.busy:
            self.kick(w, now)

    def outcome(self, c: Call, w: int, engine_done: float, result: float) -> CallOutcome[None]:
        """A returned call's outcome: its engine finished at ``engine_done``, the gateway saw it at ``result`` (a
        split call's from its decode leg, ready and started as the call asked for: its prefill leg's)."""
        asked = c.parent if c.parent is not None else c
        started = asked.started_at if asked.started_at is not None else engine_done
        return CallOutcome(
            c.workflow.wid,
            getattr(c.spec, "node", -1),
            c.kind,
            asked.ready_at,
            result,
            w,
            self.names[w],
            started,
            started - asked.ready_at,
            result - started,
            1,
            c.budget,
            engine_done,
        )

    def on_arrival(self, wf: Workflow, now: float) -> None:
        """A workflow arrives: admission (when on), then its first calls."""
        gate = self.sim.gate
        if gate is not None and gate.refuses(self.sched):
            self.rejected.append(wf.wid)
            self.pending -= 1
            return
        if self.admitter is not None and not self.admit(wf, now):
            self.pending -= 1
            return
        if isinstance(wf, KnobbedWorkflow) and wf.degrader is not None:
            wf.decide(CompletionPredictor(self.sched, now))
        first = wf.start()
        if first:
            self.submit(wf, first, now)
        else:
            self.pending -= 1
            self.records.append(WorkflowOutcome(wf.wid, wf.tenant, wf.arrival, wf.deadline, now))

    def submit(self, wf: Workflow, specs: list[CallSpec], t: float) -> None:
        """Submit the calls that became ready and fill the workers they went to."""
        sched = self.sched
        touched: list[int] = []
        adm = self.admitter
        committed = adm is not None and adm.committed_of(wf)
        pred = CompletionPredictor(sched, t) if committed else None
        low = adm is not None and wf in adm.best_effort
        watched = self.watched.get(wf) if adm is not None else None
        for spec in specs:
            self.call_id += 1
            c = Call(self.call_id, wf, spec, t, best_effort=low)
            if adm is not None and committed:  # submitted: in the queues now, no longer committed
                adm.submitted(wf, spec, t, pred)
            if watched is not None:
                watched.append(c)
            w = sched.submit(c, t)
            leg = sched.last_leg
            if leg is not None:  # split: its prefill leg was queued
                self.legs[c.id] = leg
            if w not in touched:
                touched.append(w)
        self.ncalls[wf.wid] = self.ncalls.get(wf.wid, 0) + len(specs)
        for w in touched:
            self.fill(w, t)

    def on_result(self, c: Call, w: int, now: float) -> None:
        """The gateway sees a call return: the slot frees, the estimator learns, the next calls are submitted."""
        # (The emptiness test spares the common path, no shedding, a boxed-id lookup.)
        if self.abandoned and c.id in self.abandoned:
            if c.leg == 1 and self.engines[w].release(c):  # a shed split call's prefill: the KV it kept
                self.kick(w, now)
            return  # its workflow was shed; its slot was freed then
        sched = self.sched
        sched.on_finish(c, now)
        refitter = self.refitter
        if now >= self.next_refit and refitter is not None:
            self.next_refit = now + refitter.s.interval_s
            self.sim.refits.extend((now, r, out) for r, out in refitter.step(sched, now))
        if c.leg == 1:
            self.on_prefilled(c, w, now)
            return
        wf = c.workflow
        if c.leg == 2:
            self.legs.pop(c.id, None)
        if self.admitter is not None:
            self.admitter.completed(now, c)
            calls = self.watched.get(wf)
            asked = c.parent if c.parent is not None else c
            if calls is not None and asked in calls:
                calls.remove(asked)
        if isinstance(wf, KnobbedWorkflow):
            wf.clock = now
            if wf.degrader is not None and wf.last_of_stage:
                wf.decide(CompletionPredictor(sched, now))
        nxt = wf.complete(c.spec)
        if nxt:
            self.submit(wf, nxt, now)
        self.fill(w, now)
        if not nxt and wf.done:
            self.finished(wf, now)

    def on_prefilled(self, leg: Call, w: int, now: float) -> None:
        """A split call's prefill leg returned: its KV stays on ``w`` until its decode leg, queued now, has it."""
        if self.admitter is not None:
            self.admitter.completed(now, leg)
        self.held[leg.id] = (w, leg)
        dec = self.sched.submit_decode(leg, now)
        self.legs[leg.id] = dec
        self.fill(dec.worker, now)
        self.fill(w, now)

    def finished(self, wf: Workflow, now: float) -> None:
        """A workflow's last call returned: its record (and, with admission, its end of commitment)."""
        self.pending -= 1
        if self.admitter is not None:
            self.watched.pop(wf, None)
            self.admitter.ended(wf, now - wf.arrival)
        n = self.ncalls.get(wf.wid, 0)
        knobs, full = (wf.used, wf.full) if isinstance(wf, KnobbedWorkflow) else (None, None)
        self.records.append(
            WorkflowOutcome(wf.wid, wf.tenant, wf.arrival, wf.deadline, now, ncalls=n, knobs=knobs, full_knobs=full)
        )

    def admit(self, wf: Workflow, now: float) -> bool:
        """The live gateway's admission: False when refused (only a ``StagedWorkflow`` can be)."""
        adm = self.admitter
        assert adm is not None
        if isinstance(wf, StagedWorkflow):
            question = None
            if isinstance(wf, KnobbedWorkflow) and wf.degrader is not None:
                # As the live pipeline admits a question: at its tenant's floor (``QuestionPlan.rest``).
                deg = wf.degrader
                plan = calls_plan(knobbed_stages(wf.stages, deg.grid[-1]))
                template = wf.plan_template if wf.plan_template is not None else wf.template
                if template is not None:
                    question = QuestionPlan(template, wf.full, deg.grid[-1], quality=deg.quality)
            else:
                plan = calls_plan([st.calls for st in wf.stages])
            try:
                admission = adm.admit(
                    now,
                    plan,
                    wf.deadline - now,
                    best_effort_on_miss=self.sim.admission_miss == "best_effort",
                    question=question,
                )
            except AdmissionRefused:
                self.rejected.append(wf.wid)
                return False
            if isinstance(wf, KnobbedWorkflow) and admission.plan is not None:
                wf.ceiling = admission.plan.ceiling
            if admission.best_effort:
                self.demoted.append(wf.wid)
            adm.take(wf, admission)
        self.watched[wf] = []
        if not self.checking:
            self.checking = True
            self.push(now + SHED_PERIOD_S, _CHECK, None, -1, 0)
        return True

    def on_check(self, now: float) -> None:
        """The overload re-check (``Admitter.overdue``), every ``SHED_PERIOD_S`` while workflows are admitted."""
        adm = self.admitter
        assert adm is not None
        miss = self.sim.admission_miss
        for v in adm.overdue(now, self.watched, lambda _wf: miss):
            if v.action == "demote":
                self.demote(v.wf, v.queued, now)
            else:
                self.drop(v.wf, now)
        if self.watched:
            self.push(now + SHED_PERIOD_S, _CHECK, None, -1, 0)
        else:
            self.checking = False

    def demote(self, wf: Workflow, queued: Sequence[Call], now: float) -> None:
        """Run a workflow at the lowest urgency from now on: its queued calls move to the best-effort lane."""
        if wf.wid not in self.demoted:
            self.demoted.append(wf.wid)
        sched = self.sched
        for c in queued:
            if sched.cancel(c):  # off its queue first: the estimator counts a call by the lane it was queued in
                c.best_effort = True
                self.fill(sched.submit(c, now), now)

    def drop(self, wf: Workflow, now: float) -> None:
        """Shed a workflow (or expire a best-effort one): its calls are taken back, queued or running."""
        self.shed.append(wf.wid)
        self.pending -= 1
        for c in self.watched.pop(wf, []):
            self.cancel(c, now)
        assert self.admitter is not None
        self.admitter.ended(wf)

    def cancel(self, c: Call, now: float) -> None:
        """Take a call back: off its queue, or out of its engine at the next iteration boundary (its slot freed)."""
        if c.id in self.abandoned or c.finished_at is not None:
            return
        c = self.legs.pop(c.id, c)  # a split call: the leg running now
        self.release(c.id, now)  # and the KV its prefill leg kept
        was_running = c.started_at is not None
        self.abandoned.add(c.id)
        self.sched.abandon(c, now)
        if was_running:
            eng = self.engines[c.worker]
            if eng.cancel(c, now):
                self.push(eng.wake_at, _WAKE, None, c.worker, eng.version)
            self.loads(c.worker)
            self.fill(c.worker, now)

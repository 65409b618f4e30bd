"""Admission, one implementation for both drivers: ``admit`` (an ``Admission`` token or ``AdmissionRefused``),
``take`` at start, ``submitted`` per call, ``overdue`` periodically (shed, demote or expire), ``ended``; and the
admission of the systems the baselines stand for (``SaturationGate``, ``QueueGate``). Pure."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Literal

from gateway.core.degrade import BurstRegime, QuestionPlan, knob_grid
from gateway.core.predict import (
    SUSTAINABLE_SHARE,
    CacheShare,
    CompletionPredictor,
    QueueCalibration,
    StagePlan,
    ThroughputMeter,
    cluster_call_time,
)
from gateway.core.queues import QUEUES
from gateway.core.scheduler import Scheduler
from gateway.core.workflow import Call, CallSpec, OnlineWorkflow, Workflow
from gateway.errors import DomainError

ADMISSION_HEADROOM = 0.9
"""The default share of a deadline a predicted completion must fit in (``admission.headroom``)."""
BURST_EFFICIENCY = 0.9
"""The share of the full-batch throughput a question capped by a burst is forecast at (``Admitter.admit``): what
the cluster drains saturated (docs/benchmarks.md, "Bursts"), where full-quality promises need
``SUSTAINABLE_SHARE``."""
SHED_PERIOD_S = 0.2
"""How often a driver re-checks admitted workflows (``Admitter.overdue``), in its clock's seconds."""
RETRY_TOLERANCE_S = 0.05
"""The precision of a predicted miss's wait (``CompletionPredictor.retry_after_s``), in seconds."""


class AdmissionRefused(DomainError):
    """A workflow was not admitted. ``retry_after_s``: whole seconds after which asking again may succeed."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PredictedMiss(AdmissionRefused):
    """Predicted to finish too close to or after its deadline; it would fit after about ``wait_s`` seconds."""

    def __init__(self, predicted_s: float, deadline_s: float, wait_s: float) -> None:
        super().__init__(
            f"the workflow is predicted to finish in {predicted_s:.3g} s, too close to or after its deadline of "
            f"{deadline_s:.3g} s (the queue ahead of it); retry after about {wait_s:.3g} s",
            whole_seconds(wait_s),
        )
        self.predicted_s = predicted_s
        self.deadline_s = deadline_s
        self.wait_s = wait_s


class DeadlineTooShort(AdmissionRefused):
    """A deadline no wait can meet; ``min_deadline_s``: the shortest that could be admitted (rounded up)."""

    def __init__(self, deadline_s: float, path_s: float, headroom: float) -> None:
        shortest = round_up(path_s / headroom)
        super().__init__(
            f"a deadline of {deadline_s:.3g} s cannot be met: the workflow takes about {path_s:.3g} s even on idle "
            f"workers, and admission keeps {1 - headroom:.0%} of a deadline as margin; ask for at least "
            f"{shortest:g} s",
            0,
        )
        self.min_deadline_s = shortest


class NoWorkerCanRun(AdmissionRefused):
    """No eligible worker could run the workflow now (not the deadline's fault)."""

    def __init__(self) -> None:
        super().__init__("no worker can run the workflow now", 1)


@dataclass(slots=True, eq=False)
class Admission:
    """A workflow admitted: a token owning the cluster seconds it commits (``work_s``) until its workflow takes
    them over (``Admitter.take``) or ``release`` hands them back to its ``owner``. ``predicted_s``, ``critical_s``:
    nan for none."""

    best_effort: bool = False
    work_s: float = 0.0
    _: KW_ONLY
    plan: QuestionPlan | None = None
    owner: Admitter | None = field(default=None, repr=False)
    predicted_s: float = math.nan
    critical_s: float = math.nan
    _state: str = field(init=False, default="done")

    def __post_init__(self) -> None:
        if self.owner is not None and self.work_s > 0.0:
            self._state = "held"

    def take(self) -> float:
        """A workflow takes the committed seconds over; returns them (0 when released already or never held)."""
        if self._state != "held":
            return 0.0
        self._state = "taken"
        return self.work_s

    def release(self) -> None:
        """Hand the committed seconds back unless a workflow took them over (idempotent)."""
        if self._state != "held":
            return
        self._state = "released"
        if self.owner is not None:
            self.owner.uncommit(self.work_s)


@dataclass(frozen=True, slots=True)
class ShedVerdict:
    """The overload re-check's verdict on one workflow: ``shed`` (cancel), ``demote`` (its ``queued`` calls move to
    the best-effort lane) or ``expire`` (best effort past ``best_effort_max_age`` x its deadline)."""

    wf: Workflow
    action: Literal["shed", "demote", "expire"]
    message: str = ""
    retry_after_s: int = 1
    queued: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class SaturationGate:
    """llm-d's flow control (gateway-api-inference-extension's saturation detector, its defaults): a sheddable
    request is refused while every eligible worker is saturated, its waiting queue at ``queue_depth`` calls or
    more or its KV cache at ``kv_util`` or more."""

    queue_depth: int = 5
    kv_util: float = 0.8

    def refuses(self, scheduler: Scheduler) -> bool:
        """True while no eligible worker has room (a pool without workers refuses too)."""
        loads = scheduler.estimator.loads
        for w in scheduler.eligible_workers():
            kv = loads[w].inflight_kv / scheduler.workers[w].profile.kv_capacity_tokens
            if scheduler.queue_len(w) < self.queue_depth and kv < self.kv_util:
                return False
        return True


@dataclass(frozen=True, slots=True)
class QueueGate:
    """A queue-length 429: a new workflow is refused while the queues hold ``max_queued`` calls or more."""

    max_queued: int

    def __post_init__(self) -> None:
        if self.max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {self.max_queued}")

    def refuses(self, scheduler: Scheduler) -> bool:
        """True while the queues are at or over the limit."""
        return scheduler.queued_total() >= self.max_queued


TenantRule = Callable[[Workflow], str | None]
"""What the re-check does with a workflow predicted to miss: ``"reject"``, ``"best_effort"`` or None (not watched)."""


@dataclass(eq=False)
class Admitter:
    """Admission and the work it committed, on one scheduler (one per driver). ``retry_after``: compute a refusal's
    exact wait (the simulator answers no client). ``lenient_start``: until the forecast is verified, refuse only
    what cannot make it at full throughput with nothing queued after its first stage. ``regime``: degradation
    ahead of the backlog (every workflow admitted with a deadline counts; a degrading question is capped in a
    burst)."""

    scheduler: Scheduler
    _: KW_ONLY
    headroom: float = ADMISSION_HEADROOM
    sustainable_share: float = SUSTAINABLE_SHARE
    best_effort_max_age: float | None = None
    retry_after: bool = True
    lenient_start: bool = True
    regime: BurstRegime | None = None
    throughput: ThroughputMeter = field(init=False, default_factory=ThroughputMeter)
    cache: CacheShare = field(init=False, default_factory=CacheShare)
    calibration: QueueCalibration = field(init=False, default_factory=QueueCalibration)
    committed_s: float = field(init=False, default=0.0)
    """Cluster seconds admitted workflows have yet to submit: the fluid bound of admission."""
    best_effort: set[Workflow] = field(init=False, default_factory=set)
    _work_left: dict[Workflow, float] = field(init=False, default_factory=dict)
    _held: int = field(init=False, default=0)  # tokens holding committed work no workflow has taken over yet
    _held_s: float = field(init=False, default=0.0)  # and their seconds
    _predicted: dict[Workflow, tuple[float, float]] = field(init=False, default_factory=dict)

    def efficiency(self, now: float) -> float:
        """The share of the full-batch throughput the work ahead is forecast to drain at: the configured share,
        scaled up by what the cluster was seen to complete above the model (``ThroughputMeter``), at most 1."""
        seen = self.throughput.share(now, len(self.scheduler.eligible_workers()))
        return min(self.sustainable_share * max(seen, 1.0), 1.0)

    def predictor(self, now: float) -> CompletionPredictor:
        """A predictor of what a workflow admitted now would take (the status page's load figures)."""
        return CompletionPredictor(
            self.scheduler, now, committed_s=self.committed_s * self.cache.factor, efficiency=self.efficiency(now)
        )

    def admit(
        self,
        now: float,
        plan: Sequence[StagePlan],
        deadline_s: float | None,
        *,
        checked: bool = True,
        best_effort_on_miss: bool = False,
        question: QuestionPlan | None = None,
    ) -> Admission:
        """Admit a workflow of ``plan`` due in ``deadline_s`` (None or not ``checked``: no check, work committed all
        the same), or raise ``AdmissionRefused``; ``best_effort_on_miss``: a best-effort token instead of a
        ``PredictedMiss``; ``question``: the Text-to-SQL prediction, handed on."""
        sched = self.scheduler
        ordered = deadline_s is not None and QUEUES[sched.policy.queue].deadline_ordered
        due = now + (deadline_s or 0.0)
        after = sched.queued_due_after(due) if ordered else None
        committed = (self._committed_ahead(due) if ordered else self.committed_s) * self.cache.factor
        efficiency = self.efficiency(now)
        pred = CompletionPredictor(sched, now, committed_s=committed, efficiency=efficiency, after=after)
        work = pred.plan_work(plan)
        reg = self.regime
        if reg is not None and deadline_s is not None:
            # The burst regime reads the backlog as it drains saturated, not at the share full-quality promises need.
            drained = max(efficiency, BURST_EFFICIENCY)
            saturated = CompletionPredictor(sched, now, committed_s=committed, efficiency=drained, after=after)
            question = self._burst(now, deadline_s, saturated, plan, question)
            if question is not None and question.ceiling is not None:
                # A question capped by a burst degrades further if the backlog drains slower than forecast.
                pred = saturated
        predicted, critical = pred.duration(plan), pred.critical_path(plan)
        if deadline_s is not None and checked:
            judge, forecast = pred, predicted
            if self.lenient_start and not self.calibration.verified:
                # No forecast has been checked against what admitted work took yet: refused only when it cannot
                # make it even at the cluster's full throughput with nothing queued after its first stage.
                judge = CompletionPredictor(
                    sched,
                    now,
                    later_queue_weight=0.0,
                    committed_s=pred.committed_s,
                    efficiency=max(pred.efficiency, 1.0),
                    after=after,
                )
                forecast = judge.duration(plan)
            exact = self.retry_after and not best_effort_on_miss  # (a best-effort token tells no client to wait)
            miss = self._miss(judge, plan, deadline_s, forecast, critical, exact=exact)
            if isinstance(miss, PredictedMiss) and best_effort_on_miss:
                return Admission(best_effort=True, plan=question)
            if miss is not None:  # (a deadline no wait can meet is refused whatever the tenant says)
                raise miss
        if not math.isfinite(work) or work <= 0.0:
            return Admission(plan=question, predicted_s=predicted, critical_s=critical)
        self.committed_s += work  # now, so that the next admission (before this one starts) counts it
        self._held += 1
        self._held_s += work
        return Admission(work_s=work, plan=question, owner=self, predicted_s=predicted, critical_s=critical)

    def _burst(
        self,
        now: float,
        deadline_s: float,
        pred: CompletionPredictor,
        plan: Sequence[StagePlan],
        question: QuestionPlan | None,
    ) -> QuestionPlan | None:
        """Count an arrival in the burst regime (its work at full quality); a degrading question comes back with
        the burst's cap on it."""
        reg = self.regime
        assert reg is not None
        full = plan if question is None else question.at(question.full)
        reg.arrival(
            now,
            pred.plan_work(full) * self.cache.factor,
            deadline_s,
            pred.duration(full) / (self.headroom * deadline_s),
        )
        if question is None or question.quality is None or question.full == question.floor:
            return question
        work = functools.cache(lambda k: pred.plan_work(question.at(k)))
        cap = reg.cap(knob_grid(question.full, question.floor), work, question.quality)
        return question if cap is None else replace(question, ceiling=cap)

    def _miss(
        self,
        pred: CompletionPredictor,
        plan: Sequence[StagePlan],
        deadline_s: float,
        predicted: float,
        path: float,
        *,
        exact: bool,
    ) -> AdmissionRefused | None:
        """The refusal when ``predicted`` (calibrated) exceeds ``headroom`` x ``deadline_s``, else None. ``exact``:
        the wait of a predicted miss to ``RETRY_TOLERANCE_S``; otherwise only whether some wait could do."""
        target = self.headroom * deadline_s
        cal = self.calibration
        predicted = cal.calibrated(predicted, path)
        if predicted <= target:
            return None
        wait = pred.retry_after_s(plan, cal.target(target, path), tolerance_s=RETRY_TOLERANCE_S if exact else math.inf)
        if wait is None:
            if not math.isfinite(path):
                return NoWorkerCanRun()
            return DeadlineTooShort(deadline_s, path, self.headroom)
        return PredictedMiss(predicted, deadline_s, wait)

    def _committed_ahead(self, deadline: float) -> float:
        """The committed work ahead of a workflow due at ``deadline`` under a deadline-ordered discipline."""
        ahead = self._held_s
        for wf, left in self._work_left.items():
            if wf.deadline <= deadline and wf not in self.best_effort:
                ahead += left
        return min(ahead, self.committed_s)

    def take(self, wf: Workflow, admission: Admission | None) -> None:
        """``wf`` now exists and takes over what admission decided: best effort, committed work, the forecast."""
        if admission is None:
            return
        if admission.best_effort:
            self.best_effort.add(wf)
        work = admission.take()
        if work > 0.0:
            self._unhold(work)
            self._work_left[wf] = work
        if math.isfinite(admission.predicted_s) and not admission.best_effort:
            self._predicted[wf] = (admission.predicted_s, admission.critical_s)

    def uncommit(self, work_s: float) -> None:
        """A token released its committed work unused (``Admission.release``)."""
        self._unhold(work_s)
        self.committed_s = max(self.committed_s - work_s, 0.0)
        self._settle()

    def submitted(self, wf: Workflow, spec: CallSpec, now: float, pred: CompletionPredictor | None = None) -> None:
        """A call of ``wf`` was submitted: its work is in the queues now, no longer committed."""
        left = self._work_left.get(wf)
        if left is None:
            return
        t = pred.cluster_call_time(spec) if pred is not None else cluster_call_time(self.scheduler, spec, now)
        done = min(t, left)
        self._work_left[wf] = left - done
        self.committed_s = max(self.committed_s - done, 0.0)

    def committed_of(self, wf: Workflow) -> bool:
        """Whether ``wf`` still holds committed work (its submissions count down ``committed_s``)."""
        return wf in self._work_left

    def completed(self, now: float, call: Call) -> None:
        """A call completed: its work (engine seconds at full batch, the cache credited) feeds the throughput meter,
        and with its work uncredited the cache share."""
        self.throughput.add(now, call.gpu_s)
        if call.leg != 2 and 0 <= call.worker < len(self.scheduler.workers):  # (a decode leg's prompt came over)
            s = call.spec
            self.cache.add(call.gpu_s, self.scheduler.estimator.gpu_s(call.worker, s.input_tokens, s.output_tokens))

    def ended(self, wf: Workflow, latency_s: float | None = None) -> None:
        """``wf`` ended: its commitment is released; ``latency_s`` (a valid answer, met or missed) calibrates."""
        self.best_effort.discard(wf)
        self.committed_s = max(self.committed_s - self._work_left.pop(wf, 0.0), 0.0)
        self._settle()
        forecast = self._predicted.pop(wf, None)
        if forecast is not None and latency_s is not None:
            self.calibration.add(latency_s, *forecast)

    def _unhold(self, work_s: float) -> None:
        self._held = max(self._held - 1, 0)
        self._held_s = max(self._held_s - work_s, 0.0) if self._held else 0.0

    def _settle(self) -> None:
        if not self._work_left and self._held == 0:
            self.committed_s = 0.0  # no float drift: nothing is committed

    def overdue(
        self,
        now: float,
        pending: Mapping[Workflow, Collection[Call]],
        rule: TenantRule,
        *,
        plans: Mapping[Workflow, QuestionPlan] | None = None,
        skip: Collection[Workflow] = (),
    ) -> list[ShedVerdict]:
        """Re-check every admitted workflow with pending calls (``skip``: already shed): one with a queued call
        predicted past its deadline (optimistically: no later queue; a question at its ``plans``' floor) is shed
        or demoted as ``rule`` says; a best-effort one may expire."""
        pred: CompletionPredictor | None = None
        out: list[ShedVerdict] = []
        max_age = self.best_effort_max_age
        for wf, calls in pending.items():
            if wf in skip:
                continue
            if wf in self.best_effort:
                age = now - wf.arrival
                if max_age is not None and age > max_age * (wf.deadline - wf.arrival):
                    out.append(_expiry(wf, age, max_age))
                continue
            queued = tuple(c for c in calls if c.started_at is None)
            if not queued:
                continue
            on_miss = rule(wf)
            if on_miss is None:
                continue
            pred = pred or CompletionPredictor(self.scheduler, now, later_queue_weight=0.0)
            completion = _completion(pred, wf, calls, None if plans is None else plans.get(wf))
            if completion <= wf.deadline:
                continue
            if on_miss == "best_effort":
                self.best_effort.add(wf)
                out.append(ShedVerdict(wf, "demote", queued=queued))
            else:
                over = completion - wf.deadline
                msg = f"shed: the workflow was predicted to finish {over:.3g} s after its deadline "
                msg += "(the gateway is overloaded); its calls were cancelled"
                out.append(ShedVerdict(wf, "shed", msg, whole_seconds(over)))
        return out


def _completion(pred: CompletionPredictor, wf: Workflow, calls: Iterable[Call], plan: QuestionPlan | None) -> float:
    """A running workflow's predicted completion (for an online workflow with a plan: the plan at its floor)."""
    if plan is not None and isinstance(wf, OnlineWorkflow):
        phase, rounds = wf.position
        return pred.now + pred.pending_time(calls) + pred.critical_path(plan.rest(phase=phase, rounds_done=rounds))
    return pred.workflow_completion(wf, calls)


def _expiry(wf: Workflow, age_s: float, max_age: float) -> ShedVerdict:
    """A best-effort workflow that outlived ``max_age`` times its deadline; retry after its deadline."""
    return ShedVerdict(
        wf,
        "expire",
        f"shed: the best-effort workflow was still unfinished {age_s:.3g} s after it arrived, past "
        f"{max_age:g} x its deadline (admission.best_effort_max_age; the gateway is overloaded); its calls "
        "were cancelled",
        whole_seconds(wf.deadline - wf.arrival),
    )


def round_up(seconds: float) -> float:
    """A deadline to suggest: ``seconds`` rounded up to two significant figures (at least 0.1 s)."""
    if seconds <= 0.1:
        return 0.1
    step = 10.0 ** (math.floor(math.log10(seconds)) - 1)
    return round(math.ceil(seconds / step - 1e-9) * step, 10)


def whole_seconds(seconds: float) -> int:
    """A retry delay: whole seconds, rounded up, at least 1 (60 when not finite)."""
    if not math.isfinite(seconds):
        return 60
    return max(1, math.ceil(seconds))

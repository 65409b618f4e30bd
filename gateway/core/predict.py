"""Completion prediction: when would a workflow finish if it were admitted (or kept) now? (docs/architecture.md,
"Completion prediction"). Plans come from a template, a DAG or call lists. Pure: ``now`` is an argument."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.core.dag import DagNode, graph
from gateway.core.estimates import Estimator
from gateway.core.scheduler import Scheduler
from gateway.core.workflow import Call, CallSpec, CostFn, PhaseSpec, Workflow, WorkflowTemplate

_NOTHING_AFTER = (0, 0.0, 0.0, 0.0)
SUSTAINABLE_SHARE = 0.25
"""The share of the full-batch throughput that work ahead of a workflow (backlog, committed work) is forecast to get."""


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One remaining stage: parallel calls, repeated ``rounds`` times in sequence (an expectation: fractional)."""

    calls: tuple[CallSpec, ...]
    rounds: float = 1.0

    def __post_init__(self) -> None:
        if not self.calls:
            raise ValueError("a stage needs at least one call")
        if not (self.rounds >= 0.0 and math.isfinite(self.rounds)):
            raise ValueError(f"rounds must be a finite number >= 0, got {self.rounds}")


def template_plan(
    template: WorkflowTemplate,
    *,
    phase: int = -1,
    rounds_done: int = 0,
    shape: Callable[[PhaseSpec], tuple[int, float]] | None = None,
) -> tuple[StagePlan, ...]:
    """The stages a template still expects after round ``rounds_done`` of phase ``phase`` (-1: all of them);
    ``shape``: a phase's (width, rounds) instead of its own (width 0: skipped)."""
    out: list[StagePlan] = []
    for i, p in enumerate(template.phases):
        if i < phase:
            continue
        width, rounds = (p.width, p.rounds) if shape is None else shape(p)
        if i == phase:
            if not p.repeatable:
                continue
            rounds = max(rounds - rounds_done, 0.0)
        if rounds <= 0.0 or width <= 0:
            continue
        out.append(StagePlan((CallSpec(p.kind, p.input_tokens, p.output_tokens),) * width, rounds))
    return tuple(out)


def dag_plan(nodes: Sequence[DagNode]) -> tuple[StagePlan, ...]:
    """The nodes of a valid DAG grouped by depth: the critical path when levels are balanced, else a bound."""
    order, deps, _ = graph(nodes)
    depth = [0] * len(nodes)
    for i in order:
        depth[i] = 1 + max((depth[d] for d in deps[i]), default=-1)
    levels: dict[int, list[CallSpec]] = defaultdict(list)
    for n, d in zip(nodes, depth, strict=True):
        levels[d].append(CallSpec(n.kind, n.input_tokens, n.output_tokens))
    return tuple(StagePlan(tuple(levels[k])) for k in sorted(levels))


def calls_plan(stages: Iterable[Sequence[CallSpec]]) -> tuple[StagePlan, ...]:
    """Stages given as lists of parallel calls, each run once (a chat call: ``calls_plan([[spec]])``)."""
    return tuple(StagePlan(tuple(s)) for s in stages if s)


def cluster_call_time(scheduler: Scheduler, spec: CallSpec, now: float) -> float:
    """``CompletionPredictor(scheduler, now).cluster_call_time(spec)`` without a predictor's snapshot."""
    return _cluster_call_time(scheduler.estimator, scheduler.eligible_workers(), spec, now)


def _cluster_call_time(est: Estimator, workers: Sequence[int], spec: CallSpec, now: float) -> float:
    rate = est.full_batch_rate(workers, spec.kind, spec.input_tokens, spec.output_tokens, now)
    return 1.0 / rate if rate > 0 else math.inf


class CompletionPredictor:
    """Predicted completion times on one scheduler (read only) at one instant ``now``; ``inf`` with no worker.
    ``later_queue_weight``: the share of today's ``t_queue`` that later stages wait; ``efficiency``: the share of
    the full-batch throughput others' work gets; ``after``: per worker, queued work a new workflow goes before."""

    def __init__(
        self,
        scheduler: Scheduler,
        now: float,
        *,
        later_queue_weight: float = 1.0,
        committed_s: float = 0.0,
        efficiency: float = SUSTAINABLE_SHARE,
        after: Mapping[int, tuple[int, float, float, float]] | None = None,
    ) -> None:
        if not (0.0 <= later_queue_weight <= 1.0):
            raise ValueError(f"later_queue_weight must be in [0, 1], got {later_queue_weight}")
        if not (efficiency > 0.0 and math.isfinite(efficiency)):
            raise ValueError(f"efficiency must be positive and finite, got {efficiency}")
        self.now = now
        self.efficiency = efficiency
        self.later_queue_weight = later_queue_weight
        self._sched = scheduler
        self._workers = scheduler.eligible_workers()  # shared with the scheduler: read only
        later = None if not after else [after.get(w, _NOTHING_AFTER) for w in self._workers]
        self._tq, backlog = scheduler.estimator.queue_view(self._workers, now, later)
        n = len(self._workers)
        self._backlog = sum(backlog) / n if n else math.inf
        self.committed_s = max(committed_s, 0.0)
        # By call shape: a spec's prefix or DAG node does not change its cost.
        self._cluster: dict[tuple[str, int, int], float] = {}
        self._tc: dict[tuple[str, int, int], list[float]] = {}
        self._stage: dict[tuple[tuple[CallSpec, ...], float, float], float] = {}
        self._pre: dict[tuple[str, int], list[float]] = {}
        self._tq_any: dict[int, float] = {}
        # ``call_cost`` as one object (cost caches keyed by it stay warm); made on first use (a bound method is a
        # cycle only the garbage collector frees).
        self._cost: CostFn | None = None

    def _t_comp(self, spec: CallSpec) -> list[float]:
        key = (spec.kind, spec.input_tokens, spec.output_tokens)
        v = self._tc.get(key)
        if v is None:
            v = self._sched.estimator.snapshot(self._workers, *key, self.now)[0]
            self._tc[key] = v
        return v

    def cluster_call_time(self, spec: CallSpec) -> float:
        """Cluster seconds per call of this shape when every worker is busy: ``1 / sum_w 1 / gpu_s``."""
        key = (spec.kind, spec.input_tokens, spec.output_tokens)
        v = self._cluster.get(key)
        if v is None:
            v = self._cluster[key] = _cluster_call_time(self._sched.estimator, self._workers, spec, self.now)
        return v

    def _prefill(self, spec: CallSpec) -> list[float]:
        key = ("prefill", spec.input_tokens)
        v = self._pre.get(key)
        if v is None:
            est = self._sched.estimator
            v = self._pre[key] = [est.prefill_s(w, spec.input_tokens) for w in self._workers]
        return v

    def plan_work(self, plan: Sequence[StagePlan]) -> float:
        """Cluster seconds of all of ``plan``'s calls (parallel ones each count): its share of the fluid bound."""
        return sum(st.rounds * sum(self.cluster_call_time(c) for c in st.calls) for st in plan)

    def fluid_time(self, plan: Sequence[StagePlan], *, drained_s: float = 0.0) -> float:
        """Seconds until the cluster could have worked through the backlog, the committed work (at ``efficiency``)
        and ``plan`` (at full throughput)."""
        return max(self._backlog + self.committed_s - drained_s, 0.0) / self.efficiency + self.plan_work(plan)

    def stage_time(self, calls: Sequence[CallSpec], *, queue_weight: float = 1.0, drained_s: float = 0.0) -> float:
        """Seconds until the slowest of parallel ``calls`` started now finishes, each on its fastest worker behind
        ``queue_weight`` x its queue (``drained_s`` shorter) and its siblings' prompts."""
        key = (tuple(calls), queue_weight, drained_s)
        cached = self._stage.get(key)
        if cached is not None:
            return cached
        if not self._workers:
            return math.inf
        base = [max(q - drained_s, 0.0) * queue_weight for q in self._tq]
        extra = [0.0] * len(self._workers)
        worst = 0.0
        last = len(calls) - 1
        for k, c in enumerate(calls):
            tcs = self._t_comp(c)
            best, pos = math.inf, 0
            for i, tc in enumerate(tcs):
                v = base[i] + extra[i] + tc
                if v < best:
                    best, pos = v, i
            if k < last:  # (only the siblings placed after it wait for its prompt)
                extra[pos] += self._prefill(c)[pos]
            worst = max(worst, best)
        if len(self._stage) < 4096:
            self._stage[key] = worst
        return worst

    def duration(self, plan: Sequence[StagePlan], *, drained_s: float = 0.0) -> float:
        """Seconds until ``plan`` submitted now is done: the larger of ``path_time`` and ``fluid_time``."""
        if not self._workers:
            return math.inf
        return max(self.path_time(plan, drained_s=drained_s), self.fluid_time(plan, drained_s=drained_s))

    def path_time(self, plan: Sequence[StagePlan], *, drained_s: float = 0.0) -> float:
        """The critical path of ``plan``: stage after stage, the first behind the queue ahead."""
        total = 0.0
        later = self.later_queue_weight
        for k, st in enumerate(plan):
            if k == 0:
                first = min(st.rounds, 1.0)
                total += first * self.stage_time(st.calls, queue_weight=1.0, drained_s=drained_s)
                rest = st.rounds - first
            else:
                rest = st.rounds
            if rest > 0.0:
                total += rest * self.stage_time(st.calls, queue_weight=later, drained_s=drained_s)
        return total

    def critical_path(self, plan: Sequence[StagePlan]) -> float:
        """Seconds ``plan`` takes on an idle cluster (no queue anywhere): a floor for any deadline."""
        return sum(st.rounds * self.stage_time(st.calls, queue_weight=0.0) for st in plan)

    def retry_after_s(self, plan: Sequence[StagePlan], deadline_s: float, *, tolerance_s: float = 0.05) -> float | None:
        """How long until the backlog has drained enough for ``plan`` to fit in ``deadline_s`` (a lower bound, by
        bisection): 0 when it fits now, None when it does not fit with every queue empty."""
        if self.duration(plan) <= deadline_s:
            return 0.0
        top = max(max(self._tq, default=0.0), self._backlog + self.committed_s)
        if not self._workers or self.duration(plan, drained_s=top) > deadline_s:
            return None
        lo, hi = 0.0, top
        while hi - lo > tolerance_s:
            mid = (lo + hi) / 2
            if self.duration(plan, drained_s=mid) <= deadline_s:
                hi = mid
            else:
                lo = mid
        return hi

    def _queue_on(self, worker: int) -> float:
        v = self._tq_any.get(worker)
        if v is None:
            v = self._tq_any[worker] = self._sched.estimator.t_queue(worker, self.now)
        return v

    def call_cost(self, kind: str, input_tokens: int, output_tokens: int) -> float:
        """A later call's predicted time (forecast queue plus ``t_comp`` on its best worker), as a ``CostFn``."""
        return self.stage_time((CallSpec(kind, input_tokens, output_tokens),), queue_weight=self.later_queue_weight)

    def pending_time(self, calls: Iterable[Call]) -> float:
        """Seconds until the last of a workflow's current calls is done, each where it is now (queued: behind its
        worker's whole queue)."""
        worst = 0.0
        for c in calls:
            if c.started_at is not None:
                t = max(c.started_at + (c.service_s if c.service_s > 0.0 else c.t_comp) - self.now, 0.0)
            elif c.worker >= 0 and c.t_comp > 0.0:
                t = self._queue_on(c.worker) + c.t_comp
            else:
                t = self.stage_time((c.spec,))
            worst = max(worst, t)
        return worst

    def workflow_completion(self, wf: Workflow, pending: Iterable[Call]) -> float:
        """Predicted absolute completion of a running workflow: its ``pending`` calls, then what it still expects."""
        cost = self._cost
        if cost is None:
            cost = self._cost = self.call_cost
        return self.now + self.pending_time(pending) + wf.expected_remaining(cost)


class QueueCalibration:
    """The queueing part of admission's predictions (prediction minus critical path), scaled by what admitted
    workflows took: a split conformal calibration (docs/architecture.md, "Completion prediction")."""

    FLOOR = 1.0
    CEIL = 4.0
    MIN_EXCESS = 0.1

    def __init__(self, window: int = 200, quantile: float = 0.95, min_samples: int = 10) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        if not (0.0 < quantile <= 1.0):
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        self.quantile = quantile
        self.min_samples = min_samples
        self._ratios: deque[float] = deque(maxlen=window)
        self._factor: float | None = None

    @property
    def samples(self) -> int:
        """Ratios in the window."""
        return len(self._ratios)

    @property
    def verified(self) -> bool:
        """At least ``min_samples`` ratios: the forecast has been checked against what admitted work took."""
        return len(self._ratios) >= self.min_samples

    def add(self, latency_s: float, predicted_s: float, critical_s: float) -> None:
        """An admitted workflow ended with a valid answer after ``latency_s`` (ignored without a queueing excess)."""
        excess = predicted_s - critical_s
        finite = math.isfinite(excess) and math.isfinite(latency_s)
        if not finite or excess <= 0.0 or excess < self.MIN_EXCESS * critical_s:
            return
        self._ratios.append(max(latency_s - critical_s, 0.0) / excess)
        self._factor = None

    @property
    def factor(self) -> float:
        """The calibration factor of the queueing excess (1 before ``min_samples`` ratios)."""
        if len(self._ratios) < self.min_samples:
            return 1.0
        f = self._factor
        if f is None:
            s = sorted(self._ratios)
            k = min(len(s) - 1, max(math.ceil(self.quantile * len(s)) - 1, 0))
            f = self._factor = min(max(s[k], self.FLOOR), self.CEIL)
        return f

    def calibrated(self, predicted_s: float, critical_s: float) -> float:
        """``predicted_s`` with its queueing excess over ``critical_s`` scaled by ``factor``."""
        if not math.isfinite(predicted_s) or predicted_s <= critical_s:
            return predicted_s
        return critical_s + self.factor * (predicted_s - critical_s)

    def target(self, target_s: float, critical_s: float) -> float:
        """The uncalibrated prediction that calibrates to ``target_s``."""
        if target_s <= critical_s:
            return target_s
        return critical_s + (target_s - critical_s) / self.factor


class CacheShare:
    """The engine time calls took with the prefix cache the estimator credited them (``Call.gpu_s``) over what they
    would have taken without it, over the last ``window`` completed calls (1 before ``min_calls``): what scales a
    plan's work, which counts no cache, to what the cluster spends on it."""

    def __init__(self, window: int = 500, min_calls: int = 20) -> None:
        if window < 1 or min_calls < 1:
            raise ValueError("window and min_calls must be >= 1")
        self.min_calls = min_calls
        self._calls: deque[tuple[float, float]] = deque(maxlen=window)
        self._with = 0.0
        self._without = 0.0

    def add(self, with_cache_s: float, without_cache_s: float) -> None:
        """A call completed: its engine seconds with the cache credited, and without it."""
        if not (0.0 <= with_cache_s <= without_cache_s and math.isfinite(without_cache_s) and without_cache_s > 0):
            return
        if len(self._calls) == self._calls.maxlen:
            old_with, old_without = self._calls[0]
            self._with -= old_with
            self._without -= old_without
        self._calls.append((with_cache_s, without_cache_s))
        self._with += with_cache_s
        self._without += without_cache_s

    @property
    def factor(self) -> float:
        """With over without, in (0, 1] (1 before ``min_calls`` calls)."""
        if len(self._calls) < self.min_calls or self._without <= 0.0:
            return 1.0
        return min(max(self._with / self._without, 1e-3), 1.0)


class ThroughputMeter:
    """The work the cluster was seen to complete per second (engine seconds, over the last ``window_s``)."""

    MIN_SPAN_S = 1.0

    def __init__(self, window_s: float = 10.0, max_events: int = 20_000) -> None:
        if not window_s > 0.0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque(maxlen=max_events)
        self._sum = 0.0
        self._since: float | None = None  # the first completion seen (a meter younger than its window)

    def add(self, now: float, engine_s: float) -> None:
        """A call completed at ``now``; its work was ``engine_s`` engine seconds."""
        if not (engine_s > 0.0 and math.isfinite(engine_s)):
            return
        if self._since is None:
            self._since = now
        if len(self._events) == self._events.maxlen:
            self._sum -= self._events[0][1]
        self._events.append((now, engine_s))
        self._sum += engine_s
        self._expire(now)

    def _expire(self, now: float) -> None:
        start = now - self.window_s
        ev = self._events
        while ev and ev[0][0] < start:
            self._sum -= ev.popleft()[1]
        if not ev:
            self._sum = 0.0

    def share(self, now: float, workers: int) -> float:
        """Engine seconds completed per second per worker over the window (or since the first completion)."""
        self._expire(now)
        if workers <= 0 or not self._events or self._since is None:
            return 0.0
        span = min(self.window_s, max(now - self._since, self.MIN_SPAN_S))
        return max(self._sum, 0.0) / (span * workers)

"""Latency estimates: ``t_comp(call, worker)`` and ``t_queue(worker)``, from a model of vLLM's batching.

A vLLM engine runs iteration-level continuous batching with chunked prefill (``profile.py``): prompt
tokens are processed first come first served and do not get faster with batch size (prefill is
compute-bound), while decode advances every running call by one token per iteration, so the decodes
of many calls overlap and each iteration gets slower as the batch and its contexts grow. The estimates
follow that, per worker:

``t_queue(worker)``: how long a call sent now waits before its own prompt is processed:
    * the prefill still ahead of it in the engine: the engine's prefill clock ``prefill_free_at``,
      advanced by each call sent to the worker (``start``) by that call's prefill time, from
      ``max(clock, now)``; the calls in flight past their prefill do not delay a newcomer's prompt;
    * the prefill of the calls waiting in the worker's gateway queue (they go first);
    * when no slot is free for it (calls in flight + waiting >= capacity), the time until enough
      in-flight calls return: the mean predicted remaining time of the calls in flight for the first
      slot, and a further ``service / capacity`` for each slot after that.

``t_comp(call, worker)``: the call's own time once its prompt is up: its prefill, then ``output - 1``
decode iterations at the iteration time of the batch it joins (the calls in flight plus itself, at most
``max_num_seqs``, with their mean contexts), plus the per-request overhead; corrected online by the
observed/predicted ratio kept per (worker, stage kind) as an exponentially weighted moving average.
The ratio absorbs what the model does not know: prompts of later calls that stall this call's decode,
a GPU slower than its datasheet, another model build. It carries the time of its last update and reads
as unknown (1.0) once older than ``max_age_s``: a worker idle for long is judged by its profile again.

The scheduler reports every transition (``enqueue``, ``dequeue``, ``start``, ``release``) so the state
is a handful of running sums and ``t_queue`` is O(1). An idle worker has ``t_queue`` 0, and both
estimates grow smoothly with load, so the dispatch scores stay well defined (see ``dispatch.py``).
``base_latency`` (a lone request on the profile) stays the unit of stage budgets and reference costs:
it does not depend on the load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.core.dispatchers import WorkerEstimate
from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call


@dataclass(slots=True)
class Ratio:
    """An EWMA of observed/predicted latency with the time it was last updated."""

    value: float
    updated_at: float
    samples: int


@dataclass(slots=True)
class WorkerLoad:
    """Running sums that make both estimates O(1) per worker.

    Attributes:
        queued: calls in the worker's gateway queue.
        queued_prefill_s: predicted prefill seconds of those calls.
        queued_work: their predicted ``t_comp`` (seconds), for status pages.
        inflight: calls sent to the worker and not yet returned.
        inflight_ctx: sum of the mean decode contexts (``input + output / 2``) of the calls in flight.
        inflight_prefill_s: sum of their prefill seconds: the prefill clock never runs further ahead.
        inflight_end_sum: sum of the predicted return times of the calls in flight.
        inflight_service_sum: sum of their predicted times on the worker (``service_s``).
        queued_gpu_s: engine seconds the queued calls will occupy the worker (``gpu_s``).
        inflight_gpu_s: the same for the calls in flight, from their start.
        prefill_free_at: when the engine is predicted to finish the prompts of the calls in flight.
        inflight_kv: KV-cache tokens the calls in flight reserve (``input + output`` each).
        best_effort_queued: best-effort calls in the worker's queue (its lane behind every other call). They
            are in none of the queued sums above: they delay no other call (``queues.LanedQueue``), so no
            estimate of another call's wait counts them.
        best_effort_inflight: best-effort calls among those in flight (counted in the in-flight sums too:
            they hold slots and share the engine's batches).
    """

    queued: int = 0
    queued_prefill_s: float = 0.0
    queued_work: float = 0.0
    inflight: int = 0
    inflight_ctx: float = 0.0
    inflight_prefill_s: float = 0.0
    inflight_end_sum: float = 0.0
    inflight_service_sum: float = 0.0
    queued_gpu_s: float = 0.0
    inflight_gpu_s: float = 0.0
    prefill_free_at: float = 0.0
    inflight_kv: int = 0
    best_effort_queued: int = 0
    best_effort_inflight: int = 0

    def outstanding(self, now: float) -> float:
        """Predicted seconds of work left on the worker: queued ``t_comp`` plus in-flight remainder.

        Calls past their predicted return still hold their slots: the in-flight remainder is at least
        10% of their predicted time, so a busy worker never reads as idle.
        """
        if not self.inflight:
            return self.queued_work
        rem = self.inflight_end_sum - self.inflight * now
        floor = 0.1 * self.inflight_service_sum
        return self.queued_work + (rem if rem > floor else floor)


def prefill_time(p: PerfProfile, input_tokens: int) -> float:
    """Engine seconds to take a prompt in (``admit_s``) and process it alone (``PerfProfile.prefill_time``). A
    prompt whose first tokens are cached is estimated as its uncached tokens alone (their attention to the
    cached prefix left out)."""
    return p.admit_s + p.prefill_time(input_tokens)


class _Consts:
    """One worker's constants as ``Estimator.scan`` reads them (native attributes in the compiled build, not a
    tuple of boxed numbers unpacked for every worker of every dispatch)."""

    __slots__ = ("base", "cap", "ctx_s", "g", "limit", "overhead", "tok")

    def __init__(self, base: float, tok: float, ctx_s: float, overhead: float, limit: int, cap: int, g: int) -> None:
        self.base = base  # iter_base_s
        self.tok = tok  # token_s + seq_s: what each decoding call adds to a decode step
        self.ctx_s = ctx_s
        self.overhead = overhead  # request_overhead_s
        self.limit = limit  # batch limit: min(capacity, max_num_seqs)
        self.cap = cap  # capacity
        self.g = g  # profile group


class Estimator:
    """Per-worker latency estimates with online correction.

    The estimator holds the workers' descriptions (``workers``, by index): the profile and the capacity
    are read from there, and nowhere else (``Scheduler.workers`` is this list).

    Args:
        workers: the workers, by worker index (profile and in-flight limit of each).
        ewma: weight of a new observation in the ratio.
        max_age_s: a ratio older than this reads as unknown.
        clamp: observed/predicted ratios are clamped to [1/clamp, clamp] so one outlier (a request that
            waited in vLLM's own queue, a network stall) cannot wreck the estimate.
    """

    def __init__(
        self,
        workers: Sequence[WorkerInfo],
        *,
        ewma: float = 0.2,
        max_age_s: float = 600.0,
        clamp: float = 8.0,
    ) -> None:
        if not 0.0 < ewma <= 1.0:
            raise ValueError("ewma must be in (0, 1]")
        self.workers = list(workers)
        self.loads = [WorkerLoad() for _ in self.workers]
        self.rows: list[WorkerEstimate] = [WorkerEstimate() for _ in self.workers]
        """Per worker, the estimates of its last ``scan`` (a dispatch's snapshot, kept in place)."""
        self.ewma = ewma
        self.max_age_s = max_age_s
        self.clamp = clamp
        self._by_kind: dict[str, list[Ratio | None]] = {}
        """Learned ratios by kind, then worker (None: none learned): one dict lookup per dispatch, not one per
        worker. Every row holds a slot for every worker."""
        # Profile latencies are pure functions of (profile, tokens); memoise the hot path. Workers with
        # equal profiles share one cache (a cluster of 64 engines has a handful of profiles), so a new
        # token count costs one computation per profile, not per worker.
        self._profiles: list[PerfProfile] = []
        """Distinct profiles; ``_group[w]`` is worker w's position here."""
        self._group: list[int] = []
        self._base_cache: list[dict[tuple[int, int], float]] = []
        """Per profile: lone-request latency by (input, output) tokens."""
        self._prefill_cache: list[dict[int, float]] = []
        """Per profile: prefill seconds by input tokens."""
        self._consts: list[_Consts] = []
        """Per worker, what ``estimates`` reads: iter_base_s, token_s + seq_s, ctx_s, request_overhead_s, the batch
        limit (min of capacity and max_num_seqs), capacity and the profile group. Rebuilt whenever a
        worker's ``WorkerInfo`` changes (``add_worker``, ``reset_worker``, ``set_capacity``)."""
        for w in range(len(self.workers)):
            self._index_worker(w)

    def _index_worker(self, worker: int) -> None:
        """(Re)build the per-worker constants and profile group of slot ``worker`` from ``workers``.

        A group no worker uses any more (its last worker changed profile: a refit) is given to the next
        new profile, so the groups and their caches stay as many as the distinct profiles ever held at once.
        """
        info = self.workers[worker]
        p = info.profile
        old = self._group[worker] if worker < len(self._group) else None
        try:
            g = self._profiles.index(p)
        except ValueError:
            others = {gg for w, gg in enumerate(self._group) if w != worker}
            free = next((gg for gg in range(len(self._profiles)) if gg not in others), None)
            if free is None:
                g = len(self._profiles)
                self._profiles.append(p)
                self._base_cache.append({})
                self._prefill_cache.append({})
            else:
                g = free
                self._profiles[g] = p
                self._base_cache[g] = {}
                self._prefill_cache[g] = {}
        limit = info.capacity if info.capacity < p.max_num_seqs else p.max_num_seqs
        const = _Consts(p.iter_base_s, p.token_s + p.seq_s, p.ctx_s, p.request_overhead_s, limit, info.capacity, g)
        if old is None:
            self._group.append(g)
            self._consts.append(const)
        else:
            self._group[worker] = g
            self._consts[worker] = const

    def add_worker(self, info: WorkerInfo) -> int:
        """Append a worker with fresh estimates; returns its index."""
        self.workers.append(info)
        self.loads.append(WorkerLoad())
        self.rows.append(WorkerEstimate())
        for row in self._by_kind.values():
            row.append(None)
        self._index_worker(len(self.workers) - 1)
        return len(self.workers) - 1

    def reset_worker(self, worker: int, info: WorkerInfo) -> None:
        """Give slot ``worker`` to a new worker: its profile and capacity, no load, no learned ratios."""
        self.workers[worker] = info
        self.loads[worker] = WorkerLoad()
        self._forget_ratios(worker)
        self._index_worker(worker)

    def _forget_ratios(self, worker: int) -> None:
        for row in self._by_kind.values():
            row[worker] = None

    def set_capacity(self, worker: int, capacity: int) -> None:
        """Change a worker's concurrent-call count (its batch and slot limit): a new ``WorkerInfo``."""
        self.workers[worker] = replace(self.workers[worker], capacity=capacity)
        self._index_worker(worker)

    def set_profile(self, worker: int, profile: PerfProfile, source: str) -> None:
        """Give a worker new profile constants (a refit): a new ``WorkerInfo``; its load is kept.

        The worker's learned ratios restart: they measured what the old profile missed. Calls already
        queued or in flight keep the predictions they were given (each carries its own), so the running
        sums stay consistent.
        """
        self.workers[worker] = replace(self.workers[worker], profile=profile, profile_source=source)
        self._forget_ratios(worker)
        self._index_worker(worker)

    # ------------------------------------------------------------------ profile (load-independent)

    def base_latency(self, worker: int, input_tokens: int, output_tokens: int) -> float:
        """The profile's lone-request latency, uncorrected (the unit of stage budgets)."""
        g = self._group[worker]
        cache = self._base_cache[g]
        key = (input_tokens, output_tokens)
        v = cache.get(key)
        if v is None:
            v = self._profiles[g].single_latency(input_tokens, output_tokens)
            if len(cache) < 65536:
                cache[key] = v
        return v

    def mean_base_latency(self, workers: Sequence[int], input_tokens: int, output_tokens: int) -> float:
        """Mean of ``base_latency`` over ``workers`` (0.0 for none): the reference cost of stage budgets.

        Computed once per distinct profile, then summed in the order of ``workers`` (the same sum, term
        by term, as adding ``base_latency`` worker by worker).
        """
        return self.mean_base_latency_runs(self.group_runs(workers), input_tokens, output_tokens)

    def group_runs(self, workers: Sequence[int]) -> list[tuple[int, int]]:
        """``workers`` as runs of one profile group, in order: (group, how many in a row). A cluster's workers
        of one GPU model come in a row, so a handful of runs stand for tens of workers."""
        group = self._group
        runs: list[tuple[int, int]] = []
        last = -1
        count = 0
        for w in workers:
            g = group[w]
            if g != last:
                if count:
                    runs.append((last, count))
                last, count = g, 0
            count += 1
        if count:
            runs.append((last, count))
        return runs

    def mean_base_latency_runs(self, runs: list[tuple[int, int]], input_tokens: int, output_tokens: int) -> float:
        """``mean_base_latency`` of the workers that ``runs`` (``group_runs``) stand for, the groups as they are now:
        the same sum, added one worker at a time in order, without visiting each worker's entry."""
        total = 0.0
        n = 0
        profiles = self._profiles
        for g, count in runs:
            # Not through the per-group cache: the caller keeps the mean (a miss here is a miss there).
            v = profiles[g].single_latency(input_tokens, output_tokens)
            for _ in range(count):  # added one by one, as worker by worker: the same float
                total += v
            n += count
        return total / n if n else 0.0

    def prefill_s(self, worker: int, input_tokens: int) -> float:
        """The profile's prefill seconds for a prompt of ``input_tokens`` on ``worker``."""
        return self._group_prefill(self._group[worker], input_tokens)

    def _group_prefill(self, g: int, input_tokens: int) -> float:
        cache = self._prefill_cache[g]
        v = cache.get(input_tokens)
        if v is None:
            v = prefill_time(self._profiles[g], input_tokens)
            if len(cache) < 65536:
                cache[input_tokens] = v
        return v

    def ratio(self, worker: int, kind: str, now: float) -> float:
        """The current correction factor for (worker, kind); 1.0 when unknown or stale."""
        row = self._by_kind.get(kind)
        r = row[worker] if row is not None else None
        if r is None or now - r.updated_at > self.max_age_s:
            return 1.0
        return r.value

    # ------------------------------------------------------------------ load-aware estimates

    def _own(self, worker: int, input_tokens: int, output_tokens: int, extra_ctx: float, cached: int = 0) -> float:
        """Uncorrected time of a call once its prompt is up: prefill (less ``cached`` tokens), batched decode,
        overhead."""
        info = self.workers[worker]
        p = info.profile
        load = self.loads[worker]
        n = load.inflight + 1
        limit = info.capacity if info.capacity < p.max_num_seqs else p.max_num_seqs
        ctx = load.inflight_ctx + extra_ctx
        if n > limit:
            ctx *= limit / n
            n = limit
        out = output_tokens - 1 if output_tokens > 1 else 0
        step = p.iter_base_s + (p.token_s + p.seq_s) * n + p.ctx_s * ctx
        return p.request_overhead_s + self._group_prefill(self._group[worker], input_tokens - cached) + out * step

    def gpu_s(self, worker: int, input_tokens: int, output_tokens: int, cached: int = 0) -> float:
        """Engine seconds a call takes from ``worker``'s throughput when the worker runs a full batch.

        Its prefill (compute-bound: not shared), its decode tokens' compute and attention, and its share of
        each decode step's fixed cost (``iter_base_s``) over a batch of ``min(capacity, max_num_seqs)``
        calls. The reciprocal is the worker's rate for calls of this shape when busy: what admission's fluid
        forecast counts work in (the latency a call sees is ``t_comp``; this is what it costs others).
        ``cached`` prompt tokens served from the prefix cache are not prefilled.
        """
        info = self.workers[worker]
        p = info.profile
        batch = info.capacity if info.capacity < p.max_num_seqs else p.max_num_seqs
        out = output_tokens - 1 if output_tokens > 1 else 0
        step = p.token_s + p.seq_s + p.ctx_s * (input_tokens + output_tokens / 2.0) + p.iter_base_s / batch
        return self._group_prefill(self._group[worker], input_tokens - cached) + out * step

    def full_batch_rate(
        self, workers: Sequence[int], kind: str, input_tokens: int, output_tokens: int, now: float
    ) -> float:
        """Calls of this shape per second that ``workers`` complete together when each runs a full batch: the sum
        over them of ``1 / (gpu_s x ratio)`` (workers whose product is not positive add nothing).

        ``gpu_s`` and ``ratio`` written out inline, the same operations in the same order (so the same floats).
        """
        out = output_tokens - 1 if output_tokens > 1 else 0
        mid = input_tokens + output_tokens / 2.0
        pres = [self._group_prefill(g, input_tokens) for g in range(len(self._profiles))]
        consts = self._consts
        by_kind = self._by_kind.get(kind)
        max_age = self.max_age_s
        rate = 0.0
        for w in workers:
            k = consts[w]
            base, tok, ctx_s, batch, g = k.base, k.tok, k.ctx_s, k.limit, k.g
            r = by_kind[w] if by_kind is not None else None
            rv = 1.0 if r is None or now - r.updated_at > max_age else r.value
            gpu = (pres[g] + out * (tok + ctx_s * mid + base / batch)) * rv
            if gpu > 0:
                rate += 1.0 / gpu
        return rate

    def backlog_s(self, worker: int, now: float) -> float:
        """Engine seconds of work outstanding on ``worker``: its queued calls' ``gpu_s`` plus what is left
        of its in-flight calls' (each at least 10% left, as in ``WorkerLoad.outstanding``)."""
        load = self.loads[worker]
        if not load.inflight or load.inflight_service_sum <= 0.0:
            return load.queued_gpu_s
        left = (load.inflight_end_sum - load.inflight * now) / load.inflight_service_sum
        left = min(max(left, 0.1), 1.0)
        return load.queued_gpu_s + load.inflight_gpu_s * left

    def t_comp(
        self, worker: int, kind: str, input_tokens: int, output_tokens: int, now: float, cached: int = 0
    ) -> float:
        """Predicted time of a call on ``worker`` once its prompt is up, in the batch it would join; ``cached``
        prompt tokens served from the worker's prefix cache are not prefilled."""
        extra = input_tokens + output_tokens / 2.0
        return self._own(worker, input_tokens, output_tokens, extra, cached) * self.ratio(worker, kind, now)

    def t_queue(self, worker: int, now: float) -> float:
        """Predicted wait of a call sent to ``worker`` now before its prompt is processed (seconds).

        The later of two: the prompts ahead of it are done (the engine's prefill clock plus the prefill
        of the calls queued ahead), and it holds a slot. Slots free at ``capacity`` calls per mean
        remaining time of the calls ahead, so the slot wait is ``behind * mean_remaining / capacity``
        with ``behind`` the returns needed before a slot is left for this call.
        """
        load = self.loads[worker]
        wait = load.prefill_free_at - now
        wait = max(wait, 0.0)
        wait += load.queued_prefill_s
        cap = self.workers[worker].capacity
        behind = load.inflight + load.queued + 1 - cap
        if behind > 0:
            slot = behind * load.outstanding(now) / ((load.inflight + load.queued) * cap)
            wait = max(wait, slot)
        return wait

    def queue_view(
        self, workers: Sequence[int], now: float, after: Sequence[tuple[int, float, float, float]] | None = None
    ) -> tuple[list[float], list[float]]:
        """``t_queue`` and ``backlog_s`` of each of ``workers`` at ``now``, in one pass (a completion prediction's
        snapshot of the cluster, taken at every admission).

        The two methods written out inline, the same operations in the same order (so the same floats), as
        ``snapshot`` does for dispatch. ``after`` (one entry per worker of ``workers``): the (calls, prefill
        seconds, engine seconds, ``t_comp`` seconds) of the queued calls that a new call would go before (a
        deadline-ordered queue serves work due later after it): left out of what is ahead of it.
        """
        t_queue: list[float] = []
        backlog: list[float] = []
        loads = self.loads
        infos = self.workers
        for i, w in enumerate(workers):
            load = loads[w]
            busy = load.inflight
            queued = load.queued
            queued_prefill = load.queued_prefill_s
            queued_gpu = load.queued_gpu_s
            later_work = 0.0
            if after is not None:
                n_after, pre_after, gpu_after, later_work = after[i]
                queued = max(queued - n_after, 0)
                queued_prefill = max(queued_prefill - pre_after, 0.0)
                queued_gpu = max(queued_gpu - gpu_after, 0.0)
            # t_queue
            wait = load.prefill_free_at - now
            wait = max(wait, 0.0)
            wait += queued_prefill
            cap = infos[w].capacity
            behind = busy + queued + 1 - cap
            if behind > 0:
                slot = behind * max(load.outstanding(now) - later_work, 0.0) / ((busy + queued) * cap)
                wait = max(wait, slot)
            t_queue.append(wait)
            # backlog_s
            if not busy or load.inflight_service_sum <= 0.0:
                backlog.append(queued_gpu)
            else:
                left = (load.inflight_end_sum - busy * now) / load.inflight_service_sum
                left = min(max(left, 0.1), 1.0)
                backlog.append(queued_gpu + load.inflight_gpu_s * left)
        return t_queue, backlog

    def harm(self, worker: int, input_tokens: int) -> float:
        """Seconds of delay a call's prompt would impose on the calls in flight on ``worker``.

        Chunked prefill runs a prompt's chunks inside the iterations every running call waits for, so
        each call in flight is stalled for about the prompt's prefill time: the sum over them is
        ``prefill * inflight``, from the profile (the online ratio is left out: it measures how much the
        calls' decode stretches under load, and a prompt's own prefill barely does). Earliest-finish
        placement ignores it; it is why a long prompt sent to a worker full of decoding calls costs the
        cluster more than its own latency.
        """
        n = self.loads[worker].inflight
        if not n:
            return 0.0
        return self.prefill_s(worker, input_tokens) * n

    def estimates(
        self, workers: Sequence[int], kind: str, input_tokens: int, output_tokens: int, now: float
    ) -> tuple[list[float], list[float], list[float]]:
        """``t_comp``, ``t_queue`` and ``harm`` for each of ``workers`` (one pass; the dispatch hot path)."""
        t_comp, t_queue, harm, _ = self.snapshot(workers, kind, input_tokens, output_tokens, now)
        return t_comp, t_queue, harm

    def snapshot(
        self,
        workers: Sequence[int],
        kind: str,
        input_tokens: int,
        output_tokens: int,
        now: float,
        cached: Sequence[int] | None = None,
    ) -> tuple[list[float], list[float], list[float], list[int]]:
        """``estimates`` plus each worker's calls in flight: everything a dispatch view needs, in one pass.

        ``cached`` (aligned with ``workers``): prompt tokens each worker is expected to have cached; only the
        rest count as prefill (in ``t_comp`` and ``harm``). ``workers`` are distinct (``scan``'s rows, as lists).
        """
        ws: list[int] = workers if isinstance(workers, list) else list(workers)
        n_ws = len(ws)
        rows = self.rows
        if cached is not None:
            if len(cached) != n_ws:
                raise ValueError("snapshot: cached must be aligned with workers")
            for i in range(n_ws):
                rows[ws[i]].credit = cached[i]
        self.scan(ws, kind, input_tokens, output_tokens, now, credited=cached is not None)
        return self.columns(ws)

    def columns(self, workers: list[int]) -> tuple[list[float], list[float], list[float], list[int]]:
        """``t_comp``, ``t_queue``, ``harm`` and calls in flight of ``workers``' rows (as the last ``scan`` left
        them), as lists aligned with ``workers``."""
        n_ws = len(workers)
        rows = self.rows
        t_comp: list[float] = [0.0] * n_ws
        t_queue: list[float] = [0.0] * n_ws
        harm: list[float] = [0.0] * n_ws
        inflight: list[int] = [0] * n_ws
        for i in range(n_ws):
            r = rows[workers[i]]
            t_comp[i] = r.t_comp
            t_queue[i] = r.t_queue
            harm[i] = r.harm
            inflight[i] = r.inflight
        return t_comp, t_queue, harm, inflight

    def scan(
        self,
        workers: list[int],
        kind: str,
        input_tokens: int,
        output_tokens: int,
        now: float,
        *,
        credited: bool = False,
    ) -> float:
        """``t_comp``, ``t_queue``, ``harm`` and calls in flight of a call on each of ``workers``, written into
        their ``rows``; returns the least ``t_comp`` (infinity for no workers). ``workers`` are distinct (a row
        per worker).

        ``credited``: each row's ``credit`` holds the prompt tokens that worker is expected to have cached, and
        only the rest count as prefill (in ``t_comp`` and ``harm``); otherwise the whole prompt does. The loop
        is ``t_comp``, ``t_queue`` and ``harm`` written out inline (the same operations in the same order, so the
        same floats): with tens of workers it runs once per worker for every call, and method calls, attribute
        lookups and boxed floats would dominate the simulator's time.
        """
        ws = workers
        n_ws = len(ws)
        extra = input_tokens + output_tokens / 2.0
        out = output_tokens - 1 if output_tokens > 1 else 0
        pres = [self._group_prefill(g, input_tokens) for g in range(len(self._profiles))]
        loads = self.loads
        rows = self.rows
        consts = self._consts
        by_kind = self._by_kind.get(kind)
        max_age = self.max_age_s
        least = float("inf")
        # The prefill of the uncached rest, remembered for the last (profile, cached) pair: workers of one
        # profile holding the same prefix (a stage's shared template) come in runs.
        last_g = -1
        last_c = -1
        last_pre = 0.0
        for i in range(n_ws):
            w = ws[i]
            k = consts[w]
            base, tok, ctx_s, overhead, limit, cap, g = k.base, k.tok, k.ctx_s, k.overhead, k.limit, k.cap, k.g
            load = loads[w]
            row = rows[w]
            r = by_kind[w] if by_kind is not None else None
            rv = 1.0 if r is None or now - r.updated_at > max_age else r.value
            busy = load.inflight
            # t_comp (``_own`` x ratio)
            n = busy + 1
            ctx = load.inflight_ctx + extra
            if n > limit:
                ctx *= limit / n
                n = limit
            c = row.credit if credited else 0
            if not c:
                pre = pres[g]
            else:
                if c != last_c or g != last_g:
                    last_pre = self._group_prefill(g, input_tokens - c)
                    last_g = g
                    last_c = c
                pre = last_pre
            tc = (overhead + pre + out * (base + tok * n + ctx_s * ctx)) * rv
            row.t_comp = tc
            if tc < least:  # noqa: PLR1730 (hot path: no builtin call)
                least = tc
            # t_queue
            wait = load.prefill_free_at - now
            if wait < 0.0:  # noqa: PLR1730 (hot path: no builtin call)
                wait = 0.0
            wait += load.queued_prefill_s
            queued = load.queued
            behind = busy + queued + 1 - cap
            if behind > 0:
                if busy:  # ``load.outstanding(now)``
                    rem = load.inflight_end_sum - busy * now
                    floor = 0.1 * load.inflight_service_sum
                    work = load.queued_work + (rem if rem > floor else floor)
                else:
                    work = load.queued_work
                slot = behind * work / ((busy + queued) * cap)
                if slot > wait:  # noqa: PLR1730
                    wait = slot
            row.t_queue = wait
            row.harm = pre * busy if busy else 0.0
            row.inflight = busy
        return least

    # ------------------------------------------------------------------ transitions (the scheduler reports)

    def enqueue(self, call: Call, worker: int) -> None:
        """``call`` (its ``t_comp`` filled) joined ``worker``'s gateway queue."""
        load = self.loads[worker]
        s = call.spec
        # The profile's prefill, not corrected by the ratio: the ratio measures how much calls stretch under
        # load, mostly their decode stalled by other prompts; a prompt's own processing barely does.
        pre = self.prefill_s(worker, s.input_tokens - call.cached)
        call.prefill_s = pre
        call.gpu_s = self.gpu_s(worker, s.input_tokens, s.output_tokens, call.cached)
        if call.best_effort:  # behind every other call: it delays none of them (``WorkerLoad``)
            load.best_effort_queued += 1
            return
        load.queued += 1
        load.queued_prefill_s += pre
        load.queued_work += call.t_comp
        load.queued_gpu_s += call.gpu_s

    def dequeue(self, call: Call, worker: int) -> None:
        """``call`` left ``worker``'s gateway queue (started, cancelled or drained). Its ``best_effort`` flag must be
        the one it was queued with (the scheduler's drivers change it only while the call is off every queue)."""
        load = self.loads[worker]
        if call.best_effort:
            if load.best_effort_queued > 0:
                load.best_effort_queued -= 1
            return
        load.queued -= 1
        load.queued_prefill_s -= call.prefill_s
        load.queued_work -= call.t_comp
        load.queued_gpu_s -= call.gpu_s
        if load.queued <= 0:  # shed float drift
            load.queued = 0
            load.queued_prefill_s = 0.0
            load.queued_work = 0.0
            load.queued_gpu_s = 0.0

    def start(self, call: Call, worker: int, now: float) -> None:
        """``call`` was sent to ``worker`` at ``now``: its prompt joins the engine's prefill clock.

        Its predicted time on the worker (``call.service_s``: the engine wait for the prompts ahead of
        it plus its own time in the batch it joins) is what ``observe`` compares the observed time with.
        """
        load = self.loads[worker]
        s = call.spec
        r = self.ratio(worker, s.kind, now)
        begin = load.prefill_free_at if load.prefill_free_at > now else now
        own = self._own(worker, s.input_tokens, s.output_tokens, s.input_tokens + s.output_tokens / 2.0, call.cached)
        call.service_s = (begin - now) + own * r
        call.model_s = (begin - now) + own
        # The batch ``_own`` assumed, kept for the profile refit (``gateway.sim.refit``).
        limit = self._consts[worker].limit
        n = load.inflight + 1
        ctx = load.inflight_ctx + s.input_tokens + s.output_tokens / 2.0
        if n > limit:
            ctx *= limit / n
            n = limit
        call.batch_n = n
        call.batch_ctx = ctx
        call.wait_s = begin - now
        load.prefill_free_at = begin + call.prefill_s
        load.inflight_prefill_s += call.prefill_s
        load.inflight += 1
        load.inflight_ctx += s.input_tokens + s.output_tokens / 2.0
        load.inflight_end_sum += now + call.service_s
        load.inflight_service_sum += call.service_s
        load.inflight_gpu_s += call.gpu_s
        load.inflight_kv += s.input_tokens + s.output_tokens
        if call.best_effort:
            load.best_effort_inflight += 1

    def release(self, call: Call, worker: int, now: float | None = None) -> None:
        """``call`` returned from ``worker`` (answered or failed) at ``now``: it leaves the batch.

        With ``now``, the prefill clock is pulled back to at most the prompts still in flight from now: the
        clock only ever adds predicted prefill times, so a worker faster than its profile (or a prompt cut
        short) would otherwise leave it running ahead of the engine for as long as calls stay in flight.
        """
        load = self.loads[worker]
        s = call.spec
        load.inflight -= 1
        load.inflight_ctx -= s.input_tokens + s.output_tokens / 2.0
        load.inflight_prefill_s -= call.prefill_s
        started = call.started_at if call.started_at is not None else 0.0
        load.inflight_end_sum -= started + call.service_s
        load.inflight_service_sum -= call.service_s
        load.inflight_gpu_s -= call.gpu_s
        load.inflight_kv -= s.input_tokens + s.output_tokens
        if call.best_effort and load.best_effort_inflight > 0:
            load.best_effort_inflight -= 1
        if load.inflight <= 0:  # an empty engine: no prompts ahead, no float drift
            load.inflight = 0
            load.inflight_ctx = 0.0
            load.inflight_prefill_s = 0.0
            load.inflight_end_sum = 0.0
            load.inflight_service_sum = 0.0
            load.inflight_gpu_s = 0.0
            load.inflight_kv = 0
            load.best_effort_inflight = 0
            load.prefill_free_at = 0.0
        elif now is not None:
            load.prefill_free_at = min(load.prefill_free_at, now + load.inflight_prefill_s)

    def model_for_tokens(self, call: Call, tokens: tuple[int, int] | None) -> float:
        """The load-aware prediction made when ``call`` was sent (``model_s``), for the (prompt, completion)
        ``tokens`` it turned out to process (None: the expected ones of ``call.spec``).

        The wait for the prompts ahead (``wait_s``) stays; the call's own time in its batch scales with the
        profile's lone-request latencies of the tokens processed and expected (the batch slows every step of
        the call alike). What a call is judged against (its worker's speed, the online ratio): a long answer
        the model chose to write is the model's verbosity, not a slow worker."""
        model = call.model_s
        spec = call.spec
        if tokens is None or (tokens[0] == spec.input_tokens and tokens[1] == spec.output_tokens):
            return model
        expected = self.base_latency(call.worker, spec.input_tokens, spec.output_tokens)
        if expected <= 0.0:
            return model
        wait = min(max(call.wait_s, 0.0), model)
        return wait + (model - wait) * (self.base_latency(call.worker, tokens[0], tokens[1]) / expected)

    def observe(self, call: Call, observed_s: float, now: float, tokens: tuple[int, int] | None = None) -> None:
        """Fold one observed latency (sent to returned) into the (worker, kind) ratio.

        The ratio compares with the load-aware prediction made when the call was sent (``service_s``),
        uncorrected (``model_s``), for the tokens it processed (``tokens``, ``model_for_tokens``), so the ratio
        converges to what the model misses about the worker, not about the length of the model's answers.
        """
        worker = call.worker
        kind = call.spec.kind
        predicted = self.model_for_tokens(call, tokens)
        if predicted <= 0.0 or observed_s < 0.0:
            return
        x = min(max(observed_s / predicted, 1.0 / self.clamp), self.clamp)
        row = self._by_kind.get(kind)
        if row is None:
            row = [None] * len(self.workers)
            self._by_kind[kind] = row
        r = row[worker]
        if r is None or now - r.updated_at > self.max_age_s:
            row[worker] = Ratio(x, now, 1)
        else:
            r.value += self.ewma * (x - r.value)
            r.updated_at = now
            r.samples += 1

    def ratios(self, worker: int, now: float) -> dict[str, tuple[float, float]]:
        """``kind -> (ratio, age_s)`` of the fresh ratios of a worker, for status pages."""
        out: dict[str, tuple[float, float]] = {}
        for k, row in self._by_kind.items():
            r = row[worker]
            if r is not None and now - r.updated_at <= self.max_age_s:
                out[k] = (r.value, now - r.updated_at)
        return out

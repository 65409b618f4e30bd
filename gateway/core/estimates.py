"""Per-worker load accounting (``WorkerLoad``) and online correction of the latency model (``latency.py``): an
EWMA of observed/predicted latency per (worker, kind), forgotten after ``max_age_s``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from gateway.core.dispatchers import WorkerEstimate
from gateway.core.latency import CACHE_LIMIT, LatencyModel, WorkerLoad, decode_steps, mean_context
from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call

INF: Final = float("inf")
"""What ``scan`` returns for no workers (a module constant: not parsed per call)."""


@dataclass(slots=True)
class Ratio:
    """An EWMA of observed/predicted latency with the time it was last updated."""

    value: float
    updated_at: float
    samples: int


class Estimator:
    """Per-worker latency estimates with online correction: ``ewma`` weighs a new observation, a ratio older than
    ``max_age_s`` reads as unknown, ratios are clamped to [1/clamp, clamp] (one outlier cannot wreck them)."""

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
        """Per worker, the estimates of its last ``scan``."""
        self.ewma = ewma
        self.max_age_s = max_age_s
        self.clamp = clamp
        self._by_kind: dict[str, list[Ratio | None]] = {}
        """Learned ratios by kind, then worker (None: none learned)."""
        self._models: list[LatencyModel] = []
        """One latency model per distinct profile among the workers (their memos shared), in first-use order."""
        self._model_of: list[LatencyModel] = []
        """Per worker, its profile's model in ``_models``."""
        self._prefills: dict[int, list[float]] = {}
        """Per prompt length, each of ``_models``' ``prefill_s`` (``_set_prefill``)."""
        for w in range(len(self.workers)):
            self._index_worker(w)

    def _index_worker(self, worker: int) -> None:
        """(Re)build slot ``worker``'s model (one of its profile's if any), capacity and batch limit."""
        info = self.workers[worker]
        m = next((m for m in self._models if m.profile == info.profile), None)
        if m is None:
            m = LatencyModel(info.profile)
        if worker < len(self._model_of):
            self._model_of[worker] = m
        else:
            self._model_of.append(m)
        self._models = list({id(x): x for x in self._model_of}.values())
        self._prefills = {}
        load = self.loads[worker]
        load.capacity = info.capacity
        load.limit = m.batch_limit(info.capacity)

    def _set_prefill(self, input_tokens: int) -> None:
        """Set every model's ``pre`` to its ``prefill_s(input_tokens)`` (once per call, not once per worker)."""
        pres = self._prefills.get(input_tokens)
        models = self._models
        if pres is None:
            pres = [m.prefill_s(input_tokens) for m in models]
            if len(self._prefills) < CACHE_LIMIT:
                self._prefills[input_tokens] = pres
        for i in range(len(models)):
            models[i].pre = pres[i]

    def model(self, worker: int) -> LatencyModel:
        """The latency model of ``worker``'s profile."""
        return self._model_of[worker]

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
        """Give a worker new profile constants (a refit): its load is kept, its ratios restart."""
        self.workers[worker] = replace(self.workers[worker], profile=profile, profile_source=source)
        self._forget_ratios(worker)
        self._index_worker(worker)

    def base_latency(self, worker: int, input_tokens: int, output_tokens: int) -> float:
        """The profile's lone-request latency, uncorrected (the unit of stage budgets)."""
        return self._model_of[worker].lone_s(input_tokens, output_tokens)

    def group_runs(self, workers: Sequence[int]) -> list[tuple[LatencyModel, int]]:
        """``workers`` as runs of one profile's model, in order: (model, how many in a row)."""
        model_of = self._model_of
        runs: list[tuple[LatencyModel, int]] = []
        last: LatencyModel | None = None
        count = 0
        for w in workers:
            m = model_of[w]
            if m is not last:
                if last is not None:
                    runs.append((last, count))
                last, count = m, 0
            count += 1
        if last is not None:
            runs.append((last, count))
        return runs

    def mean_base_latency_runs(
        self, runs: list[tuple[LatencyModel, int]], input_tokens: int, output_tokens: int
    ) -> float:
        """Mean ``base_latency`` of the workers that ``runs`` (``group_runs``) stand for (0.0 for none): the reference
        cost of stage budgets."""
        total = 0.0
        n = 0
        for m, count in runs:
            # Not through the model's memo: the caller keeps the mean (a miss here is a miss there).
            v = m.profile.single_latency(input_tokens, output_tokens)
            for _ in range(count):  # added one by one, as worker by worker: the same float
                total += v
            n += count
        return total / n if n else 0.0

    def prefill_s(self, worker: int, input_tokens: int) -> float:
        """The profile's prefill seconds for a prompt of ``input_tokens`` on ``worker``."""
        return self._model_of[worker].prefill_s(input_tokens)

    def ratio(self, worker: int, kind: str, now: float) -> float:
        """The current correction factor for (worker, kind); 1.0 when unknown or stale."""
        row = self._by_kind.get(kind)
        r = row[worker] if row is not None else None
        if r is None or now - r.updated_at > self.max_age_s:
            return 1.0
        return r.value

    def _own(self, worker: int, input_tokens: int, output_tokens: int, cached: int = 0) -> float:
        """Uncorrected time of a call once its prompt is up, in the batch it would join (``compute_s``)."""
        m = self._model_of[worker]
        extra = mean_context(input_tokens, output_tokens)
        return m.compute_s(m.prefill_s(input_tokens - cached), decode_steps(output_tokens), self.loads[worker], extra)

    def gpu_s(self, worker: int, input_tokens: int, output_tokens: int, cached: int = 0) -> float:
        """Engine seconds a call takes of ``worker``'s throughput at full batch (``cached`` tokens not prefilled)."""
        m = self._model_of[worker]
        return m.gpu_s(
            m.prefill_s(input_tokens - cached),
            decode_steps(output_tokens),
            mean_context(input_tokens, output_tokens),
            self.loads[worker].limit,
        )

    def full_batch_rate(
        self, workers: Sequence[int], kind: str, input_tokens: int, output_tokens: int, now: float
    ) -> float:
        """Calls of this shape per second that ``workers`` complete together at full batch: sum of 1/(gpu_s x ratio)."""
        out = decode_steps(output_tokens)
        mid = mean_context(input_tokens, output_tokens)
        self._set_prefill(input_tokens)
        model_of = self._model_of
        loads = self.loads
        by_kind = self._by_kind.get(kind)
        max_age = self.max_age_s
        rate = 0.0
        for w in workers:
            m = model_of[w]
            r = by_kind[w] if by_kind is not None else None
            rv = 1.0 if r is None or now - r.updated_at > max_age else r.value
            gpu = m.gpu_s(m.pre, out, mid, loads[w].limit) * rv
            if gpu > 0:
                rate += 1.0 / gpu
        return rate

    def t_comp(
        self, worker: int, kind: str, input_tokens: int, output_tokens: int, now: float, cached: int = 0
    ) -> float:
        """Predicted time of a call on ``worker`` once its prompt is up (``cached`` tokens not prefilled)."""
        return self._own(worker, input_tokens, output_tokens, cached) * self.ratio(worker, kind, now)

    def t_queue(self, worker: int, now: float) -> float:
        """Predicted wait of a call sent to ``worker`` now before its prompt is processed."""
        load = self.loads[worker]
        m = self._model_of[worker]
        return m.queue_s(load, now, load.queued, load.queued_prefill_s, 0.0)

    def queue_view(
        self, workers: Sequence[int], now: float, after: Sequence[tuple[int, float, float, float]] | None = None
    ) -> tuple[list[float], list[float]]:
        """``t_queue`` and the engine seconds outstanding (queued ``gpu_s`` plus what is left of the in-flight calls')
        of each of ``workers``; ``after``: per worker, the (calls, prefill s, engine s, ``t_comp`` s) queued that a new
        call would go before, left out."""
        t_queue: list[float] = []
        backlog: list[float] = []
        loads = self.loads
        model_of = self._model_of
        for i, w in enumerate(workers):
            load = loads[w]
            queued = load.queued
            queued_prefill = load.queued_prefill_s
            queued_gpu = load.queued_gpu_s
            later_work = 0.0
            if after is not None:
                n_after, pre_after, gpu_after, later_work = after[i]
                queued = max(queued - n_after, 0)
                queued_prefill = max(queued_prefill - pre_after, 0.0)
                queued_gpu = max(queued_gpu - gpu_after, 0.0)
            m = model_of[w]
            t_queue.append(m.queue_s(load, now, queued, queued_prefill, later_work))
            if load.inflight and load.inflight_service_sum > 0.0:
                left = (load.inflight_end_sum - load.inflight * now) / load.inflight_service_sum
                queued_gpu += load.inflight_gpu_s * min(max(left, 0.1), 1.0)
            backlog.append(queued_gpu)
        return t_queue, backlog

    def snapshot(
        self,
        workers: Sequence[int],
        kind: str,
        input_tokens: int,
        output_tokens: int,
        now: float,
        cached: Sequence[int] | None = None,
    ) -> tuple[list[float], list[float], list[float], list[int]]:
        """``t_comp``, ``t_queue``, ``harm`` and calls in flight of each of (distinct) ``workers``, as lists
        (``cached``: prompt tokens each worker holds)."""
        ws: list[int] = workers if isinstance(workers, list) else list(workers)
        n_ws = len(ws)
        rows = self.rows
        if cached is not None:
            if len(cached) != n_ws:
                raise ValueError("snapshot: cached must be aligned with workers")
            for i in range(n_ws):
                rows[ws[i]].credit = cached[i]
        self.scan(ws, kind, input_tokens, output_tokens, now, credited=cached is not None)
        rs = [rows[w] for w in ws]
        return [r.t_comp for r in rs], [r.t_queue for r in rs], [r.harm for r in rs], [r.inflight for r in rs]

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
        """The dispatch hot path: fill (distinct) ``workers``' ``rows``; returns the least ``t_comp`` (inf for none).
        ``credited``: each row's ``credit`` (cached prompt tokens) is left out of the prefill."""
        extra = mean_context(input_tokens, output_tokens)
        out = decode_steps(output_tokens)
        self._set_prefill(input_tokens)
        model_of = self._model_of
        loads = self.loads
        rows = self.rows
        by_kind = self._by_kind.get(kind)
        max_age = self.max_age_s
        least = INF
        # The prefill of the uncached rest, remembered for the last (model, cached) pair (they come in runs).
        last_m: LatencyModel | None = None
        last_c = -1
        last_pre = 0.0
        for w in workers:
            m = model_of[w]
            load = loads[w]
            row = rows[w]
            r = by_kind[w] if by_kind is not None else None
            rv = 1.0 if r is None or now - r.updated_at > max_age else r.value
            busy = load.inflight
            c = row.credit if credited else 0
            if not c:
                pre = m.pre
            else:
                if c != last_c or m is not last_m:
                    last_pre = m.prefill_s(input_tokens - c)
                    last_m = m
                    last_c = c
                pre = last_pre
            tc = m.compute_s(pre, out, load, extra) * rv
            row.t_comp = tc
            if tc < least:  # noqa: PLR1730 (hot path: no builtin call)
                least = tc
            row.t_queue = m.queue_s(load, now, load.queued, load.queued_prefill_s, 0.0)
            row.harm = pre * busy if busy else 0.0
            row.inflight = busy
        return least

    def enqueue(self, call: Call, worker: int) -> None:
        """``call`` (its ``t_comp`` filled) joined ``worker``'s gateway queue."""
        load = self.loads[worker]
        s = call.spec
        # Not corrected by the ratio: it measures decode stretched under load, a prompt's processing barely is.
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
        """``call`` left ``worker``'s gateway queue; its ``best_effort`` flag must be the one it was queued with."""
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
        """``call`` was sent to ``worker`` at ``now``: its prompt joins the prefill clock."""
        load = self.loads[worker]
        s = call.spec
        r = self.ratio(worker, s.kind, now)
        begin = load.prefill_free_at if load.prefill_free_at > now else now
        own = self._own(worker, s.input_tokens, s.output_tokens, call.cached)
        call.service_s = (begin - now) + own * r
        call.model_s = (begin - now) + own
        # The batch ``_own`` assumed, kept for the profile refit (``LatencyModel.sample_terms``).
        call.batch_n, call.batch_ctx = self.model(worker).batch(load, mean_context(s.input_tokens, s.output_tokens))
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
        """``call`` returned from ``worker`` at ``now``: it leaves the batch; the prefill clock is pulled back."""
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
        """``call.model_s`` rescaled to the (prompt, completion) ``tokens`` it processed (None: its spec's): a long
        answer is the model's verbosity, not a slow worker."""
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
        """Fold one observed latency (sent to returned) into the (worker, kind) ratio."""
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

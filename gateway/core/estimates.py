"""Latency estimates: ``t_comp(call, worker)`` and ``t_queue(worker)``.

``t_comp`` starts from the worker's performance profile (a lone request's latency for the call's token
counts) and is corrected online by the observed/predicted ratio, kept per (worker, stage kind) as an
exponentially weighted moving average. The ratio absorbs what the profile does not know: the slowdown
of running inside a batch, a GPU that is slower than its datasheet, a different model build. A ratio
carries the time of its last update and reads as unknown (1.0) once older than ``max_age_s``: a worker
that has been idle for a long time is judged by its profile again.

``t_queue`` is the predicted outstanding work per batch slot: the corrected ``t_comp`` of every call
waiting in the worker's gateway queue plus the predicted remaining time of every call in flight,
divided by the worker's capacity (calls it runs concurrently). It is 0 for an idle worker and grows
smoothly with load, so it is well defined for the dispatch score (see ``dispatch.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.core.worker import WorkerInfo


@dataclass(slots=True)
class Ratio:
    """An EWMA of observed/predicted latency with the time it was last updated."""

    value: float
    updated_at: float
    samples: int


@dataclass(slots=True)
class WorkerLoad:
    """Running sums that make ``t_queue`` O(1): queued work, and in-flight work with start times."""

    queued_work: float = 0.0
    queued: int = 0
    inflight_work: float = 0.0
    inflight_start_sum: float = 0.0
    inflight: int = 0

    def outstanding(self, now: float) -> float:
        """Predicted seconds of work left: queued plus in-flight remainder (each at least 10% left)."""
        if self.inflight:
            remaining = self.inflight_work - (self.inflight * now - self.inflight_start_sum)
            remaining = max(remaining, 0.1 * self.inflight_work)
        else:
            remaining = 0.0
        return self.queued_work + remaining


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
        self.ewma = ewma
        self.max_age_s = max_age_s
        self.clamp = clamp
        self._ratios: list[dict[str, Ratio]] = [{} for _ in self.workers]
        # Profile latencies are pure functions of (worker, tokens); memoise the hot path.
        self._base_cache: list[dict[tuple[int, int], float]] = [{} for _ in self.workers]

    def add_worker(self, info: WorkerInfo) -> int:
        """Append a worker with fresh estimates; returns its index."""
        self.workers.append(info)
        self.loads.append(WorkerLoad())
        self._ratios.append({})
        self._base_cache.append({})
        return len(self.workers) - 1

    def reset_worker(self, worker: int, info: WorkerInfo) -> None:
        """Give slot ``worker`` to a new worker: its profile and capacity, no load, no learned ratios."""
        self.workers[worker] = info
        self.loads[worker] = WorkerLoad()
        self._ratios[worker] = {}
        self._base_cache[worker] = {}

    def set_capacity(self, worker: int, capacity: int) -> None:
        """Change a worker's concurrent-call count (its ``t_queue`` divisor): a new ``WorkerInfo``."""
        self.workers[worker] = replace(self.workers[worker], capacity=capacity)

    def base_latency(self, worker: int, input_tokens: int, output_tokens: int) -> float:
        """The profile's lone-request latency, uncorrected."""
        cache = self._base_cache[worker]
        key = (input_tokens, output_tokens)
        v = cache.get(key)
        if v is None:
            v = self.workers[worker].profile.single_latency(input_tokens, output_tokens)
            if len(cache) < 65536:
                cache[key] = v
        return v

    def ratio(self, worker: int, kind: str, now: float) -> float:
        """The current correction factor for (worker, kind); 1.0 when unknown or stale."""
        r = self._ratios[worker].get(kind)
        if r is None or now - r.updated_at > self.max_age_s:
            return 1.0
        return r.value

    def t_comp(self, worker: int, kind: str, input_tokens: int, output_tokens: int, now: float) -> float:
        """Predicted latency of a call on ``worker`` (profile x online correction)."""
        return self.base_latency(worker, input_tokens, output_tokens) * self.ratio(worker, kind, now)

    def estimates(
        self, workers: Sequence[int], kind: str, input_tokens: int, output_tokens: int, now: float
    ) -> tuple[list[float], list[float]]:
        """``t_comp`` and ``t_queue`` for each of ``workers`` (one pass; the dispatch hot path)."""
        key = (input_tokens, output_tokens)
        max_age = self.max_age_s
        t_comp: list[float] = []
        t_queue: list[float] = []
        base_cache = self._base_cache
        ratios = self._ratios
        loads = self.loads
        infos = self.workers
        for w in workers:
            base = base_cache[w].get(key)
            if base is None:
                base = self.base_latency(w, input_tokens, output_tokens)
            r = ratios[w].get(kind)
            t_comp.append(base if r is None or now - r.updated_at > max_age else base * r.value)
            load = loads[w]
            if load.inflight:
                rem = load.inflight_work - (load.inflight * now - load.inflight_start_sum)
                floor = 0.1 * load.inflight_work
                t_queue.append((load.queued_work + (rem if rem > floor else floor)) / infos[w].capacity)
            elif load.queued:
                t_queue.append(load.queued_work / infos[w].capacity)
            else:
                t_queue.append(0.0)
        return t_comp, t_queue

    def t_queue(self, worker: int, now: float) -> float:
        """Predicted outstanding work per batch slot on ``worker`` (seconds)."""
        return self.loads[worker].outstanding(now) / self.workers[worker].capacity

    def observe(
        self, worker: int, kind: str, input_tokens: int, output_tokens: int, observed_s: float, now: float
    ) -> None:
        """Fold one observed latency into the (worker, kind) ratio."""
        predicted = self.base_latency(worker, input_tokens, output_tokens)
        if predicted <= 0.0 or observed_s < 0.0:
            return
        x = min(max(observed_s / predicted, 1.0 / self.clamp), self.clamp)
        r = self._ratios[worker].get(kind)
        if r is None or now - r.updated_at > self.max_age_s:
            self._ratios[worker][kind] = Ratio(x, now, 1)
        else:
            r.value += self.ewma * (x - r.value)
            r.updated_at = now
            r.samples += 1

    def ratios(self, worker: int, now: float) -> dict[str, tuple[float, float]]:
        """``kind -> (ratio, age_s)`` of the fresh ratios of a worker, for status pages."""
        return {
            k: (r.value, now - r.updated_at)
            for k, r in self._ratios[worker].items()
            if now - r.updated_at <= self.max_age_s
        }

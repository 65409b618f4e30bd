"""``llmd``: llm-d's inference scheduler with its default scheduling profile."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, Rng, register_dispatcher


class LlmdScorer:
    """llm-d's endpoint picker with its default ``EndpointPickerConfig``: the prefix-cache (3), queue (2; waiting
    calls) and KV-cache utilisation (2) scorers, each in [0, 1]; ``max-score-picker`` takes the highest weighted
    sum, ties at random."""

    PREFIX_WEIGHT = 3.0
    QUEUE_WEIGHT = 2.0
    KV_WEIGHT = 2.0

    def __init__(self, rng: Rng) -> None:
        self._rng = rng

    def choose(self, view: DispatchView) -> int:
        """The highest weighted score; ties at random."""
        rows = view.rows
        workers = view.workers
        n = len(workers)
        q_min = q_max = rows[workers[0]].queued
        for i in range(1, n):
            qi = rows[workers[i]].queued
            if qi < q_min:  # noqa: PLR1730 (hot path: no builtin call)
                q_min = qi
            if qi > q_max:  # noqa: PLR1730
                q_max = qi
        q_span = q_max - q_min
        n_in = view.input_tokens if view.input_tokens > 0 else 1
        prefix = view.prefix
        best: list[int] = []
        best_score = -float("inf")
        for i in range(n):
            r = rows[workers[i]]
            score = self.QUEUE_WEIGHT * ((q_min + q_span - r.queued) / q_span if q_span else 1.0)
            if prefix:
                score += self.PREFIX_WEIGHT * r.cached / n_in
            score += self.KV_WEIGHT * (1.0 - min(max(r.kv_util, 0.0), 1.0))
            if score > best_score + 1e-12:
                best, best_score = [i], score
            elif score >= best_score - 1e-12:
                best.append(i)
        if len(best) == 1:
            return best[0]
        return best[int(self._rng.random() * len(best)) % len(best)]


register_dispatcher("llmd", LlmdScorer, Capabilities(queue_len=True, kv_util=True, prefix_index=True))

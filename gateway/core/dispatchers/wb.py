"""``wb`` and ``wbi``: HexGen-Flow's workload-balanced, heterogeneity-aware score.

    Score(q, m) = (1 - alpha) * beta / (beta + t_queue(m) [+ harm(q, m)]) - alpha * t_comp(q, m) / beta
    beta        = max(budget(q), min over m of t_comp(q, m))

``wbi`` adds the call's interference (``harm``) to the queue term. Highest score wins; ties go to the lower
``t_comp``, then the lower position (docs/architecture.md, "Policies and the WB score")."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, register_dispatcher


class WorkloadBalanced:
    """HexGen-Flow's score; ``interference``: weight of the call's ``harm`` in the queue term (0: ``wb``)."""

    def __init__(self, interference: float = 0.0) -> None:
        if interference < 0.0:
            raise ValueError("interference weight must be >= 0")
        self.interference = interference

    def choose(self, view: DispatchView) -> int:
        """Maximum of ``(1-alpha) * beta/(beta + t_queue + w * harm) - alpha * t_comp/beta``."""
        rows = view.rows
        workers = view.workers
        n = len(workers)
        if n == 0:
            raise ValueError("dispatch view: no workers")
        alpha = view.alpha
        beta = max(view.budget, view.t_comp_min, 1e-9)
        load_w = (1.0 - alpha) * beta  # the score's first product, hoisted (same operands, same order)
        w = self.interference
        with_harm = w > 0.0
        best = 0
        best_score = -float("inf")
        best_tc = rows[workers[0]].t_comp
        # Index loop, no per-worker tuples or lists (the dispatch hot path); the same operations in the same order
        # as ``tq = t_queue + w * harm; score = load_w / (beta + tq) - alpha * tc / beta``.
        for i in range(n):
            r = rows[workers[i]]
            tc = r.t_comp
            tq = r.t_queue + w * r.harm if with_harm else r.t_queue
            score = load_w / (beta + tq) - alpha * tc / beta
            if score > best_score or (score == best_score and tc < best_tc):
                best, best_score, best_tc = i, score, tc
        return best


register_dispatcher("wb", lambda _rng: WorkloadBalanced(), Capabilities(uses_alpha=True))
register_dispatcher("wbi", lambda _rng: WorkloadBalanced(interference=1.0), Capabilities(uses_alpha=True))

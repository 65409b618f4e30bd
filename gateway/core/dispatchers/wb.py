"""``wb`` and ``wbi``: HexGen-Flow's workload-balanced, heterogeneity-aware score.

``wb`` is the score as the paper has it; ``wbi`` adds the call's interference to the queue term (below): what
``hexgen`` runs. Normalised (the paper leaves beta and the t_queue -> 0 case open):

    Score(q, m) = (1 - alpha) * beta / (beta + t_queue(m)) - alpha * t_comp(q, m) / beta
    beta        = max(budget(q), min over m of t_comp(q, m))

``beta`` is the call's stage budget (its share of the time left before the workflow's deadline, ``slo.py``),
floored at the call's best-case compute time; a late call (budget <= 0) gets the floor. Both terms are then
dimensionless: the load term says how much of the budget the queue would leave (1 for an idle worker, so
t_queue -> 0 is well defined), the compute term how much of the budget the call's compute would use on m.
Measuring against the budget couples dispatch to urgency: a call with a loose budget is placed mostly by load
(with alpha = 0.5 and small queues the score is about ``const - (t_queue + t_comp) / beta``: earliest finish),
so it can run on a slow GPU that is free and still meet its budget; a call that is behind has a small beta, its
compute term dominates, and it goes to the fastest GPU, where the urgency queue lets it pass the calls that can
wait. alpha = 0 is pure load balancing (the ``lw`` choice), alpha = 1 always picks the fastest GPU. The highest
score wins; ties go to the lower ``t_comp``, then the lower position.

Interference (``wbi``, beyond the paper). Under vLLM's chunked prefill a prompt's chunks run inside the
iterations that every call in the batch waits for, so a prompt sent to a worker stalls each call in flight there
for about its prefill time. The estimator reports that as ``harm`` (prefill seconds x calls in flight,
``estimates.py``), and ``wbi`` charges it to the worker as queue time:

    Score(q, m) = (1 - alpha) * beta / (beta + t_queue(m) + w * harm(q, m)) - alpha * t_comp(q, m) / beta

with weight ``w = 1``. Long prompts then go where few calls decode, and a worker busy decoding keeps its speed
for the calls already there; short prompts, whose harm is small, still fill gaps anywhere (its effect on
capacity is measured in ``docs/benchmarks.md``).
"""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, Rng, register_dispatcher


class WorkloadBalanced:
    """HexGen-Flow's score: balance queue load against this call's compute time on each GPU.

    Args:
        interference: weight of the call's ``harm`` in the queue term (0: the paper's score, ``wb``).
    """

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


def _make_wb(rng: Rng) -> WorkloadBalanced:
    return WorkloadBalanced()


def _make_wbi(rng: Rng) -> WorkloadBalanced:
    return WorkloadBalanced(interference=1.0)


register_dispatcher("wb", _make_wb, Capabilities(uses_alpha=True))
register_dispatcher("wbi", _make_wbi, Capabilities(uses_alpha=True))

"""Dispatchers: the global choice of a worker for a ready call.

A dispatcher gets a ``DispatchView`` (a snapshot: the call's predicted compute time and each worker's
predicted queue time, queue length and in-flight count, all computed by the scheduler) and returns a
worker index. It never fetches or mutates shared state; a dispatcher may keep its own small state
(the round-robin pointer, its RNG).

Registered dispatchers (``DISPATCHERS``):

``rr``   round-robin over the workers, ignoring load and speed. What vLLM deployments behind a plain
         Kubernetes Service or an nginx upstream get, and the paper's vLLM baseline.
``p2c``  power of two choices on queue length (queued + in flight): two distinct workers sampled at
         random, the shorter wins. Ray Serve's default request router.
``lw``   least predicted wait: the worker with the smallest ``t_queue`` (how long the call would wait
         there before its prompt is processed, from the estimator's batching model). AIBrix's
         least-busy-time and llm-d's load-aware scorers do this. Ties go to the worker that computes the
         call fastest.
``eft``  earliest finish time: the worker with the smallest ``t_queue + t_comp`` (when the call could
         start there plus how long it would run there). The classic list-scheduling heuristic for
         heterogeneous clusters (HEFT's processor choice, Topcuoglu et al. 2002). Ties go to the lower
         ``t_comp``, then the lower position.
``wb``   HexGen-Flow's workload-balanced, heterogeneity-aware score (below), as the paper has it.
``wbi``  ``wb`` with the call's interference added to the queue term (below): what ``hexgen`` runs.
``llmd`` llm-d's inference scheduler (its default scheduling profile): per worker, a weighted sum of the
         prefix-cache score (share of the prompt the worker is believed to hold, weight 3), the queue
         score (waiting calls, min-max normalised over the workers so the shortest scores 1, weight 2)
         and the KV-cache score (1 - KV utilisation, weight 2); the highest sum wins, ties at random
         (its max-score picker).

The ``wb`` score, normalised (the paper leaves beta and the t_queue -> 0 case open):

    Score(q, m) = (1 - alpha) * beta / (beta + t_queue(m)) - alpha * t_comp(q, m) / beta
    beta        = max(budget(q), min over m of t_comp(q, m))

``beta`` is the call's stage budget (its share of the time left before the workflow's deadline,
``slo.py``), floored at the call's best-case compute time; a late call (budget <= 0) gets the floor.
Both terms are then dimensionless: the load term says how much of the budget the queue would leave
(1 for an idle worker, so t_queue -> 0 is well defined), the compute term how much of the budget the
call's compute would use on m. Measuring against the budget couples dispatch to urgency: a call with a
loose budget is placed mostly by load (with alpha = 0.5 and small queues the score is about
``const - (t_queue + t_comp) / beta``: earliest finish), so it can run on a slow GPU that is free and
still meet its budget; a call that is behind has a small beta, its compute term dominates, and it goes
to the fastest GPU, where the urgency queue lets it pass the calls that can wait. alpha = 0 is pure
load balancing (the ``lw`` choice), alpha = 1 always picks the fastest GPU. The highest score wins;
ties go to the lower ``t_comp``, then the lower index.

Interference (``wbi``, beyond the paper). Under vLLM's chunked prefill a prompt's chunks run inside the
iterations that every call in the batch waits for, so a prompt sent to a worker stalls each call in
flight there for about its prefill time. The estimator reports that as ``harm`` (prefill seconds x calls
in flight, ``estimates.py``), and ``wbi`` charges it to the worker as queue time:

    Score(q, m) = (1 - alpha) * beta / (beta + t_queue(m) + w * harm(q, m)) - alpha * t_comp(q, m) / beta

with weight ``w = 1``. Long prompts then go where few calls decode, and a worker busy decoding keeps its
speed for the calls already there; short prompts, whose harm is small, still fill gaps anywhere. In the
simulator this lifts capacity at the SLO by 4-8% over ``wb`` on the CHESS traces (``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


def _as_list(seq: Sequence[float]) -> list[float]:
    """``seq`` as a list (itself when it is one): the compiled build indexes a list directly, any other
    sequence through the generic protocol."""
    return seq if isinstance(seq, list) else list(seq)


class Rng(Protocol):
    """The part of ``random.Random`` a dispatcher may use; injected, never created here."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


@dataclass(slots=True)
class DispatchView:
    """What a dispatcher sees for one call; lists are indexed by worker, only eligible workers included.

    ``workers`` holds the eligible worker indices; the other lists are aligned with it. ``budget`` is the
    call's stage budget in seconds (``slo.stage_budget``; negative when the workflow is late). ``harm`` is
    the delay the call's prompt would impose on the calls in flight on each worker (empty: unknown, 0).
    ``cached`` is the prompt tokens each worker is believed to hold for this call (empty: no prefix index),
    ``input_tokens`` the call's prompt length, ``kv_util`` each worker's KV-cache use in [0, 1] (filled for
    dispatchers that ask for it with ``wants_kv_util``).
    """

    workers: Sequence[int]
    t_comp: Sequence[float]
    t_queue: Sequence[float]
    queue_len: Sequence[int]
    inflight: Sequence[int]
    alpha: float
    budget: float = 0.0
    harm: Sequence[float] = ()
    cached: Sequence[int] = ()
    input_tokens: int = 0
    kv_util: Sequence[float] = ()


@dataclass(slots=True)
class WorkerEstimate:
    """One worker's row of a dispatch snapshot, refreshed in place (``Estimator.scan``): what a ``DispatchView``
    holds for that worker, kept per worker instead of in lists built for every call (the dispatch hot path of
    a large cluster: no float boxed into a list and read back out)."""

    t_comp: float = 0.0
    t_queue: float = 0.0
    harm: float = 0.0
    inflight: int = 0
    cached: int = 0
    """Prompt tokens of the call the worker is believed to hold (``DispatchView.cached``)."""
    credit: int = 0
    """The cached tokens the estimates count (``cached`` scaled by the policy's prefix credit)."""


class RowsDispatcher(Protocol):
    """A dispatcher that can also choose from the estimator's rows (``WorkerEstimate`` per worker) without a
    ``DispatchView``: the scheduler's path for it (no per-call lists). The same choice as ``choose``."""

    def choose_rows(
        self, rows: list[WorkerEstimate], workers: list[int], alpha: float, budget: float, t_comp_min: float
    ) -> int:
        """Position (in ``workers``) of the chosen worker; ``t_comp_min`` is their least ``t_comp``."""
        ...


class Dispatcher(Protocol):
    """Chooses a worker for a call. Returns a position in ``view.workers``."""

    def choose(self, view: DispatchView) -> int:
        """Position (in ``view.workers``) of the chosen worker."""
        ...


class RoundRobin:
    """vLLM behind a plain load balancer: the next worker in turn."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, view: DispatchView) -> int:
        """The first eligible worker at or after the turn pointer (by worker index), wrapping around.

        Walking by worker index means a temporarily ineligible worker does not shift the others' turns.
        """
        pos = 0
        for i, w in enumerate(view.workers):
            if w >= self._next:
                pos = i
                break
        self._next = view.workers[pos] + 1
        return pos


class PowerOfTwo:
    """Ray Serve's router: sample two distinct workers, send to the one with the shorter queue."""

    def __init__(self, rng: Rng) -> None:
        self._rng = rng

    def choose(self, view: DispatchView) -> int:
        """The shorter of two random distinct workers (queued + in flight); ties to the first sample."""
        n = len(view.workers)
        if n == 1:
            return 0
        a = int(self._rng.random() * n) % n
        b = int(self._rng.random() * (n - 1)) % (n - 1)
        if b >= a:
            b += 1
        la = view.queue_len[a] + view.inflight[a]
        lb = view.queue_len[b] + view.inflight[b]
        return b if lb < la else a


class LeastWork:
    """AIBrix least-busy-time / llm-d load-aware: least predicted wait before the call's prompt runs."""

    def choose(self, view: DispatchView) -> int:
        """Minimum ``t_queue``; ties to the lower ``t_comp``, then the lower position."""
        t_queue = _as_list(view.t_queue)
        t_comp = _as_list(view.t_comp)
        best = 0
        bq = t_queue[0]
        bc = t_comp[0]
        for i in range(1, len(view.workers)):
            q = t_queue[i]
            # ``(q, c) < (bq, bc)`` written out (no tuples built per worker: the dispatch hot path)
            if q < bq or (q == bq and t_comp[i] < bc):
                best, bq, bc = i, q, t_comp[i]
        return best

    def choose_rows(
        self, rows: list[WorkerEstimate], workers: list[int], alpha: float, budget: float, t_comp_min: float
    ) -> int:
        """``choose`` on the rows of ``workers`` (the scheduler's path): the same comparisons, the same choice."""
        return _least_on_rows(rows, workers, with_comp=False)


class EarliestFinish:
    """HEFT-style earliest finish time: least predicted ``t_queue + t_comp``."""

    def choose(self, view: DispatchView) -> int:
        """Minimum ``t_queue + t_comp``; ties to the lower ``t_comp``, then the lower position."""
        t_queue = _as_list(view.t_queue)
        t_comp = _as_list(view.t_comp)
        best = 0
        bc = t_comp[0]
        bf = t_queue[0] + bc
        for i in range(1, len(view.workers)):
            c = t_comp[i]
            f = t_queue[i] + c
            # ``(f, c) < (bf, bc)`` written out (no tuples built per worker)
            if f < bf or (f == bf and c < bc):
                best, bf, bc = i, f, c
        return best

    def choose_rows(
        self, rows: list[WorkerEstimate], workers: list[int], alpha: float, budget: float, t_comp_min: float
    ) -> int:
        """``choose`` on the rows of ``workers`` (the scheduler's path): the same comparisons, the same choice."""
        return _least_on_rows(rows, workers, with_comp=True)


def _least_on_rows(rows: list[WorkerEstimate], workers: list[int], *, with_comp: bool) -> int:
    """Position of the least ``t_queue`` (``with_comp``: ``t_queue + t_comp``) among ``workers``' rows; ties to
    the lower ``t_comp``, then the lower position (``LeastWork``/``EarliestFinish`` on rows)."""
    r = rows[workers[0]]
    best = 0
    bc = r.t_comp
    bk = r.t_queue + bc if with_comp else r.t_queue
    for i in range(1, len(workers)):
        r = rows[workers[i]]
        c = r.t_comp
        key = r.t_queue + c if with_comp else r.t_queue
        if key < bk or (key == bk and c < bc):
            best, bk, bc = i, key, c
    return best


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
        alpha = view.alpha
        t_comp = _as_list(view.t_comp)
        beta = max(view.budget, min(t_comp), 1e-9)
        load_w = (1.0 - alpha) * beta  # the score's first product, hoisted (same operands, same order)
        w = self.interference
        t_queue = _as_list(view.t_queue)
        harm = _as_list(view.harm)
        n = len(t_comp)
        with_harm = w > 0.0 and len(harm) > 0
        if len(t_queue) != n or (with_harm and len(harm) != n):
            raise ValueError("dispatch view: t_comp, t_queue and harm must be aligned")
        best = 0
        best_score = -float("inf")
        best_tc = t_comp[0]
        # Index loop, no per-worker tuples or lists (the dispatch hot path); the same operations in the same
        # order as ``tq = t_queue + w * harm; score = load_w / (beta + tq) - alpha * tc / beta``.
        for i in range(n):
            tc = t_comp[i]
            tq = t_queue[i] + w * harm[i] if with_harm else t_queue[i]
            score = load_w / (beta + tq) - alpha * tc / beta
            if score > best_score or (score == best_score and tc < best_tc):
                best, best_score, best_tc = i, score, tc
        return best

    def choose_rows(
        self, rows: list[WorkerEstimate], workers: list[int], alpha: float, budget: float, t_comp_min: float
    ) -> int:
        """``choose`` on the rows of ``workers`` (``rows[w]``), with ``t_comp_min`` their least ``t_comp``: the
        same operations in the same order, so the same choice (``tests/core/test_dispatch.py`` compares them).
        Every row's ``harm`` is used (a worker with nothing in flight has 0)."""
        n = len(workers)
        if n == 0:
            raise ValueError("dispatch view: no workers")
        beta = max(budget, t_comp_min, 1e-9)
        load_w = (1.0 - alpha) * beta
        w = self.interference
        with_harm = w > 0.0
        best = 0
        best_score = -float("inf")
        best_tc = rows[workers[0]].t_comp
        for i in range(n):
            r = rows[workers[i]]
            tc = r.t_comp
            tq = r.t_queue + w * r.harm if with_harm else r.t_queue
            score = load_w / (beta + tq) - alpha * tc / beta
            if score > best_score or (score == best_score and tc < best_tc):
                best, best_score, best_tc = i, score, tc
        return best


class LlmdScorer:
    """llm-d's endpoint picker with its default profile: prefix-cache 3, queue 2, KV-cache utilisation 2.

    Each scorer gives every worker a score in [0, 1] and the weighted sums are compared (llm-d's
    ``prefix-cache-scorer``, ``queue-scorer`` and ``kv-cache-utilization-scorer`` with the weights of its
    default ``EndpointPickerConfig``); ``max-score-picker`` takes the highest, breaking ties at random.
    The queue is the worker's waiting calls (vLLM's ``num_requests_waiting``; here the calls waiting for
    a slot), and the prefix score the share of the prompt's tokens the worker is believed to hold.
    """

    wants_kv_util = True
    PREFIX_WEIGHT = 3.0
    QUEUE_WEIGHT = 2.0
    KV_WEIGHT = 2.0

    def __init__(self, rng: Rng) -> None:
        self._rng = rng

    def choose(self, view: DispatchView) -> int:
        """The highest weighted score; ties at random."""
        n = len(view.workers)
        q = view.queue_len
        q_min = min(q)
        q_span = max(q) - q_min
        n_in = view.input_tokens if view.input_tokens > 0 else 1
        cached = view.cached
        kv = view.kv_util
        best: list[int] = []
        best_score = -float("inf")
        for i in range(n):
            score = self.QUEUE_WEIGHT * ((q_min + q_span - q[i]) / q_span if q_span else 1.0)
            if cached:
                score += self.PREFIX_WEIGHT * cached[i] / n_in
            if kv:
                score += self.KV_WEIGHT * (1.0 - min(max(kv[i], 0.0), 1.0))
            if score > best_score + 1e-12:
                best, best_score = [i], score
            elif score >= best_score - 1e-12:
                best.append(i)
        if len(best) == 1:
            return best[0]
        return best[int(self._rng.random() * len(best)) % len(best)]


DispatcherFactory = Callable[[Rng], Dispatcher]

DISPATCHERS: dict[str, DispatcherFactory] = {}


def register_dispatcher(name: str, factory: DispatcherFactory) -> None:
    """Register a dispatcher factory; a duplicate name raises."""
    if name in DISPATCHERS:
        raise ValueError(f"dispatcher {name!r} already registered")
    DISPATCHERS[name] = factory


register_dispatcher("rr", lambda rng: RoundRobin())
register_dispatcher("p2c", PowerOfTwo)
register_dispatcher("lw", lambda rng: LeastWork())
register_dispatcher("eft", lambda rng: EarliestFinish())
register_dispatcher("wb", lambda rng: WorkloadBalanced())
register_dispatcher("wbi", lambda rng: WorkloadBalanced(interference=1.0))
register_dispatcher("llmd", LlmdScorer)

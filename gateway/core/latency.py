"""The latency model: every estimate of how long a call takes on an engine, in one class.

A vLLM engine runs iteration-level continuous batching with chunked prefill (``profile.py`` holds the
constants and the lone engine's iteration time): prompt tokens are processed first come first served and
do not get faster with batch size (prefill is compute-bound), while decode advances every running call by
one token per iteration, so the decodes of many calls overlap and each iteration gets slower as the batch
and its contexts grow. ``LatencyModel`` (one per distinct ``PerfProfile``) turns that into:

* ``prefill_s``: engine seconds to take a prompt in and process it alone (``admit_s`` plus
  ``PerfProfile.prefill_time``); a prompt whose first tokens are cached counts its uncached tokens alone.
* ``lone_s``: a lone request's latency as a caller sees it (``PerfProfile.single_latency``).
* ``compute_s``: a call's own time once its prompt is up, in the batch it joins (the calls in flight plus
  itself, at most the worker's batch limit, with their mean contexts): overhead, prefill, then ``output - 1``
  decode steps (``step_s``).
* ``queue_s``: how long a call sent now waits before its own prompt is processed: the engine's prefill
  clock and the prefill of the calls queued ahead, or, when no slot is free for it, the time until enough
  calls in flight return (the mean remaining time of the work ahead, ``capacity`` slots freeing at once).
* ``gpu_s``: the engine seconds a call costs others when the worker runs a full batch (its prefill, its
  decode tokens, and its share of each step's fixed cost); its reciprocal is the full-batch rate.
* ``under_load_s``: a prediction made again knowing the load a call ran under (prompts that joined while
  it decoded, and the larger batch).
* ``sample_terms``: a completed call's predicted latency as coefficients of the profile's constants (the
  same formulas, linear in them), for the profile refit.

The ``Estimator`` (``estimates.py``) keeps the load accounting (``WorkerLoad``, per worker) and the online
ratios, and asks this model for every number; the live pool's outlier check, the refit's samples and the
simulator's dispatch go through the same methods. To change how a call's compute time is estimated, edit
this module (and ``PerfProfile`` for the lone engine's iteration, prefill and decode times).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.profile import PerfProfile

CACHE_LIMIT = 65536
"""Entries kept per memo (prefill seconds by prompt tokens, lone latency by token pair)."""


@dataclass(slots=True)
class WorkerLoad:
    """Running sums of one worker's load that make every estimate O(1) (kept by the ``Estimator``).

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
        capacity: the worker's concurrent-call count (``WorkerInfo.capacity``), set by the ``Estimator``.
        limit: its batch limit, ``LatencyModel.batch_limit(capacity)``, set with it.
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
    capacity: int = 1
    limit: int = 1

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


def decode_steps(output_tokens: int) -> int:
    """Decode iterations after the prefill: the prefill's last iteration yields the first output token."""
    return output_tokens - 1 if output_tokens > 1 else 0


def mean_context(input_tokens: int, output_tokens: int) -> float:
    """The mean context a call's decode steps read: ``input + output / 2``."""
    return input_tokens + output_tokens / 2.0


def prefill_token_s(profile: PerfProfile) -> float:
    """Engine seconds per prompt token of a prefill run in full chunks: converts the prefill clock's wait into
    the tokens ahead of a call (``LatencyModel.sample_terms``'s ``wait_tokens``)."""
    return profile.token_s + profile.iter_base_s / profile.max_batched_tokens


class LatencyModel:
    """The latency estimates of one engine profile, its constants read once (plain floats, no lookups).

    A worker's capacity and batch limit (``batch_limit``: its in-flight cap, at most ``max_num_seqs``) are
    the worker's, read from its ``WorkerLoad``; everything else is the profile's. Lone latencies and prefill
    times are memoised by token count (a cluster of many engines has a handful of profiles).
    """

    __slots__ = ("_lone", "_prefill", "base", "ctx_s", "overhead", "profile", "tok")

    def __init__(self, profile: PerfProfile) -> None:
        self.profile = profile
        self.base = profile.iter_base_s
        self.tok = profile.token_s + profile.seq_s  # what each decoding call adds to a decode step
        self.ctx_s = profile.ctx_s
        self.overhead = profile.request_overhead_s
        self._prefill: dict[int, float] = {}
        self._lone: dict[tuple[int, int], float] = {}

    def batch_limit(self, capacity: int) -> int:
        """The largest batch a worker of ``capacity`` concurrent calls runs: ``min(capacity, max_num_seqs)``."""
        m = self.profile.max_num_seqs
        return capacity if capacity < m else m

    # ------------------------------------------------------------------ lone request (load-independent)

    def prefill_s(self, input_tokens: int) -> float:
        """Engine seconds to take a prompt in (``admit_s``) and process it alone (``PerfProfile.prefill_time``).
        A prompt whose first tokens are cached is estimated as its uncached tokens alone."""
        cache = self._prefill
        v = cache.get(input_tokens)
        if v is None:
            p = self.profile
            v = p.admit_s + p.prefill_time(input_tokens)
            if len(cache) < CACHE_LIMIT:
                cache[input_tokens] = v
        return v

    def lone_s(self, input_tokens: int, output_tokens: int) -> float:
        """A lone request's latency as a caller sees it (``PerfProfile.single_latency``): the unit of budgets."""
        cache = self._lone
        key = (input_tokens, output_tokens)
        v = cache.get(key)
        if v is None:
            v = self.profile.single_latency(input_tokens, output_tokens)
            if len(cache) < CACHE_LIMIT:
                cache[key] = v
        return v

    # ------------------------------------------------------------------ under load

    def batch(self, load: WorkerLoad, ctx_add: float) -> tuple[int, float]:
        """The decode batch a call of mean context ``ctx_add`` joins on a worker of load ``load``: the calls in
        flight plus itself, at most ``load.limit`` of them (a batch over the limit reads the mean context per
        call): (calls, context tokens per step)."""
        n = load.inflight + 1
        ctx = load.inflight_ctx + ctx_add
        if n > load.limit:
            return load.limit, ctx * (load.limit / n)
        return n, ctx

    def compute_s(self, prefill_s: float, steps: int, load: WorkerLoad, ctx_add: float) -> float:
        """A call's own time once its prompt is up (uncorrected): overhead, its prefill (``prefill_s``), then
        ``steps`` decode steps in the batch it joins on a worker of load ``load`` (``batch``, written out: the
        dispatch scan calls this once per worker for every call; ``ctx_add``: the call's mean context), each
        ``iter_base_s + (token_s + seq_s) * calls + ctx_s * context``."""
        n = load.inflight + 1
        ctx = load.inflight_ctx + ctx_add
        limit = load.limit
        if n > limit:
            ctx *= limit / n
            n = limit
        return self.overhead + prefill_s + steps * (self.base + self.tok * n + self.ctx_s * ctx)

    def queue_s(self, load: WorkerLoad, now: float, queued: int, queued_prefill_s: float, later_work: float) -> float:
        """The wait of a call sent now before its prompt is processed (seconds), behind ``queued`` calls of
        ``queued_prefill_s`` prefill seconds in the worker's queue.

        The later of two: the prompts ahead of it are done (the engine's prefill clock plus the prefill of
        the calls queued ahead), and it holds a slot. Slots free at ``capacity`` calls per mean remaining time
        of the calls ahead, so the slot wait is ``behind * mean_remaining / capacity`` with ``behind`` the
        returns needed before a slot is left for this call. ``later_work``: predicted seconds of queued work
        that the call goes before (left out of the work ahead of it).
        """
        wait = load.prefill_free_at - now
        if wait < 0.0:  # noqa: PLR1730 (hot path: no builtin call)
            wait = 0.0
        wait += queued_prefill_s
        busy = load.inflight
        capacity = load.capacity
        behind = busy + queued + 1 - capacity
        if behind > 0:
            work = load.outstanding(now) - later_work
            if work < 0.0:  # noqa: PLR1730
                work = 0.0
            slot = behind * work / ((busy + queued) * capacity)
            if slot > wait:  # noqa: PLR1730
                wait = slot
        return wait

    def gpu_s(self, prefill_s: float, steps: int, mid_ctx: float, batch: int) -> float:
        """Engine seconds a call takes from a worker's throughput when it runs a full batch of ``batch`` calls:
        its prefill (compute-bound: not shared), its ``steps`` decode tokens' compute and attention (at mean
        context ``mid_ctx``), and its share of each decode step's fixed cost. What admission's fluid forecast
        counts work in (the latency a call sees is ``compute_s``; this is what it costs others)."""
        return prefill_s + steps * (self.tok + self.ctx_s * mid_ctx + self.base / batch)

    def under_load_s(self, predicted_s: float, joined_prefill_s: float, extra_calls: float, steps: int) -> float:
        """A call's predicted time knowing the load it ran under: ``predicted_s`` (the batch it joined), plus
        the prefill of the prompts sent to the worker while it ran (chunked prefill runs them in the
        iterations its decode waits for) and ``extra_calls`` more calls in each of its ``steps`` decode steps
        (on average) than the batch it joined."""
        joined = joined_prefill_s if joined_prefill_s > 0.0 else 0.0
        extra = extra_calls if extra_calls > 0.0 else 0.0
        return predicted_s + joined + extra * self.tok * steps

    # ------------------------------------------------------------------ the refit's view

    def sample_terms(
        self, prefill_tokens: int, output_tokens: int, batch_n: int, batch_ctx: float, wait_tokens: float
    ) -> tuple[float, float, float, float, float, float, float]:
        """A completed call's predicted latency (``compute_s`` plus its wait, the tokens ahead in the engine
        prefilled in full chunks) as the coefficients of the profile's ``iter_base_s``, ``token_s``, ``ctx_s``,
        ``request_overhead_s``, ``attn_s``, ``seq_s`` and ``admit_s``: the model is linear in them.

        The prefill of ``p`` tokens in chunks is ``PerfProfile.prefill_time``'s: one ``iter_base_s`` per chunk,
        ``token_s`` per token, ``ctx_s`` per context token already cached when each chunk runs, and ``attn_s``
        per attention pair (``p (p + 1) / 2``).
        """
        chunk = self.profile.max_batched_tokens
        p = float(prefill_tokens)
        out = float(decode_steps(output_tokens))
        n_full, rest = divmod(prefill_tokens, chunk)
        full = float(n_full)
        chunks = full + (1.0 if rest else 0.0)
        pre_ctx = chunk * (full * (full - 1) / 2 + (full if rest else 0.0))
        return (
            chunks + out + wait_tokens / chunk,
            p + out * batch_n + wait_tokens,
            pre_ctx + out * batch_ctx,
            1.0,
            p * (p + 1) / 2,
            out * batch_n,
            1.0,
        )

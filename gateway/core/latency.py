"""The latency model: every estimate of how long a call takes on an engine, in one class.

``LatencyModel`` (one per distinct ``PerfProfile``) gives ``prefill_s``, ``lone_s``, ``compute_s``, ``queue_s``,
``gpu_s``, ``under_load_s`` and ``sample_terms`` (docs/architecture.md, "The latency model"). To change how a
call's compute time is estimated, edit this module (and ``PerfProfile`` for the lone engine)."""

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
        best_effort_queued: best-effort calls in the worker's queue (in none of the queued sums: they delay
            no other call).
        best_effort_inflight: best-effort calls among those in flight (in the in-flight sums too).
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
        """Predicted seconds of work left on the worker: queued ``t_comp`` plus the in-flight remainder (at least
        10% of their predicted time: calls past their predicted return still hold slots)."""
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
    """The latency estimates of one engine profile, its constants read once as plain floats; capacity and batch
    limit come from the worker's ``WorkerLoad``. Lone latencies and prefill times are memoised by token count."""

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
        """The wait of a call sent now before its prompt is processed, behind ``queued`` calls of ``queued_prefill_s``:
        the later of the prompts ahead being done (prefill clock plus queued prefill) and a free slot
        (``behind * mean_remaining / capacity``). ``later_work``: queued seconds the call goes before."""
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
        """A completed call's predicted latency (``compute_s`` plus its wait) as coefficients of the profile's
        ``iter_base_s``, ``token_s``, ``ctx_s``, ``request_overhead_s``, ``attn_s``, ``seq_s`` and ``admit_s`` (the
        model is linear in them; prefill as ``PerfProfile.prefill_time`` counts it)."""
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

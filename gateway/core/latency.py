"""The latency model: every estimate of how long a call takes on an engine, in one class (docs/architecture.md,
"The latency model"). To change how a call's compute time is estimated, edit this module."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.profile import PerfProfile

CACHE_LIMIT = 65536
"""Entries kept per memo (prefill seconds by prompt tokens, lone latency by token pair)."""


@dataclass(slots=True)
class WorkerLoad:
    """Running sums of one worker's load that make every estimate O(1) (kept by the ``Estimator``): ``queued*``
    over its gateway queue (best-effort calls only in ``best_effort_queued``), ``inflight*`` over the calls sent
    and not returned; ``prefill_free_at``: when the engine is predicted to finish their prompts."""

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
        10% of their predicted time)."""
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
    """Engine seconds per prompt token of a prefill run in full chunks."""
    return profile.token_s + profile.iter_base_s / profile.max_batched_tokens


class LatencyModel:
    """The latency estimates of one engine profile (lone latencies and prefill times memoised by token count)."""

    __slots__ = ("_lone", "_prefill", "base", "ctx_s", "overhead", "pre", "profile", "tok")

    def __init__(self, profile: PerfProfile) -> None:
        self.profile = profile
        self.base = profile.iter_base_s
        self.tok = profile.token_s + profile.seq_s  # what each decoding call adds to a decode step
        self.ctx_s = profile.ctx_s
        self.overhead = profile.request_overhead_s
        self._prefill: dict[int, float] = {}
        self._lone: dict[tuple[int, int], float] = {}
        self.pre = 0.0
        """``prefill_s`` of the prompt being estimated on every worker (set once per call by ``Estimator``)."""

    def batch_limit(self, capacity: int) -> int:
        """The largest batch a worker of ``capacity`` concurrent calls runs: ``min(capacity, max_num_seqs)``."""
        m = self.profile.max_num_seqs
        return capacity if capacity < m else m

    def prefill_s(self, input_tokens: int) -> float:
        """Engine seconds to take a prompt in (``admit_s``) and process it alone."""
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

    def batch(self, load: WorkerLoad, ctx_add: float) -> tuple[int, float]:
        """The decode batch a call of mean context ``ctx_add`` joins: (calls, context tokens per step)."""
        n = load.inflight + 1
        ctx = load.inflight_ctx + ctx_add
        if n > load.limit:
            return load.limit, ctx * (load.limit / n)
        return n, ctx

    def compute_s(self, prefill_s: float, steps: int, load: WorkerLoad, ctx_add: float) -> float:
        """A call's own time once its prompt is up (uncorrected): overhead, prefill, then ``steps`` decode steps in
        the batch it joins (``batch``, written out: the hot path)."""
        n = load.inflight + 1
        ctx = load.inflight_ctx + ctx_add
        limit = load.limit
        if n > limit:
            ctx *= limit / n
            n = limit
        return self.overhead + prefill_s + steps * (self.base + self.tok * n + self.ctx_s * ctx)

    def queue_s(self, load: WorkerLoad, now: float, queued: int, queued_prefill_s: float, later_work: float) -> float:
        """The wait of a call sent now before its prompt is processed: the later of the prompts ahead being done and
        a free slot. ``later_work``: queued seconds the call goes before."""
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
        """Engine seconds a call takes of a worker's throughput in a full batch of ``batch`` calls (what it costs
        others; admission's fluid forecast counts work in it)."""
        return prefill_s + steps * (self.tok + self.ctx_s * mid_ctx + self.base / batch)

    def under_load_s(self, predicted_s: float, joined_prefill_s: float, extra_calls: float, steps: int) -> float:
        """A call's predicted time knowing the load it ran under: plus the prompts that joined while it ran and
        ``extra_calls`` more calls per decode step."""
        joined = joined_prefill_s if joined_prefill_s > 0.0 else 0.0
        extra = extra_calls if extra_calls > 0.0 else 0.0
        return predicted_s + joined + extra * self.tok * steps

    def sample_terms(
        self, prefill_tokens: int, output_tokens: int, batch_n: int, batch_ctx: float, wait_tokens: float
    ) -> tuple[float, float, float, float, float, float, float]:
        """A completed call's predicted latency as coefficients of the profile's ``iter_base_s``, ``token_s``,
        ``ctx_s``, ``request_overhead_s``, ``attn_s``, ``seq_s`` and ``admit_s`` (it is linear in them)."""
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

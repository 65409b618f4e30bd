"""Iteration-time model of one vLLM engine: the numbers behind every latency estimate.

vLLM runs iteration-level continuous batching: every iteration (one forward pass) processes one decode
token for each running call plus, with chunked prefill, up to ``max_batched_tokens - decoding`` prompt
tokens of calls still in prefill. The duration of one iteration is modelled as

    t_iter = iter_base_s + token_s * tokens_in_batch + ctx_s * context_tokens_read + seq_s * decoding_calls

* ``iter_base_s``: the memory-bound floor of a forward pass (reading the weights once), plus launch
  overhead; what a batch-1 decode step costs at zero context.
* ``token_s``: compute per batched token (``2 * params / effective FLOP/s``): prefill chunks are
  dominated by it, large decode batches grow with it.
* ``ctx_s``: attention over the KV cache, proportional to the context tokens read in the iteration
  (``kv_bytes_per_token / effective bandwidth``), so decode steps slow down as contexts grow.
* ``attn_s`` (default 0): prefill attention's compute, per (query, key) pair a prompt chunk computes: a
  chunk of ``c`` prompt tokens after ``p`` tokens already processed computes ``c * p + c * (c + 1) / 2``
  pairs (causal attention), so a prompt of ``n`` tokens alone computes ``n * (n + 1) / 2`` however it is
  chunked. Quadratic in the prompt: it matters where the model is small against its context (the CPU's
  tiny test model), and is folded into ``token_s`` by the fits of published GPU numbers, which leave it at 0.

* ``seq_s`` (default 0): host work per decoding call per iteration (sampling, detokenising and
  streaming its token, the scheduler's bookkeeping), beyond its token's compute: an engine whose host
  side runs on the same core as its forward pass (vLLM on a CPU, where it dwarfs ``token_s``) slows every
  step by it per call in the batch. On a GPU host it overlaps the forward pass and is folded into
  ``token_s`` by the fits of published numbers, which leave it at 0; ``hexflow calibrate`` measures
  ``token_s + seq_s`` per step directly (its step probes) and pins ``token_s`` by the prompts.

* ``admit_s`` (default 0): engine time per admitted request, spent in the iteration that admits it: the
  host work of taking a request in (the API server parsing its body, input processing, the engine's
  bookkeeping) where it runs on the engine's own core, so it stalls every running call's step as well as
  the request itself (vLLM on a CPU, growing with the prompt; the profile keeps one figure per request). On a GPU host
  the API server has cores of its own and it is 0 (all of its time is ``request_overhead_s``);
  ``hexflow calibrate`` measures it by batches of requests sent together (each one's intake stalls all).

``block_tokens`` (default 16, vLLM's default on GPUs) is the engine's KV block size: its prefix cache
reuses whole blocks only, so a shared prefix counts down to a multiple of it. vLLM's CPU backend uses 128
(and accepts only multiples of 32); ``hexflow calibrate`` reads it from the worker's ``vllm:cache_config_info``.

``request_overhead_s`` is latency per request that does not occupy the GPU (API server, tokenisation,
detokenisation, client framework); it is added to what a caller observes but does not hold a batch slot.

The same profile drives the simulator's worker model, the emulated worker and the scheduler's latency
model (``latency.py``), so the three agree by construction. The constants come from ``config/gpus.yaml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gateway.core.prefix import BLOCK_TOKENS

CAPACITY_CALL_TOKENS = 4096
"""Prompt + output tokens of a typical call, for ``derived_capacity`` (CHESS calls average 3-4k)."""
CAPACITY_SLOWDOWN = 2.0
"""How much slower than a lone decode step a full batch's step may be, for ``derived_capacity``."""


@dataclass(frozen=True, slots=True)
class PerfProfile:
    """Performance model of one engine (a GPU type, a model, a tensor-parallel degree)."""

    gpu: str
    model: str
    iter_base_s: float
    token_s: float
    ctx_s: float
    request_overhead_s: float
    kv_capacity_tokens: int
    max_num_seqs: int
    max_batched_tokens: int
    attn_s: float = 0.0
    block_tokens: int = BLOCK_TOKENS
    seq_s: float = 0.0
    admit_s: float = 0.0

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"{self.gpu}/{self.model}: block_tokens must be at least 1, got {self.block_tokens}")

    def __reduce__(
        self,
    ) -> tuple[type[PerfProfile], tuple[str, str, float, float, float, float, int, int, int, float, int, float, float]]:
        # Pickled by its fields (to a bench's worker processes): a frozen dataclass compiled by mypyc (the
        # native build) cannot be unpickled by setting attributes.
        return (
            type(self),
            (
                self.gpu,
                self.model,
                self.iter_base_s,
                self.token_s,
                self.ctx_s,
                self.request_overhead_s,
                self.kv_capacity_tokens,
                self.max_num_seqs,
                self.max_batched_tokens,
                self.attn_s,
                self.block_tokens,
                self.seq_s,
                self.admit_s,
            ),
        )

    @property
    def name(self) -> str:
        """``GPU/model``, the profile's display name."""
        return f"{self.gpu}/{self.model}"

    def iter_time(self, tokens: int, ctx: float, pairs: float = 0.0, decoders: int = 0) -> float:
        """Duration of one iteration that processes ``tokens``, reads ``ctx`` context tokens, computes
        ``pairs`` prefill attention pairs and decodes one token for each of ``decoders`` calls (among the
        ``tokens``)."""
        return self.iter_base_s + self.token_s * tokens + self.ctx_s * ctx + self.attn_s * pairs + self.seq_s * decoders

    def busy_split(self, iterations: int, batched_tokens: int, busy_s: float) -> tuple[float, float, float]:
        """An engine's ``busy_s`` seconds over ``iterations`` that processed ``batched_tokens`` tokens, split by
        the terms of ``iter_time``: the per-iteration base, ``token_s`` per batched token (at most what the base
        leaves), and the rest (context reads, prefill attention, per-call host work; never negative)."""
        base = self.iter_base_s * iterations
        tok = min(self.token_s * batched_tokens, busy_s - base)
        return base, tok, max(busy_s - base - tok, 0.0)

    def prefill_time(self, input_tokens: int) -> float:
        """Engine seconds to process a prompt alone: its chunks, each reading the context before it (and,
        with ``attn_s``, computing its attention pairs); the iteration that ends it yields the first token."""
        chunk = self.max_batched_tokens
        n = input_tokens if input_tokens > 1 else 1
        full, rest = divmod(n, chunk)
        n_chunks = full + (1 if rest else 0)
        # Context read while prefilling chunk i is the i*chunk tokens already in the KV cache.
        t = (
            n_chunks * self.iter_base_s
            + self.token_s * n
            + self.ctx_s * chunk * (full * (full - 1) / 2 + (full if rest else 0))
        )
        if self.attn_s:
            t += self.attn_s * (n * (n + 1) / 2.0)
        return t

    def engine_latency(self, input_tokens: int, output_tokens: int) -> float:
        """Time a lone request spends in the engine: chunked prefill, then one decode step per token.

        The prefill's last iteration yields the first output token, so ``output_tokens - 1`` decode
        iterations follow. Closed form of the simulator's worker model with a batch of one.
        """
        prefill = self.prefill_time(input_tokens)
        n = max(output_tokens - 1, 0)
        ctx0 = max(input_tokens, 1)
        decode = n * (self.iter_base_s + self.token_s + self.seq_s) + self.ctx_s * (n * ctx0 + n * (n - 1) / 2)
        return prefill + decode

    def single_latency(self, input_tokens: int, output_tokens: int) -> float:
        """What a caller observes for a lone request: engine time (its own intake, ``admit_s``, included)
        plus the per-request overhead."""
        return self.request_overhead_s + self.admit_s + self.engine_latency(input_tokens, output_tokens)

    def decode_throughput(self, batch: int, mean_ctx: float) -> float:
        """Decode tokens per second with ``batch`` running calls of mean context ``mean_ctx``."""
        return batch / self.iter_time(batch, batch * mean_ctx, decoders=batch)

    def derived_capacity(self, call_tokens: int = CAPACITY_CALL_TOKENS, slowdown: float = CAPACITY_SLOWDOWN) -> int:
        """The in-flight limit of a worker whose config names none: the largest batch that

        1. vLLM runs at once (``max_num_seqs``);
        2. the KV cache holds with ``call_tokens`` (prompt + output) per call;
        3. keeps a decode step within ``slowdown`` x a lone one, where latency binds: a step costs
           ``iter_base_s + n * (token_s + seq_s + ctx_s * call_tokens)`` with n calls, so on an engine whose
           weight reads (``iter_base_s``) dominate, many calls share a step almost for free, and on one
           where compute and attention dominate, a large batch slows every call in it.
        """
        if call_tokens < 1 or slowdown < 1.0:
            raise ValueError("call_tokens must be >= 1 and slowdown >= 1")
        by_kv = self.kv_capacity_tokens // call_tokens
        per_call = self.token_s + self.seq_s + self.ctx_s * call_tokens
        # base + n * per_call <= slowdown * (base + per_call)
        by_latency = (
            int(((slowdown - 1.0) * self.iter_base_s + slowdown * per_call) / per_call)
            if per_call > 0
            else self.max_num_seqs
        )
        return max(1, min(self.max_num_seqs, by_kv, by_latency))

    def prefill_throughput(self, mean_ctx: float) -> float:
        """Prompt tokens per second when every iteration is a full prefill chunk."""
        chunk = self.max_batched_tokens
        return chunk / self.iter_time(chunk, mean_ctx)


CONSTANTS: tuple[str, ...] = (
    "iter_base_s",
    "token_s",
    "ctx_s",
    "request_overhead_s",
    "kv_capacity_tokens",
    "max_num_seqs",
    "max_batched_tokens",
    "attn_s",
    "block_tokens",
    "seq_s",
    "admit_s",
)
"""The fields of ``PerfProfile`` besides its name, in its order: what a config entry or a fit provides."""


def profile_from(gpu: str, model: str, source: object) -> PerfProfile:
    """A ``PerfProfile`` whose constants are read from the same-named attributes of ``source`` (a source
    without ``attn_s`` gives 0: its prefill is linear; without ``block_tokens``, vLLM's GPU default; without
    ``seq_s`` or ``admit_s``, 0: no per-call host work per step or per admission)."""
    return PerfProfile(
        gpu,
        model,
        getattr(source, "iter_base_s"),  # noqa: B009 (the names of CONSTANTS, spelled out for the type checker)
        getattr(source, "token_s"),  # noqa: B009
        getattr(source, "ctx_s"),  # noqa: B009
        getattr(source, "request_overhead_s"),  # noqa: B009
        getattr(source, "kv_capacity_tokens"),  # noqa: B009
        getattr(source, "max_num_seqs"),  # noqa: B009
        getattr(source, "max_batched_tokens"),  # noqa: B009
        getattr(source, "attn_s", 0.0),
        getattr(source, "block_tokens", BLOCK_TOKENS),
        getattr(source, "seq_s", 0.0),
        getattr(source, "admit_s", 0.0),
    )


def iterations_within(a: float, g: float, elapsed: float) -> int:
    """Largest k >= 0 with ``k * a + g * k * (k - 1) / 2 <= elapsed``.

    The time of k iterations whose duration starts at ``a`` and grows by ``g`` per iteration (context
    grows linearly while the batch is unchanged). Used to find where a running segment stands.
    """
    if elapsed <= 0.0:
        return 0
    if g <= 0.0:
        return int(elapsed / a) if a > 0.0 else 0
    # g/2 k^2 + (a - g/2) k - elapsed = 0
    h = a - g / 2.0
    k = int((-h + math.sqrt(h * h + 2.0 * g * elapsed)) / g)
    # Guard the float rounding on both sides.
    while k > 0 and k * a + g * k * (k - 1) / 2.0 > elapsed:
        k -= 1
    while (k + 1) * a + g * (k + 1) * k / 2.0 <= elapsed:
        k += 1
    return k


def time_scaled(profile: PerfProfile, scale: float) -> PerfProfile:
    """The profile of an engine running ``1/scale`` times faster (an emulated worker at ``--time-scale``).

    Every latency the model predicts is multiplied by ``scale``; capacities are unchanged.
    """
    if not scale > 0:
        raise ValueError(f"time scale must be positive, got {scale}")
    if scale == 1.0:
        return profile
    return replace(
        profile,
        iter_base_s=profile.iter_base_s * scale,
        token_s=profile.token_s * scale,
        ctx_s=profile.ctx_s * scale,
        request_overhead_s=profile.request_overhead_s * scale,
        attn_s=profile.attn_s * scale,
        seq_s=profile.seq_s * scale,
        admit_s=profile.admit_s * scale,
    )

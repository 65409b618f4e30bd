"""Iteration-time model of one vLLM engine: the constants behind every latency estimate (docs/architecture.md,
"The engine's constants"; values in ``config/gpus.yaml``)."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields, replace

from gateway.core.pickled import field_values
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

    def __reduce__(self) -> tuple[type[PerfProfile], tuple[object, ...]]:
        return type(self), field_values(self)

    @property
    def name(self) -> str:
        """``GPU/model``, the profile's display name."""
        return f"{self.gpu}/{self.model}"

    def iter_time(self, tokens: int, ctx: float, pairs: float = 0.0, decoders: int = 0) -> float:
        """Duration of one iteration that processes ``tokens``, reads ``ctx`` context tokens, computes ``pairs`` prefill
        attention pairs and decodes one token for each of ``decoders`` calls (among the ``tokens``)."""
        return self.iter_base_s + self.token_s * tokens + self.ctx_s * ctx + self.attn_s * pairs + self.seq_s * decoders

    def busy_split(self, iterations: int, batched_tokens: int, busy_s: float) -> tuple[float, float, float]:
        """An engine's ``busy_s`` split into the per-iteration base, ``token_s`` per batched token and the rest."""
        base = self.iter_base_s * iterations
        tok = min(self.token_s * batched_tokens, busy_s - base)
        return base, tok, max(busy_s - base - tok, 0.0)

    def prefill_time(self, input_tokens: int) -> float:
        """Engine seconds to process a prompt alone: its chunks, each reading the context before it (and,
        with ``attn_s``, computing its attention pairs); the iteration that ends it yields the first token."""
        chunk = self.max_batched_tokens
        n = input_tokens if input_tokens > 1 else 1
        full = n // chunk  # not divmod: a generic call in the native build
        rest = n % chunk
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
        """Time a lone request spends in the engine: chunked prefill (whose last iteration yields the first
        token), then ``output_tokens - 1`` decode steps; the simulated engine's closed form at batch one."""
        prefill = self.prefill_time(input_tokens)
        n = max(output_tokens - 1, 0)
        ctx0 = max(input_tokens, 1)
        decode = n * (self.iter_base_s + self.token_s + self.seq_s) + self.ctx_s * (n * ctx0 + n * (n - 1) / 2)
        return prefill + decode

    def single_latency(self, input_tokens: int, output_tokens: int) -> float:
        """What a caller observes for a lone request: engine time (its own intake, ``admit_s``, included)
        plus the per-request overhead."""
        return self.request_overhead_s + self.admit_s + self.engine_latency(input_tokens, output_tokens)

    def derived_capacity(self, call_tokens: int = CAPACITY_CALL_TOKENS, slowdown: float = CAPACITY_SLOWDOWN) -> int:
        """The in-flight limit of a worker whose config names none: the largest batch vLLM runs at once that the KV
        cache holds at ``call_tokens`` per call and whose decode step stays within ``slowdown`` x a lone one."""
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
TIME_CONSTANTS: tuple[str, ...] = tuple(k for k in CONSTANTS if k.endswith("_s"))
"""The constants in seconds (the rest are counts), in the order of a fit's coefficient row
(``LatencyModel.sample_terms``, ``gateway.profiling.plan``)."""


def profile_from(gpu: str, model: str, source: object) -> PerfProfile:
    """A ``PerfProfile`` from the same-named attributes of ``source`` (missing optional ones: their defaults)."""
    optional = {f.name: f.default for f in fields(PerfProfile) if f.default is not MISSING}
    values = [getattr(source, k, optional[k]) if k in optional else getattr(source, k) for k in CONSTANTS]
    return PerfProfile(gpu, model, *values)


def iterations_within(a: float, g: float, elapsed: float) -> int:
    """Largest k >= 0 with ``k * a + g * k * (k - 1) / 2 <= elapsed``: iterations of a segment done by then."""
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
    """The profile of an engine whose every latency is multiplied by ``scale`` (capacities unchanged)."""
    if not scale > 0:
        raise ValueError(f"time scale must be positive, got {scale}")
    if scale == 1.0:
        return profile
    return replace(profile, **{k: getattr(profile, k) * scale for k in TIME_CONSTANTS})

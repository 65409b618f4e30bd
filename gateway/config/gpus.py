"""``config/gpus.yaml``: GPU specs, model specs, the fitter's inputs and the fitted profiles."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated

from pydantic import Field, PrivateAttr, model_validator

from gateway.config.base import (
    DEFAULT_GPU_CATALOG,
    FieldError,
    Fraction,
    Name,
    NonNegFloat,
    PosFloat,
    _known,
    _Strict,
    load_yaml_model,
)
from gateway.core.prefix import BLOCK_TOKENS
from gateway.core.profile import PerfProfile, profile_from
from gateway.errors import UnknownNameError, unknown_name_message


class GpuSpec(_Strict):
    """One GPU type as its vendor's spec sheet describes it."""

    description: str = Field("", description="Full product name (form factor, memory variant).")
    tflops_bf16: PosFloat = Field(description="Peak dense BF16 tensor-core throughput, TFLOP/s.")
    mem_bw_tbs: PosFloat = Field(description="Peak memory bandwidth, TB/s.")
    mem_gb: PosFloat = Field(description="Memory per GPU, GB (10^9 bytes).")
    source: str = Field(min_length=1, description="Where the numbers come from (spec sheet name, URL).")
    usd_per_hour: PosFloat | None = Field(
        None,
        description="Price of one GPU of this type for an hour, USD; a worker (one engine) costs this times "
        "its profile's tp. Indicative only: set what you pay. Unset: hexflow plan counts workers, not dollars.",
    )


class ModelSpec(_Strict):
    """A served model: what its weights and its KV cache cost."""

    params: PosFloat = Field(description="Parameter count.")
    dtype_bytes: int = Field(2, ge=1, le=4, description="Bytes per weight and per KV element (bf16: 2).")
    layers: int = Field(ge=1, description="Transformer layers.")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(ge=1, description="Dimension of one attention head.")
    source: str = Field(min_length=1, description="Where the architecture numbers come from.")

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights read by one forward pass (all of them: dense model)."""
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies: layers x kv_heads x head_dim x (K, V) x dtype bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes


class ProfileSpec(_Strict):
    """Performance constants of one engine (a model on ``tp`` GPUs of one type); see ``PerfProfile``."""

    tp: int = Field(ge=1, le=64, description="Tensor-parallel degree: GPUs per engine.")
    iter_base_s: PosFloat = Field(description="Seconds per iteration at zero batch and context.")
    token_s: PosFloat = Field(description="Seconds per batched token (prefill or decode) per iteration.")
    ctx_s: NonNegFloat = Field(description="Seconds per context token read by attention per iteration.")
    request_overhead_s: NonNegFloat = Field(description="Per-request latency off the GPU, seconds.")
    kv_capacity_tokens: int = Field(ge=1, description="KV-cache capacity of the engine, tokens.")
    max_num_seqs: int = Field(64, ge=1, le=4096, description="vLLM --max-num-seqs: running calls.")
    max_batched_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="vLLM --max-num-batched-tokens: chunked-prefill budget."
    )
    attn_s: NonNegFloat = Field(
        0.0,
        description="Seconds per prefill attention pair (query token x key token a prompt chunk computes); "
        "0: prefill linear in the prompt (fits of published GPU numbers), measured by hexflow calibrate.",
    )
    block_tokens: int = Field(
        BLOCK_TOKENS,
        ge=1,
        le=4096,
        description="The engine's KV block size, tokens (vLLM --block-size): its prefix cache reuses whole blocks "
        "only. 16 is vLLM's default on GPUs; its CPU backend uses 128. hexflow calibrate reads it from the worker.",
    )
    seq_s: NonNegFloat = Field(
        0.0,
        description="Seconds per decoding call per iteration beyond its token's compute (sampling, output "
        "processing on the engine's own core); 0 on GPU hosts (folded into token_s), measured by hexflow calibrate.",
    )
    admit_s: NonNegFloat = Field(
        0.0,
        description="Engine seconds per admitted request, stalling the iteration that takes it in (host work on "
        "the engine's own core: a CPU server); 0 on GPU hosts (all in request_overhead_s), measured by hexflow "
        "calibrate.",
    )
    basis: str = Field("", description="How the constants were obtained (fitted, derived, ...).")


class StepTokens(_Strict):
    """The token counts one published step latency was measured at."""

    input_tokens: int = Field(ge=1, le=10_000_000, description="Prompt tokens.")
    output_tokens: int = Field(ge=1, le=10_000_000, description="Generated tokens.")


class PublishedLatency(_Strict):
    """Published single-request latencies of one GPU, the calibration targets."""

    workflow_s: PosFloat = Field(
        description="Published whole STANDARD_WORKFLOW, seconds (its steps summed); reported, not fitted."
    )
    steps: dict[Name, PosFloat] = Field(
        min_length=1, description="Stage kind -> one call alone at calibration.steps' tokens, seconds (fitted)."
    )


class TpRule(_Strict):
    """Tensor-parallel degree of a model's engines: a default and per-GPU exceptions."""

    default: int = Field(ge=1, le=64, description="GPUs per engine unless listed in per_gpu.")
    per_gpu: dict[str, Annotated[int, Field(ge=1, le=64)]] = Field(
        default_factory=dict, description="GPU name -> GPUs per engine."
    )

    def for_gpu(self, gpu: str) -> int:
        """The degree for ``gpu``."""
        return self.per_gpu.get(gpu, self.default)


class CalibrationSpec(_Strict):
    """Inputs of the fitter (``gateway.profiling.fit``), which writes the ``profiles`` section."""

    model: str = Field(description="The model the published latencies were measured with.")
    source: str = Field(min_length=1, description="Where the published latencies come from.")
    steps: dict[Name, StepTokens] = Field(
        min_length=1, description="Stage kind -> the tokens its published latencies were measured at."
    )
    published: dict[str, PublishedLatency] = Field(description="GPU name -> published latencies.")
    target_error: Fraction = Field(
        0.10, description="Largest |fitted/published - 1| a fitted step should have; the report explains any above it."
    )
    min_request_overhead_s: NonNegFloat = Field(
        0.001, description="Lower bound of a fitted request_overhead_s (host-side latency, off the GPU), seconds."
    )
    max_request_overhead_s: NonNegFloat = Field(
        0.1, description="Upper bound of a fitted request_overhead_s (host-side latency, off the GPU), seconds."
    )
    reference_gpu: str = Field(description="Fitted GPU whose efficiencies (and overhead) derived profiles reuse.")
    decode_from: dict[str, str] = Field(
        default_factory=dict,
        description="GPU -> fitted GPU whose efficiencies and overhead it reuses (calibration model only).",
    )
    tp: dict[str, TpRule] = Field(description="Model name -> tensor-parallel rule.")
    gpu_memory_utilization: Fraction = Field(0.9, description="vLLM --gpu-memory-utilization.")
    max_num_seqs: int = Field(64, ge=1, le=4096, description="vLLM --max-num-seqs of every profile.")
    max_batched_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="vLLM --max-num-batched-tokens of every profile."
    )


class GpuCatalog(_Strict):
    """``config/gpus.yaml``: GPU specs, model specs, the fitter's inputs and the fitted profiles."""

    gpus: dict[Name, GpuSpec] = Field(min_length=1, description="GPU name -> spec sheet numbers.")
    models: dict[Name, ModelSpec] = Field(min_length=1, description="Model name -> architecture.")
    calibration: CalibrationSpec = Field(description="Inputs of gateway.profiling.fit.")
    profiles: dict[str, dict[str, ProfileSpec]] = Field(
        default_factory=dict, description="Model name -> GPU name -> fitted constants."
    )

    _from_file: frozenset[tuple[str, str]] = PrivateAttr(default_factory=frozenset)
    """(model, label) of the profiles an overlay (``with_profiles``) added or replaced."""

    @model_validator(mode="after")
    def _names_exist(self) -> GpuCatalog:
        cal = self.calibration
        # (field, name, the names it must be one of, what they are)
        gpus, models = (self.gpus, "GPU"), (self.models, "model")
        checks: list[tuple[str, str, Collection[str], str]] = [(f"profiles.{m}", m, *models) for m in self.profiles]
        checks += [(f"profiles.{m}.{g}", g, *gpus) for m, per_gpu in self.profiles.items() for g in per_gpu]
        checks += [("calibration.model", cal.model, *models), ("calibration.reference_gpu", cal.reference_gpu, *gpus)]
        checks += [(f"calibration.published.{g}", g, *gpus) for g in cal.published]
        checks += [(f"calibration.decode_from.{g}", g, *gpus) for g in cal.decode_from]
        checks += [(f"calibration.tp.{m}", m, *models) for m in cal.tp]
        checks += [(f"calibration.tp.{m}.per_gpu.{g}", g, *gpus) for m, r in cal.tp.items() for g in r.per_gpu]
        for field, name, known, what in checks:
            if name not in known:
                raise FieldError(field, unknown_name_message(what, name, known))
        for g, pub in cal.published.items():
            for kind in pub.steps:
                if kind not in cal.steps:
                    problem = f"unknown step {kind!r}; calibration.steps: {_known(cal.steps)}"
                    raise FieldError(f"calibration.published.{g}.steps.{kind}", problem)
        sources = {"calibration.reference_gpu": cal.reference_gpu}
        sources |= {f"calibration.decode_from.{g}": src for g, src in cal.decode_from.items()}
        for field, src in sources.items():
            if src not in cal.published:
                raise FieldError(field, f"{src!r} has no published latency; fitted: {_known(cal.published)}")
        if cal.min_request_overhead_s > cal.max_request_overhead_s:
            raise FieldError("calibration.min_request_overhead_s", "is above calibration.max_request_overhead_s")
        for m in self.models:
            if m not in cal.tp:
                raise FieldError("calibration.tp", f"no tensor-parallel rule for model {m!r}")
        return self

    def with_profiles(self, overlay: ProfilesFile) -> GpuCatalog:
        """This catalogue with ``overlay``'s profiles merged over its own (an entry of the overlay replaces
        the catalogue's of the same model and label). Overlay labels need not be GPU types of ``gpus``:
        a worker names them with ``profile`` (``hexflow calibrate --gpu LABEL`` chose the label)."""
        for m in overlay.profiles:
            if m not in self.models:
                raise FieldError(f"profiles.{m}", unknown_name_message("model", m, self.models))
        merged = {m: dict(per) for m, per in self.profiles.items()}
        for m, per in overlay.profiles.items():
            merged.setdefault(m, {}).update(per)
        out = self.model_copy(update={"profiles": merged})
        out._from_file = self._from_file | {(m, label) for m, per in overlay.profiles.items() for label in per}
        return out

    def named_profile(self, label: str, model: str) -> tuple[PerfProfile, str]:
        """The profile ``label`` of ``model`` and where it comes from (``file`` for an overlay entry, else
        ``catalogue``); its ``gpu`` is the label. ``UnknownNameError`` lists the labels known for the model."""
        if model not in self.models:
            raise UnknownNameError("model", model, list(self.models))
        spec = self.profiles.get(model, {}).get(label)
        if spec is None:
            raise UnknownNameError(f"profile of {model}", label, list(self.profiles.get(model, {})))
        return profile_from(label, model, spec), ("file" if (model, label) in self._from_file else "catalogue")

    def profile_spec(self, gpu: str, model: str) -> ProfileSpec:
        """The raw constants of ``gpu`` serving ``model``; ``UnknownNameError`` when there are none."""
        if model not in self.models:
            raise UnknownNameError("model", model, list(self.models))
        if gpu not in self.gpus:
            raise UnknownNameError("GPU", gpu, list(self.gpus))
        spec = self.profiles.get(model, {}).get(gpu)
        if spec is None:
            pairs = [f"{g}/{m}" for m, per_gpu in self.profiles.items() for g in per_gpu]
            raise UnknownNameError("profile", f"{gpu}/{model}", pairs)
        return spec

    def worker_usd_per_hour(self, gpu: str, model: str) -> float | None:
        """USD per hour of one worker (``model`` on the profile's ``tp`` GPUs of type ``gpu``); None when the GPU
        has no price. Raises ``UnknownNameError`` for an unknown name or pair."""
        spec = self.profile_spec(gpu, model)
        price = self.gpus[gpu].usd_per_hour
        return None if price is None else price * spec.tp

    def profile(self, gpu: str, model: str) -> PerfProfile:
        """The performance model of one engine of ``model`` on ``gpu`` GPUs.

        Raises ``UnknownNameError`` for an unknown GPU, an unknown model, or a pair without a profile.
        """
        return profile_from(gpu, model, self.profile_spec(gpu, model))


class ProfilesFile(_Strict):
    """A profiles overlay (gateway.yaml ``profiles_file``): ``profiles`` in ``config/gpus.yaml``'s format,
    e.g. the file ``hexflow calibrate --out`` writes. Labels are free (``hexflow calibrate --gpu LABEL``)."""

    profiles: dict[Name, dict[Name, ProfileSpec]] = Field(
        min_length=1, description="Model name -> profile label -> constants."
    )


def load_profiles_file(path: Path | str) -> ProfilesFile:
    """Load a profiles overlay (``ConfigError`` naming the file and field on a bad entry)."""
    return load_yaml_model(path, ProfilesFile)


def load_gpu_catalog(path: Path | str | None = None) -> GpuCatalog:
    """Load the GPU catalogue; default: the repository's ``config/gpus.yaml``."""
    return load_yaml_model(DEFAULT_GPU_CATALOG if path is None else path, GpuCatalog)

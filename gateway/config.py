"""Typed configuration: the GPU performance catalogue (``config/gpus.yaml``) and cluster files.

Every file is parsed once, at start, into pydantic v2 models with ``extra="forbid"``; every foreign
error (missing file, bad YAML, failed validation, unknown name) is translated at one boundary,
``load_yaml_model``, into ``ConfigError(path, field, problem)`` whose message is one line::

    config/clusters/x.yaml: workers.2.gpu: unknown GPU 'A1000'; known: A100, A40, ...

Models:
    GpuSpec, ModelSpec, ProfileSpec, CalibrationSpec, GpuCatalog   ``config/gpus.yaml``
    WorkerConfig, ClusterConfig, ResolvedWorker                   ``config/clusters/*.yaml``

Loading:
    load_yaml_model(path, cls, context=None)    any YAML file into a model, errors as ConfigError
    load_gpu_catalog(path=None)                 the catalogue (default: the repo's config/gpus.yaml)
    resolve_cluster_path(name_or_path)          ``paper-4gpu`` -> config/clusters/paper-4gpu.yaml
    load_cluster_config(path, catalog=None)     a cluster file, names checked against the catalogue
    build_workers(cluster, catalog)             the scheduler's ``WorkerInfo`` list for a cluster
    load_cluster(path, catalog=None)            both steps: file -> ``list[WorkerInfo]``

Building a model does no I/O: the catalogue is passed to cluster validation through pydantic's
validation context (``{"catalog": GpuCatalog}``), so unknown GPU or model names are reported with
the field that holds them.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.core.profile import PerfProfile, profile_from
from gateway.core.scheduler import WorkerInfo
from gateway.errors import ConfigError, UnknownNameError

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository (or install) root: the folder that holds ``gateway/`` and ``config/``."""
CONFIG_DIR = Path(os.environ.get("HEXFLOW_CONFIG_DIR") or REPO_ROOT / "config")
"""``config/`` of the checkout, or ``$HEXFLOW_CONFIG_DIR`` (set in the container image)."""
DEFAULT_GPU_CATALOG = CONFIG_DIR / "gpus.yaml"
CLUSTERS_DIR = CONFIG_DIR / "clusters"

PosFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]

M = TypeVar("M", bound=BaseModel)


class FieldError(ValueError):
    """A cross-field check failed at ``field`` (dotted path from the file's root).

    Raised inside validators; ``load_yaml_model`` reports ``field`` instead of the validator's own
    location, which for a model-level validator is the whole object.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _known(names: typing.Iterable[str]) -> str:
    return ", ".join(sorted(names))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------
# GPU catalogue


class GpuSpec(_Strict):
    """One GPU type as its vendor's spec sheet describes it."""

    description: str = Field("", description="Full product name (form factor, memory variant).")
    tflops_bf16: PosFloat = Field(description="Peak dense BF16 tensor-core throughput, TFLOP/s.")
    mem_bw_tbs: PosFloat = Field(description="Peak memory bandwidth, TB/s.")
    mem_gb: PosFloat = Field(description="Memory per GPU, GB (10^9 bytes).")
    source: str = Field(min_length=1, description="Where the numbers come from (spec sheet name, URL).")


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
    basis: str = Field("", description="How the constants were obtained (fitted, derived, ...).")


class PublishedLatency(_Strict):
    """Published single-request latencies of one GPU, the calibration targets."""

    workflow_s: PosFloat = Field(description="Whole STANDARD_WORKFLOW, seconds (sum of its calls).")
    candidate_s: PosFloat = Field(description="One generate_candidate call (11748 in, 678 out), seconds.")


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
    """Inputs of the fitter (``gateway.sim.calibrate``), which writes the ``profiles`` section."""

    model: str = Field(description="The model the published latencies were measured with.")
    source: str = Field(min_length=1, description="Where the published latencies come from.")
    published: dict[str, PublishedLatency] = Field(description="GPU name -> published latencies.")
    reference_gpu: str = Field(description="Fitted GPU whose bandwidth efficiency and overhead derived profiles reuse.")
    decode_from: dict[str, str] = Field(
        default_factory=dict,
        description="GPU -> fitted GPU whose decode constants it reuses (calibration model only).",
    )
    tp: dict[str, TpRule] = Field(description="Model name -> tensor-parallel rule.")
    prefill_mfu: Fraction = Field(0.5, description="Model-FLOPs utilisation assumed for batched tokens.")
    gpu_memory_utilization: Fraction = Field(0.9, description="vLLM --gpu-memory-utilization.")
    max_num_seqs: int = Field(64, ge=1, le=4096, description="vLLM --max-num-seqs of every profile.")
    max_batched_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="vLLM --max-num-batched-tokens of every profile."
    )


class GpuCatalog(_Strict):
    """``config/gpus.yaml``: GPU specs, model specs, the fitter's inputs and the fitted profiles."""

    gpus: dict[Name, GpuSpec] = Field(min_length=1, description="GPU name -> spec sheet numbers.")
    models: dict[Name, ModelSpec] = Field(min_length=1, description="Model name -> architecture.")
    calibration: CalibrationSpec = Field(description="Inputs of gateway.sim.calibrate.")
    profiles: dict[str, dict[str, ProfileSpec]] = Field(
        default_factory=dict, description="Model name -> GPU name -> fitted constants."
    )

    @model_validator(mode="after")
    def _names_exist(self) -> GpuCatalog:
        gpus, models = self.gpus, self.models
        cal = self.calibration

        def gpu(field: str, name: str) -> None:
            if name not in gpus:
                raise FieldError(field, f"unknown GPU {name!r}; known: {_known(gpus)}")

        def model(field: str, name: str) -> None:
            if name not in models:
                raise FieldError(field, f"unknown model {name!r}; known: {_known(models)}")

        for m, per_gpu in self.profiles.items():
            model(f"profiles.{m}", m)
            for g in per_gpu:
                gpu(f"profiles.{m}.{g}", g)
        model("calibration.model", cal.model)
        gpu("calibration.reference_gpu", cal.reference_gpu)
        if cal.reference_gpu not in cal.published:
            raise FieldError(
                "calibration.reference_gpu",
                f"{cal.reference_gpu!r} has no published latency; fitted: {_known(cal.published)}",
            )
        for g in cal.published:
            gpu(f"calibration.published.{g}", g)
        for g, src in cal.decode_from.items():
            gpu(f"calibration.decode_from.{g}", g)
            if src not in cal.published:
                raise FieldError(
                    f"calibration.decode_from.{g}",
                    f"{src!r} has no published latency; fitted: {_known(cal.published)}",
                )
        for m, rule in cal.tp.items():
            model(f"calibration.tp.{m}", m)
            for g in rule.per_gpu:
                gpu(f"calibration.tp.{m}.per_gpu.{g}", g)
        for m in models:
            if m not in cal.tp:
                raise FieldError("calibration.tp", f"no tensor-parallel rule for model {m!r}")
        return self

    def profile_names(self) -> list[str]:
        """Every ``GPU/model`` pair that has a profile."""
        return sorted(f"{g}/{m}" for m, per_gpu in self.profiles.items() for g in per_gpu)

    def profile_spec(self, gpu: str, model: str) -> ProfileSpec:
        """The raw constants of ``gpu`` serving ``model``; ``UnknownNameError`` when there are none."""
        if model not in self.models:
            raise UnknownNameError("model", model, list(self.models))
        if gpu not in self.gpus:
            raise UnknownNameError("GPU", gpu, list(self.gpus))
        spec = self.profiles.get(model, {}).get(gpu)
        if spec is None:
            raise UnknownNameError("profile", f"{gpu}/{model}", self.profile_names())
        return spec

    def profile(self, gpu: str, model: str) -> PerfProfile:
        """The performance model of one engine of ``model`` on ``gpu`` GPUs.

        Raises ``UnknownNameError`` for an unknown GPU, an unknown model, or a pair without a profile.
        """
        return profile_from(gpu, model, self.profile_spec(gpu, model))


# --------------------------------------------------------------------------------------------------
# Cluster files


def _catalog_from(info: ValidationInfo) -> GpuCatalog | None:
    ctx = info.context
    if isinstance(ctx, Mapping):
        cat = ctx.get("catalog")
        if isinstance(cat, GpuCatalog):
            return cat
    return None


class WorkerConfig(_Strict):
    """One entry of a cluster's ``workers`` list: ``count`` identical vLLM engines."""

    name: Name | None = Field(
        None,
        description="Worker name; default '<gpu>-<index>' (index in the expanded list). "
        "With count > 1 a given name becomes '<name>-<k>'.",
    )
    gpu: str = Field(min_length=1, description="GPU type, a key of gpus.yaml's 'gpus'.")
    model: str | None = Field(None, min_length=1, description="Served model; default: the cluster's.")
    capacity: int = Field(8, ge=1, le=1024, description="Gateway in-flight limit for this worker.")
    count: int = Field(1, ge=1, le=1024, description="Number of identical workers this entry stands for.")
    url: str | None = Field(
        None, pattern=r"^https?://\S+$", description="Base URL of the worker's OpenAI-compatible server."
    )
    served_model: str | None = Field(
        None,
        min_length=1,
        description="Model name the worker serves (the 'model' field of requests sent to it); "
        "default: the profile's model name.",
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str, info: ValidationInfo) -> str:
        cat = _catalog_from(info)
        if cat is not None and v not in cat.gpus:
            raise ValueError(f"unknown GPU {v!r}; known: {_known(cat.gpus)}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | None, info: ValidationInfo) -> str | None:
        cat = _catalog_from(info)
        if v is not None and cat is not None and v not in cat.models:
            raise ValueError(f"unknown model {v!r}; known: {_known(cat.models)}")
        return v

    @model_validator(mode="after")
    def _one_url_one_worker(self) -> WorkerConfig:
        if self.url is not None and self.count > 1:
            raise ValueError("a url names one worker; give each worker its own entry instead of count")
        return self


@dataclass(frozen=True, slots=True)
class ResolvedWorker:
    """One worker after expansion: defaults filled in, ``count`` unrolled."""

    name: str
    gpu: str
    model: str
    capacity: int
    url: str | None
    served_model: str | None = None


class ClusterConfig(_Strict):
    """A cluster file: a named list of workers, each a vLLM engine on some GPU type."""

    name: Name = Field(description="Cluster name (used in reports).")
    description: str = Field("", description="Free text: where the setting comes from.")
    model: str = Field(
        "llama-3.1-70b",
        min_length=1,
        validate_default=True,
        description="Model served unless a worker overrides.",
    )
    workers: list[WorkerConfig] = Field(min_length=1, description="The workers, in scheduler order.")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str, info: ValidationInfo) -> str:
        cat = _catalog_from(info)
        if cat is not None and v not in cat.models:
            raise ValueError(f"unknown model {v!r}; known: {_known(cat.models)}")
        return v

    @model_validator(mode="after")
    def _check_workers(self, info: ValidationInfo) -> ClusterConfig:
        cat = _catalog_from(info)
        if cat is not None:
            for i, w in enumerate(self.workers):
                model = w.model or self.model
                profiled = cat.profiles.get(model, {})
                if w.gpu in cat.gpus and model in cat.models and w.gpu not in profiled:
                    raise FieldError(
                        f"workers.{i}.gpu",
                        f"no profile for {model} on {w.gpu}; profiled GPUs: {_known(profiled)}",
                    )
        seen: dict[str, int] = {}
        for i, (entry, rw) in enumerate(self._expand()):
            if rw.name in seen:
                raise FieldError(
                    f"workers.{entry}.name",
                    f"duplicate worker name {rw.name!r} (also worker {seen[rw.name]} after expansion)",
                )
            seen[rw.name] = i
        return self

    def _expand(self) -> list[tuple[int, ResolvedWorker]]:
        out: list[tuple[int, ResolvedWorker]] = []
        for entry, w in enumerate(self.workers):
            for k in range(w.count):
                index = len(out)
                base = f"{w.gpu}-{index}" if w.name is None else w.name
                name = base if w.name is None or w.count == 1 else f"{base}-{k}"
                rw = ResolvedWorker(name, w.gpu, w.model or self.model, w.capacity, w.url, w.served_model)
                out.append((entry, rw))
        return out

    def expanded(self) -> list[ResolvedWorker]:
        """The workers with ``count`` unrolled, names and models filled in, in file order.

        Default names are ``<gpu>-<index>`` with the index of the worker in this list, so they are
        unique and match the scheduler's worker indices (``A100-0, A100-1, A6000-2, L40S-3``).
        """
        return [rw for _, rw in self._expand()]


# --------------------------------------------------------------------------------------------------
# Loading


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated[...]`` and ``X | None`` down to the bare type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
            continue
        return tp


def _allowed_keys(model_cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys allowed in the mapping at ``loc`` (walking model fields, lists and dicts), if known."""
    tp: Any = model_cls
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif origin is list:
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return None


def _describe(err: Mapping[str, Any], model_cls: type[BaseModel]) -> tuple[str, str]:
    """``(field, problem)`` for one pydantic error dict."""
    loc: tuple[int | str, ...] = tuple(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    exc = ctx.get("error") if isinstance(ctx, Mapping) else None
    if isinstance(exc, FieldError):
        return exc.field, exc.problem
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model_cls, loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return _dotted(loc), f"unknown key{hint}"
    if kind == "missing":
        return _dotted(loc), "required key is missing"
    if isinstance(exc, ValueError):
        return _dotted(loc), str(exc)
    problem = str(err.get("msg", "invalid value"))
    if "input" in err and kind not in ("model_type", "dict_type", "list_type"):
        problem = f"{problem} (got {err['input']!r})"
    return _dotted(loc), problem


def load_yaml_model(path: Path | str, model_cls: type[M], *, context: Mapping[str, Any] | None = None) -> M:
    """Read a YAML file into ``model_cls``; every failure is a one-line ``ConfigError``.

    The error names the file as given, the dotted field path (``workers.2.gpu``; empty for the whole
    file) and what was expected. When validation finds several problems the first is reported and the
    count of the rest is appended. ``context`` is passed to pydantic validators (cluster files receive
    ``{"catalog": GpuCatalog}``).
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(where, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, "", f"cannot read the file: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "syntax error"
        field = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(where, field, f"invalid YAML: {problem}") from exc
    if data is None:
        raise ConfigError(where, "", "the file is empty; expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(where, "", f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model_cls.model_validate(data, context=dict(context) if context is not None else None)
    except ValidationError as exc:
        errors = exc.errors()
        field, problem = _describe(errors[0], model_cls)
        if len(errors) > 1:
            problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        raise ConfigError(where, field, problem) from None


def load_gpu_catalog(path: Path | str | None = None) -> GpuCatalog:
    """Load the GPU catalogue; default: the repository's ``config/gpus.yaml``."""
    return load_yaml_model(DEFAULT_GPU_CATALOG if path is None else path, GpuCatalog)


def known_clusters() -> list[str]:
    """Names of the cluster files in ``config/clusters``."""
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))


def resolve_cluster_path(name_or_path: str | Path) -> Path:
    """A cluster file path: a ``Path`` or anything path-like is kept, a bare name is looked up.

    ``"paper-4gpu"`` -> ``config/clusters/paper-4gpu.yaml``; ``"my/x.yaml"`` is a path. A bare name
    without a file raises ``UnknownNameError`` listing the known clusters; a path is not checked here
    (loading reports a missing file as ``ConfigError``).
    """
    if isinstance(name_or_path, Path):
        return name_or_path
    s = name_or_path
    if "/" in s or "\\" in s or s.endswith((".yaml", ".yml")):
        return Path(s)
    p = CLUSTERS_DIR / f"{s}.yaml"
    if not p.is_file():
        raise UnknownNameError("cluster", s, known_clusters())
    return p


def load_cluster_config(path: Path | str, catalog: GpuCatalog | None = None) -> ClusterConfig:
    """Load a cluster file (a path or a bare name), checking GPU and model names against ``catalog``.

    ``catalog`` defaults to ``load_gpu_catalog()``.
    """
    cat = load_gpu_catalog() if catalog is None else catalog
    return load_yaml_model(resolve_cluster_path(path), ClusterConfig, context={"catalog": cat})


def build_workers(cluster: ClusterConfig, catalog: GpuCatalog) -> list[WorkerInfo]:
    """The scheduler's view of a cluster: one ``WorkerInfo`` per expanded worker, in file order.

    Raises ``UnknownNameError`` for a GPU/model pair without a profile (``load_cluster_config``
    already reports those as ``ConfigError``).
    """
    return [
        WorkerInfo(name=w.name, profile=catalog.profile(w.gpu, w.model), capacity=w.capacity)
        for w in cluster.expanded()
    ]


def load_cluster(path: Path | str, catalog: GpuCatalog | None = None) -> list[WorkerInfo]:
    """Load a cluster file (a path or a bare name) into the scheduler's workers.

    Use ``load_cluster_config`` + ``build_workers`` when the ``ClusterConfig`` (name, urls) is needed
    as well; ``ClusterConfig.expanded()[i]`` describes ``WorkerInfo`` ``i``.
    """
    cat = load_gpu_catalog() if catalog is None else catalog
    return build_workers(load_cluster_config(path, cat), cat)

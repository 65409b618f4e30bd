"""Cluster files (``config/clusters/*.yaml``) and the scheduler's workers built from them.

``make_worker`` is the one place a ``WorkerInfo`` (``gateway.core.worker``) is built, for the workers of
a cluster file (``build_workers``, the gateway's ``LoadedConfig``) and for the pods discovery finds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from gateway.config.base import CLUSTERS_DIR, FieldError, Name, _known, _Strict, load_yaml_model
from gateway.config.gpus import GpuCatalog, load_gpu_catalog
from gateway.core.profile import time_scaled
from gateway.core.transfer import BETWEEN_NODES, LINK_PRESETS, SAME_NODE, Interconnect, Link
from gateway.core.worker import Role, WorkerInfo
from gateway.errors import UnknownNameError, unknown_name_message


def _catalog_from(info: ValidationInfo) -> GpuCatalog | None:
    ctx = info.context
    if isinstance(ctx, Mapping):
        cat = ctx.get("catalog")
        if isinstance(cat, GpuCatalog):
            return cat
    return None


def _in_catalog(what: str) -> AfterValidator:
    """A name the validation context's catalogue (if any) must know as a ``what`` ("GPU" or "model")."""

    def check(v: str, info: ValidationInfo) -> str:
        cat = _catalog_from(info)
        known = None if cat is None else cat.gpus if what == "GPU" else cat.models
        if known is not None and v not in known:
            raise ValueError(unknown_name_message(what, v, known))
        return v

    return AfterValidator(check)


KnownModel = Annotated[str, _in_catalog("model")]
GpuName = Annotated[str, Field(min_length=1), _in_catalog("GPU")]
ModelName = Annotated[str, Field(min_length=1), _in_catalog("model")]


class WorkerConfig(_Strict):
    """One entry of a cluster's ``workers`` list: ``count`` identical vLLM engines."""

    name: Name | None = Field(
        None,
        description="Worker name; default '<gpu>-<index>' (index in the expanded list). "
        "With count > 1 a given name becomes '<name>-<k>'.",
    )
    gpu: GpuName = Field(description="GPU type, a key of gpus.yaml's 'gpus'.")
    model: ModelName | None = Field(None, description="Served model; default: the cluster's.")
    capacity: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Gateway in-flight limit for this worker; default: derived from its profile (the batch "
        "its KV cache and max_num_seqs allow, lowered where a larger batch would slow decode steps over 2x).",
    )
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
    profile: Name | None = Field(
        None,
        description="Performance profile to schedule with: a label of the worker's model in the catalogue or "
        "in gateway.yaml's profiles_file (e.g. what 'hexflow calibrate --gpu LABEL --out FILE' wrote); "
        "default: the catalogue's profile of 'gpu'.",
    )

    role: Literal["colocated", "prefill", "decode"] = Field(
        "colocated",
        description="Under prefill/decode disaggregation: 'prefill' runs split calls' prompts, 'decode' their "
        "decodes once the KV blocks arrived, 'colocated' whole calls (docs/architecture.md, 'Prefill/decode "
        "disaggregation').",
    )
    node: Name | None = Field(
        None,
        description="The machine the worker runs on: workers of one node share links.same_node (default: a "
        "node of its own).",
    )

    @model_validator(mode="after")
    def _one_url_one_worker(self) -> WorkerConfig:
        if self.url is not None and self.count > 1:
            raise ValueError("a url names one worker; give each worker its own entry instead of count")
        return self


@dataclass(frozen=True, slots=True)
class ResolvedWorker:
    """One entry of a cluster file after expansion: defaults filled in, ``count`` unrolled.

    Names only (GPU type, model), checked against a catalogue but not looked up in it: what tools that
    start workers need (``workers/cluster.py``, the live bench). ``build_workers`` turns each into the
    ``WorkerInfo`` that the scheduler and the pool use.
    """

    name: str
    gpu: str
    model: str
    capacity: int | None
    url: str | None
    served_model: str | None = None
    profile: str | None = None
    role: Role = "colocated"
    node: str | None = None


class LinkConfig(_Strict):
    """A link's payload bandwidth and per-transfer latency."""

    gbps: float = Field(gt=0, le=1e6, description="Payload bandwidth, gigabits per second.")
    latency_ms: float = Field(0.0, ge=0, le=60_000, description="Per-transfer latency (setup, first byte), ms.")

    def link(self) -> Link:
        """The core ``Link``."""
        return Link(self.gbps, self.latency_ms / 1000.0)


LinkPreset = Literal["nvlink", "pcie4", "pcie5", "network-100g", "network-200g", "network-400g"]


def _link(v: LinkPreset | LinkConfig) -> Link:
    return LINK_PRESETS[v] if isinstance(v, str) else v.link()


class LinkPair(_Strict):
    """The link between two named workers, either direction."""

    workers: tuple[Name, Name] = Field(description="The two workers' names (after expansion).")
    link: LinkPreset | LinkConfig = Field(description="A preset name or {gbps, latency_ms}.")


class LinksConfig(_Strict):
    """How KV blocks move between workers (prefill/decode disaggregation)."""

    same_node: LinkPreset | LinkConfig = Field(SAME_NODE, description="Between two workers of one node.")
    between_nodes: LinkPreset | LinkConfig = Field(BETWEEN_NODES, description="Between workers of different nodes.")
    pairs: list[LinkPair] = Field(default_factory=list, description="Links pinned per pair of workers.")


class ClusterConfig(_Strict):
    """A cluster file: a named list of workers, each a vLLM engine on some GPU type."""

    name: Name = Field(description="Cluster name (used in reports).")
    description: str = Field("", description="Free text: where the setting comes from.")
    model: ModelName = Field(
        "llama-3.1-70b",
        validate_default=True,
        description="Model served unless a worker overrides.",
    )
    workers: list[WorkerConfig] = Field(min_length=1, description="The workers, in scheduler order.")
    links: LinksConfig = Field(
        default_factory=LinksConfig,
        description="The links split calls' KV blocks cross (presets: nvlink, pcie4, pcie5, network-100g, "
        "network-200g, network-400g).",
    )

    @model_validator(mode="after")
    def _check_workers(self, info: ValidationInfo) -> ClusterConfig:
        cat = _catalog_from(info)
        if cat is not None:
            for i, w in enumerate(self.workers):
                model = w.model or self.model
                profiled = cat.profiles.get(model, {})
                if w.profile is not None:
                    if model in cat.models and w.profile not in profiled:
                        raise FieldError(
                            f"workers.{i}.profile",
                            f"unknown profile {w.profile!r} for {model}; known: {_known(profiled)}",
                        )
                elif w.gpu in cat.gpus and model in cat.models and w.gpu not in profiled:
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
        for k, pair in enumerate(self.links.pairs):
            for name in pair.workers:
                if name not in seen:
                    raise FieldError(f"links.pairs.{k}.workers", unknown_name_message("worker", name, list(seen)))
            if pair.workers[0] == pair.workers[1]:
                raise FieldError(f"links.pairs.{k}.workers", "a link joins two different workers")
        return self

    def interconnect(self) -> Interconnect:
        """The links between the expanded workers (``gateway.core.transfer.Interconnect``)."""
        nodes = {rw.name: rw.node for rw in self.expanded() if rw.node is not None}
        links = self.links
        pairs = {frozenset(p.workers): _link(p.link) for p in links.pairs}
        return Interconnect(nodes, _link(links.same_node), _link(links.between_nodes), pairs)

    def _expand(self) -> list[tuple[int, ResolvedWorker]]:
        out: list[tuple[int, ResolvedWorker]] = []
        for entry, w in enumerate(self.workers):
            for k in range(w.count):
                index = len(out)
                base = f"{w.gpu}-{index}" if w.name is None else w.name
                name = base if w.name is None or w.count == 1 else f"{base}-{k}"
                model = w.model or self.model
                rw = ResolvedWorker(name, w.gpu, model, w.capacity, w.url, w.served_model, w.profile, w.role, w.node)
                out.append((entry, rw))
        return out

    def expanded(self) -> list[ResolvedWorker]:
        """The workers with ``count`` unrolled, names and models filled in, in file order.

        Default names are ``<gpu>-<index>`` with the index of the worker in this list, so they are
        unique and match the scheduler's worker indices (``A100-0, A100-1, A6000-2, L40S-3``).
        """
        return [rw for _, rw in self._expand()]


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


def make_worker(
    catalog: GpuCatalog,
    *,
    name: str,
    gpu: str,
    model: str,
    capacity: int | None,
    url: str | None = None,
    served_model: str | None = None,
    time_scale: float = 1.0,
    profile: str | None = None,
) -> WorkerInfo:
    """The ``WorkerInfo`` of a worker: its profile (``profile``: a label of ``model``; default the GPU's) looked
    up in ``catalog`` and scaled by ``time_scale``; ``capacity`` None: derived from the profile. Raises
    ``UnknownNameError`` for a pair without a profile or an unknown label."""
    return entry_worker(catalog, ResolvedWorker(name, gpu, model, capacity, url, served_model, profile), time_scale)


def entry_worker(catalog: GpuCatalog, w: ResolvedWorker, time_scale: float = 1.0) -> WorkerInfo:
    """``make_worker`` of ``w`` (a cluster file's worker or a discovered pod's ``PodWorker``)."""
    if w.profile is None:
        perf, source = catalog.profile(w.gpu, w.model), "catalogue"
    else:
        perf, source = catalog.named_profile(w.profile, w.model)
    return WorkerInfo(
        name=w.name,
        profile=time_scaled(perf, time_scale),
        capacity=perf.derived_capacity() if w.capacity is None else w.capacity,
        url=w.url or "",
        served_model=w.served_model or w.model,
        profile_source=source,
        role=w.role,
        node=w.node or "",
        kv_bytes_per_token=catalog.models[w.model].kv_bytes_per_token,
    )


def build_workers(cluster: ClusterConfig, catalog: GpuCatalog, *, time_scale: float = 1.0) -> list[WorkerInfo]:
    """The scheduler's view of a cluster: one ``WorkerInfo`` per expanded worker, in file order, profiles scaled
    by ``time_scale``. Raises ``UnknownNameError`` for a GPU/model pair without a profile."""
    return [entry_worker(catalog, w, time_scale) for w in cluster.expanded()]


def load_cluster(path: Path | str, catalog: GpuCatalog | None = None) -> list[WorkerInfo]:
    """Load a cluster file (a path or a bare name) into the scheduler's workers (``load_cluster_config`` +
    ``build_workers`` when the ``ClusterConfig`` is needed too)."""
    cat = load_gpu_catalog() if catalog is None else catalog
    return build_workers(load_cluster_config(path, cat), cat)

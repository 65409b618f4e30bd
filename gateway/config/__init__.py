"""Typed configuration: every YAML file the project reads, as pydantic v2 models, and the one loader.

Modules: ``base`` (``load_yaml_model``, ``FieldError``, shared types), ``gpus``, ``cluster``, ``gateway``,
``tenants``, ``databases``, ``workflows``, ``quality``. Every file is parsed once into models with
``extra="forbid"``; every failure becomes a one-line ``ConfigError(path, field, problem)`` at
``load_yaml_model``. Models do no I/O: the GPU catalogue reaches cluster validation through pydantic's
validation context."""

from gateway.config.base import (
    CLUSTERS_DIR,
    CONFIG_DIR,
    DEFAULT_GPU_CATALOG,
    REPO_ROOT,
    FieldError,
    Fraction,
    Name,
    NonNegFloat,
    PosFloat,
    _Strict,
    load_yaml_model,
)
from gateway.config.cluster import (
    ClusterConfig,
    ResolvedWorker,
    WorkerConfig,
    build_workers,
    known_clusters,
    load_cluster,
    load_cluster_config,
    make_worker,
    resolve_cluster_path,
)
from gateway.config.gpus import (
    CalibrationSpec,
    GpuCatalog,
    GpuSpec,
    ModelSpec,
    ProfileSpec,
    PublishedLatency,
    TpRule,
    load_gpu_catalog,
)

__all__ = [
    "CLUSTERS_DIR",
    "CONFIG_DIR",
    "DEFAULT_GPU_CATALOG",
    "REPO_ROOT",
    "CalibrationSpec",
    "ClusterConfig",
    "FieldError",
    "Fraction",
    "GpuCatalog",
    "GpuSpec",
    "ModelSpec",
    "Name",
    "NonNegFloat",
    "PosFloat",
    "ProfileSpec",
    "PublishedLatency",
    "ResolvedWorker",
    "TpRule",
    "WorkerConfig",
    "_Strict",
    "build_workers",
    "known_clusters",
    "load_cluster",
    "load_cluster_config",
    "load_gpu_catalog",
    "load_yaml_model",
    "make_worker",
    "resolve_cluster_path",
]

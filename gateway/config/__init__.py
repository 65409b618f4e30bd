"""Typed configuration: every YAML file the project reads, as pydantic v2 models, and the one loader.

Every file is parsed once into models with ``extra="forbid"``; every failure becomes a one-line
``ConfigError(path, field, problem)`` at ``load_yaml_model`` (``base``). Models do no I/O: the GPU catalogue
reaches cluster validation through pydantic's validation context."""

from gateway.config.base import CLUSTERS_DIR, CONFIG_DIR, DEFAULT_GPU_CATALOG, REPO_ROOT, load_yaml_model
from gateway.config.cluster import (
    ClusterConfig,
    build_workers,
    known_clusters,
    load_cluster,
    load_cluster_config,
    make_worker,
    resolve_cluster_path,
)
from gateway.config.gpus import GpuCatalog, GpuSpec, ModelSpec, load_gpu_catalog

__all__ = [
    "CLUSTERS_DIR",
    "CONFIG_DIR",
    "DEFAULT_GPU_CATALOG",
    "REPO_ROOT",
    "ClusterConfig",
    "GpuCatalog",
    "GpuSpec",
    "ModelSpec",
    "build_workers",
    "known_clusters",
    "load_cluster",
    "load_cluster_config",
    "load_gpu_catalog",
    "load_yaml_model",
    "make_worker",
    "resolve_cluster_path",
]

"""Typed configuration: every YAML file the project reads, as pydantic v2 models, and the one loader.

Modules:
    base        the loader (``load_yaml_model``), ``FieldError``, the config folder, shared field types
    gpus        ``config/gpus.yaml``: the GPU performance catalogue
    cluster     ``config/clusters/*.yaml``
    gateway     ``config/gateway.yaml`` (``hexflow serve``)
    tenants     ``config/tenants.yaml``
    databases   the Text-to-SQL databases file

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
    make_worker(catalog, name=, gpu=, ...)      one ``WorkerInfo`` (the one place it is built)
    load_cluster(path, catalog=None)            both steps: file -> ``list[WorkerInfo]``

Building a model does no I/O: the catalogue is passed to cluster validation through pydantic's
validation context (``{"catalog": GpuCatalog}``), so unknown GPU or model names are reported with
the field that holds them.
"""

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

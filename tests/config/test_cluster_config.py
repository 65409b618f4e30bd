"""Cluster files: loading into the scheduler's workers, expansion, and one-line config errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import (
    CLUSTERS_DIR,
    ClusterConfig,
    GpuCatalog,
    build_workers,
    known_clusters,
    load_cluster,
    load_cluster_config,
    load_gpu_catalog,
    load_yaml_model,
    resolve_cluster_path,
)
from gateway.core.transfer import LINK_PRESETS, Link
from gateway.errors import ConfigError, UnknownNameError

CLUSTER_FILES = sorted(CLUSTERS_DIR.glob("*.yaml"))


@pytest.fixture(scope="module")
def catalog() -> GpuCatalog:
    return load_gpu_catalog()


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_repo_ships_the_expected_cluster_files() -> None:
    assert {"paper-4gpu", "paper-alt", "mixed-12", "mixed-16", "mixed-64", "small-8b"} <= set(known_clusters())


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_every_cluster_file_loads(catalog: GpuCatalog, path: Path) -> None:
    cfg = load_cluster_config(path, catalog)
    workers = build_workers(cfg, catalog)
    assert cfg.name == path.stem
    assert len(workers) == len(cfg.expanded()) >= 1
    assert len({w.name for w in workers}) == len(workers)


@pytest.mark.parametrize(
    ("cluster", "gpus", "model"),
    [
        ("paper-4gpu", ["A100", "A100", "A6000", "L40S"], "llama-3.1-70b"),
        ("paper-alt", ["A100", "A6000", "A100", "A6000"], "llama-3.1-70b"),
        ("small-8b", ["H100", "A100", "L40S", "L4"], "llama-3.1-8b"),
    ],
)
def test_named_cluster_has_the_documented_workers(
    catalog: GpuCatalog, cluster: str, gpus: list[str], model: str
) -> None:
    workers = load_cluster(cluster, catalog)
    assert [w.profile.gpu for w in workers] == gpus
    assert {w.profile.model for w in workers} == {model}


def test_mixed_12_spans_h100_to_l4(catalog: GpuCatalog) -> None:
    workers = load_cluster("mixed-12", catalog)
    assert len(workers) == 12
    assert workers[0].profile.gpu == "H100" and workers[-1].profile.gpu == "L4"


MIXED_16 = {"H200": 1, "H100": 3, "A100": 4, "A800": 2, "L40S": 2, "A6000": 2, "A40": 1, "L4": 1}


@pytest.mark.parametrize(("cluster", "scale"), [("mixed-16", 1), ("mixed-64", 4)])
def test_mixed_scale_clusters_hold_the_enterprise_mix_in_the_same_proportions(
    catalog: GpuCatalog, cluster: str, scale: int
) -> None:
    workers = load_cluster(cluster, catalog)
    counts: dict[str, int] = {}
    for w in workers:
        counts[w.profile.gpu] = counts.get(w.profile.gpu, 0) + 1
    assert counts == {gpu: n * scale for gpu, n in MIXED_16.items()}
    assert len(workers) == 16 * scale
    assert {w.profile.model for w in workers} == {"llama-3.1-70b"}
    # Fastest first, as in mixed-12: an H200 engine leads, an L4 engine closes.
    assert workers[0].profile.gpu == "H200" and workers[-1].profile.gpu == "L4"


def test_default_names_use_the_expanded_index_and_defaults_fill_in(catalog: GpuCatalog) -> None:
    workers = load_cluster("paper-4gpu", catalog)
    assert [w.name for w in workers] == ["A100-0", "A100-1", "A6000-2", "L40S-3"]
    assert all(w.capacity == w.profile.derived_capacity() for w in workers)
    assert workers[0].profile == catalog.profile("A100", "llama-3.1-70b")


def test_an_explicit_capacity_overrides_the_derived_one(tmp_path: Path, catalog: GpuCatalog) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nworkers:\n  - {gpu: A100, capacity: 3}\n  - {gpu: A100}\n")
    workers = load_cluster(path, catalog)
    assert [w.capacity for w in workers] == [3, catalog.profile("A100", "llama-3.1-70b").derived_capacity()]


def test_count_expands_named_entries_and_workers_may_override_the_model(tmp_path: Path, catalog: GpuCatalog) -> None:
    path = write(
        tmp_path,
        "name: t\nworkers:\n"
        "  - {gpu: H100, name: fast, count: 2, capacity: 16}\n"
        "  - {gpu: L4, model: llama-3.1-8b, url: 'http://10.0.0.7:8000'}\n",
    )
    cfg = load_cluster_config(path, catalog)
    rows = [(w.name, w.gpu, w.model, w.capacity, w.url) for w in cfg.expanded()]
    assert rows == [
        ("fast-0", "H100", "llama-3.1-70b", 16, None),
        ("fast-1", "H100", "llama-3.1-70b", 16, None),
        ("L4-2", "L4", "llama-3.1-8b", None, "http://10.0.0.7:8000"),  # None: derived
    ]
    assert [w.profile.model for w in build_workers(cfg, catalog)] == [
        "llama-3.1-70b",
        "llama-3.1-70b",
        "llama-3.1-8b",
    ]


def test_roles_nodes_and_links_come_from_the_cluster_file(tmp_path: Path, catalog: GpuCatalog) -> None:
    path = write(
        tmp_path,
        "name: pd\nworkers:\n"
        "  - {gpu: H100, name: p, count: 2, role: prefill, node: n1}\n"
        "  - {gpu: A100, name: d, role: decode, node: n1}\n"
        "  - {gpu: L40S, name: c}\n"
        "links:\n  between_nodes: {gbps: 50, latency_ms: 3}\n"
        "  pairs:\n    - {workers: [p-1, c], link: pcie4}\n",
    )
    cfg = load_cluster_config(path, catalog)
    workers = build_workers(cfg, catalog)
    assert [(w.name, w.role, w.node) for w in workers] == [
        ("p-0", "prefill", "n1"),
        ("p-1", "prefill", "n1"),
        ("d", "decode", "n1"),
        ("c", "colocated", ""),
    ]
    assert {w.kv_bytes_per_token for w in workers} == {catalog.models["llama-3.1-70b"].kv_bytes_per_token}
    assert catalog.models["llama-3.1-70b"].kv_bytes_per_token == 80 * 8 * 128 * 2 * 2
    net = cfg.interconnect()
    assert net.link("p-0", "d") == LINK_PRESETS["nvlink"], "one node: the default same-node link"
    assert net.link("p-0", "c") == Link(50.0, 0.003), "different nodes: the file's between-nodes link"
    assert net.link("c", "p-1") == LINK_PRESETS["pcie4"], "a pinned pair, either direction"
    assert net.link("c", "c") is None


@pytest.mark.parametrize(
    ("links", "field", "problem"),
    [
        ("  pairs:\n    - {workers: [w, nope], link: nvlink}\n", "links.pairs.0.workers", "unknown worker 'nope'"),
        ("  pairs:\n    - {workers: [w, w], link: nvlink}\n", "links.pairs.0.workers", "two different workers"),
        ("  same_node: {gbps: 0}\n", "links.same_node", ""),
        ("  same_node: infiniband\n", "links.same_node", ""),
    ],
)
def test_a_bad_link_is_a_config_error_naming_the_field(
    tmp_path: Path, catalog: GpuCatalog, links: str, field: str, problem: str
) -> None:
    path = write(tmp_path, "name: x\nworkers:\n  - {gpu: A100, name: w}\n  - {gpu: A100, name: v}\nlinks:\n" + links)
    with pytest.raises(ConfigError) as info:
        load_cluster(path, catalog)
    assert info.value.field.startswith(field) and problem in info.value.problem


def test_a_bad_role_is_a_config_error(tmp_path: Path, catalog: GpuCatalog) -> None:
    path = write(tmp_path, "name: x\nworkers:\n  - {gpu: A100, role: both}\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path, catalog)
    assert info.value.field == "workers.0.role"


def test_resolve_cluster_path_maps_a_bare_name_into_config_clusters() -> None:
    assert resolve_cluster_path("paper-4gpu") == CLUSTERS_DIR / "paper-4gpu.yaml"
    assert resolve_cluster_path("elsewhere/x.yaml") == Path("elsewhere/x.yaml")
    assert resolve_cluster_path(Path("x")) == Path("x")


def test_resolve_cluster_path_of_an_unknown_bare_name_lists_known_clusters() -> None:
    with pytest.raises(UnknownNameError, match="paper-4gpu"):
        resolve_cluster_path("no-such-cluster")


GOOD_WORKER = "  - gpu: A100\n"


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        pytest.param(
            "name: x\nworkers:\n" + GOOD_WORKER * 2 + "  - gpu: A1000\n",
            "workers.2.gpu",
            "unknown GPU 'A1000'; known: A100, ",
            id="unknown-gpu",
        ),
        pytest.param(
            "name: x\nworkers:\n  - gpu: A100\n    capacity: -3\n",
            "workers.0.capacity",
            "greater than or equal to 1",
            id="negative-capacity",
        ),
        pytest.param(
            "name: x\nworkers:\n  - gpu: A100\n    colour: red\n",
            "workers.0.colour",
            "unknown key; allowed: name, gpu, model, capacity, count, url",
            id="extra-key",
        ),
        pytest.param(
            "name: x\nworkers:\n  - gpu: A100\n   bad: [\n",
            "line 4, column 4",
            "invalid YAML",
            id="malformed-yaml",
        ),
        pytest.param(
            "name: x\nmodel: gpt-5\nworkers:\n" + GOOD_WORKER,
            "model",
            "unknown model 'gpt-5'",
            id="unknown-model",
        ),
        pytest.param(
            "name: x\nworkers:\n" + GOOD_WORKER + "  - gpu: L4\n    model: llama-2\n",
            "workers.1.model",
            "unknown model 'llama-2'",
            id="unknown-worker-model",
        ),
        pytest.param(
            "name: x\nworkers:\n  - {gpu: A100, name: w}\n  - {gpu: L4, name: w}\n",
            "workers.1.name",
            "duplicate worker name 'w'",
            id="duplicate-name",
        ),
        pytest.param(
            "name: x\nworkers:\n  - {gpu: A100, count: 2, url: 'http://a:8000'}\n",
            "workers.0",
            "a url names one worker",
            id="url-with-count",
        ),
        pytest.param("name: x\nworkers: []\n", "workers", "at least 1 item", id="no-workers"),
        pytest.param("workers:\n" + GOOD_WORKER, "name", "required key is missing", id="missing-name"),
        pytest.param("- gpu: A100\n", "", "expected a mapping", id="not-a-mapping"),
        pytest.param("", "", "the file is empty", id="empty-file"),
    ],
)
def test_invalid_cluster_file_raises_config_error_naming_file_and_field(
    tmp_path: Path, catalog: GpuCatalog, text: str, field: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster(path, catalog)
    err = info.value
    assert (err.path, err.field) == (str(path), field)
    assert problem in err.problem
    assert str(err).startswith(f"{path}: {field + ': ' if field else ''}")
    assert "\n" not in str(err)


def test_missing_cluster_file_raises_config_error_naming_the_file(tmp_path: Path, catalog: GpuCatalog) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent\.yaml: file not found$"):
        load_cluster(path, catalog)


def test_gpu_pair_without_profile_is_reported_on_the_worker_gpu(tmp_path: Path, catalog: GpuCatalog) -> None:
    data = catalog.model_dump()
    del data["profiles"]["llama-3.1-8b"]["L4"]
    partial = GpuCatalog.model_validate(data)
    path = write(tmp_path, "name: x\nmodel: llama-3.1-8b\nworkers:\n  - gpu: H100\n  - gpu: L4\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path, partial)
    assert info.value.field == "workers.1.gpu"
    assert "no profile for llama-3.1-8b on L4" in info.value.problem


def test_several_problems_report_the_first_and_count_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nworkers:\n  - {gpu: A100, capacity: 0, count: 0}\n")
    with pytest.raises(ConfigError, match=r"\(and 1 more problem\)$"):
        load_yaml_model(path, ClusterConfig)


def test_cluster_model_validates_without_a_catalog() -> None:
    cfg = ClusterConfig.model_validate({"name": "x", "workers": [{"gpu": "Z9"}]})
    assert cfg.expanded()[0].name == "Z9-0"


# ------------------------------------------------------------------------------------------------ named profiles

OVERLAY = """\
# Measured by hexflow calibrate (comments above the section are kept by YAML as comments)
profiles:
  llama-3.1-70b:
    node7:
      tp: 4
      iter_base_s: 0.04
      token_s: 0.0003
      ctx_s: 1.0e-07
      request_overhead_s: 0.02
      kv_capacity_tokens: 90000
      max_num_seqs: 64
      max_batched_tokens: 2048
"""


def gateway_yaml(tmp_path: Path, worker: str, profiles_file: str | None = "profiles.yaml") -> Path:
    (tmp_path / "profiles.yaml").write_text(OVERLAY, encoding="utf-8")
    head = f"profiles_file: {profiles_file}\n" if profiles_file else ""
    return write(
        tmp_path,
        head + "cluster:\n  name: c\n  workers:\n    - {gpu: L40S, url: 'http://w:8000'" + worker + "}\n",
        "gateway.yaml",
    )


def test_a_worker_names_a_calibrated_profile_from_the_profiles_file(tmp_path: Path) -> None:
    from gateway.config.gateway import load_gateway_config

    loaded = load_gateway_config(gateway_yaml(tmp_path, ", profile: node7"))
    [w] = loaded.workers
    assert (w.profile.name, w.profile_source, w.profile.iter_base_s) == ("node7/llama-3.1-70b", "file", 0.04)
    # Without ``profile`` the catalogue's entry of the GPU is used, overlay or not.
    [w] = load_gateway_config(gateway_yaml(tmp_path, "")).workers
    assert (w.profile.name, w.profile_source) == ("L40S/llama-3.1-70b", "catalogue")
    # A catalogue label is a valid profile name too (an L40S scheduled as an A100, say).
    [w] = load_gateway_config(gateway_yaml(tmp_path, ", profile: A100")).workers
    assert (w.profile.name, w.profile_source) == ("A100/llama-3.1-70b", "catalogue")


def test_an_unknown_profile_name_is_a_config_error_listing_the_known_ones(tmp_path: Path) -> None:
    from gateway.config.gateway import load_gateway_config

    with pytest.raises(ConfigError) as err:
        load_gateway_config(gateway_yaml(tmp_path, ", profile: node8"))
    msg = str(err.value)
    assert "workers.0.profile" in msg and "'node8'" in msg and "node7" in msg and "A100" in msg
    # The overlay's labels exist only with the overlay.
    with pytest.raises(ConfigError, match="unknown profile 'node7'"):
        load_gateway_config(gateway_yaml(tmp_path, ", profile: node7", profiles_file=None))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (OVERLAY.replace("llama-3.1-70b:", "gpt-9:"), "profiles.gpt-9"),
        (OVERLAY.replace("token_s: 0.0003", "token_s: -1"), "profiles.llama-3.1-70b.node7.token_s"),
        ("profiles: {}\n", "profiles"),
    ],
)
def test_a_bad_profiles_file_is_a_config_error_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    from gateway.config.gateway import load_gateway_config

    path = gateway_yaml(tmp_path, "")
    (tmp_path / "profiles.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_gateway_config(path)
    assert err.value.field == field

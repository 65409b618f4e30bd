"""``hexflow emulate-cluster`` names its workers as the gateway's shipped configs do (``a100-0``, not
``A100-0``), so a worker reads the same in the emulator's lines and in the gateway's logs and metrics."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config import load_cluster_config
from workers.cluster import bind_sockets, plan_cluster, worker_names

REPO = Path(__file__).resolve().parents[2]


def test_the_paper_cluster_is_named_as_config_gateway_yaml_names_it() -> None:
    shipped = yaml.safe_load((REPO / "config" / "gateway.yaml").read_text())["cluster"]["workers"]
    assert worker_names(load_cluster_config("paper-4gpu")) == [w["name"] for w in shipped]


def test_emulated_workers_carry_those_names(tmp_path: Path) -> None:
    sockets = bind_sockets("127.0.0.1", 0, 4)
    try:
        workers = plan_cluster("paper-4gpu", sockets, host="127.0.0.1", time_scale=0.05)
    finally:
        for s in sockets:
            s.close()
    assert [(w.name, w.gpu) for w in workers] == [
        ("a100-0", "A100"),
        ("a100-1", "A100"),
        ("a6000-0", "A6000"),
        ("l40s-0", "L40S"),
    ]


def test_a_name_the_cluster_file_gives_is_kept_and_never_taken_twice(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: c\nworkers:\n  - {gpu: A100, name: a100-0}\n  - {gpu: A100, count: 2}\n"
        "  - {gpu: L40S, name: edge, count: 2}\n  - {gpu: L40S}\n"
    )
    assert worker_names(load_cluster_config(path)) == ["a100-0", "a100-1", "a100-2", "edge-0", "edge-1", "l40s-0"]

"""What the README and docs tell a newcomer stays true: the three commands to a live /v1/text2sql parse
as written, the bench-demo time is stated one way, and .gitignore hides no tracked file."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
THREE_COMMANDS = [
    "make setup",
    ".venv/bin/hexflow emulate-cluster --demo --base-port 8001 --time-scale 0.05 &",
    ".venv/bin/hexflow serve --demo --config config/gateway.yaml --time-scale 0.05 &",
]
CURL = (
    "curl -s localhost:8080/v1/text2sql -H 'Authorization: Bearer demo-batch-key' -H 'content-type: application/json'"
)
BENCH_DEMO_TIME = "under a minute on two idle cores (about 40 s of CPU time)"


def _commands(path: Path) -> list[str]:
    """The shell lines of ``path``'s sh blocks, comments cut."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line == "```sh"
            continue
        if inside:
            lines.append(line.split(" # ", 1)[0].rstrip())
    return lines


@pytest.mark.parametrize("doc", ["README.md", "docs/text2sql.md"])
def test_the_docs_give_three_commands_to_a_live_text2sql_and_its_curl(doc: str) -> None:
    lines = _commands(REPO / doc)
    start = lines.index(THREE_COMMANDS[0])
    assert lines[start : start + 3] == THREE_COMMANDS
    assert any(line.startswith(CURL) for line in lines[start + 3 :])


def test_the_three_commands_parse_as_written() -> None:
    from workers.cluster import build_parser as cluster_parser

    cluster = shlex.split(THREE_COMMANDS[1].rstrip(" &"))[2:]
    args = cluster_parser("hexflow emulate-cluster").parse_args(cluster)
    assert args.demo and args.base_port == 8001 and args.time_scale == 0.05
    serve = shlex.split(THREE_COMMANDS[2].rstrip(" &"))[1:]
    args = build_parser().parse_args(serve)
    assert args.demo and args.config == "config/gateway.yaml"
    assert (REPO / args.config).is_file()


def test_the_bench_demo_time_is_stated_one_way() -> None:
    """Measured: 40 s of CPU (user) time for the command make bench-demo runs; the three places say so."""
    for doc in ("Makefile", "README.md", "docs/architecture.md"):
        text = " ".join((REPO / doc).read_text(encoding="utf-8").split())
        assert BENCH_DEMO_TIME in text, doc
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    comment = makefile.split("\nbench-demo: setup", 1)[0].rsplit("\n", 1)[1]
    assert BENCH_DEMO_TIME in comment


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_gitignore_hides_no_tracked_file() -> None:
    out = subprocess.run(
        # The repository's .gitignore files only (not a developer's global excludes).
        ["git", "ls-files", "--cached", "--ignored", "--exclude-per-directory=.gitignore"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == []


def test_the_capacity_docs_state_what_the_shipped_files_use() -> None:
    """docs/deploy-gpu-hosts.md: the deploy files set capacity 8, config/ sets none (the profile's derived
    capacity, whose rule and Llama-3.1-70B values the page gives)."""
    import yaml

    from gateway.config import load_gpu_catalog
    from gateway.core.profile import CAPACITY_CALL_TOKENS, CAPACITY_SLOWDOWN

    for name in ("gateway.yaml", "gateway-gpu.yaml"):
        workers = yaml.safe_load((REPO / "deploy" / "compose" / name).read_text())["cluster"]["workers"]
        assert {w.get("capacity") for w in workers} == {8}, name
    pods = [
        doc["spec"]["template"].get("metadata", {})
        for path in sorted((REPO / "deploy" / "k8s" / "overlays").glob("*/*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") in ("Deployment", "StatefulSet")
    ]
    workers = [pod for pod in pods if "hexflow.io/gpu" in pod.get("labels", {})]  # the worker pods
    assert len(workers) == 6
    assert {pod.get("annotations", {}).get("hexflow.io/capacity") for pod in workers} == {"8"}
    shipped = yaml.safe_load((REPO / "config" / "gateway.yaml").read_text())["cluster"]["workers"]
    clusters = [yaml.safe_load(p.read_text())["workers"] for p in sorted((REPO / "config" / "clusters").glob("*.yaml"))]
    assert all("capacity" not in w for w in shipped) and all("capacity" not in w for ws in clusters for w in ws)
    catalog = load_gpu_catalog()
    a100, a6000, l40s = (catalog.profile(g, "llama-3.1-70b").derived_capacity() for g in ("A100", "A6000", "L40S"))
    assert a6000 == l40s
    text = " ".join((REPO / "docs" / "deploy-gpu-hosts.md").read_text(encoding="utf-8").split())
    assert "Every shipped configuration uses 8" not in text
    assert f"at {CAPACITY_CALL_TOKENS:,} tokens a call" in text and CAPACITY_SLOWDOWN == 2.0 and "at most twice" in text
    assert f"For Llama-3.1-70B that is {a100} on an A100 x4 and {a6000} on an A6000 x4 or an L40S x4." in text
    assert "the deploy files set 8 on every worker" in text


def test_the_plan_time_is_stated_with_the_machine_it_was_measured_on() -> None:
    """docs/deploy-gpu-hosts.md's `hexflow plan` example: its run time comes with the machine and the CPU time."""
    text = (REPO / "docs" / "deploy-gpu-hosts.md").read_text(encoding="utf-8")
    block = text.split("## Size a cluster: `hexflow plan`", 1)[1].split("**What it simulates.**", 1)[0]
    assert "29 simulated runs, 63.3 s\n```" in block
    assert "63 s of wall time and 40 s of CPU time (the search runs on one core) on a 2-core x86_64" in " ".join(
        block.split()
    )

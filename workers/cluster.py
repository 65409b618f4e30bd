"""A whole emulated cluster in one process: one emulated vLLM worker per worker of a cluster file.

    python -m workers.cluster --cluster paper-4gpu --base-port 8001 --time-scale 0.05
        [--host 127.0.0.1] [--scheduling-policy fcfs|priority] [--seed N] [--no-request-overhead]
        [--catalog GPUS_YAML] [--no-enable-prefix-caching] [--enable-prompt-tokens-details]
    hexflow emulate-cluster ...   (the same)

Worker ``i`` of the cluster (``ClusterConfig.expanded()`` order, the scheduler's order) listens on
``base-port + i``; with ``--base-port 0`` every worker gets a free port. All servers run in one asyncio
loop (one ``uvicorn.Server`` task each); their sockets are bound before anything starts, so a port
in use is reported at once. When every worker answers, one line per worker is printed to stdout::

    a100-0 http://127.0.0.1:8001 A100

Workers are named as the gateway's shipped configs name them (``worker_names``: ``a100-0, a100-1, a6000-0,
l40s-0`` for paper-4gpu, config/gateway.yaml's names), so a worker reads the same here and in the gateway.

SIGTERM or SIGINT stops all of them gracefully. Like ``workers.emulator`` this is a TEST DOUBLE for
GPUs; never use it in production.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from workers.emulator import (
    DEFAULT_MAX_MODEL_LEN,
    EmulatorConfig,
    Responder,
    add_answer_arguments,
    add_cache_arguments,
    add_context_arguments,
    answers_label,
    create_app,
    responder_from_args,
)

if TYPE_CHECKING:
    from gateway.config.cluster import ClusterConfig

START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class EmulatedWorker:
    """One worker of the emulated cluster: its name, GPU, URL and emulator settings."""

    name: str
    gpu: str
    url: str
    config: EmulatorConfig


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals alone: the cluster handles them once for all servers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_sockets(host: str, base_port: int, n: int) -> list[socket.socket]:
    """``n`` listening TCP sockets on ``base_port``, ``base_port + 1``, ... (any free ports for 0).

    Each is made with its protocol named (``IPPROTO_TCP``), as uvicorn's own listener is: asyncio disables
    Nagle's algorithm (``TCP_NODELAY``) only on connections accepted from such a socket, and uvicorn writes
    an answer's headers and body in two writes. Accepted from a socket made with protocol 0, a connection
    kept Nagle's algorithm and an answer's body waited for the client's delayed ACK of its headers: a
    delay of wall time that a small time scale turns into modelled seconds on every call, which the
    simulator does not have (docs/benchmarks.md, "Live beside the simulator"). The listener has
    ``TCP_NODELAY`` set too, which Linux copies to the connections it accepts.

    Raises ``OSError`` naming the port that could not be bound (the sockets bound so far are closed).
    """
    out: list[socket.socket] = []
    try:
        for i in range(n):
            port = base_port + i if base_port else 0
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
            sock.listen(2048)
            sock.setblocking(False)
    except BaseException:
        for s in out:
            s.close()
        raise
    return out


def worker_names(cluster: ClusterConfig) -> list[str]:
    """The workers' names, in ``cluster.expanded()`` order, as the gateway's shipped configs write them
    (config/gateway.yaml, deploy/): a worker the cluster file names keeps its name; any other is
    ``<gpu in lower case>-<n>``, ``n`` counting that GPU's unnamed workers in file order and skipping a name a
    named worker holds. (``ClusterConfig.expanded()``'s own default names, ``A100-0``, are the simulator's.)"""
    resolved = cluster.expanded()
    named = [w.name is not None for w in cluster.workers for _ in range(w.count)]
    taken = {rw.name for rw, given in zip(resolved, named, strict=True) if given}
    per_gpu: dict[str, int] = {}
    out: list[str] = []
    for rw, given in zip(resolved, named, strict=True):
        if given:
            out.append(rw.name)
            continue
        n = per_gpu.get(rw.gpu, 0)
        while f"{rw.gpu.lower()}-{n}" in taken:
            n += 1
        per_gpu[rw.gpu] = n + 1
        out.append(f"{rw.gpu.lower()}-{n}")
    return out


def plan_cluster(
    cluster: str,
    sockets: Sequence[socket.socket],
    *,
    host: str,
    time_scale: float,
    priority_scheduling: bool = False,
    seed: int = 0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    add_request_overhead: bool = True,
    catalog: str | None = None,
    prefix_caching: bool = True,
    prompt_tokens_details: bool = False,
    refuse_context_overflow: bool = False,
) -> list[EmulatedWorker]:
    """The emulated workers of a cluster file (name or path), one per bound socket, in scheduler order.

    ``catalog``: the GPU catalogue whose profiles the workers run (default: the packaged one).
    ``prefix_caching``/``prompt_tokens_details``/``refuse_context_overflow``: as the emulator's
    ``EmulatorConfig`` (vLLM's flags, and the vLLM release's answer to a prompt + max_tokens over the context).
    Raises ``GatewayError`` for a bad cluster file and ``ValueError`` when the socket count differs.
    """
    from gateway.config import load_cluster_config, load_gpu_catalog

    cat = load_gpu_catalog(catalog)
    loaded = load_cluster_config(cluster, cat)
    resolved = loaded.expanded()
    if len(resolved) != len(sockets):
        raise ValueError(f"{len(resolved)} workers but {len(sockets)} sockets")
    url_host = f"[{host}]" if ":" in host else host
    out = []
    names = worker_names(loaded)
    for i, (rw, sock) in enumerate(zip(resolved, sockets, strict=True)):
        port = int(sock.getsockname()[1])
        cfg = EmulatorConfig(
            profile=cat.profile(rw.gpu, rw.model),
            served_model_name=rw.served_model or rw.model,
            time_scale=time_scale,
            seed=seed * 1000 + i,
            max_model_len=max_model_len,
            priority_scheduling=priority_scheduling,
            add_request_overhead=add_request_overhead,
            prefix_caching=prefix_caching,
            prompt_tokens_details=prompt_tokens_details,
            refuse_context_overflow=refuse_context_overflow,
        )
        out.append(EmulatedWorker(names[i], rw.gpu, f"http://{url_host}:{port}", cfg))
    return out


async def serve_cluster(
    workers: Sequence[EmulatedWorker], sockets: Sequence[socket.socket], responder: Responder | None = None
) -> int:
    """Serve every worker on its socket until SIGTERM/SIGINT; 0 on a clean stop, 1 if a server failed.

    ``responder`` (e.g. scripted answers) is shared by every worker; default: filler text.
    """
    servers = [
        _Server(
            uvicorn.Config(
                create_app(w.config, responder),
                log_level="warning",
                lifespan="on",
                timeout_graceful_shutdown=5,
                timeout_keep_alive=5,
                access_log=False,
            )
        )
        for w in workers
    ]
    tasks = [
        asyncio.create_task(s.serve(sockets=[sock]), name=f"emulator-{w.name}")
        for s, sock, w in zip(servers, sockets, workers, strict=True)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    failed = False
    try:
        deadline = loop.time() + START_TIMEOUT_S
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks) or loop.time() > deadline or stop.is_set():
                failed = not stop.is_set()
                break
            await asyncio.sleep(0.02)
        else:
            for w in workers:
                print(f"{w.name} {w.url} {w.gpu}", flush=True)
        if not failed:
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            failed = stopper not in done
            stopper.cancel()
    finally:
        for s in servers:
            s.should_exit = True
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for sig in installed:
            loop.remove_signal_handler(sig)
    for w, r in zip(workers, results, strict=True):
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            print(f"cluster: worker {w.name} failed: {r!r}", file=sys.stderr)
            failed = True
    if failed:
        print("cluster: a worker stopped or did not start; shutting the cluster down", file=sys.stderr)
    return 1 if failed else 0


def build_parser(prog: str = "python -m workers.cluster") -> argparse.ArgumentParser:
    """Arguments of ``python -m workers.cluster`` (``hexflow emulate-cluster``: ``prog`` names it)."""
    from gateway.argtypes import HelpFormatter, nonneg_int, port_or_zero, positive_float

    p = argparse.ArgumentParser(
        prog=prog,
        description="A whole emulated cluster in one process: one emulated vLLM worker (a TEST DOUBLE for a GPU) "
        "per worker of a cluster file, on consecutive ports.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--cluster", default="paper-4gpu", help="cluster file or name under config/clusters")
    p.add_argument("--host", default="127.0.0.1", help="bind address of every worker")
    p.add_argument("--base-port", type=port_or_zero, default=8001, help="port of the first worker (0: any free ports)")
    p.add_argument(
        "--time-scale", type=positive_float, default=1.0, help="real seconds per modelled second (0.05: 20x faster)"
    )
    p.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="vLLM's engine queue order (priority: the request's priority field)",
    )
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="seed of the filler text the worker generates (with each request's seed or prompt)",
    )
    add_context_arguments(p)
    p.add_argument(
        "--catalog", default=None, help="GPU catalogue whose profiles the workers run (default: the packaged gpus.yaml)"
    )
    add_answer_arguments(p)
    p.add_argument(
        "--no-request-overhead",
        action="store_true",
        help="do not add the profile's per-request overhead (API server time) to responses",
    )
    add_cache_arguments(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m workers.cluster") -> int:
    """Run the emulated cluster until SIGTERM/SIGINT (bad input: one line on stderr, exit 2)."""
    from gateway.config import load_cluster_config
    from gateway.errors import GatewayError

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        from gateway.config import load_gpu_catalog

        n = len(load_cluster_config(args.cluster, load_gpu_catalog(args.catalog)).expanded())
        if args.base_port and args.base_port + n - 1 > 65535:
            raise ValueError(f"--base-port {args.base_port}: {n} workers need ports up to {args.base_port + n - 1}")
        sockets = bind_sockets(args.host, args.base_port, n)
    except (GatewayError, OSError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        workers = plan_cluster(
            args.cluster,
            sockets,
            host=args.host,
            time_scale=args.time_scale,
            priority_scheduling=args.scheduling_policy == "priority",
            seed=args.seed,
            max_model_len=args.max_model_len,
            add_request_overhead=not args.no_request_overhead,
            catalog=args.catalog,
            prefix_caching=args.enable_prefix_caching,
            prompt_tokens_details=args.enable_prompt_tokens_details,
            refuse_context_overflow=args.context_overflow == "refuse",
        )
        responder = responder_from_args(args)
        print(
            f"emulated cluster (test doubles) {args.cluster}: {len(workers)} workers "
            f"({', '.join(w.gpu for w in workers)}) on {workers[0].url} ... {workers[-1].url}; "
            f"time scale {args.time_scale:g}, answers {answers_label(args)}, "
            f"prefix caching {'on' if args.enable_prefix_caching else 'off'}",
            file=sys.stderr,
            flush=True,
        )
        return asyncio.run(serve_cluster(workers, sockets, responder))
    except (GatewayError, ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        for s in sockets:
            s.close()


if __name__ == "__main__":
    sys.exit(main())

"""The real vLLM servers of ``hexflow bench fidelity-vllm``: their options, how they are started, the
cluster file that names their calibrated profiles, and one server's calibration."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.bench.stats import finite_or_none
from gateway.core.profile import PerfProfile
from gateway.profiling.probe import CalibrationResult
from workers import cpu_vllm

TARGET = 0.10
"""Largest relative gap between live and simulated P95 (issue 14, real vLLM on the CPU)."""
MODEL = "llama-3.1-8b"
"""The catalogue model the profiles are filed under (the servers serve ``cpu_vllm.SERVED_MODEL_NAME``)."""
STAND_IN_GPU = "L4"
"""Each worker's ``gpu`` in the cluster file: a name the catalogue knows; its ``profile`` overrides it."""
CHUNK = 2048
"""``--max-num-batched-tokens`` of every server (the profile's ``max_batched_tokens``)."""
MAX_MODEL_LEN = 4096
"""``--max-model-len`` of every server: a scaled call's prompt plus output must fit."""
CLUSTER_NAME = "vllm-cpu"


@dataclass(frozen=True)
class VllmServer:
    """One server of the benchmark: its worker name, its options and the CPUs it is pinned to."""

    name: str
    omp_threads: int
    max_num_seqs: int
    cpus: tuple[int, ...] = ()  # empty: unpinned, sharing every CPU

    @property
    def label(self) -> str:
        """The profile label its calibration is filed under."""
        return f"vllm-cpu-{self.name}"

    def options(self) -> cpu_vllm.ServeOptions:
        """Its ``ServeOptions``."""
        return cpu_vllm.ServeOptions(
            max_num_seqs=self.max_num_seqs,
            max_model_len=MAX_MODEL_LEN,
            omp_threads=self.omp_threads,
            max_num_batched_tokens=CHUNK,
            cpus=self.cpus,
        )


def default_servers(cpus: Sequence[int] | None = None) -> tuple[VllmServer, VllmServer]:
    """Two servers that differ in ``--max-num-seqs`` (4 and 2), one OMP thread each, each pinned to a CPU of
    its own when two or more are usable (``cpus``, default this process's affinity), as two GPUs would be."""
    usable = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(usable) >= 2:
        return VllmServer("a", 1, 4, (usable[0],)), VllmServer("b", 1, 2, (usable[1],))
    return VllmServer("a", 1, 4), VllmServer("b", 1, 2)


def parse_server(text: str, name: str) -> VllmServer:
    """``THREADS:MAX_NUM_SEQS[@CPU,...]`` (e.g. ``1:4@0``) as a server named ``name``; ``ValueError``
    otherwise (a CPU this process may not use included)."""
    head, at, pinned = text.partition("@")
    try:
        threads, seqs = (int(p) for p in head.split(":"))
    except ValueError:
        raise ValueError(f"--server {text!r}: expected THREADS:MAX_NUM_SEQS[@CPU,...], e.g. 1:4@0") from None
    if not (1 <= threads <= 256 and 1 <= seqs <= 256):
        raise ValueError(f"--server {text!r}: threads and max-num-seqs must be 1..256")
    try:
        cpus = cpu_vllm.parse_cpus(pinned) if at else ()
        cpu_vllm.check_cpus(cpus)
    except ValueError as exc:
        raise ValueError(f"--server {text!r}: {exc}") from None
    return VllmServer(name, threads, seqs, cpus)


FITTED = ("iter_base_s", "token_s", "ctx_s", "attn_s", "seq_s", "admit_s", "request_overhead_s")
"""The fitted constants of a server's profile, as its JSON and the calibration table list them."""


@dataclass
class ServerCalibration:
    """One server: its options, URL, calibration and fitted profile; the standard workflow's lone latency
    under it (at the benchmark's token scale) and the requests the other servers completed meanwhile (0: they
    were idle)."""

    server: VllmServer
    url: str
    result: CalibrationResult
    profile: PerfProfile
    standard_s: float
    background_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSON view."""
        p = self.profile
        median, largest = self.result.error_spread()
        return {
            "name": self.server.name,
            "label": self.server.label,
            "url": self.url,
            "omp_threads": self.server.omp_threads,
            "max_num_seqs": self.server.max_num_seqs,
            "cpus": list(self.server.cpus),
            "background_requests": self.background_requests,
            "max_batched_tokens": p.max_batched_tokens,
            "profile": {k: getattr(p, k) for k in (*FITTED, "kv_capacity_tokens", "block_tokens")},
            "probes": len(self.result.measurements),
            "probe_fits": self.result.probes_json(),
            "fit_median_abs_error": finite_or_none(median),
            "fit_max_abs_error": finite_or_none(largest),
            "calibration_wall_s": self.result.wall_s,
            "standard_workflow_s": self.standard_s,
        }


def start_servers(
    options: Sequence[cpu_vllm.ServeOptions], base_port: int, paths: cpu_vllm.Paths, say: Callable[[str], None]
) -> list[str]:
    """Start every server (restarting ones this module left on the ports), all at once; their URLs."""
    ports = [base_port + i for i in range(len(options))]
    stale = cpu_vllm.stop_servers(ports, paths=paths)
    if stale:
        say(f"stopped servers left on ports {stale} (their options may differ)")
    say(f"starting {len(options)} vLLM servers on ports {ports} (about a minute)")
    with concurrent.futures.ThreadPoolExecutor(len(options)) as pool:
        futures = [
            pool.submit(cpu_vllm.serve, 1, port, o, paths=paths, timeout_s=420.0)
            for o, port in zip(options, ports, strict=True)
        ]
        try:
            return [f.result()[0] for f in futures]
        except cpu_vllm.CpuVllmError:
            cpu_vllm.stop_servers(ports, paths=paths)
            raise


def cluster_doc(servers: Sequence[VllmServer]) -> dict[str, Any]:
    """The cluster file of the servers: each worker names its calibrated profile's label, serves the tiny
    model, and takes ``max_num_seqs`` calls at once."""
    return {
        "name": CLUSTER_NAME,
        "description": "real vLLM servers on the CPU (tiny random-weight LLaMA), calibrated profiles",
        "model": MODEL,
        "workers": [
            {
                "name": s.name,
                "gpu": STAND_IN_GPU,
                "profile": s.label,
                "served_model": cpu_vllm.SERVED_MODEL_NAME,
                "capacity": s.max_num_seqs,
            }
            for s in servers
        ],
    }

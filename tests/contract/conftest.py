"""One contract, two backends: the emulated worker (always) and the real vLLM CPU server (``-m vllm_cpu``).

The emulated worker is started as a subprocess serving the name and context length the real test
server uses (``tiny-llama``, 16384: ``tests/vllm_cpu/conftest.py``), so the same assertions apply to both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.emulator_process import emulator_process

SERVED = "tiny-llama"
MAX_MODEL_LEN = 16384  # as tests/vllm_cpu/conftest.py: one server on port 18150 serves both suites


@pytest.fixture(scope="session")
def emulator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--gpu", "A100", "--model", "llama-3.1-8b", "--served-model-name", SERVED, "--max-model-len"]
    args += [str(MAX_MODEL_LEN), "--time-scale", "0.01", "--scheduling-policy", "priority"]
    with emulator_process(args, Path(tmp_path_factory.mktemp("emulator")) / "emulator.log") as url:
        yield url


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

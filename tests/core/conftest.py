"""Shared fixtures for core tests: small hand-written profiles (no config files)."""

from __future__ import annotations

import pytest

from gateway.core.profile import PerfProfile
from gateway.core.worker import WorkerInfo


def make_profile(gpu: str = "FAST", base: float = 0.02, token: float = 2e-4, overhead: float = 0.5) -> PerfProfile:
    """A synthetic profile; ``base`` sets decode speed, ``token`` prefill speed."""
    return PerfProfile(gpu, "m", base, token, base * 2.3e-6, overhead, 200_000, 64, 2048)


@pytest.fixture
def fast() -> PerfProfile:
    return make_profile("FAST", 0.02, 2e-4)


@pytest.fixture
def slow() -> PerfProfile:
    return make_profile("SLOW", 0.05, 5e-4)


@pytest.fixture
def cluster(fast: PerfProfile, slow: PerfProfile) -> list[WorkerInfo]:
    return [WorkerInfo("f0", fast, 4), WorkerInfo("f1", fast, 4), WorkerInfo("s0", slow, 4)]

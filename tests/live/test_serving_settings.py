"""The process-wide settings the gateway serves under: start-up objects frozen and a higher generation-0
threshold for the garbage collector, both undone when the app stops; FastAPI's own telemetry off."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.live.app import FASTAPI_TELEMETRY_OFF, GC_GEN0_THRESHOLD, serving_gc
from tests.live.harness import gateway_client, write_config


def test_serving_gc_freezes_and_raises_the_threshold_then_restores() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with serving_gc():
        assert gc.get_threshold() == (max(GC_GEN0_THRESHOLD, before[0]), before[1], before[2])
        assert gc.get_freeze_count() > 0
        # What serving allocates is not frozen: it stays collectable.
        young: list[list[object]] = [[]]
        young[0].append(young)
        del young
        assert gc.collect() >= 1
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_higher_threshold_already_set_is_kept() -> None:
    before = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD * 2, before[1], before[2])
    try:
        with serving_gc():
            assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD * 2
        assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD * 2
    finally:
        gc.set_threshold(*before)


async def test_the_app_serves_with_the_tuned_collector(tmp_path: Path) -> None:
    before = gc.get_threshold()
    async with gateway_client(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"])) as (client, _):
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == max(GC_GEN0_THRESHOLD, before[0])
        assert (await client.get("/healthz")).status_code == 200
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


async def test_fastapi_telemetry_is_not_consulted_per_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI's OpenTelemetry instrumentation is off: no request asks for a provider (each ask reads
    ``os.environ`` while none is configured)."""
    if not FASTAPI_TELEMETRY_OFF:
        pytest.skip("this FastAPI has no telemetry of its own")
    from opentelemetry import _logs, metrics, trace

    asked: list[str] = []

    def counting(name: str, original: Callable[[], object]) -> Callable[[], object]:
        def ask() -> object:
            asked.append(name)
            return original()

        return ask

    getters = ((trace, "get_tracer_provider"), (metrics, "get_meter_provider"), (_logs, "get_logger_provider"))
    for module, name in getters:
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    async with gateway_client(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"])) as (client, _):
        for path in ("/healthz", "/v1/models", "/nowhere"):
            await client.get(path)
    assert asked == []

"""Fixtures: an emulated worker app with its engine driver running, reached through httpx's ASGI transport."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace

import httpx
import pytest

from gateway.config import load_gpu_catalog
from gateway.core.profile import PerfProfile
from workers.emulator import EmulatorConfig, create_app

MODEL = "llama-3.1-70b"
EmuFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


def a100(**changes: object) -> PerfProfile:
    return replace(load_gpu_catalog().profile("A100", MODEL), **changes)  # type: ignore[arg-type]


@pytest.fixture
def emulator() -> EmuFactory:
    @asynccontextmanager
    async def make(profile: PerfProfile | None = None, **cfg: object) -> AsyncIterator[httpx.AsyncClient]:
        config = EmulatorConfig(profile=profile or a100(), served_model_name=MODEL, **cfg)  # type: ignore[arg-type]
        app = create_app(config)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://emulator", timeout=60.0) as client:
                client.app = app  # type: ignore[attr-defined]
                yield client

    return make

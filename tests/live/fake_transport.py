"""The tests' fake ``Transport``: ``FakeTransport`` (the protocol's defaults; a test overrides ``send``),
``Hold`` (holds every call until released), a pool and a gateway around a fake transport."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config.gateway import OutlierConfig, load_gateway_config
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.live.metrics import GatewayMetrics
from gateway.live.pool import WorkerPool
from gateway.live.service import Gateway
from gateway.live.tenants import TenantStore
from gateway.live.transport import CallResult, LiveCall, Transport
from tests.live.harness import write_config

Clock = Callable[[], float]


class FakeTransport:
    """The transport protocol's defaults for a test: probes answer ``healthy``, scrapes ``metrics_text``,
    ``aclose`` counts; ``send`` fails the test (a subclass answers calls by overriding it)."""

    def __init__(self) -> None:
        self.healthy = True
        self.metrics_text = ""
        self.closed = 0

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        """Fails the test: this transport expects no call."""
        raise AssertionError("no call is sent")

    async def probe(self, worker: WorkerInfo) -> bool:
        """The worker is as healthy as ``healthy`` says."""
        return self.healthy

    async def scrape(self, worker: WorkerInfo) -> str:
        """The worker's metrics: ``metrics_text``."""
        return self.metrics_text

    async def aclose(self) -> None:
        """Counts the closes."""
        self.closed += 1


class Hold(FakeTransport):
    """Holds every sent call until ``release`` is set, then answers an empty result; counts the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.sent = 0

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        """Counts the call and answers it once ``release`` is set."""
        self.sent += 1
        await self.release.wait()
        return CallResult({})


def fake_pool(
    tmp: Path,
    transport: Transport,
    clock: Clock = time.monotonic,
    *,
    workers: int = 1,
    policy: str = "hexgen",
    outlier: OutlierConfig | None = None,
    **sections: Any,
) -> WorkerPool:
    """A pool of ``workers`` A100 workers (capacity 4, unreachable URLs) that talks only to ``transport``, on
    ``clock``; the health and scrape loops off; ``outlier``: outlier ejection's settings (the defaults when None);
    ``sections``: more gateway.yaml sections (``limits``, ``timeouts``, ...) as dicts."""
    urls = [f"http://127.0.0.1:{i + 1}" for i in range(workers)]
    health = {"outlier": (outlier or OutlierConfig()).model_dump()}
    loaded = load_gateway_config(write_config(tmp, urls, ["A100"] * workers, health=health, **sections))
    return WorkerPool(
        Scheduler(loaded.workers, policy, random.Random(0)),
        transport,
        GatewayMetrics([w.name for w in loaded.workers], []),
        loaded.cfg,
        clock=clock,
        background=False,
    )


def fake_gateway(config: Path, transport: Transport, clock: Clock = time.monotonic) -> Gateway:
    """The gateway of the config file ``config`` (and its tenants file), talking only to ``transport``, on
    ``clock``; its background loops off (``background=False``)."""
    loaded = load_gateway_config(config)
    return Gateway(loaded, TenantStore.load(loaded.tenants_path), transport, clock=clock, background=False)


def one_call(i: int, outcomes: list[object]) -> LiveCall:
    """A one-call workflow whose outcome is appended to ``outcomes``."""
    wf = StagedWorkflow(i, "t", 0.0, 100.0, [Stage("k", (CallSpec("k", 10, 2),))])
    return LiveCall(id=i, workflow=wf, spec=CallSpec("k", 10, 2), ready_at=0.0, on_done=lambda c, o: outcomes.append(o))


def chat_call(body: dict[str, Any], *, max_tokens: int = 8, priority: int | None = 0, stream: bool = False) -> LiveCall:
    """The call of a one-call chat workflow (30 prompt tokens, ``max_tokens`` out) sending ``body``;
    ``stream``: a streamed call (its chunks go to ``call.stream``)."""
    spec = CallSpec("chat", 30, max_tokens)
    wf = StagedWorkflow(1, "t", 0.0, 100.0, [Stage("chat", (spec,))])
    queue: asyncio.Queue[bytes | None] | None = asyncio.Queue() if stream else None
    return LiveCall(id=1, workflow=wf, spec=spec, ready_at=0.0, body=body, priority=priority, stream=queue)

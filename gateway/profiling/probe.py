"""``hexflow calibrate``: probe a live OpenAI-compatible worker and fit its performance profile.

The plan and the probes' model are in ``plan``, the HTTP side in ``worker``, the written profile and report in
``output``. Safe against a production worker: bounded concurrency, back-off while others' requests queue, a
hard budget (docs/architecture.md, "Fitting profiles"). ``max_num_seqs`` and ``max_batched_tokens`` are not in
vLLM's metrics: pass the worker's (defaults 64 and 2048)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np

from gateway.core.prefix import BLOCK_TOKENS
from gateway.core.profile import TIME_CONSTANTS, PerfProfile, profile_from
from gateway.profiling.plan import (
    CalibrationError,
    PlanSettings,
    Probe,
    Vector,
    fit_constants,
    make_plan,
    probe_features,
    step_short,
)
from gateway.profiling.promparse import CACHE_CONFIG_INFO, KV_CACHE_USAGE, WorkerMetrics
from gateway.profiling.worker import ProbeWorker

MIN_POSITIVE = 1e-12
"""``iter_base_s`` and ``token_s`` must be positive in ``gpus.yaml``; a fit at 0 is written as this."""


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Measurement:
    """One probe as measured: the median latency of its requests and the worker's token counts (a ``step``
    probe: seconds per decode step, its long batch's output and, in ``short_tokens``, its short one's)."""

    probe: Probe
    latency_s: float
    prompt_tokens: int
    output_tokens: int
    others_running: float | None
    """Requests running on the worker just before the probe (others' traffic); None without metrics."""
    fitted_s: float = math.nan
    short_tokens: int | None = None

    @property
    def error(self) -> float:
        """``fitted / measured - 1``."""
        return self.fitted_s / self.latency_s - 1.0

    def features(self, chunk: int) -> np.ndarray:
        """This probe's coefficient row (``probe_features`` with the worker's token counts)."""
        p = self.probe
        return probe_features(p.kind, p.concurrency, self.prompt_tokens, self.output_tokens, chunk, self.short_tokens)


_NO_FIT: Vector = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass
class CalibrationResult:
    """Everything ``hexflow calibrate`` measured and fitted (filled in as the calibration runs)."""

    worker: str
    model: str
    gpu: str
    tp: int
    settings: PlanSettings
    planned: int
    budget_s: float
    measurements: list[Measurement] = field(default_factory=list)
    constants: Vector = _NO_FIT
    kv_capacity_tokens: int | None = None
    kv_source: str = "unknown"
    prefix_ratio: float | None = None
    """Latency of the repeated prompt over its first send (well below 1: prefix caching is on)."""
    prefix_hits_tokens: float | None = None
    backoffs: int = 0
    backoff_s: float = 0.0
    skipped: int = 0
    stopped_by_budget: bool = False
    wall_s: float = 0.0
    measured_at: str = ""
    metrics_available: bool = False
    block_tokens: int = BLOCK_TOKENS
    """The worker's KV block size (its prefix cache reuses whole blocks), from ``vllm:cache_config_info``."""
    block_source: str = "default"

    @property
    def fitted(self) -> list[Measurement]:
        """The measurements the fit used (every probe but the repeated prefix)."""
        return [m for m in self.measurements if m.probe.kind != "prefix"]

    def profile(self, *, kv_capacity_tokens: int | None = None) -> PerfProfile:
        """The fitted ``PerfProfile`` (``CalibrationError`` when the KV capacity is unknown)."""
        kv = kv_capacity_tokens if kv_capacity_tokens is not None else self.kv_capacity_tokens
        if kv is None or kv < 1:
            raise CalibrationError(
                "the worker exposes no KV-cache capacity (vllm:cache_config_info) and none could be estimated; "
                "rerun with --kv-tokens N"
            )
        x, t, *_ = self.constants
        consts = dict(zip(TIME_CONSTANTS, self.constants, strict=True))
        consts.update(iter_base_s=max(x, MIN_POSITIVE), token_s=max(t, MIN_POSITIVE))
        s = self.settings
        limits = {"max_num_seqs": s.max_num_seqs, "max_batched_tokens": s.max_batched_tokens}
        source = SimpleNamespace(**consts, **limits, kv_capacity_tokens=kv, block_tokens=self.block_tokens)
        return profile_from(self.gpu, self.model, source)

    def error_spread(self) -> tuple[float, float]:
        """The median and the largest ``|error|`` of the fitted probes (NaN without any)."""
        errs = [abs(m.error) for m in self.fitted]
        return (statistics.median(errs), max(errs)) if errs else (math.nan, math.nan)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (``--json``)."""
        doc = {k: getattr(self, k) for k in ("worker", "model", "gpu", "tp", "measured_at")}
        doc["constants"] = dict(zip(TIME_CONSTANTS, self.constants, strict=True))
        doc |= {k: getattr(self, k) for k in ("kv_capacity_tokens", "kv_source", "block_tokens", "block_source")}
        doc |= {"max_num_seqs": self.settings.max_num_seqs, "max_batched_tokens": self.settings.max_batched_tokens}
        doc |= {"prefix_ratio": _finite(self.prefix_ratio), "prefix_hits_tokens": _finite(self.prefix_hits_tokens)}
        counts = ("backoffs", "backoff_s", "skipped", "stopped_by_budget", "planned", "wall_s", "budget_s")
        return doc | {k: getattr(self, k) for k in counts} | {"probes": self.probes_json()}

    def probes_json(self) -> list[dict[str, Any]]:
        """Every probe: its shape, measured and fitted latency and the fit's error (null for the prefix
        repeat, which is not fitted)."""
        return [
            {
                "kind": m.probe.kind,
                "concurrency": m.probe.concurrency,
                "prompt_tokens": m.prompt_tokens,
                "output_tokens": m.output_tokens,
                "measured_s": m.latency_s,
                "fitted_s": _finite(m.fitted_s),
                "error": _finite(m.error) if m.probe.kind != "prefix" else None,
                "others_running": m.others_running,
            }
            for m in self.measurements
        ]


class _Run:
    """One calibration in progress: fills in ``res`` (the probes measured so far, the fit of them, what the
    worker's metrics said) as ``calibrate`` runs the plan through it."""

    def __init__(
        self,
        w: ProbeWorker,
        res: CalibrationResult,
        kv_tokens: int | None,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.w, self.res, self.kv_tokens, self.clock, self.sleep = w, res, kv_tokens, clock, sleep
        self.start = clock()
        self.deadline = self.start + res.budget_s
        self.chunk = res.settings.max_batched_tokens
        self.kv_found: int | None = None
        self.block_found: int | None = None
        self.kv_usage_est: int | None = None
        self.prefix_hits: list[float] = []
        self.coef: np.ndarray | None = None
        self.bar: Any = None

    def refit(self) -> None:
        """Fit the constants to the probes so far (once four distinct shapes are measured)."""
        rows = self.res.fitted
        if len({(m.probe.concurrency, m.prompt_tokens, m.output_tokens) for m in rows}) >= 4:
            a = np.array([m.features(self.chunk) for m in rows])
            c = fit_constants(a, np.array([m.latency_s for m in rows]))
            self.res.constants, self.coef = (c[0], c[1], c[2], c[3], c[4], c[5], c[6]), np.array(c)

    def predict(self, p: Probe) -> float | None:
        """The probe's wall time by the fit so far (a step probe: both its batches)."""
        if self.coef is None:
            return None
        coef = self.coef
        parts = (
            [p]
            if p.kind != "step"
            else [replace(p, kind="batch"), replace(p, kind="batch", output=step_short(p.output))]
        )
        return sum(float(probe_features(q.kind, q.concurrency, q.prompt, q.output, self.chunk) @ coef) for q in parts)

    def on_wait(self, waiting: float, wait_s: float) -> None:
        """A back-off while ``waiting`` of others' requests queue."""
        self.res.metrics_available = True
        self.res.backoffs += 1
        self.res.backoff_s += wait_s
        if self.bar is not None:
            self.bar.set_postfix_str(f"backing off: {waiting:g} waiting")

    def note(self, load: WorkerMetrics | None) -> bool:
        """Keep what the worker's metrics said; False when others' requests still queue (the budget ended
        while backing off)."""
        if load is None:
            return True
        self.res.metrics_available = True
        self.kv_found = self.kv_found if load.kv_capacity_tokens is None else load.kv_capacity_tokens
        self.block_found = self.block_found if load.block_tokens is None else load.block_tokens
        if load.prefix_hits_total is not None:
            self.prefix_hits.append(load.prefix_hits_total)
        return load.queued <= 0

    async def run(self, plan: Sequence[Probe], progress: bool) -> None:
        """Every probe of ``plan`` in turn until the budget ends."""
        from tqdm import tqdm

        bar = self.bar = tqdm(total=len(plan), desc="calibrate", unit="probe", disable=not progress, leave=False)
        try:
            for probe in plan:
                bar.update(1)
                # Back off while others' requests queue on the worker (never add load to a queue).
                load = await self.w.load_when_quiet(self.deadline, self.clock, self.sleep, self.on_wait)
                remaining = self.deadline - self.clock()
                if remaining <= 0 or not self.note(load):
                    self.res.stopped_by_budget = True
                    break
                guess = self.predict(probe)
                if guess is not None and guess * 1.2 > remaining:
                    self.res.skipped += 1
                    continue
                bar.set_postfix_str(f"{probe.kind} {probe.concurrency}x{probe.prompt}+{probe.output}")
                if not await self.measure(probe, load, guess, remaining):
                    self.res.stopped_by_budget = True
                    break
            self.note(await self.w.load())  # the prefix-cache hits after the last probe
        finally:
            bar.close()

    async def measure(self, probe: Probe, load: WorkerMetrics | None, guess: float | None, remaining: float) -> bool:
        """Send one probe and keep its measurement; False when the budget ended during it."""
        w, clock = self.w, self.clock
        watch: asyncio.Task[int | None] | None = None
        if probe.kind == "batch" and guess is not None and self.kv_tokens is None and self.coef is not None:
            watch = asyncio.ensure_future(_watch_usage(w, probe, guess, self.res.constants, self.sleep, clock))
        shorts: list[tuple[float, int, int]] = []
        try:
            async with asyncio.timeout(remaining):
                results = await asyncio.gather(
                    *(w.complete(probe, clock, remaining, j) for j in range(probe.concurrency))
                )
                if probe.kind == "step":
                    short = replace(probe, output=step_short(probe.output))
                    left = max(self.deadline - clock(), 0.001)
                    shorts = await asyncio.gather(
                        *(w.complete(short, clock, left, probe.concurrency + j) for j in range(probe.concurrency))
                    )
        except (TimeoutError, httpx.TimeoutException):
            return False
        finally:
            if watch is not None:
                if watch.done() and not watch.cancelled() and watch.exception() is None:
                    self.kv_usage_est = watch.result() or self.kv_usage_est
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        whole = Measurement(
            probe,
            float(statistics.median([r[0] for r in results])),
            _median_int([r[1] for r in results]),
            _median_int([r[2] for r in results]),
            None if load is None else load.running,
        )
        got = _step_measurement(whole, results, shorts) if probe.kind == "step" else whole
        if got is not None:
            self.res.measurements.append(got)
            if probe.kind != "prefix":
                self.refit()
        return True

    def finish(self) -> None:
        """The fitted latencies, KV capacity, block size and prefix-cache verdict, once the plan ended."""
        res = self.res
        res.wall_s = self.clock() - self.start
        self.refit()
        if self.coef is None:
            raise CalibrationError(
                f"fewer than 4 distinct probes measured within the budget of {res.budget_s:g} s; raise --budget-s"
            )
        for m in res.measurements:
            m.fitted_s = float(m.features(self.chunk) @ self.coef)
        if self.kv_tokens is not None:
            res.kv_capacity_tokens, res.kv_source = self.kv_tokens, "--kv-tokens"
        elif self.kv_found is not None:
            res.kv_capacity_tokens, res.kv_source = self.kv_found, CACHE_CONFIG_INFO
        elif self.kv_usage_est is not None:
            res.kv_capacity_tokens = self.kv_usage_est
            res.kv_source = f"estimated from {KV_CACHE_USAGE} during the largest batch probe (coarse)"
        if self.block_found is not None:
            res.block_tokens, res.block_source = self.block_found, CACHE_CONFIG_INFO
        ms = res.measurements
        first = next((m for m in ms if m.probe.kind == "lone" and _same_prompt(m, ms)), None)
        again = next((m for m in ms if m.probe.kind == "prefix"), None)
        if first is not None and again is not None:
            res.prefix_ratio = again.latency_s / first.latency_s
        if len(self.prefix_hits) >= 2:
            res.prefix_hits_tokens = self.prefix_hits[-1] - self.prefix_hits[0]
        res.measured_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def calibrate(
    worker: str,
    model: str,
    *,
    gpu: str = "measured",
    tp: int = 1,
    budget_s: float = 300.0,
    settings: PlanSettings | None = None,
    kv_tokens: int | None = None,
    client: httpx.AsyncClient | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    progress: bool = True,
) -> CalibrationResult:
    """Run the probe plan against ``worker`` (its base URL) within ``budget_s`` and fit the profile.

    ``client``, ``clock`` and ``sleep`` are injected for tests (default: an ``httpx.AsyncClient`` sized to
    the plan's concurrency, the monotonic clock, ``asyncio.sleep``).
    """
    s = settings or PlanSettings()
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise ValueError("budget-s must be a positive number")
    if kv_tokens is not None and kv_tokens < 1:
        raise ValueError("kv-tokens must be >= 1")
    plan = make_plan(s)
    http = client or httpx.AsyncClient(
        limits=httpx.Limits(max_connections=min(s.max_concurrency, s.max_num_seqs) + 2),
        timeout=httpx.Timeout(60.0, connect=10.0),
    )
    res = CalibrationResult(worker, model, gpu, tp, s, len(plan), budget_s)
    run = _Run(ProbeWorker(http, worker, model), res, kv_tokens, clock, sleep)
    try:
        await run.run(plan, progress)
    finally:
        if client is None:
            await http.aclose()
    run.finish()
    return res


def _step_measurement(
    m: Measurement, longs: Sequence[tuple[float, int, int]], shorts: Sequence[tuple[float, int, int]]
) -> Measurement | None:
    """A step probe's measurement from its two batches: the difference of their mean latencies over the
    difference of their outputs (None when the worker's outputs do not differ: nothing to divide by)."""
    out_long, out_short = _median_int([r[2] for r in longs]), _median_int([r[2] for r in shorts])
    if out_long <= out_short or out_short < 1:
        return None
    per_step = (statistics.fmean(r[0] for r in longs) - statistics.fmean(r[0] for r in shorts)) / (out_long - out_short)
    if not per_step > 0:
        return None
    return replace(m, latency_s=per_step, output_tokens=out_long, short_tokens=out_short)


def _median_int(xs: Sequence[int]) -> int:
    return int(statistics.median_low(xs))


def _same_prompt(m: Measurement, all_: Sequence[Measurement]) -> bool:
    return any(o.probe.kind == "prefix" and o.probe.seed == m.probe.seed for o in all_)


async def _watch_usage(
    w: ProbeWorker,
    probe: Probe,
    predicted_s: float,
    constants: Vector,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float],
) -> int | None:
    """Halfway through a batch probe, estimate the KV capacity as tokens held / ``kv_cache_usage``.

    The tokens held are the batch's prompts plus the decode steps the fit says have run by then.
    None when the worker exports no usage or nothing runs.
    """
    t0 = clock()
    await sleep(predicted_s / 2)
    load = await w.load()
    if load is None or not load.kv_cache_usage or load.running is None or load.running < 1:
        return None
    x, t, c, o, a, q, h = constants
    n, p = probe.concurrency, probe.prompt
    elapsed = clock() - t0 - o - n * h - (x + t * n * p + a * n * p * (p + 1) / 2)
    step = x + (t + q) * n + c * n * p
    k = min(probe.output, max(0.0, elapsed / step)) if step > 0 else 0.0
    return int(load.running * (p + k) / load.kv_cache_usage)

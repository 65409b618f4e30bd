"""``hexflow calibrate``: measure a live OpenAI-compatible worker and fit its performance profile.

    hexflow calibrate --worker URL --model NAME [--gpu LABEL] [--tp N] [--out FILE] [--budget-s N]
        [--max-concurrency N] [--max-prompt N] [--max-output N] [--max-num-seqs N]
        [--max-batched-tokens N] [--kv-tokens N] [--step-output N] [--plot PNG] [--json FILE] [--quiet]

The profile is the iteration-time model of ``gateway.core.profile`` (the one the simulator, the
scheduler and the emulated worker use): ``t_iter = iter_base_s + token_s * tokens + ctx_s * context +
attn_s * pairs + seq_s * decoders`` (``pairs``: the prefill attention pairs the iteration's prompt chunks
compute; ``decoders``: the requests decoding a token in it) plus ``request_overhead_s`` per request. What a
request costs is linear in the six constants for given token counts, so measured latencies fit them by a
linear program. ``attn_s`` is what makes prefill quadratic in the prompt; where the worker's prefill is
linear the fit leaves it near 0. ``seq_s`` is host work per decoding request per step (sampling, output
processing) on the engine's own core: large on a CPU server, near 0 on a GPU host where it overlaps.

The probe plan (``make_plan``), run in this order until ``--budget-s`` is spent:

1. **lone requests** over a grid of prompt and output lengths (cheapest first), one at a time:
   ``single_latency(prompt, output)`` (chunked prefill, then one decode step per output token);
2. **batches** of ``n`` concurrent requests of one shape, each its own prompt (``n`` = 2, 4, 8, ... up to
   ``--max-concurrency``) with a short prompt (``n * prompt <= max_batched_tokens``, one prefill iteration) and a longer
   output: each decode step then costs ``iter_base_s + (token_s + seq_s) * n + ctx_s * n * context``, which is
   how decode slows down with the batch. The same batches run at two output lengths: a cost per request per
   step grows with the output, a cost per request (``admit_s``) does not, so the fit tells them apart
   (``token_s`` is pinned by the prompts, which have no per-request step cost). The ``n`` requests are taken in
   together, so each one's latency carries ``n`` intakes (``admit_s``) where a lone request's carries one:
   what tells ``admit_s`` (engine time per admitted request) from ``request_overhead_s`` (latency only);
3. **decode steps** (``step``): ``n`` concurrent requests of a short prompt and a long output (``--step-output``,
   default 256 tokens), then ``n`` more of the same prompt length and a quarter of that output; the
   difference of their mean latencies over the difference of their outputs is the time of one decode step
   at batch ``n`` (prefill, the per-request overhead and the intakes are in both and cancel). Run at
   ``n`` = 1, half the concurrency bound and the bound with a short prompt, and at the bound with the long
   prompt of the batch probes: the per-step cost of each decoding request (``token_s + seq_s``) and of its
   context (``ctx_s``) measured directly, not inferred from whole latencies in which they are a few per cent;
4. **a repeated prefix**: one prompt sent twice; the second send's latency over the first's (and the
   worker's ``vllm:prefix_cache_hits`` counter) says whether prefix caching is on. The profile has no
   prefix term, so only the first (uncached) send enters the fit;
5. the lone, batch and step probes once more, while budget remains (repeats average out noise).

Every prompt is a list of token ids drawn from a per-probe seed, each request of a batch its own, salted
per calibration run, so no two probes share a prefix (vLLM's prefix cache would otherwise make a repeat,
a batch or a second calibration of the same worker look fast), and its length is what the worker counts.
Requests ask for ``max_tokens = min_tokens = output`` with ``ignore_eos``, so outputs have exactly that length;
the fit uses the worker's own ``usage`` counts, never the requested ones.

**Safe against a production worker.** Concurrency never exceeds ``--max-concurrency`` (default 16, and
never above ``--max-num-seqs``). Before every probe the worker's ``/metrics`` is read; while
``vllm:num_requests_waiting`` is above zero (others' traffic is queued) the calibration backs off (1 s,
doubling up to 30 s) instead of adding load. The budget is a hard stop: a probe predicted (by the fit
so far) not to end within it is skipped, and requests still running when it ends are cancelled (vLLM
aborts a request whose client went away). Probes measured while others' requests were running are
counted in the report: their latencies include the others' share of each batch.

**The fit** (``fit_constants``): the constants ``>= 0`` with the smallest sum of relative errors
``|predicted / measured - 1|`` over every probe (an L1 fit: one probe disturbed by a hiccup moves it
less than least squares would); the report lists each probe's error. ``ctx_s`` weighs little in the
latencies of short contexts and is the least determined constant; the probe table shows how much each
probe depends on it.

**KV capacity**: ``--kv-tokens`` when given; else vLLM's ``vllm:cache_config_info`` gauge (its
``kv_cache_size_tokens`` label, or ``num_gpu_blocks x block_size`` before vLLM 0.32: the engine's own
figure); else estimated from
``vllm:kv_cache_usage_perc`` read halfway through the largest batch probe (tokens held / usage: coarse,
a block's worth per request). The KV block size (``block_tokens``: the prefix cache reuses whole blocks)
from the same gauge's ``block_size`` label, else vLLM's GPU default of 16 (its CPU backend uses 128).
``max_num_seqs`` and ``max_batched_tokens`` are not in vLLM's metrics; pass the worker's ``--max-num-seqs``
and ``--max-num-batched-tokens`` (defaults: 64 and 2048).

**Units.** Constants are in wall seconds as measured. An emulated worker at ``--time-scale s`` runs ``s``
times its modelled time, so its constants come out ``s`` times its profile's (divide by ``s`` for the
catalogue of a gateway run at that time scale, as ``hexflow bench fidelity`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import random
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from gateway.bench.stats import finite_or_none
from gateway.core.prefix import BLOCK_TOKENS
from gateway.core.profile import PerfProfile, time_scaled
from gateway.core.workflow import CallSpec
from gateway.errors import GatewayError
from gateway.live.promparse import (
    KV_CACHE_USAGE,
    KV_CACHE_USAGE_OLD,
    RUNNING,
    WAITING,
    MetricsParseError,
    parse_families,
)
from gateway.sim.calibrate import design_matrix
from gateway.sim.lpfit import l1_relative_fit

__all__ = [
    "CACHE_CONFIG_INFO",
    "CalibrationError",
    "CalibrationResult",
    "Measurement",
    "PlanSettings",
    "Probe",
    "ProbeWorker",
    "batch_features",
    "calibrate",
    "fit_constants",
    "format_report",
    "make_plan",
    "plot_fit",
    "probe_features",
    "profile_entry",
    "render_profile_yaml",
    "scaled_profile",
]

CACHE_CONFIG_INFO = "vllm:cache_config_info"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_ON_RATIO = 0.8
"""Without a hit counter: a repeated prompt faster than this fraction of its first send reads as cached."""
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
TOKEN_ID_RANGE = (100, 1100)
"""Prompt token ids are drawn from here: ordinary vocabulary entries of any current LLM tokenizer and of
small ones (the tiny CPU test model has 3072); the range of the gateway's synthetic prompts
(``gateway.live.routers.workflows.SYNTHETIC_VOCAB``)."""
MIN_POSITIVE = 1e-12
"""``iter_base_s`` and ``token_s`` must be positive in ``gpus.yaml``; a fit at 0 is written as this."""
STEP_MIN_OUTPUT = 8
"""The shortest long output of a step probe (shorter, and its difference of latencies is mostly noise)."""
FITTED = ("iter_base_s", "token_s", "ctx_s", "request_overhead_s", "attn_s", "seq_s", "admit_s")
Vector = tuple[float, float, float, float, float, float, float]


class CalibrationError(GatewayError):
    """The calibration cannot run or cannot produce a profile (no probe answered, no KV capacity, ...)."""


# --------------------------------------------------------------------------------------------------
# The plan and the model of each probe
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """``concurrency`` requests (each its own prompt) of ``prompt`` tokens and ``output`` tokens, sent together."""

    kind: str
    """``lone``, ``batch`` or ``prefix`` (the repeated send of a ``lone`` prompt; not fitted)."""
    prompt: int
    output: int
    concurrency: int = 1
    seed: int = 0
    """Seed of the prompt's token ids: equal seeds send equal prompts."""


@dataclass(frozen=True)
class PlanSettings:
    """The bounds of a probe plan."""

    max_prompt: int = 4096
    max_output: int = 256
    max_concurrency: int = 16
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    repeats: int = 2
    step_output: int = 256
    """The long output of a step probe (its short one is a quarter of it)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting out of range."""
        for name in ("max_prompt", "max_output", "max_concurrency", "max_num_seqs", "repeats", "step_output"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1")
        if self.max_prompt < 32:
            raise ValueError("max-prompt must be >= 32")
        if self.max_batched_tokens < 16:
            raise ValueError("max-batched-tokens must be >= 16")
        if self.step_output < STEP_MIN_OUTPUT:
            raise ValueError(f"step-output must be >= {STEP_MIN_OUTPUT}")


def step_short(output: int) -> int:
    """The short output of a step probe whose long output is ``output``."""
    return max(1, output // 4)


def make_plan(s: PlanSettings) -> list[Probe]:
    """The probes in the order they run (module docstring): lone grid, batches, steps, prefix, then repeats."""
    s.validate()
    prompts = sorted({32, max(32, s.max_prompt // 8), max(32, s.max_prompt // 2), s.max_prompt})
    outputs = sorted({1, max(2, s.max_output // 4), s.max_output})
    # Cheapest first (about one iteration per 256 prompt tokens and one per output token), so a short
    # budget still gets a spread of both lengths before the long probes.
    grid = sorted(((p, o) for p in prompts for o in outputs), key=lambda po: (po[0] / 256 + po[1], po[0]))
    cap = min(s.max_concurrency, s.max_num_seqs)
    b_out = max(16, s.max_output // 2)
    b_out_short = max(4, b_out // 4)
    sizes = [n for n in (2, 4, 8, 16, 32, 64, 128, 256) if n <= cap]
    if cap not in sizes and cap > 1:
        sizes.append(cap)
    b_prompt = max(1, min(64, s.max_batched_tokens // max(sizes, default=1)))
    # Long contexts make the attention term (ctx_s) visible: n requests of half the largest prompt.
    long_prompt = max(32, min(s.max_prompt // 2, 2048))
    long_sizes = sorted({max(2, cap // 2), cap}) if cap > 1 else []
    # Step probes: a prompt plus the long output never exceeds the longest request the lone grid sends.
    longest = s.max_prompt + s.max_output
    steps = [(n, b_prompt) for n in sorted({1, max(1, cap // 2), cap})]
    if cap > 1:
        steps.append((cap, long_prompt))
    steps = [(n, p) for n, p in steps if min(s.step_output, longest - p) >= STEP_MIN_OUTPUT]
    out: list[Probe] = []
    seed = 0
    for rep in range(s.repeats):
        for p, o in grid:
            seed += 1
            out.append(Probe("lone", p, o, 1, seed))
        if rep == 0:
            out.append(Probe("lone", b_prompt, b_out, 1, seed + 1))
            seed += 1
        for n in sizes:
            seed += 1
            out.append(Probe("batch", b_prompt, b_out, n, seed))
        for n in sizes:
            seed += 1
            out.append(Probe("batch", b_prompt, b_out_short, n, seed))
        for n in long_sizes:
            seed += 1
            out.append(Probe("batch", long_prompt, b_out, n, seed))
        for n, p in steps:
            seed += 1
            out.append(Probe("step", p, min(s.step_output, longest - p), n, seed))
        if rep == 0:
            # The same prompt twice: the first is an ordinary lone probe, the second may hit the cache.
            seed += 1
            p = max(32, min(s.max_prompt, 1024))
            out.append(Probe("lone", p, 1, 1, seed))
            out.append(Probe("prefix", p, 1, 1, seed))
    return out


def batch_features(n: int, prompt: int, output: int, chunk: int) -> np.ndarray:
    """Coefficients of ``FITTED`` (``iter_base_s, token_s, ctx_s, request_overhead_s, attn_s, seq_s, admit_s``) in the
    mean latency of ``n``
    requests of one shape that arrive together, from their iteration schedule (vLLM's V1 scheduler, as
    ``gateway.sim.engine`` models it).

    Every iteration runs one decode token per decoding request and fills the rest of the ``chunk``
    token budget with prompt tokens, first come first served; the iteration that finishes a prompt
    yields its first output token. An iteration reads the context of every request in the engine
    (the tokens it has processed so far). Which tokens run in which iteration depends on the token
    counts only, not on the constants, so each request's latency is linear in them: ``overhead +
    sum over its iterations of (iter_base_s + token_s * tokens + ctx_s * context + attn_s * pairs + seq_s *
    decoders)``, a chunk of ``c`` prompt tokens after ``p`` computing ``c * p + c * (c + 1) / 2`` pairs, plus ``n``
    intakes (``admit_s``: all ``n`` are admitted in the first iteration, which each one's intake stalls). With
    ``n = 1`` this is ``PerfProfile.single_latency``.
    """
    if min(n, prompt, output, chunk) < 1:
        raise ValueError("batch_features: n, prompt, output and chunk must be >= 1")
    prefilled = [0] * n
    generated = [0] * n
    done = [False] * n
    # Running sums of the features over the iterations so far, and each request's at its finish.
    iters = tokens_sum = ctx_sum = pairs_sum = dec_sum = 0.0
    row = np.zeros(7)
    left = n
    while left:
        decoding = [i for i in range(n) if not done[i] and generated[i] >= 1]
        ctx = float(sum(prefilled[i] + max(generated[i] - 1, 0) for i in range(n) if not done[i]))
        budget = chunk - len(decoding)
        tok = len(decoding)
        for i in decoding:
            generated[i] += 1
        for i in range(n):
            if budget <= 0:
                break
            if done[i] or prefilled[i] >= prompt:
                continue
            take = min(budget, prompt - prefilled[i])
            pairs_sum += take * prefilled[i] + take * (take + 1) / 2.0
            prefilled[i] += take
            budget -= take
            tok += take
            if prefilled[i] == prompt:
                generated[i] = 1
        iters += 1.0
        dec_sum += len(decoding)
        tokens_sum += tok
        ctx_sum += ctx
        for i in range(n):
            if not done[i] and generated[i] >= output:
                done[i] = True
                left -= 1
                row += (iters, tokens_sum, ctx_sum, 1.0, pairs_sum, dec_sum, float(n))
    return row / n


def probe_features(kind: str, n: int, prompt: int, output: int, chunk: int, short: int | None = None) -> np.ndarray:
    """The coefficient row of one measured probe: the profile's ``FITTED`` constants (a lone probe: exactly
    ``PerfProfile.single_latency``; a batch, ``batch_features``).

    A ``step`` probe's row is the difference of the mean-latency rows of its long (``output``) and short
    (``short``, default ``step_short(output)``) batches over the difference of their outputs: the model of
    one decode step's time at batch ``n`` (the intakes and the overhead are in both batches and cancel)."""
    if kind == "step":
        lo = step_short(output) if short is None else short
        if not 1 <= lo < output:
            raise ValueError(f"a step probe needs a short output below its long one, got {lo} and {output}")
        diff: np.ndarray = (batch_features(n, prompt, output, chunk) - batch_features(n, prompt, lo, chunk)) / (
            output - lo
        )
        return diff
    if n == 1:
        calls = [CallSpec(kind, max(prompt, 1), max(output, 1))]
        return np.append(np.asarray(design_matrix(calls, chunk, attention=True, seq=True)[0], dtype=float), 1.0)
    return batch_features(n, prompt, output, chunk)


# --------------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------------


def fit_constants(a: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """Coefficients ``>= 0`` minimising the sum of ``|a x / y - 1|`` (an L1 fit of relative errors; a
    linear program, ``gateway.sim.calibrate.l1_relative_fit``), one per column of ``a``. Raises
    ``CalibrationError`` when there is nothing to fit or the solver fails."""
    k = a.shape[1] if a.ndim == 2 else 0
    if len(y) == 0 or k == 0 or a.shape[0] != len(y) or not np.all(y > 0):
        raise CalibrationError("no measured probe to fit (every probe failed or the budget ended first)")
    try:
        return l1_relative_fit(a, y)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


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


@dataclass
class CalibrationResult:
    """Everything ``hexflow calibrate`` measured and fitted."""

    worker: str
    model: str
    gpu: str
    tp: int
    settings: PlanSettings
    measurements: list[Measurement]
    constants: Vector
    kv_capacity_tokens: int | None
    kv_source: str
    prefix_ratio: float | None
    """Latency of the repeated prompt over its first send (well below 1: prefix caching is on)."""
    prefix_hits_tokens: float | None
    backoffs: int
    backoff_s: float
    skipped: int
    stopped_by_budget: bool
    planned: int
    wall_s: float
    budget_s: float
    measured_at: str
    metrics_available: bool
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
        x, t, c, o, a, q, h = self.constants
        s = self.settings
        return PerfProfile(
            self.gpu,
            self.model,
            max(x, MIN_POSITIVE),
            max(t, MIN_POSITIVE),
            c,
            o,
            kv,
            s.max_num_seqs,
            s.max_batched_tokens,
            a,
            self.block_tokens,
            q,
            h,
        )

    def errors(self) -> list[float]:
        """Relative error of each fitted probe."""
        return [m.error for m in self.fitted]

    def to_json(self) -> dict[str, Any]:
        """The JSON document (``--json``)."""
        num = finite_or_none
        return {
            "worker": self.worker,
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "measured_at": self.measured_at,
            "constants": dict(zip(FITTED, self.constants, strict=True)),
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_source": self.kv_source,
            "block_tokens": self.block_tokens,
            "block_source": self.block_source,
            "max_num_seqs": self.settings.max_num_seqs,
            "max_batched_tokens": self.settings.max_batched_tokens,
            "prefix_ratio": num(self.prefix_ratio),
            "prefix_hits_tokens": num(self.prefix_hits_tokens),
            "backoffs": self.backoffs,
            "backoff_s": self.backoff_s,
            "skipped": self.skipped,
            "stopped_by_budget": self.stopped_by_budget,
            "planned": self.planned,
            "wall_s": self.wall_s,
            "budget_s": self.budget_s,
            "probes": self.probes_json(),
        }

    def probes_json(self) -> list[dict[str, Any]]:
        """Every probe: its shape, measured and fitted latency and the fit's error (null for the prefix
        repeat, which is not fitted)."""
        num = finite_or_none
        return [
            {
                "kind": m.probe.kind,
                "concurrency": m.probe.concurrency,
                "prompt_tokens": m.prompt_tokens,
                "output_tokens": m.output_tokens,
                "measured_s": m.latency_s,
                "fitted_s": num(m.fitted_s),
                "error": num(m.error) if m.probe.kind != "prefix" else None,
                "others_running": m.others_running,
            }
            for m in self.measurements
        ]


@dataclass
class _Load:
    running: float | None
    waiting: float | None
    kv_usage: float | None
    kv_tokens: int | None
    prefix_hits: float | None
    block_tokens: int | None = None

    @property
    def queued(self) -> float:
        """Others' requests waiting on the worker (0 where it does not say)."""
        return self.waiting or 0.0


def _load_from(text: str) -> _Load:
    fam = parse_families(text)

    def total(name: str) -> float | None:
        rows = fam.get(name)
        return sum(v for _, v in rows) if rows else None

    usage_rows = fam.get(KV_CACHE_USAGE) or fam.get(KV_CACHE_USAGE_OLD)
    usage = statistics.fmean(v for _, v in usage_rows) if usage_rows else None
    kv: int | None = None
    block: int | None = None
    for labels, _ in fam.get(CACHE_CONFIG_INFO, []):
        with contextlib.suppress(KeyError, ValueError):
            block = int(labels["block_size"])
        # vLLM 0.32 labels the capacity in tokens; older versions give blocks and the block size.
        with contextlib.suppress(KeyError, ValueError):
            kv = int(labels["kv_cache_size_tokens"])
            continue
        with contextlib.suppress(KeyError, ValueError):
            kv = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    if kv is not None and kv < 1:
        kv = None
    if block is not None and block < 1:
        block = None
    return _Load(total(RUNNING), total(WAITING), usage, kv, total(PREFIX_HITS), block)


class ProbeWorker:
    """The HTTP side of a calibration: one completion request, one ``/metrics`` read (None when there are
    none)."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.model = model
        self.salt = secrets.token_hex(8)
        """Salts every prompt of this calibration: a second calibration of the same worker must not hit the
        blocks the first one left in its prefix cache."""

    async def load(self) -> _Load | None:
        try:
            r = await self.client.get(f"{self.url}/metrics", timeout=5.0)
            if r.status_code != 200:
                return None
            return _load_from(r.text)
        except (httpx.HTTPError, MetricsParseError):
            return None

    async def load_when_quiet(
        self,
        deadline: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        on_wait: Callable[[float, float], None] | None = None,
    ) -> _Load | None:
        """The worker's load once none of others' requests wait on it: while some do, back off (1 s,
        doubling up to 30 s; ``on_wait(waiting, seconds)`` before each wait) until ``deadline``, when the
        last read, still showing waiting requests, is returned. None when the worker has no metrics."""
        delay = BACKOFF_FIRST_S
        load = await self.load()
        while load is not None and load.queued > 0:
            wait = min(delay, deadline - clock())
            if wait <= 0:
                break
            if on_wait is not None:
                on_wait(load.queued, wait)
            await sleep(wait)
            delay = min(delay * 2, BACKOFF_MAX_S)
            load = await self.load()
        return load

    async def complete(
        self, probe: Probe, clock: Callable[[], float], timeout_s: float, member: int = 0
    ) -> tuple[float, int, int]:
        """(latency, prompt tokens, completion tokens) of request ``member`` of ``probe``. Each request of a
        batch has its own prompt: identical prompts would hit the prefix cache once the first one's blocks
        are computed, and the batch would measure the cache instead of the batch."""
        rng = random.Random(f"{self.salt}/{probe.seed}/{member}")
        ids = [rng.randrange(*TOKEN_ID_RANGE) for _ in range(probe.prompt)]
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": probe.output,
            "min_tokens": probe.output,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": False,
        }
        t0 = clock()
        try:
            r = await self.client.post(f"{self.url}/v1/completions", json=body, timeout=max(timeout_s, 0.001))
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise CalibrationError(f"{self.url}: request failed ({type(exc).__name__})") from None
        dt = clock() - t0
        if r.status_code != 200:
            # The body is the worker's; its message may quote the prompt, so only the status is shown.
            raise CalibrationError(f"{self.url}/v1/completions answered HTTP {r.status_code}")
        try:
            usage = r.json()["usage"]
            return dt, int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            raise CalibrationError(f"{self.url}/v1/completions: a response without usage counts") from None


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


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
    own = client is None
    http = client or httpx.AsyncClient(
        limits=httpx.Limits(max_connections=min(s.max_concurrency, s.max_num_seqs) + 2),
        timeout=httpx.Timeout(60.0, connect=10.0),
    )
    w = ProbeWorker(http, worker, model)
    t_start = clock()
    deadline = t_start + budget_s
    chunk = s.max_batched_tokens
    measured: list[Measurement] = []
    backoffs, backoff_s, skipped = 0, 0.0, 0
    stopped = False
    metrics_seen = False
    kv_found: int | None = None
    block_found: int | None = None
    kv_usage_est: int | None = None
    prefix_hits: list[float] = []
    constants: Vector | None = None
    coef: np.ndarray | None = None

    def refit() -> None:
        nonlocal constants, coef
        rows = [m for m in measured if m.probe.kind != "prefix"]
        if len({(m.probe.concurrency, m.prompt_tokens, m.output_tokens) for m in rows}) >= 4:
            a = np.array([m.features(chunk) for m in rows])
            c = fit_constants(a, np.array([m.latency_s for m in rows]))
            constants, coef = (c[0], c[1], c[2], c[3], c[4], c[5], c[6]), np.array(c)

    def predict(p: Probe) -> float | None:
        """The probe's wall time by the fit so far (a step probe: both its batches)."""
        if coef is None:
            return None
        parts = (
            [p]
            if p.kind != "step"
            else [replace(p, kind="batch"), replace(p, kind="batch", output=step_short(p.output))]
        )
        return sum(float(probe_features(q.kind, q.concurrency, q.prompt, q.output, chunk) @ coef) for q in parts)

    from tqdm import tqdm

    bar = tqdm(total=len(plan), desc="calibrate", unit="probe", disable=not progress, leave=False)

    def on_wait(waiting: float, wait_s: float) -> None:
        nonlocal metrics_seen, backoffs, backoff_s
        metrics_seen = True
        backoffs += 1
        backoff_s += wait_s
        bar.set_postfix_str(f"backing off: {waiting:g} waiting")

    try:
        for probe in plan:
            bar.update(1)
            # Back off while others' requests queue on the worker (never add load to a queue).
            load = await w.load_when_quiet(deadline, clock, sleep, on_wait)
            remaining = deadline - clock()
            if remaining <= 0:
                stopped = True
                break
            if load is not None:
                metrics_seen = True
                if load.kv_tokens is not None:
                    kv_found = load.kv_tokens
                if load.block_tokens is not None:
                    block_found = load.block_tokens
                if load.prefix_hits is not None:
                    prefix_hits.append(load.prefix_hits)
                if load.queued > 0:  # the budget ended while backing off
                    stopped = True
                    break
            guess = predict(probe)
            if guess is not None and guess * 1.2 > remaining:
                skipped += 1
                continue
            bar.set_postfix_str(f"{probe.kind} {probe.concurrency}x{probe.prompt}+{probe.output}")
            watch: asyncio.Task[int | None] | None = None
            if probe.kind == "batch" and guess is not None and kv_tokens is None and constants is not None:
                watch = asyncio.ensure_future(_watch_usage(w, probe, guess, constants, sleep, clock))
            shorts: list[tuple[float, int, int]] = []
            try:
                async with asyncio.timeout(remaining):
                    results = await asyncio.gather(
                        *(w.complete(probe, clock, remaining, j) for j in range(probe.concurrency))
                    )
                    if probe.kind == "step":
                        short = replace(probe, output=step_short(probe.output))
                        left = max(deadline - clock(), 0.001)
                        shorts = await asyncio.gather(
                            *(w.complete(short, clock, left, probe.concurrency + j) for j in range(probe.concurrency))
                        )
            except (TimeoutError, httpx.TimeoutException):
                stopped = True
                break
            finally:
                if watch is not None:
                    if watch.done() and not watch.cancelled() and watch.exception() is None:
                        kv_usage_est = watch.result() or kv_usage_est
                    watch.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watch
            others = None if load is None else load.running
            whole = Measurement(
                probe,
                _median([r[0] for r in results]),
                _median_int([r[1] for r in results]),
                _median_int([r[2] for r in results]),
                others,
            )
            got = _step_measurement(whole, results, shorts) if probe.kind == "step" else whole
            if got is None:
                continue
            measured.append(got)
            if probe.kind != "prefix":
                refit()
        load = await w.load()
        if load is not None and load.prefix_hits is not None:
            prefix_hits.append(load.prefix_hits)
    finally:
        bar.close()
        if own:
            await http.aclose()
    wall = clock() - t_start
    refit()
    if constants is None or coef is None:
        raise CalibrationError(
            f"fewer than 4 distinct probes measured within the budget of {budget_s:g} s; raise --budget-s"
        )
    for m in measured:
        m.fitted_s = float(m.features(chunk) @ coef)
    if kv_tokens is not None:
        kv, kv_source = kv_tokens, "--kv-tokens"
    elif kv_found is not None:
        kv, kv_source = kv_found, CACHE_CONFIG_INFO
    elif kv_usage_est is not None:
        kv, kv_source = kv_usage_est, f"estimated from {KV_CACHE_USAGE} during the largest batch probe (coarse)"
    else:
        kv, kv_source = None, "unknown"
    block, block_source = (block_found, CACHE_CONFIG_INFO) if block_found is not None else (BLOCK_TOKENS, "default")
    first = next((m for m in measured if m.probe.kind == "lone" and _same_prompt(m, measured)), None)
    again = next((m for m in measured if m.probe.kind == "prefix"), None)
    ratio = again.latency_s / first.latency_s if first is not None and again is not None else None
    hits = prefix_hits[-1] - prefix_hits[0] if len(prefix_hits) >= 2 else None
    return CalibrationResult(
        worker=worker,
        model=model,
        gpu=gpu,
        tp=tp,
        settings=s,
        measurements=measured,
        constants=constants,
        kv_capacity_tokens=kv,
        kv_source=kv_source,
        prefix_ratio=ratio,
        prefix_hits_tokens=hits,
        backoffs=backoffs,
        backoff_s=backoff_s,
        skipped=skipped,
        stopped_by_budget=stopped,
        planned=len(plan),
        wall_s=wall,
        budget_s=budget_s,
        measured_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        metrics_available=metrics_seen,
        block_tokens=block,
        block_source=block_source,
    )


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
    if load is None or not load.kv_usage or load.running is None or load.running < 1:
        return None
    x, t, c, o, a, q, h = constants
    n, p = probe.concurrency, probe.prompt
    elapsed = clock() - t0 - o - n * h - (x + t * n * p + a * n * p * (p + 1) / 2)
    step = x + (t + q) * n + c * n * p
    k = min(probe.output, max(0.0, elapsed / step)) if step > 0 else 0.0
    return int(load.running * (p + k) / load.kv_usage)


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _fmt_num(v: float) -> float:
    return float(f"{v:.6g}")


def profile_entry(
    res: CalibrationResult, *, kv_capacity_tokens: int | None = None, scale: float = 1.0
) -> dict[str, Any]:
    """The measured profile as one ``gpus.yaml`` entry (``ProfileSpec``'s fields), time constants divided
    by ``scale`` and rounded to 6 significant digits."""
    prof = scaled_profile(res, scale, kv_capacity_tokens=kv_capacity_tokens)
    return {
        "tp": res.tp,
        "iter_base_s": _fmt_num(prof.iter_base_s),
        "token_s": _fmt_num(prof.token_s),
        "ctx_s": _fmt_num(prof.ctx_s),
        "request_overhead_s": _fmt_num(prof.request_overhead_s),
        "kv_capacity_tokens": prof.kv_capacity_tokens,
        "max_num_seqs": prof.max_num_seqs,
        "max_batched_tokens": prof.max_batched_tokens,
        "attn_s": _fmt_num(prof.attn_s),
        "block_tokens": prof.block_tokens,
        "seq_s": _fmt_num(prof.seq_s),
        "admit_s": _fmt_num(prof.admit_s),
        "basis": f"measured: hexflow calibrate at {res.measured_at}, {len(res.fitted)} probes",
    }


def render_profile_yaml(res: CalibrationResult, *, kv_capacity_tokens: int | None = None, scale: float = 1.0) -> str:
    """A ``profiles`` section holding the measured entry, in ``config/gpus.yaml``'s format.

    Comment lines above it say what was measured, when, against what, and each probe's fit error.
    ``scale`` divides the time constants (an emulated worker's time scale: modelled seconds).
    """
    errs = [abs(e) for e in res.errors()]
    unit = "wall seconds" if scale == 1.0 else f"modelled seconds (wall seconds / time scale {scale:g})"
    lines = [
        f"# Measured by hexflow calibrate at {res.measured_at} against {res.worker} (model {res.model}):",
        f"# {len(res.measurements)} of {res.planned} planned probes in {res.wall_s:.0f} s (budget {res.budget_s:g} s)"
        f"{', stopped by the budget' if res.stopped_by_budget else ''}; {res.backoffs} back-offs; constants in {unit}.",
        f"# Fit: L1 of relative error; median |error| {statistics.median(errs):.1%}, largest {max(errs):.1%}.",
        f"# kv_capacity_tokens: {res.kv_source if kv_capacity_tokens is None else 'given'}; block_tokens: "
        f"{res.block_source}; max_num_seqs and max_batched_tokens: as given (vLLM does not export them).",
        "#",
        f"# {'probe':<7}{'n':>4}{'in':>7}{'out':>6}{'measured_s':>12}{'fitted_s':>11}{'error':>8}",
    ]
    for m in res.measurements:
        err = f"{m.error:>+8.1%}" if m.probe.kind != "prefix" else f"{'-':>8}"
        lines.append(
            f"# {m.probe.kind:<7}{m.probe.concurrency:>4}{m.prompt_tokens:>7}{m.output_tokens:>6}"
            f"{m.latency_s:>12.4f}{m.fitted_s:>11.4f}{err}"
        )
    entry = profile_entry(res, kv_capacity_tokens=kv_capacity_tokens, scale=scale)
    body = yaml.safe_dump({"profiles": {res.model: {res.gpu: entry}}}, sort_keys=False)
    return "\n".join(lines) + "\n" + body


def scaled_profile(res: CalibrationResult, scale: float, **kw: Any) -> PerfProfile:
    """The fitted profile with its time constants divided by ``scale`` (modelled seconds of an emulated
    worker at that time scale)."""
    return time_scaled(res.profile(**kw), 1.0 / scale)


def format_report(res: CalibrationResult) -> str:
    """The text ``hexflow calibrate`` prints: constants, KV capacity, prefix caching, fit error."""
    x, t, c, o, a, q, h = res.constants
    errs = [abs(e) for e in res.errors()]
    worst = max(res.fitted, key=lambda m: abs(m.error))
    others = sum(1 for m in res.measurements if m.others_running)
    lines = [
        f"{res.worker} ({res.model}): {len(res.measurements)}/{res.planned} probes in {res.wall_s:.1f} s of a "
        f"{res.budget_s:g} s budget" + (" (stopped by the budget)" if res.stopped_by_budget else ""),
        f"  iter_base_s {x:.6g}  token_s {t:.6g}  ctx_s {c:.6g}  request_overhead_s {o:.6g}  attn_s {a:.6g}  "
        f"seq_s {q:.6g}  admit_s {h:.6g}  (wall seconds)",
        f"  kv_capacity_tokens {res.kv_capacity_tokens if res.kv_capacity_tokens is not None else 'unknown'} "
        f"({res.kv_source}); block_tokens {res.block_tokens} ({res.block_source})",
        f"  fit: median |error| {statistics.median(errs):.1%}, largest {max(errs):.1%} "
        f"({worst.probe.kind} {worst.probe.concurrency}x{worst.prompt_tokens}+{worst.output_tokens})",
    ]
    if res.prefix_ratio is not None:
        hits = (
            "" if res.prefix_hits_tokens is None else f", vllm:prefix_cache_hits +{res.prefix_hits_tokens:.0f} tokens"
        )
        # The hit counter is the engine's own word; without it, a repeat well below the first send's latency.
        on = res.prefix_hits_tokens > 0 if res.prefix_hits_tokens is not None else res.prefix_ratio < PREFIX_ON_RATIO
        verdict = "prefix caching is on" if on else "no sign of prefix caching"
        lines.append(f"  repeated prompt: {res.prefix_ratio:.2f} x the first send's latency{hits} ({verdict})")
    if not res.metrics_available:
        lines.append("  the worker has no readable /metrics: no back-off on queued traffic was possible")
    lines.append(f"  back-offs {res.backoffs} ({res.backoff_s:.1f} s), probes skipped for the budget {res.skipped}")
    if others:
        lines.append(f"  {others} probes ran alongside others' requests: their latencies include a share of those")
    return "\n".join(lines)


def plot_fit(res: CalibrationResult, path: Path) -> None:
    """Measured against fitted latency, one point per probe, coloured by kind (log-log, with y = x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for kind, colour in (("lone", "tab:blue"), ("batch", "tab:orange"), ("prefix", "tab:green")):
        ms = [m for m in res.measurements if m.probe.kind == kind]
        if not ms:
            continue
        ax1.scatter([m.latency_s for m in ms], [m.fitted_s for m in ms], s=18, c=colour, label=kind)
        if kind != "prefix":
            ax2.scatter([m.latency_s for m in ms], [100 * m.error for m in ms], s=18, c=colour, label=kind)
    lo = min(m.latency_s for m in res.measurements) * 0.8
    hi = max(m.latency_s for m in res.measurements) * 1.25
    ax1.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("measured latency (s)")
    ax1.set_ylabel("fitted latency (s)")
    ax1.legend(fontsize=8)
    ax2.axhline(0, color="grey", lw=1)
    ax2.set_xscale("log")
    ax2.set_xlabel("measured latency (s)")
    ax2.set_ylabel("fit error (%)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"hexflow calibrate: {res.gpu}/{res.model} at {res.worker}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The probe plan of ``hexflow calibrate`` and the model of each probe: which requests to send, and what each
one's latency is in the profile's constants (the rows of the L1 fit, ``fit_constants``). The probes and why
each is there: docs/architecture.md, "Fitting profiles"."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gateway.errors import GatewayError
from gateway.profiling.lpfit import l1_relative_fit

STEP_MIN_OUTPUT = 8
"""The shortest long output of a step probe (shorter, and its difference of latencies is mostly noise)."""
Vector = tuple[float, float, float, float, float, float, float]
"""The fitted constants in ``TIME_CONSTANTS``' order (a probe's coefficient row's)."""


class CalibrationError(GatewayError):
    """The calibration cannot run or cannot produce a profile (no probe answered, no KV capacity, ...)."""


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
        """Raise ``ValueError`` naming the first setting below its least value (``LEAST``)."""
        for name, least in LEAST.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name.replace('_', '-')} must be >= {least}")


LEAST = {"max_prompt": 32, "max_output": 1, "max_concurrency": 1, "max_num_seqs": 1, "max_batched_tokens": 16}
LEAST |= {"repeats": 1, "step_output": STEP_MIN_OUTPUT}
"""The least value of each ``PlanSettings`` field."""


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
    seeds = itertools.count(1)
    for rep in range(s.repeats):
        shapes = [("lone", p, o, 1) for p, o in grid] + ([("lone", b_prompt, b_out, 1)] if rep == 0 else [])
        shapes += [("batch", b_prompt, b_out, n) for n in sizes] + [("batch", b_prompt, b_out_short, n) for n in sizes]
        shapes += [("batch", long_prompt, b_out, n) for n in long_sizes]
        shapes += [("step", p, min(s.step_output, longest - p), n) for n, p in steps]
        out += [Probe(kind, p, o, n, next(seeds)) for kind, p, o, n in shapes]
        if rep == 0:
            # The same prompt twice: the first is an ordinary lone probe, the second may hit the cache.
            seed, p = next(seeds), max(32, min(s.max_prompt, 1024))
            out += [Probe("lone", p, 1, 1, seed), Probe("prefix", p, 1, 1, seed)]
    return out


def batch_features(n: int, prompt: int, output: int, chunk: int) -> np.ndarray:
    """Coefficients of ``TIME_CONSTANTS`` in the mean latency of ``n`` requests of one shape that arrive together, from
    their iteration schedule (as ``gateway.sim.engine`` runs it). The schedule depends on the token counts only,
    so each latency is linear in the constants: the overhead, every iteration's ``t_iter`` terms, and ``n``
    intakes (``admit_s``: all are admitted in the first iteration). With ``n = 1``: ``PerfProfile.single_latency``.
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
    """The coefficient row of one measured probe (a lone probe or a batch: ``batch_features``; a ``step`` probe: its
    long and short batches' rows differenced over their outputs' difference, ``short`` defaulting to
    ``step_short(output)``)."""
    if kind == "step":
        lo = step_short(output) if short is None else short
        if not 1 <= lo < output:
            raise ValueError(f"a step probe needs a short output below its long one, got {lo} and {output}")
        diff: np.ndarray = (batch_features(n, prompt, output, chunk) - batch_features(n, prompt, lo, chunk)) / (
            output - lo
        )
        return diff
    return batch_features(n, max(prompt, 1), max(output, 1), chunk)


def fit_constants(a: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """Coefficients ``>= 0`` minimising the sum of ``|a x / y - 1|`` (an L1 fit of relative errors; a
    linear program, ``gateway.profiling.lpfit.l1_relative_fit``), one per column of ``a``. Raises
    ``CalibrationError`` when there is nothing to fit or the solver fails."""
    try:
        return l1_relative_fit(a, y)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None

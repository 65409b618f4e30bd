"""Slow online refit of a worker's profile constants from the calls it completed.

``Refitter`` holds the decisions (bounded steps and drift, acceptance by error and gain) and no I/O: the
simulator calls ``step``; the live task (``gateway.live.refit``) takes ``jobs``, runs ``fit_job`` in a thread
and ``apply``s the outcomes (docs/architecture.md, "Fitting profiles")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gateway.core.latency import LatencyModel
from gateway.core.profile import TIME_CONSTANTS, PerfProfile
from gateway.core.samples import CallSample
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.profiling.fit import FITTED, round_sig
from gateway.profiling.lpfit import l1_relative_fit

RESULTS = ("applied", "kept", "rejected", "skipped", "failed")
"""Outcome labels of one refit attempt (``hexflow_profile_refits_total{result}``)."""


@dataclass(frozen=True, slots=True)
class RefitSettings:
    """The refit's knobs (``refit`` in gateway.yaml; see the module docstring)."""

    interval_s: float = 60.0
    min_calls: int = 200
    window_calls: int = 1000
    max_step: float = 1.5
    max_drift: float = 8.0
    max_error: float = 0.3
    min_gain: float = 0.2

    def __post_init__(self) -> None:
        checks = {
            f"interval_s must be positive, got {self.interval_s}": self.interval_s > 0,
            f"min_calls must be in [1, window_calls], got {self.min_calls}": 1 <= self.min_calls <= self.window_calls,
            "max_step must be > 1 and max_drift >= max_step": 1.0 < self.max_step <= self.max_drift,
            "max_error must be positive and min_gain in [0, 1)": self.max_error > 0.0 and 0.0 <= self.min_gain < 1.0,
        }
        for problem, ok in checks.items():
            if not ok:
                raise ValueError(problem)


def sample_rows(samples: Sequence[CallSample], model: LatencyModel) -> tuple[np.ndarray, np.ndarray]:
    """``(a, y)``: per sample, the coefficients of the profile's constants in its predicted latency
    (``LatencyModel.sample_terms``: ``FITTED``, then ``attn_s``, ``seq_s`` and ``admit_s``), and its observed one."""
    a = np.array(
        [model.sample_terms(s.prefill_tokens, s.output_tokens, s.batch_n, s.batch_ctx, s.wait_tokens) for s in samples],
        dtype=float,
    ).reshape(len(samples), 7)
    y = np.array([s.observed_s for s in samples], dtype=float)
    return a, y


def constants_of(p: PerfProfile) -> tuple[float, float, float, float, float, float, float]:
    """The profile's ``TIME_CONSTANTS`` (``FITTED``, then ``attn_s``, ``seq_s`` and ``admit_s``: the columns of
    ``sample_rows``)."""
    return (p.iter_base_s, p.token_s, p.ctx_s, p.request_overhead_s, p.attn_s, p.seq_s, p.admit_s)


def median_error(a: np.ndarray, y: np.ndarray, x: Sequence[float]) -> float:
    """Median ``|a x / y - 1|``: how far the constants ``x`` are from the observed latencies, typically."""
    return float(np.median(np.abs(a @ np.asarray(x, dtype=float) / y - 1.0)))


def refit_bounds(
    current: PerfProfile, base: PerfProfile, max_step: float, max_drift: float
) -> tuple[list[float], list[float]]:
    """Per ``FITTED`` constant (the ones the refit changes): within ``max_step`` x of the current value and
    ``max_drift`` x of the base; then ``attn_s``, ``seq_s`` and ``admit_s``, held at the current values:
    completed calls do not say where their cached prefixes ended, decoding calls are collinear with ``token_s``'s
    decode share, and a call's intake with ``request_overhead_s`` (``hexflow calibrate`` measures them)."""
    lower: list[float] = []
    upper: list[float] = []
    k = len(FITTED)
    for cur, b in zip(constants_of(current)[:k], constants_of(base)[:k], strict=True):
        lo = max(cur / max_step, b / max_drift)
        hi = min(cur * max_step, b * max_drift)
        if lo > hi:  # the current value lies outside the drift bounds (base changed): come back to them
            lo = hi = min(max(cur, b / max_drift), b * max_drift)
        lower.append(lo)
        upper.append(hi)
    lower += [current.attn_s, current.seq_s, current.admit_s]
    upper += [current.attn_s, current.seq_s, current.admit_s]
    return lower, upper


@dataclass(frozen=True, slots=True)
class FitJob:
    """One worker's refit, taken on the driver's loop: its data and its profile at that moment."""

    worker: int
    info: WorkerInfo
    base: PerfProfile
    samples: tuple[CallSample, ...]


@dataclass(frozen=True, slots=True)
class FitOutcome:
    """What ``fit_job`` decided: ``result`` (one of ``RESULTS``), the new profile when applied, the median
    relative errors of the current and the fitted constants on the window, and why."""

    job: FitJob
    result: str
    profile: PerfProfile | None
    current_error: float | None
    fit_error: float | None
    reason: str


def fit_job(job: FitJob, s: RefitSettings) -> FitOutcome:
    """Fit the job's worker and decide (pure CPU: runs in a thread live). A fit within the drift bounds alone
    says whether the model describes the worker (else ``rejected``); the step, within ``max_step`` too, is
    applied when it beats the current constants by ``min_gain`` (else ``kept``), so a far worker takes several."""
    cur = job.info.profile
    a, y = sample_rows(job.samples, LatencyModel(cur))
    keep = y > 0
    a, y = a[keep], y[keep]
    if len(y) < s.min_calls:
        return FitOutcome(job, "skipped", None, None, None, f"{len(y)} calls (at least {s.min_calls})")
    cur_err = median_error(a, y, constants_of(cur))
    free_lo, free_hi = refit_bounds(job.base, job.base, s.max_drift, s.max_drift)
    lower, upper = refit_bounds(cur, job.base, s.max_step, s.max_drift)
    try:
        best = median_error(a, y, l1_relative_fit(a, y, free_lo, free_hi))
        x = l1_relative_fit(a, y, lower, upper)
    except ValueError as exc:
        return FitOutcome(job, "failed", None, cur_err, None, str(exc))
    err = median_error(a, y, x)
    if best > s.max_error:
        why = f"best fit error {best:.1%} above {s.max_error:.0%}: the model does not fit"
        return FitOutcome(job, "rejected", None, cur_err, err, why)
    if err > cur_err * (1.0 - s.min_gain) or cur_err - err < 0.01:
        return FitOutcome(job, "kept", None, cur_err, err, f"fit error {err:.1%} vs current {cur_err:.1%}")
    new = replace(cur, iter_base_s=x[0], token_s=x[1], ctx_s=x[2], request_overhead_s=x[3])
    return FitOutcome(job, "applied", new, cur_err, err, f"fit error {err:.1%} (was {cur_err:.1%}; best {best:.1%})")


@dataclass
class WorkerRefit:
    """The refit's memory of one worker (by name): its configured profile and its last attempt."""

    base: PerfProfile
    base_source: str
    attempted_total: int = 0
    """``SampleLog.added`` at the last attempt (a new attempt waits for ``min_calls // 4`` more calls)."""
    last_at: float | None = None
    last_applied_at: float | None = None
    last: FitOutcome | None = None
    """The last attempt's outcome, with the result and reason ``apply`` recorded."""
    applied: int = 0
    counts: dict[str, int] = field(default_factory=dict)


class Refitter:
    """Which workers are due, the fit, and applying it (the module docstring); no clock, no I/O."""

    def __init__(self, settings: RefitSettings) -> None:
        self.s = settings
        self.state: dict[str, WorkerRefit] = {}

    def attach(self, sched: Scheduler) -> None:
        """Make the scheduler keep the completed calls the refit needs."""
        sched.keep_samples(self.s.window_calls)

    def _state(self, info: WorkerInfo) -> WorkerRefit:
        st = self.state.get(info.name)
        if st is None or (st.base.gpu, st.base.model) != (info.profile.gpu, info.profile.model):
            st = self.state[info.name] = WorkerRefit(info.profile, info.profile_source)
        return st

    def forget(self, name: str) -> None:
        """Drop a worker that left."""
        self.state.pop(name, None)

    def jobs(self, sched: Scheduler) -> list[FitJob]:
        """The members due for an attempt, with a copy of their data (``min_calls`` in the window and
        ``min_calls // 4`` new since the last attempt)."""
        log = sched.samples
        if log is None:
            return []
        out: list[FitJob] = []
        members = sched.members()
        present = {sched.workers[w].name for w in members}
        for gone in [n for n in self.state if n not in present]:  # workers that left: bounded memory
            del self.state[gone]
        for w in members:
            info = sched.workers[w]
            st = self._state(info)
            added = log.added(w)
            if added - st.attempted_total < max(self.s.min_calls // 4, 1) or len(log.samples(w)) < self.s.min_calls:
                continue
            st.attempted_total = added
            out.append(FitJob(w, info, st.base, tuple(log.samples(w))))
        return out

    def apply(self, sched: Scheduler, out: FitOutcome, now: float) -> str:
        """Record an outcome and apply an accepted profile, unless the worker changed meanwhile (then the
        outcome is ``skipped``). Returns the result label."""
        job = out.job
        w = job.worker
        result = out.result
        if w >= len(sched.workers) or not sched.member[w] or sched.workers[w] is not job.info:
            result, reason = "skipped", "the worker changed during the fit"
        else:
            reason = out.reason
        st = self._state(job.info)
        st.last_at, st.last = now, replace(out, result=result, reason=reason)
        st.counts[result] = st.counts.get(result, 0) + 1
        if result == "applied" and out.profile is not None:
            sched.set_profile(w, out.profile, "refit")
            st.applied += 1
            st.last_applied_at = now
        return result

    def step(self, sched: Scheduler, now: float) -> list[tuple[str, FitOutcome]]:
        """Attempt every due worker now, synchronously (the simulator); ``(result, outcome)`` per attempt."""
        done: list[tuple[str, FitOutcome]] = []
        for job in self.jobs(sched):
            out = fit_job(job, self.s)
            done.append((self.apply(sched, out, now), out))
        return done

    def status(self, info: WorkerInfo, now: float) -> dict[str, Any]:
        """A worker's refit state for ``/v1/status``."""
        st = self.state.get(info.name)
        if st is None:
            return {"attempts": 0}
        ages = {"last_attempt_age_s": st.last_at, "last_refit_age_s": st.last_applied_at}
        last = st.last
        errors = {k: None if last is None else getattr(last, k) for k in ("current_error", "fit_error")}
        return {
            "attempts": sum(st.counts.values()),
            "applied": st.applied,
            "last_result": None if last is None else last.result,
            "last_reason": "" if last is None else last.reason,
            **{k: None if at is None else round(now - at, 3) for k, at in ages.items()},
            **{k: None if e is None else round(e, 4) for k, e in errors.items()},
            "configured_source": st.base_source,
        }


def profile_status(info: WorkerInfo) -> dict[str, Any]:
    """A worker's profile for ``/v1/status``: name, source and its time constants (the fitted ones,
    ``attn_s``, ``seq_s`` and ``admit_s``)."""
    p = info.profile
    return {
        "name": p.name,
        "source": info.profile_source,
        "constants": {k: round_sig(v) for k, v in zip(TIME_CONSTANTS, constants_of(p), strict=True)},
    }

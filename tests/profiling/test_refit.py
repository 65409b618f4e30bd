"""The slow profile refit: samples in the estimator's terms, a bounded robust fit, applied through the scheduler."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from gateway.config import load_gpu_catalog
from gateway.core.latency import LatencyModel
from gateway.core.profile import PerfProfile
from gateway.core.samples import CallSample
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.profiling.refit import (
    FitJob,
    RefitSettings,
    Refitter,
    constants_of,
    fit_job,
    refit_bounds,
    sample_rows,
)

MODEL = "llama-3.1-70b"


@pytest.fixture(scope="module")
def a100() -> PerfProfile:
    return load_gpu_catalog().profile("A100", MODEL)


def scaled(p: PerfProfile, k: float) -> PerfProfile:
    return replace(p, iter_base_s=p.iter_base_s * k, token_s=p.token_s * k, ctx_s=p.ctx_s * k)


def synthetic(truth: PerfProfile, n: int, rng: random.Random) -> list[CallSample]:
    """Completed calls whose latency is exactly what ``truth`` predicts for them."""
    raw = [
        CallSample(
            prefill_tokens=rng.randint(50, 9000),
            output_tokens=rng.randint(1, 400),
            batch_n=rng.randint(1, 40),
            batch_ctx=rng.uniform(0, 200_000),
            wait_tokens=rng.choice([0.0, 0.0, rng.uniform(0, 8000)]),
            observed_s=1.0,
            at=float(i),
        )
        for i in range(n)
    ]
    a, _ = sample_rows(raw, LatencyModel(truth))
    y = a @ np.array(constants_of(truth))
    return [replace(s, observed_s=float(v)) for s, v in zip(raw, y, strict=True)]


def job(profile: PerfProfile, samples: list[CallSample], base: PerfProfile | None = None) -> FitJob:
    return FitJob(0, WorkerInfo("w", profile, 16), base or profile, tuple(samples))


def test_a_samples_row_gives_the_latency_the_estimator_predicted_when_the_call_started(a100: PerfProfile) -> None:
    sched = Scheduler([WorkerInfo("w", a100, 8)], "lw-fcfs", random.Random(0))
    sched.keep_samples(100)
    calls = []
    for i, (n_in, n_out) in enumerate([(9000, 300), (300, 5), (4000, 50), (2500, 200)]):
        spec = CallSpec("revise", n_in, n_out)
        wf = StagedWorkflow(i, "t", 0.0, 500.0, [Stage(spec.kind, (spec,))])
        c = Call(i, wf, spec, 0.0)
        sched.submit(c, float(i) * 0.01)
        popped = sched.pop_next(0, float(i) * 0.01)
        assert popped is c
        calls.append(c)
    for c in calls:
        sched.on_finish(c, 10.0, observed_s=3.0)
    assert sched.samples is not None
    samples = sched.samples.samples(0)
    a, y = sample_rows(samples, LatencyModel(a100))
    predicted = a @ np.array(constants_of(a100))
    assert predicted == pytest.approx([c.model_s for c in calls], rel=1e-6)
    assert list(y) == [3.0] * 4
    assert [s.batch_n for s in samples] == [1, 2, 3, 4]


def test_a_refit_recovers_constants_within_one_step_of_the_current(a100: PerfProfile) -> None:
    truth = scaled(a100, 1.3)
    out = fit_job(job(a100, synthetic(truth, 400, random.Random(1))), RefitSettings(min_calls=100))
    assert out.result == "applied"
    assert out.profile is not None
    assert out.fit_error is not None and out.fit_error < 0.01
    assert out.profile.iter_base_s == pytest.approx(truth.iter_base_s, rel=0.02)
    assert out.profile.token_s == pytest.approx(truth.token_s, rel=0.02)
    # Capacities are configuration, never fitted.
    assert (out.profile.kv_capacity_tokens, out.profile.max_num_seqs) == (a100.kv_capacity_tokens, a100.max_num_seqs)


def test_a_refit_moves_each_constant_at_most_max_step_and_converges_over_steps(a100: PerfProfile) -> None:
    truth = scaled(a100, 2.0)
    samples = synthetic(truth, 400, random.Random(2))
    s = RefitSettings(min_calls=100, max_step=1.5)
    cur = a100
    for _ in range(2):
        out = fit_job(job(cur, samples, base=a100), s)
        assert out.result == "applied"
        assert out.profile is not None
        for new, old in zip(constants_of(out.profile), constants_of(cur), strict=True):
            assert old / 1.5 * 0.999 <= new <= old * 1.5 * 1.001
        cur = out.profile
    assert cur.iter_base_s == pytest.approx(truth.iter_base_s, rel=0.02)
    assert fit_job(job(cur, samples, base=a100), s).result == "kept"  # converged: nothing left to gain


def test_a_refit_never_leaves_max_drift_of_the_configured_profile(a100: PerfProfile) -> None:
    lower, upper = refit_bounds(scaled(a100, 3.0), a100, max_step=1.5, max_drift=4.0)
    assert upper[0] == pytest.approx(a100.iter_base_s * 4.0)
    assert lower[0] == pytest.approx(a100.iter_base_s * 2.0)
    truth = scaled(a100, 10.0)
    out = fit_job(
        job(scaled(a100, 3.0), synthetic(truth, 300, random.Random(3)), base=a100),
        RefitSettings(min_calls=100, max_drift=4.0),
    )
    assert out.profile is None or out.profile.iter_base_s <= a100.iter_base_s * 4.0 * 1.0001


def test_one_bad_minute_among_many_calls_barely_moves_the_fit(a100: PerfProfile) -> None:
    truth = scaled(a100, 1.2)
    good = synthetic(truth, 450, random.Random(4))
    bad = [replace(s, observed_s=s.observed_s * 6.0) for s in synthetic(truth, 50, random.Random(5))]
    out = fit_job(job(a100, good + bad), RefitSettings(min_calls=100))
    assert out.result == "applied"
    assert out.profile is not None
    assert out.profile.iter_base_s == pytest.approx(truth.iter_base_s, rel=0.05)
    assert out.profile.token_s == pytest.approx(truth.token_s, rel=0.05)


@pytest.mark.parametrize(
    ("case", "result"),
    [("few", "skipped"), ("right", "kept"), ("noise", "rejected")],
)
def test_a_refit_is_applied_only_when_it_fits_and_gains(a100: PerfProfile, case: str, result: str) -> None:
    rng = random.Random(6)
    samples = synthetic(a100, 300, rng)
    if case == "few":
        samples = samples[:50]
    elif case == "noise":  # latencies the model cannot describe: uniform noise
        samples = [replace(s, observed_s=s.observed_s * rng.uniform(0.2, 5.0)) for s in samples]
    out = fit_job(job(a100, samples), RefitSettings(min_calls=100))
    assert out.result == result
    assert out.profile is None


def test_set_profile_restarts_the_ratio_keeps_the_load_and_reuses_profile_groups(a100: PerfProfile) -> None:
    sched = Scheduler([WorkerInfo("w", a100, 8), WorkerInfo("v", a100, 8)], "lw-fcfs", random.Random(0))
    spec = CallSpec("revise", 1000, 50)
    wf = StagedWorkflow(1, "t", 0.0, 500.0, [Stage(spec.kind, (spec,))])
    c = Call(1, wf, spec, 0.0)
    sched.submit(c, 0.0)
    assert sched.pop_next(c.worker, 0.0) is c
    sched.on_finish(c, 5.0, observed_s=5.0)
    w = c.worker
    assert sched.estimator.ratio(w, "revise", 5.0) != 1.0
    groups = []
    for k in (1.1, 1.2, 1.3, 1.4):
        sched.set_profile(w, scaled(a100, k))
        groups.append(len(sched.estimator._models))
    assert sched.estimator.ratio(w, "revise", 5.0) == 1.0
    assert sched.workers[w].profile_source == "refit"
    assert sched.workers[w].profile.iter_base_s == pytest.approx(a100.iter_base_s * 1.4)
    assert groups == [2, 2, 2, 2]  # the old group of the refitted worker is reused, not leaked


def test_a_refitter_applies_through_the_scheduler_and_skips_a_worker_that_changed(a100: PerfProfile) -> None:
    sched = Scheduler([WorkerInfo("w", a100, 8)], "lw-fcfs", random.Random(0))
    r = Refitter(RefitSettings(min_calls=100, window_calls=400))
    r.attach(sched)
    assert sched.samples is not None
    for s in synthetic(scaled(a100, 1.3), 300, random.Random(7)):
        sched.samples.add(0, s)
    jobs = r.jobs(sched)
    assert len(jobs) == 1
    assert r.jobs(sched) == []  # nothing new since the attempt
    sched.set_capacity(0, 4)  # the worker changed while the fit ran
    assert r.apply(sched, fit_job(jobs[0], r.s), 1.0) == "skipped"
    for s in synthetic(scaled(a100, 1.3), 100, random.Random(8)):
        sched.samples.add(0, s)
    [(result, _)] = r.step(sched, 2.0)
    assert result == "applied"
    assert sched.workers[0].profile_source == "refit"
    st = r.status(sched.workers[0], 3.0)
    assert st["applied"] == 1 and st["last_refit_age_s"] == pytest.approx(1.0)


def test_a_worker_further_than_one_step_away_is_stepped_even_while_the_step_still_misses(a100: PerfProfile) -> None:
    truth = scaled(a100, 2.5)
    samples = synthetic(truth, 300, random.Random(9))
    out = fit_job(job(a100, samples), RefitSettings(min_calls=100, max_error=0.05))
    # The best fit describes the worker (error ~0), so the capped step is taken although its own error is large.
    assert out.result == "applied"
    assert out.fit_error is not None and out.fit_error > 0.05
    assert out.profile is not None and out.profile.iter_base_s == pytest.approx(a100.iter_base_s * 1.5, rel=1e-3)

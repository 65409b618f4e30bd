"""Capacity planning (``gateway.bench.plan``): the mixes searched, the fluid bound of identical engines, and a
smoke-sized plan whose answer meets the SLO when simulated again while the cheaper mixes it lists do not."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from gateway.bench.bound import solve_fluid_bound
from gateway.bench.plan import (
    PlanReport,
    PlanSpec,
    enumerate_mixes,
    gpu_options,
    on_mix,
    reference_slo,
    run_plan,
)
from gateway.bench.simbench import Setup, run_point, standard_latency
from gateway.config import GpuCatalog, load_gpu_catalog, make_worker
from gateway.errors import UnknownNameError
from gateway.sim.workload import generate_chess_bird

MODEL = "llama-3.1-70b"
RATE = 0.2
"""With 60 workflows on one seed, A100 and L40S up to 4 workers: some mixes pruned, some missed, then one met."""


@pytest.fixture(scope="module")
def catalog() -> GpuCatalog:
    return load_gpu_catalog()


@pytest.fixture(scope="module")
def workload() -> Setup:
    queries = generate_chess_bird(60, random.Random(0))
    return Setup([], queries, "chess-bird", n_workflows=60, n_seeds=1, prefix_caching=True)


@pytest.fixture(scope="module")
def slo_s(catalog: GpuCatalog) -> float:
    return reference_slo(catalog, MODEL, ["A100", "L40S"], 5.0)[0]


@pytest.fixture(scope="module")
def report(catalog: GpuCatalog, workload: Setup, slo_s: float) -> PlanReport:
    spec = PlanSpec(model=MODEL, gpus=("A100", "L40S"), rate_qps=RATE, slo_s=slo_s, max_workers=4)
    return run_plan(catalog, workload, spec)


def test_mixes_are_every_count_vector_of_one_to_max_workers() -> None:
    mixes = list(enumerate_mixes(3, 4))
    assert len(mixes) == len(set(mixes)) == math.comb(4 + 3, 3) - 1
    assert all(len(m) == 3 and 1 <= sum(m) <= 4 and min(m) >= 0 for m in mixes)
    assert list(enumerate_mixes(1, 3)) == [(1,), (2,), (3,)]


def test_bound_of_identical_engines_equals_the_bound_of_the_engines_listed_one_by_one(catalog: GpuCatalog) -> None:
    queries = generate_chess_bird(40, random.Random(1))
    a = make_worker(catalog, name="a", gpu="A100", model=MODEL, capacity=None)
    lw = make_worker(catalog, name="l", gpu="L40S", model=MODEL, capacity=None)
    listed = solve_fluid_bound([a, a, a, lw, lw], queries, prefix_caching=True)
    grouped = solve_fluid_bound([a, lw], queries, prefix_caching=True, engines=[3, 2])
    assert grouped.rate_qps == pytest.approx(listed.rate_qps, rel=1e-6)
    assert grouped.calls_per_s[0] == pytest.approx(sum(listed.calls_per_s[:3]), rel=1e-6)
    assert max(grouped.gpu_busy) == pytest.approx(1.0, abs=1e-6)  # per engine, not per group
    with pytest.raises(ValueError, match="engines"):
        solve_fluid_bound([a, lw], queries, engines=[1, 0])


def test_slo_is_fixed_by_the_catalogue_reference_gpu_not_by_the_mix(catalog: GpuCatalog) -> None:
    a100 = make_worker(catalog, name="a", gpu="A100", model=MODEL, capacity=None)
    slo, ref = reference_slo(catalog, MODEL, ["L40S", "H100"], 5.0)
    assert ref == catalog.calibration.reference_gpu == "A100"
    assert slo == pytest.approx(5.0 * standard_latency([a100]))
    assert reference_slo(catalog, MODEL, ["H100"], 5.0)[0] == slo


def test_gpu_options_name_unknown_and_unprofiled_gpus(catalog: GpuCatalog) -> None:
    opts = gpu_options(catalog, MODEL, ["L40S", "A100"])
    assert [(o.gpu, o.tp) for o in opts] == [("L40S", 4), ("A100", 4)]
    assert opts[1].usd_per_hour == catalog.worker_usd_per_hour("A100", MODEL)
    with pytest.raises(UnknownNameError, match=r"unknown GPU 'A1000'; known: A100, A40"):
        gpu_options(catalog, MODEL, ["A1000"])
    data = catalog.model_dump()
    del data["profiles"]["llama-3.1-8b"]["L4"]
    partial = GpuCatalog.model_validate(data)
    with pytest.raises(ValueError, match=r"no profile for llama-3\.1-8b on L4; profiled GPUs: A100"):
        gpu_options(partial, "llama-3.1-8b", ["A100", "L4"])
    with pytest.raises(ValueError, match="listed twice"):
        gpu_options(catalog, MODEL, ["A100", "A100"])


def test_cost_needs_a_price_on_every_gpu_and_workers_is_the_fallback(
    catalog: GpuCatalog, workload: Setup, slo_s: float
) -> None:
    data = catalog.model_dump()
    data["gpus"]["L40S"]["usd_per_hour"] = None
    unpriced = GpuCatalog.model_validate(data)
    base = PlanSpec(model=MODEL, gpus=("A100", "L40S"), rate_qps=0.05, slo_s=slo_s, max_workers=2)
    for bad in (replace(base, objective="cost"), replace(base, budget_usd_per_hour=50.0)):
        with pytest.raises(ValueError, match="usd_per_hour on every GPU; none on: L40S"):
            run_plan(unpriced, workload, bad)
    rep = run_plan(unpriced, workload, replace(base, find_margin=False))
    assert rep.objective == "workers"
    assert [c.workers for c in rep.considered] == sorted(c.workers for c in rep.considered)


def test_plan_spec_rejects_a_rate_that_is_not_positive(slo_s: float) -> None:
    for rate in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="rate must be a positive number"):
            PlanSpec(model=MODEL, gpus=("A100",), rate_qps=rate, slo_s=slo_s)


def test_plan_tries_mixes_cheapest_first_and_stops_at_the_first_that_meets(report: PlanReport) -> None:
    costs = [c.usd_per_hour or 0.0 for c in report.considered]
    assert costs == sorted(costs)
    assert report.objective == "cost"
    assert report.answer is report.considered[-1] and report.answer.verdict == "met"
    verdicts = {c.verdict for c in report.considered[:-1]}
    assert verdicts == {"pruned", "failed"}  # the sizes were picked to show both
    for c in report.considered:
        assert (c.verdict == "pruned") == (c.bound_qps < RATE)
        assert (c.attainment == []) == (c.verdict == "pruned")


def test_the_answer_meets_the_slo_when_simulated_again_and_the_cheaper_mixes_do_not(
    catalog: GpuCatalog, workload: Setup, slo_s: float, report: PlanReport
) -> None:
    def attainment(counts: tuple[int, ...]) -> float:
        workers = [
            make_worker(catalog, name=f"{g}-{i}-{k}", gpu=g, model=MODEL, capacity=None)
            for i, (g, n) in enumerate(zip([o.gpu for o in report.options], counts, strict=True))
            for k in range(n)
        ]
        setup = on_mix(workload, workers, slo_s)
        return run_point(setup, "hexgen", RATE, seed=setup.seeds[0]).slo_attainment

    assert report.answer is not None
    assert attainment(report.answer.counts) >= 0.95
    missed = [c for c in report.next_cheaper(10) if c.verdict == "failed"]
    assert missed
    for c in missed:
        assert attainment(c.counts) < 0.95, c.label
    # The margin: the answer's own capacity, at least the planned rate, at most its fluid bound.
    assert report.margin is not None and 1.0 <= report.margin <= report.answer.bound_qps / RATE + 1e-9
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["met"] is True and doc["answer"]["label"] == report.answer.label
    assert doc["slo_s"] == slo_s and doc["alpha"] == 0.3
    assert len(doc["considered"]) == len(report.considered)


def test_a_budget_below_the_answer_finds_nothing_and_names_the_best_attainment(
    catalog: GpuCatalog, workload: Setup, slo_s: float, report: PlanReport
) -> None:
    assert report.answer is not None and report.answer.usd_per_hour is not None
    budget = report.answer.usd_per_hour - 0.01
    spec = PlanSpec(
        model=MODEL, gpus=("A100", "L40S"), rate_qps=RATE, slo_s=slo_s, max_workers=4, budget_usd_per_hour=budget
    )
    rep = run_plan(catalog, workload, spec)
    assert rep.answer is None and rep.capacity_per_seed == [] and rep.margin is None
    assert rep.over_budget > 0
    assert all((c.usd_per_hour or 0.0) <= budget for c in rep.considered)
    best = rep.best_failed
    assert best is not None and best.min_attainment is not None and best.min_attainment < 0.95

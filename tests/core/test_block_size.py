"""The engine's KV block size (``PerfProfile.block_tokens``): the prefix cache reuses whole blocks of it, in
the gateway's estimates, the simulated engine and the fluid bound alike (vLLM's CPU backend uses 128)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gateway.bench.bound import solve_fluid_bound
from gateway.config import load_cluster
from gateway.config.gpus import ProfileSpec
from gateway.core.prefix import PrefixSeg, best_case_cached, cached_tokens
from gateway.core.profile import profile_from
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from tests.sim.test_engine import PROFILE, run_prefixed


@pytest.mark.parametrize(("block", "want"), [(16, 848), (32, 832), (128, 768), (1, 850)])
def test_a_prefix_is_served_in_whole_blocks_of_the_engines_size(block: int, want: int) -> None:
    assert cached_tokens(850, 900, block) == want
    assert best_case_cached([((PrefixSeg("t", 850),), 900)], block) == [want]


def test_the_profile_carries_its_block_size_and_refuses_none() -> None:
    p = dataclasses.replace(PROFILE, block_tokens=128)
    assert profile_from("X", "m", p) == p
    with pytest.raises(ValueError, match="block_tokens must be at least 1"):
        dataclasses.replace(PROFILE, block_tokens=0)
    spec = ProfileSpec(
        tp=1, iter_base_s=0.02, token_s=2e-4, ctx_s=5e-8, request_overhead_s=0.0, kv_capacity_tokens=60_000
    )
    assert spec.block_tokens == 16 and profile_from("X", "m", spec).block_tokens == 16
    assert profile_from("X", "m", spec.model_copy(update={"block_tokens": 128})).block_tokens == 128


def test_the_simulated_engine_serves_whole_blocks_of_its_own_size() -> None:
    chain: tuple[PrefixSeg, ...] = (PrefixSeg("q", 850, per_query=True),)
    calls: list[tuple[float, int, int, int, tuple[PrefixSeg, ...]]] = [
        (0.0, 900, 20, 1, chain),
        (10.0, 900, 20, 1, chain),
    ]
    for block, want in ((16, 848), (128, 768)):
        _, eng = run_prefixed(dataclasses.replace(PROFILE, block_tokens=block), calls)
        assert eng.stats.prefix_hit_tokens == want
        assert eng.stats.prompt_tokens == 1800


def _call(cid: int, spec: CallSpec) -> Call:
    wf = StagedWorkflow(7, "t", 0.0, 1e6, [Stage(spec.kind, (spec,))])
    return Call(cid, wf, spec, 0.0)


@pytest.mark.parametrize("block", [16, 128])
def test_the_gateway_credits_each_worker_whole_blocks_of_its_size(block: int) -> None:
    base = load_cluster("paper-4gpu")[0].profile
    workers = [WorkerInfo(f"w{i}", dataclasses.replace(base, block_tokens=block), 4) for i in range(2)]
    sched = Scheduler(workers, "hexgen", random.Random(1), prefix_caching=True)
    spec = CallSpec("evaluate", 900, 20, (PrefixSeg("evaluate", 850, per_query=True),))
    first, second = _call(1, spec), _call(2, spec)
    w1 = sched.submit(first, 0.0)
    for w in range(2):
        sched.set_eligible(w, w == w1)
    assert sched.submit(second, 0.0) == w1
    assert second.cached == cached_tokens(850, 900, block)
    assert second.prefill_s == pytest.approx(sched.estimator.prefill_s(w1, 900 - second.cached))


def test_the_bound_credits_the_finest_block_of_the_cluster() -> None:
    cluster = load_cluster("paper-4gpu")
    tpl = PrefixSeg("template", 850)
    queries = [[CallSpec("evaluate", 900, 20, (tpl,)), CallSpec("generate_candidate", 4000, 200)] for _ in range(20)]
    coarse = [dataclasses.replace(w, profile=dataclasses.replace(w.profile, block_tokens=128)) for w in cluster]
    fine = solve_fluid_bound(cluster, queries, prefix_caching=True).rate_qps
    assert solve_fluid_bound(coarse, queries, prefix_caching=True).rate_qps < fine
    # One engine with the finest block credits every call with it (it could serve them all): a relaxation,
    # so the program stays a bound; the block enters the program only through those credits.
    mixed = [cluster[0], *coarse[1:]]
    assert solve_fluid_bound(mixed, queries, prefix_caching=True).rate_qps == pytest.approx(fine, rel=1e-9)

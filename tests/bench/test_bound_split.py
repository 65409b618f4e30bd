"""The fluid bound with split calls (prefill/decode disaggregation): the legs add up to the whole call, splitting
only adds options (never below the colocated bound), and roles, KV bytes and links restrict it as they say."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from gateway.bench.bound import call_resources, solve_fluid_bound, split_resources
from gateway.config import load_cluster
from gateway.core.transfer import Interconnect, Link
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec
from gateway.sim.workload import generate_chess_bird

QUERIES = generate_chess_bird(60, random.Random(3))


@pytest.fixture(scope="module")
def cluster() -> list[WorkerInfo]:
    return load_cluster("paper-4gpu")


def _links(workers: list[WorkerInfo], gbps: float) -> list[list[Link | None]]:
    link = Link(gbps)
    return Interconnect(same_node=link, between_nodes=link).matrix([w.name for w in workers])


def test_a_split_calls_legs_add_up_to_the_whole_call(cluster: list[WorkerInfo]) -> None:
    p = cluster[0].profile
    n_in, n_out, n_cached = np.array([9000, 300, 1]), np.array([400, 1, 50]), np.array([2000, 0, 0])
    whole = call_resources(p, n_in, n_out, n_cached)
    pre, dec = split_resources(p, n_in, n_out, n_cached)
    for key in ("gpu_s", "iters", "tokens"):
        assert pre[key] + dec[key] == pytest.approx(whole[key])
    assert pre["iters"][0] == np.ceil((9000 - 2000) / p.max_batched_tokens) and dec["iters"][0] == 399
    assert dec["iters"][1] == 0, "one output token: nothing left to decode"
    assert (pre["kv_iters"] + dec["kv_iters"] <= whole["kv_iters"] + 1e-9).all()


def test_splitting_only_adds_options(cluster: list[WorkerInfo]) -> None:
    whole = solve_fluid_bound(cluster, QUERIES, prefix_caching=True)
    split = solve_fluid_bound(cluster, QUERIES, prefix_caching=True, split=True, links=_links(cluster, 100.0))
    assert split.rate_qps >= whole.rate_qps * (1 - 1e-9)
    assert 0.0 <= split.split_share <= 1.0 and whole.split_share == 0.0
    assert max(split.gpu_busy) == pytest.approx(1.0, abs=1e-6), "some worker limits it"


def test_no_bandwidth_or_no_kv_size_means_no_split(cluster: list[WorkerInfo]) -> None:
    whole = solve_fluid_bound(cluster, QUERIES).rate_qps
    starved = solve_fluid_bound(cluster, QUERIES, split=True, links=_links(cluster, 1e-9))
    assert starved.rate_qps == pytest.approx(whole, rel=1e-6) and starved.split_share < 1e-6
    unknown = [replace(w, kv_bytes_per_token=0) for w in cluster]
    no_kv = solve_fluid_bound(unknown, QUERIES, split=True, links=_links(unknown, 100.0))
    assert no_kv.rate_qps == pytest.approx(whole, rel=1e-6) and no_kv.split_share < 1e-6


def test_roles_restrict_what_each_worker_runs(cluster: list[WorkerInfo]) -> None:
    spec = [[CallSpec("generate_candidate", 8000, 300)]]
    a100 = cluster[0]
    prefill_only = [replace(a100, name="p", role="prefill"), replace(a100, name="q", role="prefill")]
    assert solve_fluid_bound(prefill_only, spec, split=True).rate_qps == pytest.approx(0.0, abs=1e-9), (
        "nothing can decode"
    )
    pair = [replace(a100, name="p", role="prefill"), replace(a100, name="d", role="decode")]
    both = solve_fluid_bound(pair, spec, split=True)
    alone = solve_fluid_bound([a100], spec).rate_qps
    assert both.rate_qps > alone * 1.05 and both.split_share > 0.0, "the prefill worker adds its prompts' time"
    assert both.rate_qps < 2 * alone, "but no decode: less than two colocated engines"
    # Without ``split`` roles are ignored: two colocated engines.
    assert solve_fluid_bound(pair, spec).rate_qps == pytest.approx(solve_fluid_bound([a100, a100], spec).rate_qps)


def test_links_must_cover_every_pair(cluster: list[WorkerInfo]) -> None:
    with pytest.raises(ValueError, match="links must be 4 x 4"):
        solve_fluid_bound(cluster, QUERIES, split=True, links=[[None]])

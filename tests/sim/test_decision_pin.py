"""Pins every simulated decision of a small fixed run, so that speed work cannot change behaviour unseen.

Each case runs 60 CHESS/BIRD workflows (generator seed 1) at 1.2 x the fluid bound (queues form, so the
queue disciplines matter) with SLO 3x, and hashes every workflow's finish time (to the microsecond) and
every call's (workflow, stage kind, worker) in the order the engines finished them.

Reference run: the expected digests were printed by this module's ``digest`` at commit aa22620 (before the
simulator's speed work) and again after it, identically, on Linux x86-64, CPython 3.11; then updated for the
estimator's prefill clock (profile prefill, pulled back on every return), with the code before and after
the speed work merged giving identical digests again. The simulator
uses only IEEE-754 arithmetic and ``math.sqrt`` (exactly rounded everywhere), so the digests hold on
other platforms too; the workload generator draws from ``random`` with ``math.log``/``exp``, whose last
bit may differ on another libm, and the six-decimal finish times keep one stray ulp from mattering.

An intentional change of the model or of a policy (a new estimate, another tie rule) changes these
digests: update them from ``python -m tests.sim.test_decision_pin`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from gateway.bench.simbench import Setup
from gateway.config import load_cluster
from gateway.sim.simulator import Simulator
from gateway.sim.workload import load_queries

EXPECTED = {
    ("paper-4gpu", "hexgen"): "58bbc59272a54346",
    ("paper-4gpu", "hexgen-paper"): "dee7416f7a964dca",
    ("paper-4gpu", "wb-fcfs"): "6814b91e3b3b6548",
    ("paper-4gpu", "rr-pq"): "1dde8d93ad11b7f3",
    ("paper-4gpu", "lw-fcfs"): "e2d19eef449ac04d",
    ("paper-4gpu", "eft-fcfs"): "5ca94765d5dce2ab",
    ("paper-4gpu", "p2c-fcfs"): "72a91ec651474a78",
    ("paper-4gpu", "edf"): "e2d19eef449ac04d",
    ("paper-4gpu", "llf"): "3949b4837351cfcd",
    ("paper-4gpu", "rr-fcfs"): "ab0870e800e65055",
    ("mixed-12", "hexgen"): "0c4e78cefb3f8c96",
    ("mixed-12", "hexgen-paper"): "11b68f9701970ba3",
    ("mixed-12", "lw-fcfs"): "dbb07f66cd2f06de",
    ("mixed-12", "eft-fcfs"): "a8e0d2925078a428",
    ("mixed-12", "p2c-fcfs"): "92040a84bef2bdd0",
    ("mixed-12", "llf"): "dbb07f66cd2f06de",
    ("mixed-12", "rr-fcfs"): "9c189e241ba42132",
}


EXPECTED_CACHED = {
    ("paper-4gpu", "hexgen"): "2eeef626426e86f5",
    ("paper-4gpu", "llmd"): "88bdbb80d57feb5b",
    ("paper-4gpu", "lw-fcfs"): "0635ba2c57d61866",
    ("mixed-12", "hexgen"): "ac0da21ca1fb9957",
    ("mixed-12", "llmd"): "be51f761ab541f69",
}
"""The same runs with the engines caching prompt prefixes (pinned when prefix caching was added; updated when
the engines and the gateway's prefix index began counting a segment as cached from the admission, resp. the
dispatch, of the call that brings it, as vLLM V1 caches blocks when it schedules them)."""


def digest(cluster: str, policy: str, prefix_caching: bool = False) -> str:
    """The first 16 hex digits of the SHA-256 of the run's finish times and call placements."""
    workers = load_cluster(cluster)
    queries = load_queries("chess-bird", 60, random.Random(1))
    setup = Setup(
        workers=workers,
        queries=queries,
        trace="chess-bird",
        n_workflows=60,
        slo_scale=3.0,
        seed=1,
        prefix_caching=prefix_caching,
    )
    sim = Simulator(workers, policy, seed=1, record_calls=True, prefix_caching=prefix_caching)
    res = sim.run(setup.workflows(1.2 * setup.bound.rate_qps))
    h = hashlib.sha256()
    for r in sorted(res.workflows, key=lambda r: r.wid):
        h.update(f"{r.wid}:{r.finish:.6f};".encode())
    for c in res.calls:
        h.update(f"{c.wid}:{c.kind}:{c.worker};".encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("cluster", "policy"), sorted(EXPECTED))
def test_simulated_decisions_match_the_reference_run(cluster: str, policy: str) -> None:
    assert digest(cluster, policy) == EXPECTED[(cluster, policy)]


@pytest.mark.parametrize(("cluster", "policy"), sorted(EXPECTED_CACHED))
def test_simulated_decisions_with_prefix_caching_match_the_reference_run(cluster: str, policy: str) -> None:
    assert digest(cluster, policy, prefix_caching=True) == EXPECTED_CACHED[(cluster, policy)]


if __name__ == "__main__":  # print the tables above, for an intentional update
    for key in EXPECTED:
        print(f"    {key!r}: {digest(*key)!r},")
    print()
    for key in EXPECTED_CACHED:
        print(f"    {key!r}: {digest(*key, prefix_caching=True)!r},")

"""Named policies: every policy has one role, and only deployable alternatives count as baselines."""

from __future__ import annotations

import pytest

from gateway.core.policy import (
    POLICIES,
    Policy,
    get_policy,
    policies_with_role,
    production_policy,
    register_policy,
)
from gateway.errors import UnknownName


def test_roles_split_ours_baselines_and_ablations() -> None:
    assert policies_with_role("ours") == ["hexgen"]
    assert set(policies_with_role("ablation")) == {"hexgen-paper", "hexgen-noprefix", "wb-fcfs", "rr-pq"}
    assert set(policies_with_role("baseline")) == {
        "rr-fcfs",
        "p2c-fcfs",
        "lw-fcfs",
        "eft-fcfs",
        "llf",
        "edf",
        "vtc",
        "llmd",
    }
    assert sum(len(policies_with_role(r)) for r in ("ours", "baseline", "ablation")) == len(POLICIES)


def test_eft_fcfs_is_earliest_finish_dispatch_with_fcfs_queues() -> None:
    p = get_policy("eft-fcfs")
    assert (p.dispatcher, p.queue, p.role, p.uses_alpha) == ("eft", "fcfs", "baseline", False)


def test_prefix_aware_policies_are_ours_and_the_llmd_baseline() -> None:
    aware = {name for name, p in POLICIES.items() if p.prefix_aware}
    assert aware == {"hexgen", "llmd"}
    assert (get_policy("llmd").dispatcher, get_policy("llmd").queue) == ("llmd", "fcfs")


def test_a_policy_with_an_unknown_role_is_refused() -> None:
    bad = Policy("x-fcfs", "rr", "fcfs", "nothing", "competitor")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role"):
        register_policy(bad)
    assert "x-fcfs" not in POLICIES


def test_uses_alpha_is_the_dispatchers_declared_capability() -> None:
    tuned = {name for name, p in POLICIES.items() if p.uses_alpha}
    assert tuned == {name for name, p in POLICIES.items() if p.capabilities.uses_alpha}
    assert tuned == {"hexgen", "hexgen-paper", "hexgen-noprefix", "wb-fcfs"}


def test_a_dispatcher_that_reads_the_prefix_index_needs_a_prefix_aware_policy() -> None:
    with pytest.raises(ValueError, match="prefix index"):
        register_policy(Policy("llmd-blind", "llmd", "fcfs", "llm-d without its index", "ablation"))
    assert "llmd-blind" not in POLICIES


@pytest.mark.parametrize("name", [*policies_with_role("ours"), *policies_with_role("baseline")])
def test_a_deployment_runs_ours_and_the_baselines(name: str) -> None:
    assert production_policy(name) is get_policy(name)


@pytest.mark.parametrize("name", policies_with_role("ablation"))
def test_an_ablation_runs_only_behind_the_benchmark_switch(name: str) -> None:
    with pytest.raises(ValueError, match="ablation"):
        production_policy(name)
    assert production_policy(name, benchmark=True) is get_policy(name)


def test_an_unknown_policy_is_unknown_with_or_without_the_switch() -> None:
    for benchmark in (False, True):
        with pytest.raises(UnknownName):
            production_policy("nope", benchmark=benchmark)

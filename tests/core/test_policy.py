"""Named policies: every policy has one role, and only deployable alternatives count as baselines."""

from __future__ import annotations

import pytest

from gateway.core.policy import POLICIES, Policy, get_policy, policies_with_role, register_policy


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

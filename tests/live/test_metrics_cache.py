"""The metrics' cached children: the same series ``labels()`` gives, following worker and tenant membership,
and an SLO attainment kept as a running count that equals the share over the window."""

from __future__ import annotations

import random

from gateway.live.metrics import ATTAINMENT_WINDOW, GatewayMetrics


def _value(m: GatewayMetrics, name: str, labels: dict[str, str]) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_cached_children_are_the_labelled_series() -> None:
    m = GatewayMetrics(["w"], ["t"])
    for _ in range(3):
        m.for_worker(m.dispatches, "w", "k").inc()
        m.for_worker(m.queue_wait_h, "w").observe(0.5)
        m.call_done("w", "k", 2.0, 1.0, 0.5)
    m.for_worker(m.failures, "w", "rejected").inc()
    m.for_worker(m.retries, "w").inc()
    m.for_tenant(m.rejections, "t", "queue_full").inc()
    m.for_tenant(m.demoted, "t", "queued").inc()
    assert _value(m, "hexflow_dispatch_total", {"worker": "w", "kind": "k"}) == 3
    assert _value(m, "hexflow_queue_wait_seconds_count", {"worker": "w"}) == 3
    assert _value(m, "hexflow_stage_latency_seconds_sum", {"kind": "k"}) == 6.0
    assert _value(m, "hexflow_call_run_seconds_count", {"kind": "k", "worker": "w"}) == 3
    assert _value(m, "hexflow_estimate_ratio_sum", {"worker": "w"}) == 6.0
    assert _value(m, "hexflow_call_failures_total", {"worker": "w", "reason": "rejected"}) == 1
    assert _value(m, "hexflow_call_retries_total", {"worker": "w"}) == 1
    assert _value(m, "hexflow_admission_rejections_total", {"tenant": "t", "reason": "queue_full"}) == 1
    assert _value(m, "hexflow_workflows_demoted_total", {"tenant": "t", "when": "queued"}) == 1
    # The cache holds what labels() returns: counting through either is counting one series.
    m.dispatches.labels(worker="w", kind="k").inc()
    m.for_worker(m.dispatches, "w", "k").inc()
    assert _value(m, "hexflow_dispatch_total", {"worker": "w", "kind": "k"}) == 5


def test_a_series_appears_only_once_touched() -> None:
    """Caching does not create series ahead of time: a tenant without workflows has no attainment yet."""
    m = GatewayMetrics(["w"], ["t"])
    m.workflow_done("t", None, "rejected")
    assert _value(m, "hexflow_slo_attainment_ratio", {"tenant": "t"}) is None
    assert _value(m, "hexflow_workflow_latency_seconds_count", {"tenant": "t"}) is None
    assert _value(m, "hexflow_queue_wait_seconds_count", {"worker": "w"}) is None


def test_a_removed_worker_comes_back_with_fresh_series() -> None:
    m = GatewayMetrics(["w"], [])
    m.for_worker(m.dispatches, "w", "k").inc()
    m.call_done("w", "k", 1.0, 1.0, 1.0)
    m.remove_worker("w")
    assert _value(m, "hexflow_dispatch_total", {"worker": "w", "kind": "k"}) is None
    assert _value(m, "hexflow_worker_up", {"worker": "w"}) is None
    m.add_worker("w")  # discovery: the same name again
    m.for_worker(m.dispatches, "w", "k").inc()
    m.call_done("w", "k", 1.0, 1.0, 1.0)
    m.for_worker(m.up, "w").set(1)
    # Written to the registry's new series, not to the children cached before the removal.
    assert _value(m, "hexflow_dispatch_total", {"worker": "w", "kind": "k"}) == 1
    assert _value(m, "hexflow_call_run_seconds_count", {"kind": "k", "worker": "w"}) == 1
    assert _value(m, "hexflow_worker_up", {"worker": "w"}) == 1
    m.remove_worker("w")
    assert "w" not in m._workers


def test_tenant_reload_drops_the_children_of_tenants_gone() -> None:
    m = GatewayMetrics([], ["a", "b"])
    m.workflow_done("a", 1.0, "met")
    m.workflow_done("b", 1.0, "met")
    m.set_tenants(["b", "c"])
    assert set(m._tenants) == {"b"}  # c's are created on first use
    assert _value(m, "hexflow_workflows_total", {"tenant": "c", "outcome": "met"}) == 0  # created at zero
    # a's series stay (totals never go back); a late workflow of a still counts there.
    m.workflow_done("a", 1.0, "missed")
    assert _value(m, "hexflow_workflows_total", {"tenant": "a", "outcome": "met"}) == 1
    assert _value(m, "hexflow_slo_attainment_ratio", {"tenant": "a"}) == 0.5


def test_attainment_is_the_met_share_of_the_last_window() -> None:
    m = GatewayMetrics([], ["t"])
    rng = random.Random(7)
    outcomes: list[bool] = []
    for i in range(3 * ATTAINMENT_WINDOW + 17):
        met = rng.random() < (0.9 if i < ATTAINMENT_WINDOW else 0.3)
        outcomes.append(met)
        m.workflow_done("t", 1.0, "met" if met else "missed")
        if i % 97 == 0 or i > 3 * ATTAINMENT_WINDOW:
            window = outcomes[-ATTAINMENT_WINDOW:]
            assert _value(m, "hexflow_slo_attainment_ratio", {"tenant": "t"}) == sum(window) / len(window)
    m.workflow_done("t", None, "failed")  # neither met nor missed: not in the window
    window = outcomes[-ATTAINMENT_WINDOW:]
    assert _value(m, "hexflow_slo_attainment_ratio", {"tenant": "t"}) == sum(window) / len(window)

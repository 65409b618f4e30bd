"""The status page's memory: goodput outcomes, the rolling per-tenant window, the finished-workflow ring."""

from __future__ import annotations

import pytest

from gateway.live.history import (
    BUCKETS,
    GOODPUT_OUTCOMES,
    MAX_CALLS,
    CallTiming,
    FinishedWorkflow,
    OutcomeWindow,
    WorkflowHistory,
    call_timings,
    goodput_outcome,
)


@pytest.mark.parametrize(
    ("status", "valid", "outcome"),
    [
        ("met", True, "met"),
        ("missed", True, "late"),
        ("missed", False, "no_valid_answer"),  # in time or not: an answer without valid SQL is no goodput
        ("met", False, "no_valid_answer"),
        ("failed", True, "failed"),
        ("cancelled", True, "cancelled"),
        ("rejected", True, "rejected"),
        ("shed", True, "rejected"),  # dropped after admission: the client is refused with Retry-After
    ],
)
def test_goodput_outcome_sorts_every_ending(status: str, valid: bool, outcome: str) -> None:
    assert goodput_outcome(status, valid=valid) == outcome
    assert outcome in GOODPUT_OUTCOMES


def test_goodput_outcome_refuses_an_unknown_status() -> None:
    with pytest.raises(ValueError, match="unknown workflow status 'done'"):
        goodput_outcome("done")


def test_outcome_window_counts_attainment_and_goodput_over_the_window() -> None:
    w = OutcomeWindow(300.0)
    for t, outcome in [(1.0, "met"), (2.0, "met"), (3.0, "late"), (4.0, "no_valid_answer"), (5.0, "rejected")]:
        w.add("acme", outcome, t)
    s = w.summary(9.0, ["acme", "idle"])  # still in the bucket [0, 10)
    acme = s["acme"]
    assert acme["outcomes"] == {
        "met": 2,
        "late": 1,
        "no_valid_answer": 1,
        "failed": 0,
        "rejected": 1,
        "cancelled": 0,
    }
    assert acme["finished"] == 4  # rejected and cancelled are not counted against the SLO
    assert acme["attainment"] == pytest.approx(0.5)
    assert acme["goodput_per_s"] == pytest.approx(2 / 300.0)
    assert len(acme["goodput_series"]) == BUCKETS and acme["goodput_series"][-1] == pytest.approx(2 / 10.0)
    # A configured tenant with nothing finished shows zeros, and no attainment (not 0 %, not 100 %).
    assert s["idle"]["finished"] == 0 and s["idle"]["attainment"] is None and s["idle"]["goodput_per_s"] == 0.0


def test_outcome_window_forgets_what_fell_out_of_the_window() -> None:
    w = OutcomeWindow(300.0)  # buckets of 10 s
    w.add("acme", "met", 5.0)
    w.add("acme", "failed", 200.0)
    assert w.summary(250.0)["acme"]["outcomes"]["met"] == 1
    later = w.summary(320.0)["acme"]  # the bucket [0, 10) is older than 300 s now
    assert later["outcomes"]["met"] == 0 and later["outcomes"]["failed"] == 1
    assert later["attainment"] == 0.0
    assert w.summary(10_000.0)["acme"]["finished"] == 0


def test_outcome_window_memory_is_bounded_by_its_buckets() -> None:
    w = OutcomeWindow(60.0)
    for i in range(10_000):
        w.add("acme", "met", float(i))
    assert len(w._tenants["acme"]) == BUCKETS
    w.forget(["other"])
    assert w.summary(10_000.0) == {}


def test_outcome_window_rejects_a_window_of_zero() -> None:
    with pytest.raises(ValueError, match="window_s must be positive"):
        OutcomeWindow(0.0)


def _wf(i: int, latency: float, deadline: float = 10.0, finished: float = 0.0) -> FinishedWorkflow:
    return FinishedWorkflow(f"wf-{i}", "t", "workflows", "met", finished, latency, deadline, ())


def test_history_is_a_ring_of_the_last_workflows() -> None:
    h = WorkflowHistory(3)
    for i in range(5):
        h.add(_wf(i, float(i)))
    assert len(h) == 3 and h.total == 5
    assert [w.id for w in h.slowest(10)] == ["wf-4", "wf-3", "wf-2"]


def test_history_slowest_ranks_by_latency_over_deadline_and_honours_since() -> None:
    h = WorkflowHistory(10)
    h.add(_wf(1, 8.0, deadline=10.0, finished=1.0))  # 0.8 of its deadline
    h.add(_wf(2, 3.0, deadline=2.0, finished=2.0))  # 1.5: past its deadline, though faster
    h.add(_wf(3, 50.0, deadline=100.0, finished=3.0))  # 0.5
    assert [w.id for w in h.slowest(2)] == ["wf-2", "wf-1"]
    assert [w.id for w in h.slowest(5, since=2.5)] == ["wf-3"]


def test_call_timings_are_relative_sorted_and_capped() -> None:
    rows = [("k", "w", 100.0 + i, 100.5 + i, 101.0 + i, 2.0, 1, True) for i in reversed(range(MAX_CALLS + 5))]
    calls, more = call_timings(100.0, rows)
    assert len(calls) == MAX_CALLS and more == 5
    assert calls[0] == CallTiming("k", "w", 0.0, 0.5, 1.0, 2.0, 1, True)
    assert calls[0].waited_s == 0.5 and calls[0].ran_s == 0.5 and not calls[0].over_budget


def test_a_call_never_sent_waited_until_it_failed() -> None:
    c = CallTiming("k", None, 1.0, None, 4.0, 2.0, 0, False)
    assert c.waited_s == 3.0 and c.ran_s == 0.0 and c.over_budget


@pytest.mark.parametrize(
    ("done", "latency", "lost"),
    [
        ((2.0, 5.0, 9.0), 9.0, None),  # in time
        ((2.0, 12.0, 15.0), 15.0, 1),  # the second call returned after the 10 s deadline
        ((2.0, 5.0, 9.0), 11.0, None),  # every call in time: the time went after the last one
    ],
)
def test_where_the_deadline_was_lost(done: tuple[float, ...], latency: float, lost: int | None) -> None:
    calls = tuple(CallTiming("k", "w", d - 1.0, d - 0.5, d, 3.0, 1, True) for d in done)
    wf = FinishedWorkflow("wf", "t", "text2sql", "late", 0.0, latency, 10.0, calls)
    assert wf.lost_at() == lost
    body = wf.as_dict(now=5.0)
    assert body["lost_at"] == lost and body["age_s"] == 5.0 and len(body["calls"]) == 3
    assert body["calls"][0]["waited_s"] == 0.5 and body["calls"][0]["ran_s"] == 0.5


def test_a_finished_workflow_carries_the_ids_its_client_got() -> None:
    wf = FinishedWorkflow("t2s-0123abcd", "t", "text2sql", "met", 0.0, 1.0, 10.0, (), request_id="req-00ff")
    body = wf.as_dict(now=1.0)
    assert body["id"] == "t2s-0123abcd" and body["request_id"] == "req-00ff"
    assert _wf(1, 1.0).as_dict(now=1.0)["request_id"] is None  # not recorded: null, never made up


@pytest.mark.parametrize(
    ("done", "over"),
    [
        (0.9, False),  # well within its 2 s budget (a healthy workflow at 8 % of its deadline)
        (3.0, False),  # exactly at the end of its budget
        (3.5, True),
    ],
)
def test_a_call_is_over_budget_only_past_the_end_of_its_stage_budget(done: float, over: bool) -> None:
    c = CallTiming("k", "w", 1.0, 1.2, done, 2.0, 1, True)  # queued at 1 s with a 2 s budget: it ends at 3 s
    assert c.over_budget is over

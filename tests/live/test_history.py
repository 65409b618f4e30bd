"""The status page's memory: goodput outcomes, the rolling per-tenant window, the finished-workflow ring."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.core.records import CallOutcome, WorkflowOutcome
from gateway.errors import CallFailed
from gateway.live.history import (
    BUCKETS,
    GOODPUT_OUTCOMES,
    MAX_CALLS,
    OutcomeWindow,
    WorkflowHistory,
    goodput_outcome,
    kept_calls,
    lost_at,
    status_entry,
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


def _wf(
    i: int,
    latency: float,
    deadline: float = 10.0,
    finished: float = 0.0,
    calls: tuple[CallOutcome[Any], ...] = (),
    request_id: str | None = None,
    ncalls: int | None = None,
) -> WorkflowOutcome[Any]:
    """A finished workflow as the history keeps it (arrival ``finished - latency``)."""
    arrival = finished - latency
    return WorkflowOutcome(
        i,
        "t",
        arrival,
        arrival + deadline,
        finished,
        "met",
        calls,
        len(calls) if ncalls is None else ncalls,
        None,
        f"wf-{i}",
        "workflows",
        request_id,
    )


def _call(ready: float, sent: float | None, done: float, budget: float = 2.0, ok: bool = True) -> CallOutcome[Any]:
    return CallOutcome(0, 0, "k", ready, done, 0, "w", sent, attempts=1, budget_s=budget, ok=ok)


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


def test_kept_calls_are_sorted_by_ready_time_and_capped() -> None:
    calls = [_call(100.0 + i, 100.5 + i, 101.0 + i) for i in reversed(range(MAX_CALLS + 5))]
    failed = replace(calls[-1], ok=False, error=CallFailed("boom"))  # the first queued, failed: its error not kept
    kept, n = kept_calls([None, *calls[:-1], failed])  # None: a call not settled, not kept
    assert len(kept) == MAX_CALLS and n == MAX_CALLS + 5 and kept[0].ready == 100.0
    assert not kept[0].ok and kept[0].error is None
    wf = _wf(1, 200.0, deadline=300.0, finished=300.0, calls=kept, ncalls=n)  # arrived at 100 s
    body = status_entry(wf, 300.0)
    assert body["more_calls"] == 5
    first = body["calls"][0]
    assert (first["ready_s"], first["sent_s"], first["done_s"]) == (0.0, 0.5, 1.0)
    assert first["waited_s"] == 0.5 and first["ran_s"] == 0.5 and not first["over_budget"]


def test_kept_calls_drop_the_answer_and_error_and_keep_every_other_field() -> None:
    c = CallOutcome(1, 2, "k", 1.0, 5.0, 3, "w", 2.0, 1.0, 3.0, 2, 4.0, 4.5, False, answer="a", error=CallFailed("x"))
    (kept,), n = kept_calls([c])
    assert n == 1 and kept == replace(c, answer=None, error=None)


def test_a_call_never_sent_waited_until_it_failed() -> None:
    wf = _wf(1, 4.0, finished=4.0, calls=(_call(1.0, None, 4.0, ok=False),))
    [c] = status_entry(wf, 4.0)["calls"]
    assert c["waited_s"] == 3.0 and c["ran_s"] == 0.0 and c["over_budget"] and c["sent_s"] is None and not c["ok"]


@pytest.mark.parametrize(
    ("done", "latency", "lost"),
    [
        ((2.0, 5.0, 9.0), 9.0, None),  # in time
        ((2.0, 12.0, 15.0), 15.0, 1),  # the second call returned after the 10 s deadline
        ((2.0, 5.0, 9.0), 11.0, None),  # every call in time: the time went after the last one
    ],
)
def test_where_the_deadline_was_lost(done: tuple[float, ...], latency: float, lost: int | None) -> None:
    calls = tuple(_call(d - 1.0, d - 0.5, d, 3.0) for d in done)
    wf = _wf(0, latency, finished=latency, calls=calls)  # arrived at 0 s
    assert lost_at(wf) == lost
    body = status_entry(wf, now=latency + 5.0)
    assert body["lost_at"] == lost and body["age_s"] == 5.0 and len(body["calls"]) == 3
    assert body["calls"][0]["waited_s"] == 0.5 and body["calls"][0]["ran_s"] == 0.5


def test_a_finished_workflow_carries_the_ids_its_client_got() -> None:
    body = status_entry(_wf(7, 1.0, request_id="req-00ff"), now=1.0)
    assert body["id"] == "wf-7" and body["request_id"] == "req-00ff"
    assert status_entry(_wf(1, 1.0), now=1.0)["request_id"] is None  # not recorded: null, never made up


@pytest.mark.parametrize(
    ("done", "over"),
    [
        (0.9, False),  # well within its 2 s budget (a healthy workflow at 8 % of its deadline)
        (3.0, False),  # exactly at the end of its budget
        (3.5, True),
    ],
)
def test_a_call_is_over_budget_only_past_the_end_of_its_stage_budget(done: float, over: bool) -> None:
    wf = _wf(0, done, finished=done, calls=(_call(1.0, 1.2, done),))  # queued at 1 s with a 2 s budget: ends at 3 s
    assert status_entry(wf, done)["calls"][0]["over_budget"] is over

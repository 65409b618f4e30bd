"""A status-page state (``GET /ui/api/state``) with everything the page draws, for browser tests that need
exact figures: three workers (one ejected), a tenant with 7 of 20 workflows refused, and three workflows (in
time with every call within its budget, in time with one call past its stage budget, late).

``tests/live/test_status_page.py`` checks that its shape is the gateway's own (the same keys at every level).
"""

from __future__ import annotations

from typing import Any

from gateway.live.history import BUCKETS, GOODPUT_OUTCOMES

EJECTED_REASON = "its last 20 calls took 3.1x their predicted latency (peers: 1.02x)"
HEALTHY_ID = "t2s-5f1c0a9e3b7d2c41"
HEALTHY_REQUEST_ID = "req-8e2d6c4b1a9f7e35"
OVER_ID = "wf-0c4b7e2a9d1f3e58"
LATE_ID = "t2s-a3e9d7c1b5f20468"


def _worker(name: str, gpu: str, **over: Any) -> dict[str, Any]:
    w: dict[str, Any] = {
        "name": name,
        "gpu": gpu,
        "model": "llama-3.1-70b-instruct",
        "state": "up",
        "capacity": 8,
        "queued": 2,
        "inflight": 5,
        "kv_cache_usage": 0.42,
        "scrape_age_s": 0.8,
        "latency_ratio": 1.04,
        "estimate_ratios": {"generate_candidate": 1.02, "revise": 0.97},
        "completed": 1840,
        "failed": 3,
        "ejected": False,
        "ejected_reason": None,
        "ejected_for_s": None,
        "ejections": 0,
    }
    w.update(over)
    return w


def _tenant(counts: dict[str, int], window_s: float) -> dict[str, Any]:
    outcomes = {o: counts.get(o, 0) for o in GOODPUT_OUTCOMES}
    finished = sum(outcomes[o] for o in ("met", "late", "no_valid_answer", "failed"))
    arrivals = sum(outcomes.values())
    series = [outcomes["met"] / window_s * (0.5 + (i % 7) / 6) for i in range(BUCKETS)]
    return {
        "outcomes": outcomes,
        "finished": finished,
        "attainment": None if finished == 0 else outcomes["met"] / finished,
        "goodput_per_s": outcomes["met"] / window_s,
        "goodput_series": series,
        "arrivals": arrivals,
        "answered_in_time": None if arrivals == 0 else outcomes["met"] / arrivals,
    }


def _call(
    kind: str, worker: str, ready: float, sent: float, done: float, budget: float, *, ok: bool = True
) -> dict[str, Any]:
    return {
        "kind": kind,
        "worker": worker,
        "ready_s": ready,
        "sent_s": sent,
        "done_s": done,
        "waited_s": round(sent - ready, 4),
        "ran_s": round(done - sent, 4),
        "budget_s": budget,
        "over_budget": done - ready > budget,
        "attempts": 1,
        "ok": ok,
    }


def _workflow(
    wf_id: str, route: str, outcome: str, deadline: float, calls: list[dict[str, Any]], **over: Any
) -> dict[str, Any]:
    latency = max(c["done_s"] for c in calls) + 0.01
    lost = None
    if latency > deadline:
        lost = next((i for i, c in enumerate(calls) if c["done_s"] > deadline), None)
    wf: dict[str, Any] = {
        "id": wf_id,
        "request_id": None,
        "tenant": "interactive",
        "route": route,
        "outcome": outcome,
        "age_s": 12.0,
        "latency_s": round(latency, 4),
        "deadline_s": deadline,
        "lost_at": lost,
        "more_calls": 0,
        "calls": calls,
    }
    wf.update(over)
    return wf


# A Text-to-SQL workflow at 8 % of its 30 s deadline: every call well within its stage budget.
HEALTHY_CALLS = [
    _call("extract_keywords", "a100-0", 0.0, 0.01, 0.21, 1.4),
    _call("information_retriever", "a100-1", 0.22, 0.23, 0.48, 0.9),
    _call("generate_candidate", "a100-0", 0.49, 0.5, 1.61, 13.2),
    _call("generate_candidate", "l40s-2", 0.49, 0.51, 1.92, 13.2),
    _call("generate_unit_test", "a100-1", 1.93, 1.94, 2.19, 19.8),
    _call("evaluate", "a100-0", 2.2, 2.2, 2.38, 23.7),
]
# In time, but its second stage ran past its stage budget (its later stages had less time).
OVER_CALLS = [
    _call("step", "a100-0", 0.0, 0.02, 0.6, 3.0),
    _call("step", "l40s-2", 0.61, 0.9, 2.4, 1.2),
    _call("step", "a100-1", 2.41, 2.42, 3.1, 5.6),
]
# Late: its second call returned after the 4 s deadline; the third, queued late (a negative budget), failed.
LATE_CALLS = [
    _call("extract_keywords", "a100-1", 0.0, 0.3, 1.1, 0.8),
    _call("generate_candidate", "a100-1", 1.12, 1.6, 4.4, 1.9),
    _call("revise", "a100-1", 4.41, 4.45, 5.2, -0.41, ok=False),
]


def sample_state() -> dict[str, Any]:
    """A fresh copy of the sample state."""
    window_s = 300.0
    return {
        "policy": "hexgen",
        "alpha": 0.3,
        "uses_alpha": True,
        "ready": True,
        "draining": False,
        "active_workflows": 14,
        "parked_calls": 0,
        "burst": {
            "in_burst": True,
            "load": 2.41,
            "capacity": 0.9,
            "bursts": 1,
            "capped_questions": 37,
            "ceiling": {"candidates": 1, "max_revisions": 1, "evaluate": False},
            "trades": ["candidates 2 -> 1", "revision rounds capped at 1 (of 10)", "unit tests and evaluation skipped"],
        },
        "window_s": window_s,
        "outcomes": list(GOODPUT_OUTCOMES),
        "workers": [
            _worker("a100-0", "A100"),
            _worker(
                "a100-1",
                "A100",
                state="ejected",
                queued=0,
                inflight=1,
                latency_ratio=3.1,
                ejected=True,
                ejected_reason=EJECTED_REASON,
                ejected_for_s=25.0,
                ejections=2,
            ),
            _worker("l40s-2", "L40S", kv_cache_usage=0.93, latency_ratio=1.12),
        ],
        "tenants": {
            "batch": _tenant({"met": 40, "late": 3, "no_valid_answer": 1, "cancelled": 2}, window_s),
            "interactive": _tenant({"met": 13, "rejected": 7}, window_s),
        },
        "tuning": {
            "enabled": True,
            "runs": 3,
            "history": [
                {"alpha": 0.3, "result": "skipped", "reason": "12 workflows in the window", "age_s": 20.0},
                {
                    "alpha": 0.3,
                    "result": "kept",
                    "window_workflows": 188,
                    "seconds": 1.92,
                    "current": 0.3,
                    "chosen": 0.35,
                    "current_p95_s": 2.41,
                    "chosen_p95_s": 2.38,
                    "age_s": 80.0,
                },
            ],
        },
        "finished_total": 66,
        "slowest": [
            _workflow(LATE_ID, "text2sql", "late", 4.0, LATE_CALLS),
            _workflow(OVER_ID, "workflows", "met", 6.0, OVER_CALLS),
            _workflow(HEALTHY_ID, "text2sql", "met", 30.0, HEALTHY_CALLS, request_id=HEALTHY_REQUEST_ID),
        ],
    }

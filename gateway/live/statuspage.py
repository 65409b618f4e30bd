"""The data of the live status page (``GET /ui/api/state``): one JSON snapshot the page polls, built from
what the gateway already keeps, bounded in size; times are seconds ago (``age_s``). Per tenant it gives both
``attainment`` and ``answered_in_time`` (docs/live-gateway.md, "The status page")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.live.history import GOODPUT_OUTCOMES, status_entry

if TYPE_CHECKING:
    from gateway.live.service import Gateway
    from gateway.live.worker_state import WorkerState

SLOWEST = 10
"""Workflows in the page's slowest list (of those that ended within the window)."""


def worker_state(st: WorkerState) -> str:
    """One word for a worker: ``up`` (takes calls), ``ejected`` (an outlier, until a probe re-admits it),
    ``draining`` (discovery stops sending it calls: its pod is unready or going), or ``down`` (health)."""
    if not st.up:
        return "down"
    if st.removing or not st.ready:
        return "draining"
    if st.ejected:
        return "ejected"
    return "up"


def _worker(gw: Gateway, st: WorkerState, now: float) -> dict[str, Any]:
    info, sched, w = st.info, gw.scheduler, st.index
    m = st.metrics
    ratios = sched.estimator.ratios(w, now)
    return {
        "name": info.name,
        "gpu": info.profile.gpu,
        "model": info.served_model or info.profile.model,
        "state": worker_state(st),
        "capacity": info.capacity,
        "queued": sched.queue_len(w),
        "inflight": sched.inflight(w),
        "kv_cache_usage": None if m is None else m.kv_cache_usage,
        "scrape_age_s": None if st.scraped_at is None else round(now - st.scraped_at, 3),
        # The outlier window's typical observed/predicted latency (1 = as predicted; None: no call yet), and the
        # estimator's fresh per-kind corrections.
        "latency_ratio": None if st.recent_typical is None else round(st.recent_typical, 4),
        "estimate_ratios": {k: round(r, 4) for k, (r, _) in sorted(ratios.items())},
        "completed": st.sent,
        "failed": st.failed,
        # Outlier ejection (as /v1/status has it): why, and for how long the back-off still runs (0: over, a
        # probe call decides when it comes back).
        "ejected": st.ejected,
        "ejected_reason": st.ejected_reason if st.ejected else None,
        "ejected_for_s": st.ejected_for_s(now),
        "ejections": st.ejections,
    }


def tenant_shares(summary: dict[str, Any]) -> dict[str, Any]:
    """A tenant's window summary with ``arrivals`` (every workflow that ended in it) and ``answered_in_time``
    (met over arrivals; None when none arrived)."""
    arrivals = sum(summary["outcomes"].values())
    met = summary["outcomes"]["met"]
    return {**summary, "arrivals": arrivals, "answered_in_time": None if arrivals == 0 else met / arrivals}


def page_state(gw: Gateway) -> dict[str, Any]:
    """The status page's snapshot of ``gw`` now."""
    now = gw.clock()
    window_s = gw.outcome_window.window_s
    tuner = gw.tuner
    tuning: dict[str, Any] = {"enabled": tuner is not None, "runs": 0, "history": []}
    if tuner is not None:
        tuning["runs"] = tuner.runs
        tuning["history"] = [  # newest first
            {**{k: v for k, v in run.items() if k != "at"}, "age_s": round(max(now - run["at"], 0.0), 3)}
            for run in reversed(tuner.history)
        ]
    return {
        "policy": gw.scheduler.policy.name,
        "alpha": gw.scheduler.alpha,
        "uses_alpha": gw.scheduler.policy.uses_alpha,
        "ready": gw.ready and not gw.draining and gw.pool.healthy > 0,
        "draining": gw.draining,
        "active_workflows": gw.active_total,
        "parked_calls": len(gw.pool.parked),
        "window_s": window_s,
        "outcomes": list(GOODPUT_OUTCOMES),
        "workers": [_worker(gw, st, now) for st in gw.pool.workers],
        "tenants": {
            name: tenant_shares(t)
            for name, t in gw.outcome_window.summary(now, (t.name for t in gw.tenants.tenants)).items()
        },
        "tuning": tuning,
        "finished_total": gw.history.total,
        "slowest": [status_entry(wf, now) for wf in gw.history.slowest(SLOWEST, since=now - window_s)],
    }

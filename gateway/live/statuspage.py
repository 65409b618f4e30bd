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


def _worker(st: WorkerState, now: float) -> dict[str, Any]:
    """A worker as the page shows it: its ``/v1/status`` entry, reduced (``latency_ratio``: the outlier window's
    typical observed/predicted latency; ``estimate_ratios``: the estimator's fresh corrections, per kind)."""
    full, info = st.status(now), st.info
    vllm = full["vllm"] or {}
    return {
        "name": info.name,
        "gpu": info.profile.gpu,
        "model": info.served_model or info.profile.model,
        "state": worker_state(st),
        **{k: full[k] for k in ("capacity", "queued", "inflight")},
        "kv_cache_usage": vllm.get("kv_cache_usage"),
        "scrape_age_s": vllm.get("age_s"),
        "latency_ratio": full["recent"]["latency_ratio"],
        "estimate_ratios": {k: r["ratio"] for k, r in sorted(full["estimate_ratios"].items())},
        **{k: full[k] for k in ("completed", "failed", "ejected", "ejected_reason", "ejected_for_s", "ejections")},
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
        "ready": gw.unready_reason(leadership=False) is None,
        "draining": gw.draining,
        "active_workflows": gw.active_total,
        "parked_calls": len(gw.pool.parked),
        "burst": None if gw.admitter.regime is None else gw.admitter.regime.status(now),
        "window_s": window_s,
        "outcomes": list(GOODPUT_OUTCOMES),
        "workers": [_worker(st, now) for st in gw.pool.workers],
        "tenants": {
            name: tenant_shares(t)
            for name, t in gw.outcome_window.summary(now, (t.name for t in gw.tenants.tenants)).items()
        },
        "tuning": tuning,
        "finished_total": gw.history.total,
        "slowest": [status_entry(wf, now) for wf in gw.history.slowest(SLOWEST, since=now - window_s)],
    }

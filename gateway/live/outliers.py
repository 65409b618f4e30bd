"""Outlier ejection: the verdict on a worker whose recent calls fail or run slow far more than its peers'
(the rules: docs/architecture.md, "Failure handling"). A window entry per call: ``None`` for a worker error,
else observed / ``WorkerPool.under_load_s``, clamped to ``RATIO_CLAMP`` (``WorkerState.add_recent``). No I/O, no
clock."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from gateway.config.gateway import OutlierConfig
from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.live.transport import LiveCall
from gateway.live.worker_state import WorkerState


class OutlierDetector:
    """Judges the workers' windows against their peers' (see the module doc)."""

    def __init__(self, cfg: OutlierConfig) -> None:
        self.cfg = cfg

    def verdict(self, st: WorkerState, peers: Iterable[WorkerState]) -> str | None:
        """Why ``st`` should be ejected, compared with ``peers`` (``st`` skipped), or None (O(peers))."""
        cfg = self.cfg
        n = len(st.recent)
        if not cfg.enabled or n < cfg.min_calls:
            return None
        peer_n = peer_errors = 0
        typicals: list[float] = []  # of the peers with min_calls returned calls
        kin: list[float] = []  # of those, the ones with the same profile: a profile that is off is off for all
        name = st.info.profile.name
        for p in peers:
            if p is st:
                continue
            peer_n += len(p.recent)
            peer_errors += p.recent_failed
            if p.recent_typical is not None and p.recent_returned >= cfg.min_calls:
                typicals.append(p.recent_typical)
                if p.info.profile.name == name:
                    kin.append(p.recent_typical)
        errors = st.recent_failed
        rate = errors / n
        peer_rate = peer_errors / peer_n if peer_n else 0.0
        if rate >= cfg.error_rate and rate - peer_rate >= cfg.error_rate_margin:
            return f"{errors} of its last {n} calls failed (peers: {peer_rate:.0%})"
        mine = st.recent_typical
        base = kin or typicals
        if mine is not None and st.recent_returned >= cfg.min_calls and base:
            # Floored at 1 (as predicted): a worker running as the model predicts is never an outlier, even
            # when its peers' predictions are conservative and they read far below 1.
            theirs = max(statistics.median(base), 1.0)
            if mine >= cfg.latency_ratio * theirs:
                return (
                    f"its last {st.recent_returned} calls took {mine:.3g}x their predicted latency "
                    f"(peers: {theirs:.3g}x)"
                )
        return None

    def judge(self, st: WorkerState, members: Iterable[WorkerState]) -> str | None:
        """Why ``st`` is to be ejected now, or None: its verdict against the workers taking calls, when
        ejecting it keeps within ``max_ejected_fraction`` of ``members`` and leaves one taking calls."""
        if st.ejected or st.removing or not self.cfg.enabled:  # (``verdict`` would say None: no lists for it)
            return None
        pool = [w for w in members if not w.removing]
        reason = self.verdict(st, [w for w in pool if w.eligible])
        if reason is None:
            return None
        ejected = sum(1 for w in pool if w.ejected)
        if ejected + 1 > int(self.cfg.max_ejected_fraction * len(pool)):
            return None
        if not any(w.eligible for w in pool if w is not st):
            return None
        return reason

    def backoff(self, st: WorkerState, now: float) -> float:
        """The length of ``st``'s next ejection (forgets old ejections after ``max_ejection_s`` admitted)."""
        cfg = self.cfg
        if st.readmitted_at is not None and st.ejected_until is None and now - st.readmitted_at > cfg.max_ejection_s:
            st.ejections = 0
        return float(min(cfg.base_ejection_s * 2.0 ** min(st.ejections, 30), cfg.max_ejection_s))


def probe_call(now: float) -> LiveCall:
    """The call that probes an ejected worker: a one-token completion of a one-token prompt, sent (and
    its answer checked) like any call, so a worker whose ``/health`` answers but whose engine does not
    stays out. It carries no ``priority`` (vLLM's default, which every worker takes)."""
    spec = CallSpec("probe", 1, 1)
    wf = StagedWorkflow(0, "", now, now, [Stage("probe", (spec,))])
    return LiveCall(
        id=0,
        workflow=wf,
        spec=spec,
        ready_at=now,
        endpoint="/v1/completions",
        body={"prompt": [100], "max_tokens": 1, "temperature": 0},
        priority=None,
    )

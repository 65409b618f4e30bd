"""Building a workload: one staged workflow per arrival, assigned to a tenant by share."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.degrade import Degrader, Knobs, QualityModel
from gateway.core.workflow import CHAT, CallSpec, Stage, StagedWorkflow, WorkflowTemplate
from gateway.sim.degrade import KnobbedWorkflow
from gateway.sim.workload.generator import sample_chat_call
from gateway.sim.workload.tenants import TenantSpec
from gateway.sim.workload.traces import to_stages


def build_workload(
    queries: Sequence[list[CallSpec]],
    arrivals: Sequence[float],
    *,
    tenants: Sequence[TenantSpec],
    slo_s: float,
    rng: random.Random,
    quality: QualityModel | None = None,
    full: Knobs | None = None,
    plan_template: WorkflowTemplate | None = None,
    deadline_rule: bool = False,
) -> list[StagedWorkflow]:
    """One workflow per arrival (ids in arrival order), for a tenant drawn by share: a Text-to-SQL tenant's k-th
    replays ``queries[k % len(queries)]`` (``KnobbedWorkflow`` when its quality is not ``full``: ``quality``
    required), a chat tenant's is one ``CHAT`` call."""
    if not tenants:
        raise ValueError("at least one tenant is needed")
    if not (slo_s > 0 and math.isfinite(slo_s)):
        raise ValueError(f"slo_s must be a positive number, got {slo_s}")
    if not queries and any(t.kind == "text2sql" for t in tenants):
        raise ValueError("a text2sql tenant needs at least one query")
    cumulative = list(itertools.accumulate(t.share for t in tenants))
    total = cumulative[-1]
    full_knobs = full if full is not None else Knobs(2, 10, True)
    degraders: dict[str, Degrader] = {}
    for t in tenants:
        if t.kind == "text2sql" and t.quality != "full":
            if quality is None:
                raise ValueError(f"tenant {t.name!r} degrades ({t.quality}): a quality model is needed")
            degraders[t.name] = Degrader(t.quality, full_knobs, quality)
    staged: dict[int, tuple[Stage, ...]] = {}
    out: list[StagedWorkflow] = []
    k = 0
    for wid, arrival in enumerate(sorted(arrivals)):
        tenant = tenants[bisect.bisect_right(cumulative, rng.random() * total)]
        deadline = arrival + tenant.relative_deadline(slo_s)
        if tenant.kind == "chat":
            call = sample_chat_call(rng)
            stages: tuple[Stage, ...] = (Stage(CHAT, (call,)),)
            out.append(StagedWorkflow(wid, tenant.name, arrival, deadline, stages, template=None))
            continue
        q = k % len(queries)
        k += 1
        if q not in staged:
            staged[q] = tuple(to_stages(queries[q]))
        deg = degraders.get(tenant.name)
        if deg is not None or deadline_rule:
            out.append(
                KnobbedWorkflow(
                    wid,
                    tenant.name,
                    arrival,
                    deadline,
                    staged[q],
                    template=CHESS_TEMPLATE,
                    full=full_knobs,
                    degrader=deg,
                    plan_template=plan_template,
                    deadline_rule=deadline_rule,
                )
            )
        else:
            out.append(StagedWorkflow(wid, tenant.name, arrival, deadline, staged[q], template=CHESS_TEMPLATE))
    return out

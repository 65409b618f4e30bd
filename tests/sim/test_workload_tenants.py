"""Workload tenants and mixes, and building a workload from queries, arrivals and tenants."""

from __future__ import annotations

import random
import re

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.workflow import CHAT, IR, REVISE, CallSpec
from gateway.sim.workload.arrivals import poisson_arrivals
from gateway.sim.workload.build import build_workload
from gateway.sim.workload.generator import generate_chess_bird
from gateway.sim.workload.tenants import TenantSpec, parse_tenants
from gateway.sim.workload.traces import to_stages


def test_build_workload_assigns_tenants_by_share_and_sets_deadlines() -> None:
    tenants = [
        TenantSpec("gold", slo_scale=3.0, share=0.3),
        TenantSpec("silver", share=0.5),
        TenantSpec("chat", deadline_s=20.0, share=0.2, kind="chat"),
    ]
    queries = generate_chess_bird(7, random.Random(0))
    arrivals = poisson_arrivals(20000, 50.0, random.Random(1))
    wfs = build_workload(queries, arrivals, tenants=tenants, slo_s=10.0, rng=random.Random(2))
    assert [w.wid for w in wfs] == list(range(20000))
    assert [w.arrival for w in wfs] == arrivals
    counts = {t.name: sum(w.tenant == t.name for w in wfs) for t in tenants}
    assert counts["gold"] / 20000 == pytest.approx(0.3, abs=0.015)
    assert counts["silver"] / 20000 == pytest.approx(0.5, abs=0.015)
    assert counts["chat"] / 20000 == pytest.approx(0.2, abs=0.015)
    relative = {"gold": 30.0, "silver": 10.0, "chat": 20.0}
    for w in wfs:
        assert w.deadline == pytest.approx(w.arrival + relative[w.tenant])
        if w.tenant == "chat":
            assert w.template is None
            assert [(s.kind, len(s.calls)) for s in w.stages] == [(CHAT, 1)]
        else:
            assert w.template is CHESS_TEMPLATE
    text2sql = [w for w in wfs if w.tenant != "chat"]
    for k, w in enumerate(text2sql[:30]):
        assert list(w.stages) == to_stages(queries[k % len(queries)])


def test_build_workload_orders_ids_by_arrival_and_cycles_queries() -> None:
    queries = [[CallSpec(IR, 1, 1)], [CallSpec(REVISE, 2, 2)]]
    wfs = build_workload(queries, [3.0, 1.0, 2.0], tenants=[TenantSpec("a")], slo_s=5.0, rng=random.Random(0))
    assert [(w.wid, w.arrival, w.stages[0].kind) for w in wfs] == [
        (0, 1.0, IR),
        (1, 2.0, REVISE),
        (2, 3.0, IR),
    ]
    assert [w.deadline for w in wfs] == [6.0, 7.0, 8.0]


def test_build_workload_is_deterministic_per_seed() -> None:
    tenants = parse_tenants("a:share=1,b:share=1:kind=chat")
    queries = generate_chess_bird(3, random.Random(0))

    def build(seed: int) -> list[tuple[str, tuple[CallSpec, ...]]]:
        wfs = build_workload(
            queries, [float(i) for i in range(200)], tenants=tenants, slo_s=1.0, rng=random.Random(seed)
        )
        return [(w.tenant, w.stages[0].calls) for w in wfs]

    assert build(1) == build(1)
    assert build(1) != build(2)


def test_build_workload_rejects_missing_inputs() -> None:
    with pytest.raises(ValueError, match="at least one query"):
        build_workload([], [0.0], tenants=[TenantSpec("a")], slo_s=1.0, rng=random.Random(0))
    with pytest.raises(ValueError, match="tenant"):
        build_workload([[CallSpec(IR, 1, 1)]], [0.0], tenants=[], slo_s=1.0, rng=random.Random(0))
    chat_only = build_workload([], [0.0], tenants=[TenantSpec("c", kind="chat")], slo_s=1.0, rng=random.Random(0))
    assert chat_only[0].stages[0].kind == CHAT


def test_parse_tenants_reads_a_mix() -> None:
    got = parse_tenants(
        "gold:share=0.3:slo_scale=3, silver:share=0.7:slo_scale=8,chat:kind=chat:share=0.2:deadline_s=20"
    )
    assert got == [
        TenantSpec("gold", slo_scale=3.0, share=0.3),
        TenantSpec("silver", slo_scale=8.0, share=0.7),
        TenantSpec("chat", deadline_s=20.0, share=0.2, kind="chat"),
    ]
    assert parse_tenants("solo") == [TenantSpec("solo")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty tenant spec"),
        ("gold,", "part ''"),
        ("share=1", "part 'share=1': expected a tenant name"),
        ("gold:share", "part 'gold:share': expected key=value"),
        ("gold:share=", "expected key=value"),
        ("gold:weight=2", "unknown key 'weight'"),
        ("gold:share=abc", "share must be a number"),
        ("gold:share=0", "share must be a positive number"),
        ("gold:slo_scale=-1", "slo_scale must be a positive number"),
        ("gold:deadline_s=nan", "deadline_s must be a positive number"),
        ("gold:kind=batch", "kind must be text2sql or chat"),
        ("gold:share=1:share=2", "key 'share' given twice"),
        ("gold,gold", "tenant 'gold' given twice"),
    ],
)
def test_parse_tenants_names_the_offending_part(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_tenants(spec)

"""DAG workflows: validation, release order, budgets, and equivalence with staged workflows."""

from __future__ import annotations

import random

import pytest

from gateway.config import load_cluster
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.dag import DagCallSpec, DagError, DagNode, DagWorkflow, chain_nodes
from gateway.core.workflow import StagedWorkflow
from gateway.sim.simulator import Simulator
from gateway.sim.workload import TenantSpec, build_workload, generate_chess_bird, poisson_arrivals


def n(id_: str, *deps: str, kind: str = "k", i: int = 10, o: int = 2) -> DagNode:
    return DagNode(id_, kind, i, o, deps)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "at least one call"),
        ([n("a"), n("a")], "calls.1.id: duplicate call id 'a'"),
        ([n("a", "b")], "calls.0.depends_on: call 'a' depends on unknown call 'b'"),
        ([n("a", "a")], "depends on itself"),
        ([n("a", "c"), n("b", "a"), n("c", "b"), n("d")], "cycle through 'a', 'b', 'c'"),
    ],
)
def test_invalid_dags_name_the_problem(nodes: list[DagNode], message: str) -> None:
    with pytest.raises(DagError, match=message):
        DagWorkflow.build(0, "t", 0.0, 10.0, nodes)


def test_diamond_releases_join_after_both_parents() -> None:
    wf = DagWorkflow.build(0, "t", 0.0, 10.0, [n("a"), n("b", "a"), n("c", "a"), n("d", "b", "c", "b")])
    first = wf.start()
    assert [s.node for s in first if isinstance(s, DagCallSpec)] == [0]
    mid = wf.complete(first[0])
    assert sorted(s.node for s in mid if isinstance(s, DagCallSpec)) == [1, 2]
    assert wf.complete(mid[0]) == []
    last = wf.complete(mid[1])
    assert [s.node for s in last if isinstance(s, DagCallSpec)] == [3]
    assert not wf.done
    assert wf.complete(last[0]) == []
    assert wf.done
    with pytest.raises(RuntimeError, match="completed twice"):
        wf.complete(last[0])


def test_remaining_is_the_unreleased_critical_path() -> None:
    def cost(kind: str, i: int, o: int) -> float:
        return float(o)

    # a -> (b: 5, c: 1) -> d: 2 ; the longest unreleased path after a is b + d = 7.
    wf = DagWorkflow.build(0, "t", 0.0, 10.0, [n("a", o=1), n("b", "a", o=5), n("c", "a", o=1), n("d", "b", "c", o=2)])
    assert wf.expected_remaining(cost) == 8.0  # nothing released yet: a + b + d
    first = wf.start()
    assert wf.expected_remaining(cost) == 7.0
    wf.complete(first[0])
    assert wf.expected_remaining(cost) == 2.0


def test_chain_dag_with_template_simulates_like_staged_workflows() -> None:
    """A trace query as a DAG of its stages, budgeted by the template, is the same workload."""
    workers = load_cluster("paper-4gpu")
    rng = random.Random(3)
    queries = generate_chess_bird(40, rng)
    arrivals = poisson_arrivals(40, 0.1, random.Random(4))
    staged = build_workload(queries, arrivals, tenants=[TenantSpec("t")], slo_s=250.0, rng=random.Random(5))
    dags = [
        DagWorkflow.build(
            w.wid, w.tenant, w.arrival, w.deadline, chain_nodes([s.calls for s in w.stages]), CHESS_TEMPLATE
        )
        for w in staged
    ]
    assert all(isinstance(w, StagedWorkflow) for w in staged)
    a = Simulator(workers, "hexgen", alpha=0.3, record_calls=True).run(staged)
    b = Simulator(workers, "hexgen", alpha=0.3, record_calls=True).run(dags)
    assert [(r.wid, r.finish) for r in a.workflows] == [(r.wid, r.finish) for r in b.workflows]
    assert [(c.wid, c.worker, c.start) for c in a.calls] == [(c.wid, c.worker, c.start) for c in b.calls]


def test_shifted_copy_is_unstarted() -> None:
    wf = DagWorkflow.build(0, "t", 0.0, 10.0, [n("a"), n("b", "a")])
    wf.complete(wf.start()[0])
    copy = wf.shifted(5.0, 20.0)
    assert (copy.arrival, copy.deadline, copy.done) == (5.0, 20.0, False)
    assert [s.kind for s in copy.start()] == ["k"]


@pytest.mark.parametrize("template", [None, CHESS_TEMPLATE])
def test_a_one_node_dag_is_built_as_any_other(template: object) -> None:
    """The one-call shortcut of ``build`` (a chat completion) makes the workflow the general path makes."""
    node = DagNode("chat", "information_retriever", 300, 5)
    one = DagWorkflow.build(3, "t", 1.0, 9.0, [node], CHESS_TEMPLATE if template else None)
    general = DagWorkflow.build(3, "t", 1.0, 9.0, [node, n("x")], CHESS_TEMPLATE if template else None)
    assert (one._order, one._deps, one._children) == ((0,), ((),), ((),))
    assert (general._order[:1], general._deps[:1], general._children[:1]) == ((0,), ((),), ((),))

    def cost(kind: str, i: int, o: int) -> float:
        return float(i + o)

    assert one.expected_remaining(cost) == (305.0 if template is None else CHESS_TEMPLATE.remaining_after(-1, 0, cost))
    (spec,) = one.start()
    assert spec == DagCallSpec("information_retriever", 300, 5, (), node=0)
    assert not one.done
    assert one.complete(spec) == []
    assert one.done

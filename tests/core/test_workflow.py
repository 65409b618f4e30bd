"""Workflows are revealed stage by stage; the template gives the expected remaining cost."""

from __future__ import annotations

import itertools

import pytest

from gateway.config.workflows import CHESS_PARALLEL_KINDS, CHESS_TEMPLATE, STANDARD_WORKFLOW
from gateway.core.workflow import (
    CANDIDATE,
    EVALUATE,
    IR,
    KEYWORDS,
    REVISE,
    UNIT_TESTER,
    Call,
    CallSpec,
    StagedWorkflow,
    group_calls,
)


def unit_cost(kind: str, n_in: int, n_out: int) -> float:
    return 1.0


def chess_calls(revises: int) -> list[CallSpec]:
    c = [CallSpec(IR, 300, 5), CallSpec(KEYWORDS, 600, 40)] + [CallSpec(IR, 300, 5)] * 3
    c += [CallSpec(CANDIDATE, 11000, 600)] * 2 + [CallSpec(REVISE, 6000, 80)] * revises
    c += [CallSpec(UNIT_TESTER, 270, 4), CallSpec(EVALUATE, 900, 20), CallSpec(EVALUATE, 900, 20)]
    return c


def test_group_calls_runs_candidates_and_evaluations_in_parallel() -> None:
    stages = group_calls(chess_calls(2), CHESS_PARALLEL_KINDS)
    assert [(s.kind, len(s.calls)) for s in stages] == [
        (IR, 1),
        (KEYWORDS, 1),
        (IR, 1),
        (IR, 1),
        (IR, 1),
        (CANDIDATE, 2),
        (REVISE, 1),
        (REVISE, 1),
        (UNIT_TESTER, 1),
        (EVALUATE, 2),
    ]


def test_staged_workflow_releases_one_stage_at_a_time() -> None:
    wf = StagedWorkflow(0, "t", 0.0, 100.0, group_calls(chess_calls(0), CHESS_PARALLEL_KINDS), CHESS_TEMPLATE)
    released = [wf.start()]
    while not wf.done:
        ready: list[CallSpec] = []
        for spec in released[-1]:
            ready += wf.complete(spec)
        if ready:
            released.append(ready)
    assert [len(r) for r in released] == [1, 1, 1, 1, 1, 2, 1, 2]
    with pytest.raises(RuntimeError):
        wf.complete(released[0][0])


def test_expected_remaining_shrinks_as_the_workflow_advances() -> None:
    wf = StagedWorkflow(0, "t", 0.0, 100.0, group_calls(chess_calls(3), CHESS_PARALLEL_KINDS), CHESS_TEMPLATE)
    seen = []
    ready = wf.start()
    while ready:
        seen.append(wf.expected_remaining(unit_cost))
        nxt: list[CallSpec] = []
        for spec in ready:
            nxt += wf.complete(spec)
        ready = nxt
    assert seen[0] == pytest.approx(sum(p.rounds for p in CHESS_TEMPLATE.phases) - 1.0)
    assert all(a >= b for a, b in itertools.pairwise(seen))
    assert seen[-1] < 3.0


def test_template_revise_rounds_reduce_expected_remaining() -> None:
    t = CHESS_TEMPLATE
    i = t.advance(3, REVISE)
    assert t.phases[i].kind == REVISE and t.advance(i, REVISE) == i
    assert t.remaining_after(i, 1, unit_cost) > t.remaining_after(i, 3, unit_cost)


def test_template_skips_optional_phase_and_does_not_rematch_non_repeatable() -> None:
    t = CHESS_TEMPLATE
    first = t.advance(-1, IR)
    assert first == 0
    # No keyword extraction: the next IR call matches the repeatable IR phase after it, not phase 0.
    assert t.advance(first, IR) == 2


def test_standard_workflow_is_the_templates_critical_path() -> None:
    kinds = [p.kind for p in CHESS_TEMPLATE.phases for _ in range(round(p.rounds))]
    assert kinds[:6] == [c.kind for c in STANDARD_WORKFLOW][:6]
    assert len(STANDARD_WORKFLOW) == 15  # the published standard workflow: 4 revise calls among them


def test_online_workflow_budgets_like_the_staged_workflow_of_its_stages() -> None:
    from gateway.config.workflows import CHESS_TEMPLATE
    from gateway.core.workflow import OnlineWorkflow, Stage, StagedWorkflow

    def cost(kind: str, i: int, o: int) -> float:
        return i / 1000 + o / 10

    stages = [
        Stage("information_retriever", (CallSpec("information_retriever", 300, 7),)),
        Stage("generate_candidate", (CallSpec("generate_candidate", 9000, 600),) * 2),
        Stage("revise", (CallSpec("revise", 7000, 120),)),
        Stage("revise", (CallSpec("revise", 7000, 120),)),
        Stage("evaluate", (CallSpec("evaluate", 1000, 30),) * 2),
    ]
    staged = StagedWorkflow(0, "t", 0.0, 100.0, stages, CHESS_TEMPLATE)
    online = OnlineWorkflow(0, "t", 0.0, 100.0, CHESS_TEMPLATE)
    released = staged.start()
    for st in stages:
        online.begin_stage(st.kind, st.calls)
        assert online.expected_remaining(cost) == staged.expected_remaining(cost)
        assert not online.done
        for spec in released:
            online.stage_call_done()
            nxt = staged.complete(spec)
        released = nxt
        assert online.done
    assert [s.kind for s in online.stages] == [s.kind for s in stages]


def test_calls_written_out_init_takes_every_field_in_order_with_its_default() -> None:
    """``Call.__init__`` is written out (the native build compiles it; a generated one would run interpreted): it
    must take exactly the dataclass's fields, in order, with the same defaults, and store each."""
    import ast
    import dataclasses
    from pathlib import Path

    # From the source: a compiled __init__ has no introspectable signature.
    tree = ast.parse((Path(__file__).resolve().parents[2] / "gateway" / "core" / "workflow.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Call")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = [a.arg for a in init.args.args[1:]]
    defaults = [ast.literal_eval(d) for d in init.args.defaults]
    fields = dataclasses.fields(Call)
    assert params == [f.name for f in fields]
    assert [f.default for f in fields if f.default is not dataclasses.MISSING] == defaults
    assert len(fields) - len(defaults) == 4  # id, workflow, spec, ready_at
    wf = StagedWorkflow(1, "t", 0.0, 10.0, [])
    spec = CallSpec("revise", 10, 2)
    special: dict[str, object] = {
        "id": 7,
        "workflow": wf,
        "spec": spec,
        "ready_at": 1.25,
        "_prefix_keys": [(1, 2)],
        "parent": Call(3, wf, spec, 0.5),
    }

    def value(i: int, default: object) -> object:
        """A value for a field unlike its default, of the field's type (from the default: None means float)."""
        if isinstance(default, bool):
            return not default
        if isinstance(default, int):
            return default + i + 1
        return i + 0.5

    values = {f.name: special[f.name] if f.name in special else value(i, f.default) for i, f in enumerate(fields)}
    call = Call(**values)  # type: ignore[arg-type]
    assert {f.name: getattr(call, f.name) for f in fields} == values
    plain = Call(3, wf, spec, 1.5)
    got = (plain.id, plain.workflow, plain.spec, plain.ready_at, plain.worker, plain.started_at)
    assert got == (3, wf, spec, 1.5, -1, None)

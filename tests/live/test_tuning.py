"""The alpha tuner's window: recorded workflows pickle for the tuning process and rebuild identically."""

from __future__ import annotations

import pickle

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.dag import DagNode, DagWorkflow, chain_nodes
from gateway.core.workflow import CANDIDATE, IR, REVISE, CallSpec, OnlineWorkflow
from gateway.live.tuning import WindowRecorder, rebuild


def shape(wf: DagWorkflow) -> tuple[object, ...]:
    """What a rebuilt workflow is made of (``DagWorkflow.build`` derives the rest from the nodes)."""
    name = wf.template.name if wf.template is not None else None
    return (wf.wid, wf.tenant, wf.arrival, wf.deadline, wf.nodes, name)


def test_a_recorded_window_pickles_and_rebuilds_identical_workflows() -> None:
    nodes = [
        DagNode("ir", IR, 300, 5),
        DagNode("a", CANDIDATE, 1000, 80, ("ir",)),
        DagNode("b", CANDIDATE, 900, 70, ("ir",)),
        DagNode("r", REVISE, 600, 40, ("a", "b")),
    ]
    dag = DagWorkflow.build(7, "gold", 10.0, 40.0, nodes, CHESS_TEMPLATE)
    online = OnlineWorkflow(8, "chat", 12.0, 30.0)
    online.begin_stage(IR, [CallSpec(IR, 300, 5)])
    online.begin_stage(CANDIDATE, [CallSpec(CANDIDATE, 1000, 80), CallSpec(CANDIDATE, 900, 70)])
    recorder = WindowRecorder(window_s=60.0, max_workflows=10)
    recorder.record(dag)
    recorder.record_online(online)
    recorder.record_online(OnlineWorkflow(9, "chat", 13.0, 30.0))  # ran no stage: not recorded
    window = recorder.snapshot(now=15.0)

    assert [e.nodes for e in window] == [dag.nodes, tuple(chain_nodes([st.calls for st in online.stages]))]
    assert [e.template for e in window] == ["chess", None]
    back = pickle.loads(pickle.dumps(window))
    assert back == window

    rebuilt = rebuild(back)
    assert [shape(w) for w in rebuilt] == [shape(w) for w in rebuild(window)]
    first, second = rebuilt
    assert shape(first) == shape(DagWorkflow.build(0, "gold", 0.0, 30.0, nodes, CHESS_TEMPLATE))
    assert first.template is CHESS_TEMPLATE
    assert (second.arrival, second.deadline, second.template) == (2.0, 20.0, None)
    assert [n.depends_on for n in second.nodes] == [(), ("c0.0",), ("c0.0",)]

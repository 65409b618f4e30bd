"""The alpha tuner's window and decisions: the last N finished workflows (bounded, with a staleness guard),
pickled for the tuning process and rebuilt identically; a run every K workflows; the hysteresis rule."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from gateway.config.gateway import load_gateway_config
from gateway.config.operations import TuningConfig
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.dag import DagNode, DagWorkflow, chain_nodes
from gateway.core.workflow import CANDIDATE, IR, REVISE, CallSpec, OnlineWorkflow
from gateway.errors import ConfigError
from gateway.live.tuning import AlphaTuner, Retuner, TuneOutcome, WindowRecorder, rebuild
from gateway.sim.tune import ALPHA_GRID
from tests.live.harness import write_config

if TYPE_CHECKING:
    from gateway.live.service import Gateway


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
    recorder = WindowRecorder(size=10, max_age_s=60.0)
    recorder.record(dag)
    recorder.record(online)
    recorder.record(OnlineWorkflow(9, "chat", 13.0, 30.0))  # ran no stage: not recorded
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


def _entry_wf(wid: int, arrival: float) -> DagWorkflow:
    return DagWorkflow.build(wid, "t", arrival, arrival + 100.0, [DagNode("a", IR, 100, 5)])


def test_the_window_keeps_the_last_n_finished_workflows_in_finish_order_and_counts_all() -> None:
    recorder = WindowRecorder(size=3)
    for wid, arrival in enumerate([5.0, 1.0, 7.0, 2.0, 9.0]):  # finish order; arrivals out of order
        recorder.record(_entry_wf(wid, arrival))
    assert len(recorder) == 3 and recorder.total == 5
    # The last three to finish (arrivals 7, 2, 9), replayed oldest arrival first.
    assert [e.arrival for e in recorder.snapshot(now=10.0)] == [2.0, 7.0, 9.0]


def test_the_staleness_guard_leaves_out_workflows_that_arrived_too_long_ago() -> None:
    recorder = WindowRecorder(size=10, max_age_s=100.0)
    for wid, arrival in enumerate([0.0, 50.0, 120.0, 30.0]):
        recorder.record(_entry_wf(wid, arrival))
    assert [e.arrival for e in recorder.snapshot(now=140.0)] == [50.0, 120.0]
    assert len(recorder) == 2 and recorder.total == 4, "stale entries are forgotten, the count is not"
    assert [e.arrival for e in recorder.snapshot(now=0.0)] == [50.0, 120.0], "t = 0 is a valid time"


@pytest.mark.parametrize("bad", [{"size": 0}, {"size": 5, "max_age_s": 0.0}])
def test_a_window_without_room_or_age_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"window|max_age_s"):
        WindowRecorder(**bad)  # type: ignore[arg-type]


def test_a_run_is_due_every_k_finished_workflows_and_takes_the_window_at_that_point() -> None:
    cfg = TuningConfig(window_workflows=10, every_workflows=3, min_workflows=2)
    recorder = WindowRecorder(cfg.window_workflows, cfg.max_age_s)
    retuner = Retuner(cfg, recorder)
    due = []
    for wid in range(8):
        recorder.record(_entry_wf(wid, float(wid)))
        due.append(retuner.due())
        if due[-1]:
            assert retuner.enough(retuner.take_window(float(wid)))
    assert due == [False, False, True, False, False, True, False, False]
    assert not retuner.enough(WindowRecorder(5).snapshot(0.0))


@pytest.mark.parametrize(
    ("current", "p95", "hysteresis", "applied"),
    [
        (0.5, {0.0: 90.0, 0.5: 100.0, 1.0: 120.0}, 0.05, True),  # 10% better: switch
        (0.5, {0.0: 97.0, 0.5: 100.0, 1.0: 120.0}, 0.05, False),  # 3% better, under the hysteresis: keep
        (0.0, {0.0: 90.0, 0.5: 100.0, 1.0: 120.0}, 0.0, False),  # the current one is chosen: nothing to do
        (0.45, {0.0: 90.0, 0.5: 100.0, 1.0: 120.0}, 0.05, True),  # off the grid: compared with the nearest
    ],
)
def test_the_chosen_alpha_is_applied_only_when_it_beats_the_current_by_the_hysteresis(
    current: float, p95: dict[float, float], hysteresis: float, applied: bool
) -> None:
    retuner = Retuner(TuningConfig(hysteresis=hysteresis), WindowRecorder(10))
    out = TuneOutcome(min(p95, key=lambda a: p95[a]), p95, workflows=50, seconds=0.1)
    assert retuner.should_apply(out, current) is applied


def test_the_grid_is_the_configured_one_or_the_default() -> None:
    assert Retuner(TuningConfig(), WindowRecorder(1)).grid() == list(ALPHA_GRID)
    assert Retuner(TuningConfig(grid=[0.2, 0.4]), WindowRecorder(1)).grid() == [0.2, 0.4]


def test_tuning_settings_are_checked_and_old_keys_are_named() -> None:
    with pytest.raises(ValueError, match="min_workflows"):
        TuningConfig(window_workflows=20, min_workflows=30)
    with pytest.raises(ValueError, match="window_workflows"):
        TuningConfig(window_workflows=5)
    with pytest.raises(ValueError, match="grid"):
        TuningConfig(grid=[])
    for old in ("window_s", "max_window_workflows"):
        with pytest.raises(ValueError, match=rf"{old}[\s\S]*window_workflows"):
            TuningConfig.model_validate({old: 600})


def test_a_gateway_file_with_the_old_window_key_names_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"], tuning={"window_s": 600})
    with pytest.raises(ConfigError, match=r"tuning\.window_s"):
        load_gateway_config(path)


async def test_the_background_task_tunes_only_once_k_more_workflows_have_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class StubGateway:
        recorder = WindowRecorder(10)

    gw = StubGateway()
    cfg = TuningConfig(interval_s=0.01, every_workflows=2, window_workflows=10, min_workflows=1)
    tuner = AlphaTuner(cast("Gateway", gw), cfg)
    runs: list[int] = []

    async def tune_once() -> str:
        runs.append(gw.recorder.total)
        tuner.retuner.take_window(0.0)
        return "kept"

    monkeypatch.setattr(tuner, "tune_once", tune_once)
    stop = asyncio.Event()
    task = asyncio.create_task(tuner.run(stop))
    gw.recorder.record(_entry_wf(0, 0.0))
    for _ in range(5):  # several check intervals with one new workflow: not due
        await asyncio.sleep(0.01)
    assert runs == []
    gw.recorder.record(_entry_wf(1, 1.0))
    async with asyncio.timeout(5):
        while not runs:
            await asyncio.sleep(0.01)
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert runs == [2], "one run per K workflows, however many checks pass"
    stop.set()
    await task


async def test_a_run_that_keeps_alpha_logs_at_debug_and_one_that_changes_it_at_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run every tuning interval that keeps alpha is not news (DEBUG); a change of alpha is (INFO)."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from gateway.live import tuning
    from gateway.live.metrics import GatewayMetrics

    gw = SimpleNamespace(
        recorder=WindowRecorder(10),
        clock=lambda: 10.0,
        cfg=SimpleNamespace(seed=0, prefix_caching=True),
        scheduler=SimpleNamespace(workers=["w"], members=lambda: [0], alpha=0.3, policy=SimpleNamespace(name="hexgen")),
        metrics=GatewayMetrics(["w"], ["t"]),
    )
    tuner = AlphaTuner(cast("Gateway", gw), TuningConfig(window_workflows=10, min_workflows=1, hysteresis=0.0))
    outcomes = iter([TuneOutcome(0.3, {0.3: 5.0, 0.5: 6.0}, 1, 0.1), TuneOutcome(0.5, {0.3: 5.0, 0.5: 4.0}, 1, 0.1)])
    monkeypatch.setattr(tuning, "tune_window", lambda *_args: next(outcomes))
    with ThreadPoolExecutor(1) as pool:
        monkeypatch.setattr(tuner, "_pool", lambda: pool)
        gw.recorder.record(_entry_wf(0, 0.0))
        with caplog.at_level("DEBUG", logger="hexflow"):
            assert await tuner.tune_once() == "kept"
            gw.recorder.record(_entry_wf(1, 1.0))
            assert await tuner.tune_once() == "applied"
    levels = {r.getMessage().split(" ")[1]: r.levelname for r in caplog.records if r.getMessage().startswith("alpha")}
    assert levels == {"kept": "DEBUG", "0.30": "INFO"}

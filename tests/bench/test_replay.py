"""Trace replay: the workload is the simulated bench's, the body is a chain DAG, and a replay against a
real gateway over emulated workers completes, measures in modelled seconds and reports refusals."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.bench.replay import (
    ReplayError,
    ReplayWorkflow,
    replay,
    replay_setup,
    replay_workload,
    scale_queries,
    shared_prefix,
)
from gateway.bench.simbench import Setup, fluid_bound
from gateway.config import load_cluster
from gateway.config.gateway import load_gateway_config
from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.prefix import PrefixSeg
from gateway.errors import GatewayError
from gateway.live.schemas import WorkflowRequest
from gateway.live.server import build_app
from gateway.sim.metrics import percentile
from gateway.sim.simulator import Simulator
from gateway.sim.workload import load_queries, poisson_arrivals
from tests.cli_run import run_cli
from tests.emulator_process import free_port
from tests.live.harness import INTERACTIVE_KEY, emulators, serving, write_config

CLUSTER = "paper-4gpu"
GPUS = ["A100", "A100", "A6000", "L40S"]
TIME_SCALE = 0.02  # the interactive demo tenant accepts deadlines >= 5 s: 5 x 53.8 s x 0.02 = 5.4 s


@contextlib.asynccontextmanager
async def live_gateway(tmp: Path, gpus: list[str] = GPUS, **overrides: Any) -> AsyncIterator[str]:
    """Emulated workers and the gateway app served by uvicorn on a free loopback port; yields its URL."""
    async with emulators(gpus, time_scale=TIME_SCALE) as urls:
        app = build_app(load_gateway_config(write_config(tmp, urls, gpus, time_scale=TIME_SCALE, **overrides)))
        async with serving(app, what="the gateway") as url:
            yield url


def bench_setup(n: int, seed: int) -> Setup:
    """The scenario exactly as ``hexflow bench --trace chess-bird`` builds it."""
    workers = load_cluster(CLUSTER)
    queries = load_queries("chess-bird", n, random.Random(seed))
    return Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=n, slo_scale=5.0, seed=seed)


@pytest.mark.parametrize("seed", [0, 7])
def test_workload_is_the_simulated_benchs_workload(seed: int) -> None:
    rate = 0.09
    setup = replay_setup("chess-bird", load_cluster(CLUSTER), workflows=12, seed=seed, slo_scale=5.0)
    ours = replay_workload(setup, rate)
    theirs = bench_setup(12, seed).workflows(rate)
    assert [w.wid for w in ours] == [w.wid for w in theirs]
    assert [w.arrival_s for w in ours] == [w.arrival for w in theirs]
    assert [w.arrival_s + w.deadline_s for w in ours] == pytest.approx([w.deadline for w in theirs], rel=1e-12)
    assert [w.stages for w in ours] == [tuple(w.stages) for w in theirs]
    # Poisson arrivals at `rate` workflows per modelled second from random.Random(seed).
    assert [w.arrival_s for w in ours] == pytest.approx(poisson_arrivals(12, rate, random.Random(seed)), rel=1e-9)
    assert {round(w.deadline_s, 9) for w in ours} == {round(setup.slo_s, 9)}


def test_fixed_deadline_and_trace_file_are_cycled(tmp_path: Path) -> None:
    trace = tmp_path / "tiny.json"
    steps = [{"step": "Information Retriever", "input_length": 300, "output_length": 5}]
    steps += [
        {"step": "generate_candidate_llama-agent", "input_length": 900 + i, "output_length": 40} for i in range(2)
    ]
    trace.write_text(json.dumps([{"Text2SQLRequest": steps}, {"Text2SQLRequest": steps[:1]}]))
    setup = replay_setup(str(trace), load_cluster(CLUSTER), workflows=5, seed=1, deadline_s=77.0)
    wfs = replay_workload(setup, 0.5)
    assert setup.trace == "tiny" and len(wfs) == 5
    assert [sum(len(s.calls) for s in w.stages) for w in wfs] == [3, 1, 3, 1, 3]
    assert all(w.deadline_s == pytest.approx(77.0) for w in wfs)
    assert [len(w.stages) for w in wfs] == [2, 1, 2, 1, 2]  # the two candidates run as one stage


def test_body_is_a_chain_of_exact_length_calls_with_scaled_deadline() -> None:
    w = replay_workload(replay_setup("chess-bird", load_cluster(CLUSTER), workflows=3, seed=2), 0.1)[0]
    body = w.body(0.05)
    assert body["template"] == "chess" and body["return_outputs"] is False
    assert body["deadline_s"] == pytest.approx(w.deadline_s * 0.05)
    calls = body["calls"]
    assert len(calls) == sum(len(s.calls) for s in w.stages)
    by_stage: list[list[dict[str, Any]]] = []
    it = iter(calls)
    for stage in w.stages:
        by_stage.append([next(it) for _ in stage.calls])
        for spec, call in zip(stage.calls, by_stage[-1], strict=True):
            assert call["kind"] == spec.kind
            assert call["prompt_tokens"] == spec.input_tokens
            assert call["max_tokens"] == call["min_tokens"] == spec.output_tokens
            assert call["ignore_eos"] is True
            # The prompt's shared segments, as the simulator's engines cache them.
            want = [(p.name, p.tokens, "workflow" if p.per_query else "global") for p in spec.prefix]
            got = [(p["name"], p["tokens"], p["scope"]) for p in call.get("shared_prefix", [])]
            assert got == want
    assert all(c["depends_on"] == [] for c in by_stage[0])
    for prev, cur in itertools.pairwise(by_stage):
        for c in cur:
            assert c["depends_on"] == [p["id"] for p in prev]
    WorkflowRequest.model_validate(body)  # the gateway accepts it


def test_every_shared_segment_of_a_trace_reaches_the_body() -> None:
    """Over a recorded trace, every call's prefix chain becomes its ``shared_prefix``: templates global, what a
    query's rounds repeat scoped to the workflow; the gateway accepts every body."""
    try:
        setup = replay_setup("trace1", load_cluster(CLUSTER), workflows=40, seed=0)
    except GatewayError:
        pytest.skip("trace1 (../shared/data/hexgen-traces) is not available")
    wfs = replay_workload(setup, 0.1)
    scopes: Counter[str] = Counter()
    for w in wfs:
        body = w.body(0.05)
        specs = [spec for stage in w.stages for spec in stage.calls]
        for spec, call in zip(specs, body["calls"], strict=True):
            segments = call.get("shared_prefix", [])
            assert [(s["name"], s["tokens"]) for s in segments] == [(p.name, p.tokens) for p in spec.prefix]
            assert sum(s["tokens"] for s in segments) <= call["prompt_tokens"]
            scopes.update(s["scope"] for s in segments)
        WorkflowRequest.model_validate(body)
    assert scopes["global"] > 0 and scopes["workflow"] > 0


def test_scaled_queries_keep_their_shape_and_their_segments_within_the_prompt() -> None:
    queries = load_queries("chess-bird", 20, random.Random(0))
    scaled = scale_queries(queries, 0.125)
    assert [[c.kind for c in q] for q in scaled] == [[c.kind for c in q] for q in queries]
    for q, sq in zip(queries, scaled, strict=True):
        for c, sc in zip(q, sq, strict=True):
            assert sc.input_tokens == max(1, round(c.input_tokens * 0.125))
            assert sc.output_tokens == max(1, round(c.output_tokens * 0.125))
            assert [(s.name, s.per_query) for s in sc.prefix] == [(s.name, s.per_query) for s in c.prefix]
            assert sum(s.tokens for s in sc.prefix) <= sc.input_tokens
    assert scale_queries(queries, 1.0) == queries
    with pytest.raises(ValueError, match="token scale"):
        scale_queries(queries, 0.0)


def test_token_scale_scales_the_workload_and_its_slo_together() -> None:
    workers = load_cluster(CLUSTER)
    full = replay_setup("chess-bird", workers, workflows=10, seed=0)
    small = replay_setup("chess-bird", workers, workflows=10, seed=0, token_scale=0.125)
    assert small.queries == scale_queries(full.queries, 0.125)
    # The SLO is slo_scale x the standard workflow at the same scale: well below the unscaled one.
    assert 0 < small.slo_s < full.slo_s


def test_shared_prefix_maps_per_query_segments_to_the_workflow_scope() -> None:
    chain = (PrefixSeg("tpl", 512), PrefixSeg("empty", 0), PrefixSeg("schema", 900, per_query=True))
    assert shared_prefix(chain) == [
        {"name": "tpl", "tokens": 512, "scope": "global"},
        {"name": "schema", "tokens": 900, "scope": "workflow"},
    ]
    assert shared_prefix(()) == []


def test_dag_of_a_replay_workflow_simulates_like_the_staged_workflow() -> None:
    setup = bench_setup(15, 3)
    staged = setup.workflows(0.1)
    dags = [w.dag() for w in replay_workload(setup, 0.1)]
    assert all(d.template is CHESS_TEMPLATE for d in dags)
    a = Simulator(setup.workers, "hexgen", alpha=0.3).run(staged)
    b = Simulator(setup.workers, "hexgen", alpha=0.3).run(dags)
    assert [(r.wid, r.finish) for r in a.workflows] == [(r.wid, r.finish) for r in b.workflows]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, math.inf, math.inf, math.inf], 95, math.inf),
        ([1.0, 2.0, math.inf], 50, 2.0),
        ([1.0, 2.0, math.inf], 75, math.inf),
        ([1.0, 2.0, 3.0, math.inf], 50, 2.5),
        ([], 50, math.nan),
    ],
)
def test_unfinished_workflows_are_infinitely_late_in_percentiles(
    values: list[float], q: float, expected: float
) -> None:
    got = percentile(values, q)
    assert got == expected or (math.isnan(got) and math.isnan(expected))


def _lower_bound_s(w: ReplayWorkflow) -> float:
    """No schedule finishes a workflow sooner: per stage, its longest call alone on the fastest worker."""
    profiles = [x.profile for x in load_cluster(CLUSTER)]
    return sum(
        max(min(p.single_latency(c.input_tokens, c.output_tokens) for p in profiles) for c in s.calls) for s in w.stages
    )


async def test_replay_against_the_live_gateway_completes_every_workflow(tmp_path: Path) -> None:
    workers = load_cluster(CLUSTER)
    setup = replay_setup("chess-bird", workers, workflows=8, seed=0)
    rate = 0.55 * fluid_bound(workers, setup.queries)
    workload = replay_workload(setup, rate)
    async with live_gateway(tmp_path) as url:
        rep = await replay(
            workload,
            gateway=url,
            api_key=INTERACTIVE_KEY,
            time_scale=TIME_SCALE,
            trace=setup.trace,
            rate_qps=rate,
            progress=False,
        )
    assert (rep.workflows, rep.completed, rep.rejected, rep.failed) == (8, 8, 0, 0)
    assert rep.by_status == {"200": 8}
    assert 0 < rep.p50_s <= rep.p95_s <= rep.p99_s < math.inf
    assert 0 <= rep.slo_attainment <= 1 and rep.throughput_qps > 0
    for w, r in zip(workload, rep.results, strict=True):
        assert r.latency_s is not None and r.gateway_latency_s is not None
        # Modelled seconds: no faster than physics allows, and the client sees what the gateway saw plus HTTP.
        assert r.latency_s >= 0.8 * _lower_bound_s(w)
        # (The difference is HTTP and the client's own scheduling: machine-dependent, so not bounded here.)
        assert r.latency_s - r.gateway_latency_s >= 0
        assert r.met == (r.latency_s <= w.deadline_s)
        # The gateway's report of every call, with the token counts the (emulated) worker counted.
        sent = {c["id"]: (c["prompt_tokens"], c["max_tokens"]) for c in w.calls()}
        assert {c.id: (c.prompt_tokens, c.completion_tokens) for c in r.calls} == sent
        assert all(c.worker and c.run_s > 0 for c in r.calls), r.calls[:2]
    assert rep.slo_attainment == sum(r.met for r in rep.results) / 8
    out = tmp_path / "replay.json"
    rep.write_json(out)
    doc = json.loads(out.read_text())
    assert doc["completed"] == 8 and len(doc["results"]) == 8 and doc["p95_s"] == pytest.approx(rep.p95_s)


async def test_refused_workflows_are_counted_as_rejected_not_retried(tmp_path: Path) -> None:
    setup = replay_setup("chess-bird", load_cluster(CLUSTER), workflows=4, seed=0)
    workload = replay_workload(setup, 1000.0)  # all four arrive within milliseconds
    async with live_gateway(tmp_path, ["A100"], limits={"max_active_workflows": 1}) as url:
        rep = await replay(workload, gateway=url, api_key=INTERACTIVE_KEY, time_scale=TIME_SCALE, progress=False)
    assert rep.completed == 1 and rep.rejected == 3 and rep.failed == 0
    assert rep.by_status == {"200": 1, "429": 3}
    assert rep.slo_attainment <= 0.25 and rep.p95_s == math.inf
    assert all("in progress" in (r.error or "") for r in rep.results if r.status == 429)


async def test_a_wrong_api_key_stops_the_replay_before_it_starts(tmp_path: Path) -> None:
    workload = replay_workload(replay_setup("chess-bird", load_cluster(CLUSTER), workflows=2, seed=0), 0.1)
    async with live_gateway(tmp_path, ["A100"]) as url:
        with pytest.raises(ReplayError, match="refused the API key"):
            await replay(workload, gateway=url, api_key="not-a-key", time_scale=TIME_SCALE, progress=False)


async def test_a_gateway_not_in_benchmark_mode_stops_the_replay_before_it_starts(tmp_path: Path) -> None:
    workload = replay_workload(replay_setup("chess-bird", load_cluster(CLUSTER), workflows=2, seed=0), 0.1)
    async with live_gateway(tmp_path, ["A100"], benchmark=False) as url:
        with pytest.raises(ReplayError, match=r"not in benchmark mode.*--benchmark"):
            await replay(workload, gateway=url, api_key=INTERACTIVE_KEY, time_scale=TIME_SCALE, progress=False)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trace", "no-such-trace", "--api-key", "k"], "unknown workload 'no-such-trace'"),
        (["--rate", "0", "--api-key", "k"], "--rate"),
        (["--rate", "fast", "--api-key", "k"], "--rate"),
        ([], "--api-key"),
        (["--api-key", "k", "--gateway", "localhost:8080"], "--gateway"),
        (["--api-key", "k", "--deadline-s", "-3"], "--deadline-s"),
        (["--api-key", "k", "--cluster", "no-such-cluster"], "unknown cluster 'no-such-cluster'"),
        (["--api-key", "k", "--gateway", "UNREACHABLE"], "cannot reach the gateway"),
    ],
)
def test_bad_replay_arguments_exit_2_with_one_line(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEXFLOW_API_KEY", raising=False)
    args = [f"http://127.0.0.1:{free_port()}" if a == "UNREACHABLE" else a for a in args]
    argv = ["replay", "--workflows", "3", "--quiet", *args]
    if "--rate" not in args:
        argv += ["--rate", "0.1"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert expected in lines[-1] and lines[-1].startswith("hexflow replay: error: ")
    # One line, after the command's usage when argparse found the problem (a bad number).
    assert len(lines) == 1 or lines[0].startswith("usage: hexflow replay ")
    assert "Traceback" not in err and out == ""

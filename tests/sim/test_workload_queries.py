"""Workload queries: hexgen trace loading, workload names, staging, and the chess-bird generator."""

from __future__ import annotations

import json
import random
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.core.workflow import CANDIDATE, CHAT, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, UNIT_TESTER, CallSpec
from gateway.errors import ConfigError, UnknownNameError
from gateway.sim.workload.generator import generate_chess_bird, sample_chat_call
from gateway.sim.workload.traces import (
    CHESS_BIRD,
    SHARED_TRACE_DIR,
    load_queries,
    load_trace,
    normalise_step,
    repeat_to,
    resolve_trace,
    to_stages,
    trace_names,
)

TRACE_FILES = ("trace1", "trace2", "trace3", "financial", "formula1")

# Per-step (input, output) means of the five hexgen traces pooled (419 queries, 8010 calls), measured
# with ``load_trace``; ``test_measured_means_match_the_shared_traces`` pins them to the files.
TRACE_MEANS: dict[str, tuple[float, float]] = {
    IR: (306.25, 7.43),
    KEYWORDS: (677.1, 49.0),
    CANDIDATE: (10789.8, 671.5),
    REVISE: (6988.2, 128.9),
    UNIT_TESTER: (274.7, 4.7),
    UNIT_TEST: (1144.8, 99.6),
    EVALUATE: (1076.9, 30.0),
}
TRACE_CALLS_PER_QUERY = 8010 / 419


def shared_trace(name: str) -> Path:
    path = SHARED_TRACE_DIR / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"shared trace {path} is absent")
    return path


def per_kind_means(queries: Sequence[Sequence[CallSpec]]) -> dict[str, tuple[float, float]]:
    calls: dict[str, list[CallSpec]] = defaultdict(list)
    for q in queries:
        for c in q:
            calls[c.kind].append(c)
    return {
        k: (statistics.fmean(c.input_tokens for c in v), statistics.fmean(c.output_tokens for c in v))
        for k, v in calls.items()
    }


def write_trace(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def call(step: str = "revise", inp: object = 10, out: object = 2) -> dict[str, object]:
    return {"step": step, "input_length": inp, "output_length": out}


# ---------------------------------------------------------------------------------------------- traces


@pytest.mark.shared
@pytest.mark.parametrize(
    ("name", "queries", "calls"),
    [
        ("trace1", 90, 1732),
        ("trace2", 96, 1984),
        ("trace3", 110, 2296),
        ("financial", 94, 1494),
        ("formula1", 29, 504),
    ],
)
def test_load_trace_gives_the_source_call_counts(name: str, queries: int, calls: int) -> None:
    loaded = load_trace(shared_trace(name))
    assert len(loaded) == queries
    assert sum(len(q) for q in loaded) == calls
    known = {IR, KEYWORDS, CANDIDATE, REVISE, UNIT_TESTER, UNIT_TEST, EVALUATE}
    assert {c.kind for q in loaded for c in q} <= known


@pytest.mark.parametrize(
    ("step", "kind"),
    [
        ("Information Retriever", IR),
        ("extract_keywords", KEYWORDS),
        ("generate_candidate_llama-agent", CANDIDATE),
        ("generate_candidate_gpt", CANDIDATE),
        ("revise", REVISE),
        ("unit_tester", UNIT_TESTER),
        ("generate_unit_test", UNIT_TEST),
        ("evaluate", EVALUATE),
        ("Schema Linker", "schema_linker"),
    ],
)
def test_normalise_step_maps_trace_names_to_kinds(step: str, kind: str) -> None:
    assert normalise_step(step) == kind


def test_load_trace_normalises_steps_and_keeps_lengths(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path,
        [{"Text2SQLRequest": [call("Information Retriever", 301, 26), call("Odd Step", 7, 0)]}],
    )
    assert load_trace(path) == [[CallSpec(IR, 301, 26), CallSpec("odd_step", 7, 0)]]


GOOD = {"Text2SQLRequest": [call()]}


@pytest.mark.parametrize(
    ("content", "field", "problem"),
    [
        ("[{", "", "not valid JSON"),
        ({"Text2SQLRequest": []}, "", "expected a JSON list"),
        ([], "", "at least one query"),
        ([GOOD, {"steps": []}], "[1]", '"Text2SQLRequest"'),
        ([GOOD, 3], "[1]", '"Text2SQLRequest"'),
        ([{"Text2SQLRequest": []}], "[0].Text2SQLRequest", "non-empty list"),
        ([{"Text2SQLRequest": "revise"}], "[0].Text2SQLRequest", "non-empty list"),
        ([{"Text2SQLRequest": [call(), "x"]}], "[0].Text2SQLRequest[1]", "an object"),
        (
            [{"Text2SQLRequest": [{"input_length": 1, "output_length": 1}]}],
            "[0].Text2SQLRequest[0].step",
            "string",
        ),
        ([{"Text2SQLRequest": [call(step=" ")]}], "[0].Text2SQLRequest[0].step", "non-empty string"),
        (
            [GOOD, {"Text2SQLRequest": [call(), call(inp="12")]}],
            "[1].Text2SQLRequest[1].input_length",
            "integer",
        ),
        ([{"Text2SQLRequest": [call(inp=3.5)]}], "[0].Text2SQLRequest[0].input_length", "integer"),
        ([{"Text2SQLRequest": [call(inp=True)]}], "[0].Text2SQLRequest[0].input_length", "integer"),
        ([{"Text2SQLRequest": [call(out=-1)]}], "[0].Text2SQLRequest[0].output_length", "non-negative"),
        (
            [{"Text2SQLRequest": [{"step": "revise", "input_length": 1}]}],
            "[0].Text2SQLRequest[0].output_length",
            "None",
        ),
    ],
)
def test_load_trace_rejects_malformed_input_naming_the_index_path(
    tmp_path: Path, content: object, field: str, problem: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


def test_load_trace_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_trace(tmp_path / "nope.json")


def test_to_stages_runs_candidates_and_evaluations_in_parallel() -> None:
    calls = [
        CallSpec(IR, 301, 5),
        CallSpec(IR, 304, 5),
        CallSpec(CANDIDATE, 100, 10),
        CallSpec(CANDIDATE, 90, 10),
        CallSpec(REVISE, 50, 5),
        CallSpec(REVISE, 50, 5),
        CallSpec(UNIT_TESTER, 271, 6),
        CallSpec(EVALUATE, 10, 22),
        CallSpec(EVALUATE, 11, 22),
        CallSpec(EVALUATE, 12, 22),
        CallSpec(UNIT_TESTER, 278, 4),
    ]
    stages = to_stages(calls)
    assert [(s.kind, len(s.calls)) for s in stages] == [
        (IR, 1),
        (IR, 1),
        (CANDIDATE, 2),
        (REVISE, 1),
        (REVISE, 1),
        (UNIT_TESTER, 1),
        (EVALUATE, 3),
        (UNIT_TESTER, 1),
    ]
    assert [c for s in stages for c in s.calls] == calls


def test_resolve_trace_handles_builtin_names_and_paths(tmp_path: Path) -> None:
    write_trace(tmp_path, [GOOD])  # tmp_path/trace.json
    assert resolve_trace(CHESS_BIRD, tmp_path) == CHESS_BIRD
    assert resolve_trace("trace", tmp_path) == tmp_path / "trace.json"
    assert resolve_trace(str(tmp_path / "other.json"), tmp_path) == tmp_path / "other.json"
    assert trace_names(tmp_path) == [CHESS_BIRD, "trace"]
    assert trace_names(tmp_path / "absent") == [CHESS_BIRD]
    with pytest.raises(UnknownNameError, match="chess-bird, trace"):
        resolve_trace("trace9", tmp_path)


@pytest.mark.shared
def test_resolve_trace_finds_the_shared_traces() -> None:
    path = shared_trace("trace1")
    assert resolve_trace("trace1") == path
    assert set(TRACE_FILES) <= set(trace_names())


def test_load_queries_generates_or_cycles_a_trace(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [GOOD, {"Text2SQLRequest": [call("evaluate")]}])
    assert len(load_queries(CHESS_BIRD, 5, random.Random(0))) == 5
    cycled = load_queries(path, 5, random.Random(0))
    assert [q[0].kind for q in cycled] == [REVISE, EVALUATE, REVISE, EVALUATE, REVISE]
    assert len(load_queries(path, None, random.Random(0))) == 2
    with pytest.raises(ValueError, match="number of queries"):
        load_queries(CHESS_BIRD, None, random.Random(0))


def test_repeat_to_cycles_and_cuts() -> None:
    a, b = [CallSpec(IR, 1, 1)], [CallSpec(REVISE, 2, 2)]
    assert repeat_to([a, b], 3) == [a, b, a]
    assert repeat_to([a, b], 1) == [a]
    assert repeat_to([], 0) == []
    with pytest.raises(ValueError):
        repeat_to([], 1)


# ----------------------------------------------------------------------------------------- generator


@pytest.fixture(scope="module")
def generated() -> list[list[CallSpec]]:
    return generate_chess_bird(2000, random.Random(7))


@pytest.mark.parametrize("kind", sorted(TRACE_MEANS))
def test_chess_bird_per_step_means_match_the_traces(generated: list[list[CallSpec]], kind: str) -> None:
    got_in, got_out = per_kind_means(generated)[kind]
    want_in, want_out = TRACE_MEANS[kind]
    assert got_in == pytest.approx(want_in, rel=0.10)
    assert got_out == pytest.approx(want_out, rel=0.10)


def test_chess_bird_calls_per_query_match_the_traces(generated: list[list[CallSpec]]) -> None:
    mean_calls = statistics.fmean(len(q) for q in generated)
    assert mean_calls == pytest.approx(TRACE_CALLS_PER_QUERY, rel=0.10)


@pytest.mark.shared
def test_measured_means_match_the_shared_traces() -> None:
    queries = [q for name in TRACE_FILES for q in load_trace(shared_trace(name))]
    assert len(queries) == 419
    assert sum(len(q) for q in queries) == 8010
    measured = per_kind_means(queries)
    assert measured.keys() == TRACE_MEANS.keys()
    for kind, (want_in, want_out) in TRACE_MEANS.items():
        assert measured[kind][0] == pytest.approx(want_in, abs=0.05)
        assert measured[kind][1] == pytest.approx(want_out, abs=0.05)


# Every query of the traces has this skeleton (kinds abbreviated to one letter).
_SKELETON = re.compile(r"IK?IIICCR{0,10}(TUTE{2,11}T|TTT)")
_LETTER = {
    IR: "I",
    KEYWORDS: "K",
    CANDIDATE: "C",
    REVISE: "R",
    UNIT_TESTER: "T",
    UNIT_TEST: "U",
    EVALUATE: "E",
}


def test_chess_bird_queries_follow_the_trace_skeleton(generated: list[list[CallSpec]]) -> None:
    for q in generated:
        assert _SKELETON.fullmatch("".join(_LETTER[c.kind] for c in q))
        first, second = (c for c in q if c.kind == CANDIDATE)
        assert first.input_tokens - second.input_tokens == 3866
        assert len({c.input_tokens for c in q if c.kind == REVISE}) <= 1
    revise_rounds = {sum(c.kind == REVISE for c in q) for q in generated}
    assert revise_rounds == set(range(11))


@pytest.mark.shared
def test_shared_traces_follow_the_skeleton() -> None:
    for name in TRACE_FILES:
        for q in load_trace(shared_trace(name)):
            assert _SKELETON.fullmatch("".join(_LETTER[c.kind] for c in q))


def test_chess_bird_is_deterministic_per_seed() -> None:
    assert generate_chess_bird(50, random.Random(3)) == generate_chess_bird(50, random.Random(3))
    assert generate_chess_bird(50, random.Random(3)) != generate_chess_bird(50, random.Random(4))


def test_chat_calls_follow_the_azure_conversation_lengths() -> None:
    rng = random.Random(5)
    calls = [sample_chat_call(rng) for _ in range(20000)]
    assert {c.kind for c in calls} == {CHAT}
    # Means of ContextTokens / GeneratedTokens in AzureLLMInferenceTrace_conv.csv (SOURCE.md).
    assert statistics.fmean(c.input_tokens for c in calls) == pytest.approx(1155, rel=0.10)
    assert statistics.fmean(c.output_tokens for c in calls) == pytest.approx(211, rel=0.10)


def test_chess_prefixes_share_only_what_the_token_counts_prove() -> None:
    from gateway.core.prefix import PrefixSeg
    from gateway.sim.workload.prefixes import EVALUATE_TAIL, KEYWORDS_TEMPLATE, REVISE_TAIL, chess_prefixes

    q = [
        CallSpec(IR, 301, 9),
        CallSpec(KEYWORDS, 650, 40),
        CallSpec(CANDIDATE, 11900, 600),
        CallSpec(CANDIDATE, 8034, 500),
        CallSpec(REVISE, 6000, 80),
        CallSpec(REVISE, 6100, 80),
        CallSpec(UNIT_TESTER, 271, 6),
        CallSpec(UNIT_TEST, 1100, 100),
        CallSpec(EVALUATE, 960, 20),
        CallSpec(EVALUATE, 958, 20),
    ]
    got = chess_prefixes(q)
    assert [(c.kind, c.input_tokens, c.output_tokens) for c in got] == [
        (c.kind, c.input_tokens, c.output_tokens) for c in q
    ]
    pre = [c.prefix for c in got]
    assert pre[0] == (PrefixSeg(f"{IR}/301", 301),)  # a fixed prompt: shared whole
    assert pre[1] == (PrefixSeg(KEYWORDS, KEYWORDS_TEMPLATE),)
    assert pre[2] == (PrefixSeg(f"{CANDIDATE}/longer-template", 3866),) and pre[3] == ()
    assert pre[4] == pre[5] == (PrefixSeg(REVISE, 6000 - REVISE_TAIL, per_query=True),)
    assert pre[6] == (PrefixSeg(f"{UNIT_TESTER}/271", 271),)
    assert pre[7] == ()
    assert pre[8] == pre[9] == (PrefixSeg(EVALUATE, 958 - EVALUATE_TAIL, per_query=True),)
    assert all(sum(s.tokens for s in c.prefix) <= c.input_tokens for c in got)


@pytest.mark.parametrize("name", TRACE_FILES)
def test_every_traced_query_has_the_prompt_structure_the_prefix_model_assumes(name: str) -> None:
    if not (SHARED_TRACE_DIR / f"{name}.json").is_file():
        pytest.skip(f"{name} (../shared/data/hexgen-traces) is not available")
    for q in load_queries(name, None, random.Random(0)):
        cands = [c.input_tokens for c in q if c.kind == CANDIDATE]
        assert len(cands) == 2 and cands[0] - cands[1] == 3866
        assert {c.input_tokens for c in q if c.kind == IR} <= {301, 304, 308, 312}
        assert {c.input_tokens for c in q if c.kind == UNIT_TESTER} <= {271, 275, 278}
        assert all(c.input_tokens > 512 for c in q if c.kind == KEYWORDS)
        assert all(sum(s.tokens for s in c.prefix) < c.input_tokens or c.kind in (IR, UNIT_TESTER) for c in q)

"""Workloads: trace loading, the chess-bird generator, arrival processes, tenants and mixes."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.config.workflows import CHESS_TEMPLATE
from gateway.core.workflow import CANDIDATE, CHAT, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST, UNIT_TESTER, CallSpec
from gateway.errors import ConfigError, UnknownNameError
from gateway.sim.workload import (
    CHESS_BIRD,
    SHARED_TRACE_DIR,
    TenantSpec,
    build_workload,
    gamma_arrivals,
    generate_chess_bird,
    load_queries,
    load_trace,
    normalise_step,
    parse_tenants,
    poisson_arrivals,
    repeat_to,
    replay_arrivals,
    resolve_trace,
    sample_chat_call,
    to_stages,
    trace_names,
)

AZURE_CONV = SHARED_TRACE_DIR.parent / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
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


# ------------------------------------------------------------------------------------------ arrivals


def gaps(times: Sequence[float], start: float = 0.0) -> list[float]:
    return [b - a for a, b in zip([start, *times[:-1]], times, strict=True)]


def test_poisson_mean_gap_is_one_over_rate() -> None:
    times = poisson_arrivals(20000, 4.0, random.Random(1), start=10.0)
    assert len(times) == 20000
    assert times[0] > 10.0
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert statistics.fmean(gaps(times, 10.0)) == pytest.approx(0.25, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_arrivals_have_the_requested_rate_and_cv(cv: float) -> None:
    g = gaps(gamma_arrivals(20000, 2.0, cv, random.Random(11)))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.5, rel=0.10)
    assert statistics.pstdev(g) / mean == pytest.approx(cv, rel=0.10)


def test_arrivals_are_deterministic_per_seed() -> None:
    assert gamma_arrivals(100, 1.0, 2.0, random.Random(2)) == gamma_arrivals(100, 1.0, 2.0, random.Random(2))
    assert poisson_arrivals(100, 1.0, random.Random(2)) != poisson_arrivals(100, 1.0, random.Random(3))


@pytest.mark.parametrize(
    ("call_it", "message"),
    [
        (lambda: poisson_arrivals(-1, 1.0, random.Random(0)), "n must be"),
        (lambda: poisson_arrivals(5, 0.0, random.Random(0)), "rate_qps"),
        (lambda: gamma_arrivals(5, 1.0, 0.0, random.Random(0)), "cv"),
        (lambda: gamma_arrivals(5, math.inf, 1.0, random.Random(0)), "rate_qps"),
    ],
)
def test_arrivals_reject_bad_parameters(call_it: object, message: str) -> None:
    assert callable(call_it)
    with pytest.raises(ValueError, match=message):
        call_it()


def write_csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "arrivals.csv"
    path.write_text(text, encoding="utf-8")
    return path


AZURE_HEAD = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.6805900,879,55
2023-11-16 18:16:46.6805900,91,16
"""


def test_replay_reads_azure_timestamps_as_offsets(tmp_path: Path) -> None:
    times = replay_arrivals(write_csv(tmp_path, AZURE_HEAD))
    assert times == pytest.approx([0.0, 4.314579, 5.0, 60.0])
    assert replay_arrivals(write_csv(tmp_path, AZURE_HEAD), n=2) == pytest.approx([0.0, 4.314579])


def test_replay_reads_a_numeric_seconds_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path, "Timestamp,Model\n5,ChatGPT\n45,ChatGPT\n46.5,GPT-4\n")
    assert replay_arrivals(path) == [0.0, 40.0, 41.5]
    assert replay_arrivals(path, column="Timestamp", time_scale=2.0) == [0.0, 80.0, 83.0]
    rescaled = replay_arrivals(path, rate_qps=1.0)
    assert rescaled == pytest.approx([0.0, 40.0 * 2 / 41.5, 2.0])


@pytest.mark.parametrize(
    ("text", "column", "field", "problem"),
    [
        ("when,x\n1,2\n", None, "", "expected a time column"),
        ("TIMESTAMP,x\n1,2\n", "arrival", "arrival", "no such column"),
        ("", None, "", "header"),
        (AZURE_HEAD + "yesterday,1,1\n", None, "row 5 column TIMESTAMP", "expected seconds or a timestamp"),
        ("time\n1\nnan\n", None, "row 2 column time", "expected seconds"),
        ("time\n1\n2023-11-16 18:15:46\n", None, "row 2 column time", "same time format"),
        ("time\n1\n3\n2\n", None, "row 3 column time", "non-decreasing"),
        ("x,time\n1,1\n2\n", None, "row 2 column time", "got None"),
    ],
)
def test_replay_rejects_bad_csv_naming_column_and_row(
    tmp_path: Path, text: str, column: str | None, field: str, problem: str
) -> None:
    path = write_csv(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        replay_arrivals(path, column=column)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert problem in info.value.problem


def test_replay_cannot_rescale_a_single_instant(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="two distinct timestamps"):
        replay_arrivals(write_csv(tmp_path, "time\n3\n3\n"), rate_qps=1.0)
    with pytest.raises(ValueError, match="not both"):
        replay_arrivals(write_csv(tmp_path, "time\n3\n"), rate_qps=1.0, time_scale=1.0)


@pytest.mark.shared
def test_replay_reads_the_shared_azure_conversation_trace() -> None:
    if not AZURE_CONV.is_file():
        pytest.skip(f"shared trace {AZURE_CONV} is absent")
    times = replay_arrivals(AZURE_CONV)
    assert len(times) == 19366
    assert times[0] == 0.0
    assert times[-1] == pytest.approx(3502, abs=1.0)  # SOURCE.md: span 3,502 s, 5.53 req/s
    assert (len(times) - 1) / times[-1] == pytest.approx(5.53, abs=0.01)
    fast = replay_arrivals(AZURE_CONV, n=1000, rate_qps=20.0)
    assert len(fast) == 1000
    assert 999 / fast[-1] == pytest.approx(20.0)


# ------------------------------------------------------------------------------------------- tenants


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

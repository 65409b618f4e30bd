"""Workloads for the simulator and the benchmarks: queries, arrival times and tenants.

A workload is three independent choices, combined by ``build_workload``:

* **queries**, each a flat list of ``CallSpec`` in the order the CHESS workflow issues them: loaded from
  a hexgen trace file (``load_trace``) or drawn from the ``chess-bird`` generator
  (``generate_chess_bird``), which is calibrated on the five hexgen traces;
* **arrival times** in seconds: Poisson, Gamma (burstiness set by the coefficient of variation) or
  replayed from a CSV trace such as the Azure LLM inference trace 2023 (``replay_arrivals``);
* **tenants** (``TenantSpec``): each arrival is assigned to one by share; a tenant sets the deadline and
  whether its requests are Text-to-SQL workflows or single chat calls.

Everything random takes a ``random.Random`` instance; nothing here touches the global generator, so the
same seed always gives the same workload.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, get_args

from gateway.config.workflows import CHESS_PARALLEL_KINDS, CHESS_TEMPLATE
from gateway.core.workflow import (
    CANDIDATE,
    CHAT,
    EVALUATE,
    IR,
    KEYWORDS,
    REVISE,
    UNIT_TEST,
    UNIT_TESTER,
    CallSpec,
    Stage,
    StagedWorkflow,
    group_calls,
)
from gateway.errors import ConfigError, UnknownNameError

__all__ = [
    "CHESS_BIRD",
    "SHARED_TRACE_DIR",
    "TenantKind",
    "TenantSpec",
    "build_workload",
    "gamma_arrivals",
    "generate_chess_bird",
    "load_queries",
    "load_trace",
    "normalise_step",
    "parse_tenants",
    "poisson_arrivals",
    "repeat_to",
    "replay_arrivals",
    "resolve_trace",
    "sample_chat_call",
    "to_stages",
    "trace_names",
]

CHESS_BIRD = "chess-bird"
"""Name of the built-in synthetic CHESS-on-BIRD workload (``generate_chess_bird``)."""

SHARED_TRACE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "hexgen-traces"
"""Where bare trace names (``trace1``, ``financial``, ...) are looked up: ``../shared`` next to the repo."""

TenantKind = Literal["text2sql", "chat"]

# --------------------------------------------------------------------------------------------------
# Trace files
# --------------------------------------------------------------------------------------------------

_REQUEST_KEY = "Text2SQLRequest"


def normalise_step(step: str) -> str:
    """Map a trace's step name to a stage kind: lower case, spaces to underscores.

    The hexgen names then coincide with the kind constants ("Information Retriever" ->
    ``information_retriever``), except the candidate generator, whose name carries the agent
    (``generate_candidate_llama-agent``): every ``generate_candidate*`` step is ``CANDIDATE``.
    Unknown steps are kept under their normalised name.
    """
    kind = step.strip().lower().replace(" ", "_")
    if kind.startswith(CANDIDATE):
        return CANDIDATE
    return kind


def _length(value: object, path: str, where: str) -> int:
    # bool is an int subclass; a JSON true is not a token count.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(path, where, f"expected a non-negative integer, got {value!r}")
    return value


def load_trace(path: Path) -> list[list[CallSpec]]:
    """Load a hexgen trace file: one list of calls per query, in the order the workflow issued them.

    The format is a JSON list of ``{"Text2SQLRequest": [{"step", "input_length", "output_length"}, ...]}``.
    Malformed input raises ``ConfigError`` naming the file, the index path of the offending value
    (``[3].Text2SQLRequest[5].input_length``) and what was expected.
    """
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read the trace: {exc.strerror or exc}") from exc
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(where, "", f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, list):
        raise ConfigError(where, "", f"expected a JSON list of queries, got {type(data).__name__}")
    if not data:
        raise ConfigError(where, "", "expected at least one query, got an empty list")
    queries: list[list[CallSpec]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or _REQUEST_KEY not in item:
            raise ConfigError(where, f"[{i}]", f'expected an object with key "{_REQUEST_KEY}"')
        steps = item[_REQUEST_KEY]
        at = f"[{i}].{_REQUEST_KEY}"
        if not isinstance(steps, list) or not steps:
            raise ConfigError(where, at, "expected a non-empty list of calls")
        calls: list[CallSpec] = []
        for j, raw in enumerate(steps):
            call_at = f"{at}[{j}]"
            if not isinstance(raw, dict):
                raise ConfigError(where, call_at, "expected an object with step, input_length, output_length")
            step = raw.get("step")
            if not isinstance(step, str) or not step.strip():
                raise ConfigError(where, f"{call_at}.step", f"expected a non-empty string, got {step!r}")
            tokens_in = _length(raw.get("input_length"), where, f"{call_at}.input_length")
            tokens_out = _length(raw.get("output_length"), where, f"{call_at}.output_length")
            calls.append(CallSpec(normalise_step(step), tokens_in, tokens_out))
        queries.append(calls)
    return queries


def to_stages(calls: Sequence[CallSpec]) -> list[Stage]:
    """Stages of one CHESS query: consecutive candidates and consecutive evaluations run in parallel."""
    return group_calls(calls, CHESS_PARALLEL_KINDS)


def trace_names(trace_dir: Path | None = None) -> list[str]:
    """Workload names ``resolve_trace`` knows: ``chess-bird`` and the trace files of the shared folder."""
    folder = SHARED_TRACE_DIR if trace_dir is None else trace_dir
    names = [CHESS_BIRD]
    if folder.is_dir():
        names += sorted(p.stem for p in folder.glob("*.json"))
    return names


def resolve_trace(name_or_path: str | Path, trace_dir: Path | None = None) -> Path | Literal["chess-bird"]:
    """Resolve a workload name: ``chess-bird``, a bare trace name (``trace1``) or a file path.

    A bare name (no folder, no suffix) is looked up as ``<trace_dir>/<name>.json`` (default
    ``SHARED_TRACE_DIR``); an unknown bare name raises ``UnknownNameError`` listing the known ones.
    Anything else is returned as a path; ``load_trace`` reports a missing file.
    """
    if name_or_path == CHESS_BIRD:
        return "chess-bird"
    path = Path(name_or_path)
    bare = path.name == str(name_or_path) and not path.suffix
    if not bare or path.exists():
        return path
    folder = SHARED_TRACE_DIR if trace_dir is None else trace_dir
    candidate = folder / f"{path.name}.json"
    if candidate.is_file():
        return candidate
    raise UnknownNameError("workload", str(name_or_path), trace_names(trace_dir))


def load_queries(
    name_or_path: str | Path,
    n: int | None,
    rng: random.Random,
    trace_dir: Path | None = None,
) -> list[list[CallSpec]]:
    """The queries of a workload name: ``n`` generated ones for ``chess-bird``, else the trace's queries.

    With ``n`` given, trace queries are cycled or cut to exactly ``n`` (``repeat_to``).
    """
    source = resolve_trace(name_or_path, trace_dir)
    if source == CHESS_BIRD:
        if n is None:
            raise ValueError(f"the {CHESS_BIRD} workload needs a number of queries")
        return generate_chess_bird(n, rng)
    queries = load_trace(Path(source))
    return queries if n is None else repeat_to(queries, n)


def repeat_to(queries: Sequence[list[CallSpec]], n: int) -> list[list[CallSpec]]:
    """Exactly ``n`` queries: ``queries`` cycled in order (query i is ``queries[i % len(queries)]``)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and not queries:
        raise ValueError("cannot repeat an empty list of queries")
    return [queries[i % len(queries)] for i in range(n)]


# --------------------------------------------------------------------------------------------------
# The chess-bird generator
# --------------------------------------------------------------------------------------------------
#
# Measured once from the five hexgen traces in ../shared/data/hexgen-traces (trace1, trace2, trace3,
# financial, formula1: 419 queries, 8010 calls, pooled with equal weight per query). Every query has
# the same skeleton:
#
#   IR, [KEYWORDS], IR, IR, IR, CANDIDATE x2, REVISE x r,
#       then UNIT_TESTER, UNIT_TEST, UNIT_TESTER, EVALUATE x e, UNIT_TESTER   (404 queries)
#       or   UNIT_TESTER, UNIT_TESTER, UNIT_TESTER                              (15 queries: no test, e = 0)
#
# The four IR calls and three unit-tester calls are fixed prompts: their token counts are constant by
# position in all 419 queries (only the first IR call's output varies). The two candidates of a query
# always differ in input by exactly 3866 tokens (two prompt templates over the same schema); revise
# prompts follow the candidate prompt (correlation 0.98), and the evaluations of one query have nearly
# the same input (0.9999), so those share one quantile per query. Candidate outputs of one query have
# rank correlation ~0.73; other lengths are drawn independently.

_GRID = (0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 92, 94, 96, 98, 99, 100)
"""Percentiles of every length table below (finer in the tail, where the means are made)."""
_GRID_U = tuple(p / 100 for p in _GRID)

_KEYWORDS_QUERIES = 342  # queries with an extract_keywords call, of 419
_UNIT_TEST_QUERIES = 404  # queries with generate_unit_test (and evaluations), of 419
_TRACE_QUERIES = 419
# Revise rounds 0..10: number of queries with that many rounds (mean 3.39).
_REVISE_ROUNDS_WEIGHTS = (119, 52, 27, 39, 34, 34, 25, 27, 18, 33, 11)
# Evaluation calls, in queries that generate a unit test: count -> queries (mean 5.13).
_EVALUATE_COUNTS = (2, 3, 4, 5, 6, 7, 8, 11)
_EVALUATE_WEIGHTS = (1, 24, 103, 134, 124, 3, 4, 11)

_IR_INPUTS = (301, 304, 308, 312)
_IR_LATER_OUTPUTS = (5, 5, 4)
_UNIT_TESTER_CALLS = ((271, 6), (275, 4), (278, 4))
_CANDIDATE_INPUT_GAP = 3866
_CANDIDATE_OUTPUT_RANK_CORR = 0.73

# Length tables (tokens) at the _GRID percentiles.
# fmt: off
_IR_FIRST_OUTPUT = (
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 25,
    25, 26, 27, 28, 32, 37, 38, 38, 42, 43, 44, 46,
)
_KEYWORDS_INPUT = (
    634, 641, 646, 649, 655, 657, 661, 665, 665, 668, 674, 675, 682,
    689, 690, 692, 702, 706, 711, 711, 711, 724, 750, 750, 750,
)
_KEYWORDS_OUTPUT = (
    12, 21, 26, 30, 33, 36, 36, 40, 45, 46, 47, 48, 50,
    53, 56, 58, 71, 71, 73, 73, 73, 76, 93, 119, 119,
)
# The first (longer) candidate prompt; the second is _CANDIDATE_INPUT_GAP shorter. Bimodal: two
# groups of databases, 11.7-12.1k and 13.7-14.1k tokens.
_CANDIDATE_INPUT = (
    11735, 11745, 11759, 11770, 11887, 11931, 11932, 11965, 12003, 12076, 12118, 12145, 13703,
    13748, 13803, 13876, 13879, 13896, 13958, 13968, 13968, 14000, 14000, 14000, 14131,
)
_CANDIDATE_OUTPUT_FIRST = (
    360, 475, 553, 624, 657, 686, 718, 781, 825, 827, 846, 865, 872,
    894, 960, 984, 1006, 1009, 1010, 1010, 1012, 1020, 1026, 1026, 1026,
)
_CANDIDATE_OUTPUT_SECOND = (
    274, 375, 404, 416, 437, 451, 464, 503, 515, 519, 524, 530, 541,
    556, 559, 617, 620, 620, 641, 659, 675, 690, 772, 772, 772,
)
# Bimodal like the candidate prompts it follows.
_REVISE_INPUT = (
    5701, 5724, 5738, 5768, 5895, 5911, 5930, 6010, 6106, 6191, 7735, 7773, 7809,
    7868, 7892, 7900, 7912, 7992, 8021, 8029, 8078, 8777, 8862, 8904, 8904,
)
_REVISE_OUTPUT = (
    10, 13, 19, 34, 67, 73, 74, 82, 89, 98, 106, 111, 113,
    116, 131, 135, 138, 154, 170, 172, 187, 312, 1010, 1011, 1078,
)
_UNIT_TEST_INPUT = (
    628, 813, 853, 917, 961, 977, 1038, 1048, 1079, 1082, 1109, 1185, 1206,
    1217, 1226, 1295, 1387, 1416, 1439, 1439, 1467, 1467, 1467, 1553, 3320,
)
_UNIT_TEST_OUTPUT = (
    26, 42, 57, 68, 72, 78, 80, 88, 90, 96, 100, 102, 107,
    113, 116, 119, 122, 127, 128, 128, 134, 145, 245, 245, 245,
)
_EVALUATE_INPUT = (
    502, 677, 744, 798, 829, 873, 892, 930, 971, 1004, 1030, 1057, 1084,
    1139, 1153, 1204, 1262, 1290, 1409, 1417, 1897, 1901, 1905, 1909, 3177,
)
# 92% of evaluations answer with exactly 22 tokens; the rest is a long tail.
_EVALUATE_OUTPUT = (
    22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22,
    22, 22, 22, 22, 22, 22, 22, 75, 115, 167, 169, 357,
)

# Chat calls: ContextTokens / GeneratedTokens of ../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv
# (19,366 requests; mean 1155 / 211 tokens) at the same percentiles. The two are nearly independent
# there (correlation -0.11), so they are drawn independently.
_CHAT_INPUT = (
    2, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071,
    1097, 1130, 1189, 1315, 1876, 2734, 4073, 4079, 4086, 4098, 4142, 14050,
)
_CHAT_OUTPUT = (
    7, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177,
    217, 384, 395, 400, 411, 424, 429, 442, 468, 540, 601, 1000,
)
# fmt: on


def _inverse_cdf(table: Sequence[int], u: float) -> int:
    """The length at quantile ``u`` in [0, 1): linear interpolation between the table's percentiles."""
    i = min(bisect.bisect_right(_GRID_U, u), len(_GRID_U) - 1)
    lo_u, hi_u = _GRID_U[i - 1], _GRID_U[i]
    lo, hi = table[i - 1], table[i]
    value = lo + (hi - lo) * (u - lo_u) / (hi_u - lo_u)
    return max(round(value), 1)


def generate_chess_bird(n: int, rng: random.Random) -> list[list[CallSpec]]:
    """``n`` synthetic CHESS queries on BIRD, calibrated on the hexgen traces (see the figures above).

    Each query follows the traces' skeleton; the workflow shape (keyword extraction, revise rounds,
    unit test, evaluation count) and the token lengths are drawn from the traces' empirical
    distributions by inverse CDF.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [_chess_query(rng) for _ in range(n)]


def _chess_query(rng: random.Random) -> list[CallSpec]:
    has_keywords = rng.random() < _KEYWORDS_QUERIES / _TRACE_QUERIES
    rounds = rng.choices(range(len(_REVISE_ROUNDS_WEIGHTS)), weights=_REVISE_ROUNDS_WEIGHTS)[0]
    has_unit_test = rng.random() < _UNIT_TEST_QUERIES / _TRACE_QUERIES
    evaluations = rng.choices(_EVALUATE_COUNTS, weights=_EVALUATE_WEIGHTS)[0] if has_unit_test else 0

    calls = [CallSpec(IR, _IR_INPUTS[0], _inverse_cdf(_IR_FIRST_OUTPUT, rng.random()))]
    if has_keywords:
        calls.append(
            CallSpec(
                KEYWORDS,
                _inverse_cdf(_KEYWORDS_INPUT, rng.random()),
                _inverse_cdf(_KEYWORDS_OUTPUT, rng.random()),
            )
        )
    calls += [CallSpec(IR, i, o) for i, o in zip(_IR_INPUTS[1:], _IR_LATER_OUTPUTS, strict=True)]

    # One quantile for the query's schema size drives both candidate prompts and the revise prompts.
    u_schema = rng.random()
    first_in = _inverse_cdf(_CANDIDATE_INPUT, u_schema)
    u_out = rng.random()
    u_out_second = u_out if rng.random() < _CANDIDATE_OUTPUT_RANK_CORR else rng.random()
    calls.append(CallSpec(CANDIDATE, first_in, _inverse_cdf(_CANDIDATE_OUTPUT_FIRST, u_out)))
    calls.append(
        CallSpec(
            CANDIDATE,
            max(first_in - _CANDIDATE_INPUT_GAP, 1),
            _inverse_cdf(_CANDIDATE_OUTPUT_SECOND, u_out_second),
        )
    )
    revise_in = _inverse_cdf(_REVISE_INPUT, u_schema)
    calls += [CallSpec(REVISE, revise_in, _inverse_cdf(_REVISE_OUTPUT, rng.random())) for _ in range(rounds)]

    tester = [CallSpec(UNIT_TESTER, i, o) for i, o in _UNIT_TESTER_CALLS]
    if not has_unit_test:
        return [*calls, *tester]
    calls.append(tester[0])
    calls.append(
        CallSpec(
            UNIT_TEST,
            _inverse_cdf(_UNIT_TEST_INPUT, rng.random()),
            _inverse_cdf(_UNIT_TEST_OUTPUT, rng.random()),
        )
    )
    calls.append(tester[1])
    evaluate_in = _inverse_cdf(_EVALUATE_INPUT, rng.random())
    calls += [CallSpec(EVALUATE, evaluate_in, _inverse_cdf(_EVALUATE_OUTPUT, rng.random())) for _ in range(evaluations)]
    calls.append(tester[2])
    return calls


def sample_chat_call(rng: random.Random) -> CallSpec:
    """One chat call with lengths drawn from the Azure 2023 conversation trace's distribution."""
    return CallSpec(CHAT, _inverse_cdf(_CHAT_INPUT, rng.random()), _inverse_cdf(_CHAT_OUTPUT, rng.random()))


# --------------------------------------------------------------------------------------------------
# Arrivals
# --------------------------------------------------------------------------------------------------


def _check_arrival_args(n: int, rate_qps: float) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not (rate_qps > 0 and math.isfinite(rate_qps)):
        raise ValueError(f"rate_qps must be a positive number, got {rate_qps}")


def poisson_arrivals(n: int, rate_qps: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process of rate ``rate_qps`` that starts at ``start``.

    The first arrival is one exponential gap after ``start``, like every later one.
    """
    _check_arrival_args(n, rate_qps)
    out: list[float] = []
    t = start
    for _ in range(n):
        t += rng.expovariate(rate_qps)
        out.append(t)
    return out


def gamma_arrivals(n: int, rate_qps: float, cv: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """``n`` arrival times with Gamma inter-arrival gaps of mean ``1 / rate_qps``.

    ``cv`` is the gaps' coefficient of variation: ``cv = 1`` is a Poisson process, larger values are
    burstier (Gamma shape ``1 / cv**2``).
    """
    _check_arrival_args(n, rate_qps)
    if not (cv > 0 and math.isfinite(cv)):
        raise ValueError(f"cv must be a positive number, got {cv}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_qps * shape)
    out: list[float] = []
    t = start
    for _ in range(n):
        t += rng.gammavariate(shape, scale)
        out.append(t)
    return out


_TIME_COLUMNS = ("timestamp", "time", "arrival_time", "arrival")


def _parse_time(text: str) -> float | datetime:
    """Seconds as a number, or a naive wall-clock timestamp (fraction cut to the 6 digits Python reads)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError("not a finite number")
        return seconds
    head, dot, frac = value.partition(".")
    if dot:
        value = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(value)


def replay_arrivals(
    path: Path,
    n: int | None = None,
    column: str | None = None,
    *,
    rate_qps: float | None = None,
    time_scale: float | None = None,
) -> list[float]:
    """Arrival offsets in seconds from the first row of a CSV trace (0.0 first).

    The time column is ``column`` or, by default, the first header named ``timestamp``, ``time``,
    ``arrival_time`` or ``arrival`` (any case): the Azure LLM trace's ``TIMESTAMP``
    (``2023-11-16 18:15:46.6805900``) or BurstGPT's ``Timestamp`` in seconds both work. Only the first
    ``n`` rows are read when ``n`` is given. ``time_scale`` multiplies the offsets (2.0 replays at half
    speed); ``rate_qps`` instead rescales them so the mean rate (arrivals - 1) / span equals it.
    A bad file raises ``ConfigError`` naming the column or row and what was expected.
    """
    if rate_qps is not None and time_scale is not None:
        raise ValueError("give rate_qps or time_scale, not both")
    if rate_qps is not None and not (rate_qps > 0 and math.isfinite(rate_qps)):
        raise ValueError(f"rate_qps must be a positive number, got {rate_qps}")
    if time_scale is not None and not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    where = str(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            col = _time_column(header, column, where)
            stamps = _read_times(reader, col, n, where)
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read the arrival trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(where, "", "expected a UTF-8 CSV file") from exc
    if not stamps:
        return []
    offsets = stamps
    if time_scale is not None:
        offsets = [t * time_scale for t in offsets]
    elif rate_qps is not None:
        span = offsets[-1]
        if len(offsets) < 2 or span <= 0:
            raise ConfigError(where, col, "needs at least two distinct timestamps to rescale to a rate")
        factor = (len(offsets) - 1) / span / rate_qps
        offsets = [t * factor for t in offsets]
    return offsets


def _time_column(header: list[str], column: str | None, where: str) -> str:
    if not header:
        raise ConfigError(where, "", "expected a CSV header row")
    if column is not None:
        if column not in header:
            raise ConfigError(where, column, f"no such column; the header has {', '.join(header)}")
        return column
    lowered = {h.strip().lower(): h for h in header}
    for name in _TIME_COLUMNS:
        if name in lowered:
            return lowered[name]
    raise ConfigError(
        where, "", f"expected a time column ({', '.join(_TIME_COLUMNS)}); the header has {', '.join(header)}"
    )


def _read_times(reader: csv.DictReader[str], col: str, n: int | None, where: str) -> list[float]:
    """Offsets from the first row, checking every row parses and time never goes backwards."""
    out: list[float] = []
    first: float | datetime | None = None
    prev = 0.0
    for row_index, row in enumerate(reader, start=1):
        if n is not None and row_index > n:
            break
        raw = row.get(col)
        at = f"row {row_index} column {col}"
        try:
            if raw is None:
                raise ValueError("missing")
            value = _parse_time(raw)
        except ValueError:
            raise ConfigError(
                where,
                at,
                f"expected seconds or a timestamp like 2023-11-16 18:15:46.6805900, got {raw!r}",
            ) from None
        if first is None:
            first = value
        if isinstance(value, datetime) and isinstance(first, datetime):
            offset = (value - first).total_seconds()
        elif isinstance(value, float) and isinstance(first, float):
            offset = value - first
        else:
            raise ConfigError(where, at, "expected the same time format as the first row")
        if offset < prev:
            raise ConfigError(where, at, "expected non-decreasing times (the trace must be sorted)")
        prev = offset
        out.append(offset)
    return out


# --------------------------------------------------------------------------------------------------
# Tenants and mixes
# --------------------------------------------------------------------------------------------------

_TENANT_KINDS: tuple[str, ...] = get_args(TenantKind)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant of a synthetic workload.

    ``share`` is its relative weight among the tenants (normalised over all of them). The deadline of
    each of its requests is ``deadline_s`` after arrival when set, else ``slo_scale`` times the
    workload's base SLO, else the base SLO itself. ``kind`` selects Text-to-SQL workflows or single chat
    calls.
    """

    name: str
    deadline_s: float | None = None
    slo_scale: float | None = None
    share: float = 1.0
    kind: TenantKind = "text2sql"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tenant name must not be empty")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"tenant {self.name!r}: share must be a positive number, got {self.share}")
        for key, value in (("deadline_s", self.deadline_s), ("slo_scale", self.slo_scale)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"tenant {self.name!r}: {key} must be a positive number, got {value}")
        if self.kind not in _TENANT_KINDS:
            raise ValueError(f"tenant {self.name!r}: kind must be one of {', '.join(_TENANT_KINDS)}")

    def relative_deadline(self, slo_s: float) -> float:
        """Seconds from arrival to deadline, given the workload's base SLO."""
        if self.deadline_s is not None:
            return self.deadline_s
        if self.slo_scale is not None:
            return self.slo_scale * slo_s
        return slo_s


def build_workload(
    queries: Sequence[list[CallSpec]],
    arrivals: Sequence[float],
    *,
    tenants: Sequence[TenantSpec],
    slo_s: float,
    rng: random.Random,
) -> list[StagedWorkflow]:
    """One workflow per arrival, ids 0..n-1 in arrival order.

    Each arrival goes to a tenant drawn by share. A Text-to-SQL tenant's k-th workflow replays
    ``queries[k % len(queries)]`` (counting only Text-to-SQL workflows, so a chat tenant does not make
    queries be skipped), staged by ``to_stages`` with the ``CHESS_TEMPLATE``. A chat tenant's workflow is
    one stage with one ``CHAT`` call drawn by ``sample_chat_call`` and no template.
    """
    if not tenants:
        raise ValueError("at least one tenant is needed")
    if not (slo_s > 0 and math.isfinite(slo_s)):
        raise ValueError(f"slo_s must be a positive number, got {slo_s}")
    if not queries and any(t.kind == "text2sql" for t in tenants):
        raise ValueError("a text2sql tenant needs at least one query")
    cumulative: list[float] = []
    total = 0.0
    for t in tenants:
        total += t.share
        cumulative.append(total)
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
        out.append(StagedWorkflow(wid, tenant.name, arrival, deadline, staged[q], template=CHESS_TEMPLATE))
    return out


_TENANT_KEYS = ("deadline_s", "kind", "share", "slo_scale")


def parse_tenants(spec: str) -> list[TenantSpec]:
    """Parse a command-line tenant mix: comma-separated tenants, each ``name[:key=value]...``.

    Keys: ``share``, ``slo_scale``, ``deadline_s`` (positive numbers) and ``kind`` (``text2sql`` or
    ``chat``). Example:
    ``gold:share=0.3:slo_scale=3,silver:share=0.7:slo_scale=8,chat:kind=chat:deadline_s=20``.
    Errors raise ``ValueError`` naming the offending part.
    """
    if not spec.strip():
        raise ValueError("empty tenant spec; expected name[:key=value]... separated by commas")
    tenants: list[TenantSpec] = []
    seen: set[str] = set()
    for raw_part in spec.split(","):
        part = raw_part.strip()
        fields = part.split(":")
        name = fields[0].strip()
        if not name or "=" in name:
            raise ValueError(f"tenant spec part {part!r}: expected a tenant name first")
        if name in seen:
            raise ValueError(f"tenant spec part {part!r}: tenant {name!r} given twice")
        seen.add(name)
        values: dict[str, str] = {}
        for field_text in fields[1:]:
            key, eq, value = (s.strip() for s in field_text.partition("="))
            if not eq or not key or not value:
                raise ValueError(f"tenant spec part {part!r}: expected key=value, got {field_text!r}")
            if key not in _TENANT_KEYS:
                raise ValueError(f"tenant spec part {part!r}: unknown key {key!r} (known: {', '.join(_TENANT_KEYS)})")
            if key in values:
                raise ValueError(f"tenant spec part {part!r}: key {key!r} given twice")
            values[key] = value
        tenants.append(_tenant_from_fields(name, part, values))
    return tenants


def _tenant_from_fields(name: str, part: str, values: dict[str, str]) -> TenantSpec:
    numbers: dict[str, float] = {}
    for key in ("deadline_s", "slo_scale", "share"):
        if key in values:
            try:
                numbers[key] = float(values[key])
            except ValueError:
                raise ValueError(f"tenant spec part {part!r}: {key} must be a number, got {values[key]!r}") from None
    kind_text = values.get("kind", "text2sql")
    kind: TenantKind
    if kind_text == "text2sql":
        kind = "text2sql"
    elif kind_text == "chat":
        kind = "chat"
    else:
        raise ValueError(f"tenant spec part {part!r}: kind must be text2sql or chat, got {kind_text!r}")
    try:
        return TenantSpec(
            name,
            deadline_s=numbers.get("deadline_s"),
            slo_scale=numbers.get("slo_scale"),
            share=numbers.get("share", 1.0),
            kind=kind,
        )
    except ValueError as exc:
        raise ValueError(f"tenant spec part {part!r}: {exc}") from None

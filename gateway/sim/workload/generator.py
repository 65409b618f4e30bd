"""The ``chess-bird`` generator: synthetic CHESS-on-BIRD queries and chat calls, by inverse CDF of figures measured
from the hexgen traces and the Azure LLM 2023 conversation trace."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

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
)

# Measured from the five hexgen traces (419 queries, 8010 calls, equal weight per query). Skeleton:
#   IR, [KEYWORDS], IR, IR, IR, CANDIDATE x2, REVISE x r,
#       then UNIT_TESTER, UNIT_TEST, UNIT_TESTER, EVALUATE x e, UNIT_TESTER   (404 queries)
#       or   UNIT_TESTER, UNIT_TESTER, UNIT_TESTER                              (15 queries: no test, e = 0)
# IR and unit-tester prompts are fixed; revise prompts and one query's evaluations share the candidate's
# quantile (correlations 0.98, 0.9999); candidate outputs have rank correlation ~0.73; the rest is independent.

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
    """``n`` synthetic CHESS queries on BIRD: the traces' skeleton, shape and token lengths drawn by inverse CDF."""
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

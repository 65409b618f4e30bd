"""The bench tools' shared figures: one percentile (the simulator's), one number format, one text table."""

from __future__ import annotations

import math

import pytest

from gateway.bench import stats
from gateway.sim import metrics


def test_the_percentile_is_the_simulators() -> None:
    assert stats.percentile is metrics.percentile


@pytest.mark.parametrize(
    ("x", "digits", "text"),
    [(1.25, 1, "1.2"), (0.5, 3, "0.500"), (math.inf, 1, "inf"), (-math.inf, 1, "-"), (math.nan, 2, "-")],
)
def test_fmt_spells_out_what_is_not_a_finite_number(x: float, digits: int, text: str) -> None:
    assert stats.fmt(x, digits) == text


@pytest.mark.parametrize(("x", "expected"), [(1.5, 1.5), (None, None), (math.inf, None), (math.nan, None)])
def test_finite_or_none_keeps_only_finite_numbers(x: float | None, expected: float | None) -> None:
    assert stats.finite_or_none(x) == expected


def test_a_table_right_aligns_numbers_under_a_rule() -> None:
    assert stats.table(["policy", "p95_s"], [["hexgen", "12.5"], ["rr", "130.0"]]).splitlines() == [
        "policy  p95_s",
        "------  -----",
        "hexgen   12.5",
        "    rr  130.0",
    ]


def test_a_table_can_left_align_its_label_columns_without_a_rule() -> None:
    assert stats.table(["db_id", "n"], [["concert_singer", "45"], ["pets", "7"]], left=1, rule=False).splitlines() == [
        "db_id            n",
        "concert_singer  45",
        "pets             7",
    ]


def test_a_table_without_rows_is_its_header() -> None:
    assert stats.table(["a", "bb"], []) == "a  bb\n-  --"


def test_spread_gives_mean_sample_std_and_range_per_seed() -> None:
    s = stats.spread([1.0, 2.0, 4.0])
    assert s.mean == pytest.approx(7 / 3)
    assert (s.min, s.max, s.values) == (1.0, 4.0, (1.0, 2.0, 4.0))
    assert s.std == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert stats.spread([5.0]).std == 0.0
    assert stats.spread([1.0, math.inf]).as_dict()["mean"] is None  # strict JSON: no Infinity
    with pytest.raises(ValueError, match="no values"):
        stats.spread([])

"""Recorded arrival patterns: Mooncake JSON lines, ServeGen window fits, and picking by format."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.sim.workload.arrivals import (
    SERVEGEN_WINDOW_S,
    jsonl_arrivals,
    pattern_arrivals,
    servegen_arrivals,
)


def test_jsonl_offsets_from_the_first_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 1}) for t in (1000, 1000, 4000, 9000)) + "\n")
    assert jsonl_arrivals(p) == [0.0, 0.0, 3000.0, 8000.0]
    assert jsonl_arrivals(p, 2) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"timestamp": 5}\n{"timestamp": 3}\n', "line 2"),
        ('{"timestamp": "x"}\n', "line 1.timestamp"),
        ("{not json\n", "line 1"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        jsonl_arrivals(p)


def _servegen(tmp_path: Path) -> Path:
    p = tmp_path / "chunk-1-trace.csv"
    p.write_text(
        "0,0.5,2.0,Gamma,0.25,8.0\n"
        "600,0,0,,0,0\n"  # idle window: skipped
        "1200,0.1,1.2,Weibull,0.8,10.0\n"
    )
    return p


def test_servegen_windows_hold_rate_x_600_requests(tmp_path: Path) -> None:
    a = servegen_arrivals(_servegen(tmp_path), 360, random.Random(0))
    assert len(a) == 360
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    first = [x for x in a if x < SERVEGEN_WINDOW_S]
    assert len(first) == 300  # 0.5/s x 600 s in the first window; the idle one is skipped
    assert len(a) - len(first) == 60
    # Seeded: the same draw again.
    assert servegen_arrivals(_servegen(tmp_path), 360, random.Random(0)) == a


def test_servegen_rejects_a_bad_row(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("0,1.0,1.0,Lognormal,1,1\n")
    with pytest.raises(ConfigError, match="row 1"):
        servegen_arrivals(p, 10, random.Random(0))


def test_pattern_arrivals_picks_the_reader_by_format(tmp_path: Path) -> None:
    csv_path = tmp_path / "azure.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.5,1\n2023-11-16 18:15:48.5,1\n")
    assert pattern_arrivals(csv_path, 10, random.Random(0)) == [0.0, 2.0]
    j = tmp_path / "m.jsonl"
    j.write_text('{"timestamp": 0}\n{"timestamp": 10}\n')
    assert pattern_arrivals(j, 10, random.Random(0)) == [0.0, 10.0]
    assert len(pattern_arrivals(_servegen(tmp_path), 50, random.Random(0))) == 50

"""Workload arrival times: Poisson and Gamma processes, and CSV trace replay."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.sim.workload.arrivals import gamma_arrivals, poisson_arrivals, replay_arrivals
from gateway.sim.workload.traces import SHARED_TRACE_DIR

AZURE_CONV = SHARED_TRACE_DIR.parent / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


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

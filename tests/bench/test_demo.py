"""``hexflow demo``: every answer is printed with its first rows (cells cut), the report keeps the rows, and
the summary's columns have a legend, printed and in the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gateway.bench.demo import (
    CELL_CHARS,
    LEGEND,
    ROWS_SHOWN,
    DemoAnswer,
    DemoReport,
    _refused,
    format_answer,
    run_demo,
)
from gateway.cli import main


def _answer(**kw: object) -> DemoAnswer:
    base: dict[str, object] = {
        "tenant": "batch",
        "question": "Which products?",
        "status": "ok",
        "http_status": 200,
        "sql": "SELECT name, note FROM products",
        "row_count": 12,
        "revisions": 0,
        "latency_s": 1.0,
        "deadline_s": 30.0,
        "deadline_met": True,
        "correct": True,
        "columns": ["name", "note"],
        "rows": [[f"p{i}", "x" * 100 if i == 0 else None] for i in range(10)],
    }
    return DemoAnswer(**{**base, **kw})  # type: ignore[arg-type]


def test_an_answer_prints_its_first_rows_with_long_cells_cut() -> None:
    lines = format_answer(_answer()).splitlines()
    assert lines[0].startswith("ok [batch      ]") and lines[0].endswith("-> SELECT name, note FROM products")
    assert lines[1].strip() == f"name | note (first {ROWS_SHOWN} of 12)"
    assert lines[2].strip() == f"p0 | {'x' * (CELL_CHARS - 3)}..."
    assert lines[3].strip() == "p1 | NULL"
    assert len(lines) == 2 + ROWS_SHOWN


def test_an_answer_without_rows_prints_no_table() -> None:
    text = format_answer(_answer(status="deadline_exceeded", correct=False, sql=None, columns=[], rows=[]))
    assert text.startswith("-- ") and len(text.splitlines()) == 1


def test_the_report_has_the_rows_and_a_legend_of_its_columns() -> None:
    doc = DemoReport(questions=1, time_scale=1.0, cluster="c", answers=[_answer()]).as_dict()
    assert doc["answers"][0]["rows"][1] == ["p1", None] and doc["answers"][0]["columns"] == ["name", "note"]
    assert doc["legend"] == LEGEND and {"ok", "correct", "deadline_met", "mark", "rows"} <= set(doc["legend"])


def test_the_demo_prints_each_answers_rows_and_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.json"
    assert main(["demo", "--questions", "2", "--time-scale", "0.05", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "\n      COUNT(*)\n" in stdout  # a table header under an answer (the first demo questions count rows)
    assert "\nlegend:\n  mark: " in stdout and "2/2 answers match the gold result" in stdout
    doc = json.loads(out.read_text())
    assert [a["rows"] for a in doc["answers"]] and all(a["rows"] and a["columns"] for a in doc["answers"])
    assert doc["legend"]["ok"] == LEGEND["ok"]


def test_make_demo_answers_each_tenant_correctly_within_its_deadline() -> None:
    """Exactly what ``make demo`` runs (48 questions, both tenants, the default cluster, time scale and rate): at
    least 90% of each tenant's questions are answered correctly within their deadline, and no question is
    refused that would have met it."""
    rep = run_demo(48, quiet=True)
    assert {a.tenant for a in rep.answers} == {"interactive", "batch"}
    for tenant in ("interactive", "batch"):
        mine = [a for a in rep.answers if a.tenant == tenant]
        assert len(mine) == 24
        in_time = sum(a.correct and a.deadline_met for a in mine)
        assert in_time >= 0.9 * len(mine), (tenant, [(a.status, a.latency_s, a.error) for a in mine if not a.correct])
        assert not any(a.refused and a.unchecked_met for a in mine), "a false refusal"


@pytest.mark.parametrize(
    ("status", "body", "refused"),
    [
        (429, {"error": {"message": "predicted to finish late"}, "reason": "deadline"}, True),
        (422, {"error": {"message": "no wait can meet it"}, "min_deadline_s": 8.0, "reason": "deadline"}, True),
        (429, {"error": {"message": "tenant has 64 workflows in progress"}, "reason": "concurrency"}, False),
        (422, {"error": {"message": "question: must not be blank"}}, False),
        (200, {"status": "ok"}, False),
    ],
)
def test_only_refusals_for_the_deadline_are_checked(status: int, body: dict[str, object], refused: bool) -> None:
    """A configured bound (queue, concurrency) refuses by rule, not by prediction: only the deadline's refusals
    are sent again to see whether they were right."""
    assert _refused(httpx.Response(status, json=body), body) is refused
    assert _refused(None, {"error": "ReadError"}) is False

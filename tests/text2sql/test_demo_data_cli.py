"""``hexflow databases --demo`` and ``hexflow answers --demo``: the demo Text-to-SQL data as files.

They write what ``hexflow demo`` builds in its temporary folder (and what the compose stack's one-shot
``demo-data`` service writes into its volume): the demo database ``demo_retail.sqlite`` next to a databases
file naming it by a relative path, and the scripted answers of every demo question.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.text2sql.answers import build_demo_answers, load_answers
from gateway.text2sql.db import DatabaseRegistry, load_databases
from gateway.text2sql.demo import DB_ID, TABLES, demo_questions, demo_rows, write_sqlite
from tests.cli_run import run_cli
from workers.scripted import AnswersResponder

N_QUESTIONS = 73
"""The demo questions (``demo_questions()``)."""


def _counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {n: conn.execute(f"SELECT COUNT(*) FROM {n}").fetchone()[0] for n in names}


def test_databases_demo_writes_the_database_and_a_relative_databases_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data" / "databases.yaml"
    assert main(["databases", "--demo", "--out", str(out)]) == 0
    db = tmp_path / "data" / f"{DB_ID}.sqlite"
    assert f"wrote {out}: 1 database" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == ["databases.yaml", f"{DB_ID}.sqlite"]  # no temp files
    # The tables and row counts of the demo data (seed 0), byte for byte the file hexflow demo writes.
    counts = _counts(db)
    assert set(counts) == {t.name for t in TABLES}
    assert counts == {name: len(rows) for name, rows in demo_rows(0).items()}
    assert counts["customers"] == 300 and counts["products"] == 80 and counts["orders"] == 1200
    assert db.read_bytes() == write_sqlite(tmp_path / "ref.sqlite", seed=0).read_bytes()
    assert db.stat().st_mode & 0o777 == 0o644
    # The databases file points at it by a path relative to its own folder (so the folder can move, or be
    # mounted anywhere in a container), and the project's loader and registry resolve it.
    raw = yaml.safe_load(out.read_text())
    assert raw == {
        "databases": {
            DB_ID: {"url": f"sqlite:///{DB_ID}.sqlite", "description": "demo retail", "statement_timeout_s": 5.0}
        }
    }
    moved = tmp_path / "moved"
    out.parent.rename(moved)
    loaded = load_databases(moved / "databases.yaml")
    assert list(loaded.databases) == [DB_ID]
    assert loaded.databases[DB_ID].sqlite_path() == (moved / f"{DB_ID}.sqlite").resolve()
    registry = DatabaseRegistry.from_file(moved / "databases.yaml")
    assert registry.ids() == [DB_ID] and registry.config(DB_ID).statement_timeout_s == 5.0


def test_databases_demo_is_idempotent_and_takes_the_limits_and_the_seed(tmp_path: Path) -> None:
    out = tmp_path / "databases.yaml"
    assert main(["databases", "--demo", "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["databases", "--demo", "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first
    argv = ["databases", "--demo", "--out", str(out), "--statement-timeout-s", "2.5", "--max-rows", "50000"]
    assert main([*argv, "--seed", "1"]) == 0
    cfg = load_databases(out).databases[DB_ID]
    assert cfg.statement_timeout_s == 2.5 and cfg.max_rows == 50000
    db = tmp_path / f"{DB_ID}.sqlite"
    assert db.read_bytes() != first[db.name]
    assert db.read_bytes() == write_sqlite(tmp_path / "ref" / "seed1.sqlite", seed=1).read_bytes()


def test_answers_demo_writes_the_scripted_answers_of_every_demo_question(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "answers.json"
    assert main(["answers", "--demo", "--out", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert len(data) == N_QUESTIONS == len(demo_questions())
    assert set(data) == {q.question for q in demo_questions()}
    # The same script hexflow demo uses: seed 0, a wrong first candidate for round(0.25 * 73) = 18 questions.
    assert data == build_demo_answers(seed=0, wrong_fraction=0.25)
    wrong = [e for e in data.values() if e.get("wrong")]
    assert len(wrong) == round(0.25 * N_QUESTIONS) == 18
    assert {e["note"].split(":")[0] for e in wrong} == {"error", "empty", "different"}
    assert all(e["db_id"] == DB_ID for e in data.values())
    assert f"{N_QUESTIONS} questions, 18 with a wrong first candidate" in capsys.readouterr().out
    # Accepted by the loader the emulator's --answers uses.
    assert load_answers(out) == data
    responder = AnswersResponder.from_file(out)
    assert len(responder.answers) == N_QUESTIONS
    # Other seeds and fractions, as hexflow demo --seed would use them.
    assert main(["answers", "--demo", "--out", str(out), "--seed", "2", "--wrong-fraction", "0.5"]) == 0
    assert json.loads(out.read_text()) == build_demo_answers(seed=2, wrong_fraction=0.5)


def _demo_files(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.suffix in {".json", ".yaml", ".sqlite"}]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["databases", "--out", "d.yaml"], "give --spider DIR (a Spider-format dataset) or --demo"),
        (["answers", "--out", "a.json"], "give --spider DIR (a Spider-format dataset) or --demo"),
        (["databases", "--demo", "--spider", "DIR", "--out", "d.yaml"], "--demo and --spider exclude each other"),
        (["answers", "--demo", "--spider", "DIR", "--out", "a.json"], "--demo and --spider exclude each other"),
        (["databases", "--demo"], "--out: give the databases file"),
        (["answers", "--demo"], "--out: give the answers file"),
        (["databases", "--demo", "--out", f"{DB_ID}.sqlite"], "that is where the database goes"),
        (["databases", "--demo", "--out", "d.yaml", "--seed", "-1"], "--seed"),
        (["databases", "--demo", "--out", "d.yaml", "--max-rows", "0"], "--max-rows"),
        (["databases", "--demo", "--out", "d.yaml", "--statement-timeout-s", "inf"], "--statement-timeout-s"),
        (["databases", "--spider", "DIR", "--out", "d.yaml", "--seed", "1"], "--seed: only with --demo"),
        (["answers", "--demo", "--out", "a.json", "--limit", "5"], "--limit: only with --spider"),
        (["answers", "--demo", "--out", "a.json", "--wrong-fraction", "1.5"], "--wrong-fraction"),
        (["answers", "--demo", "--out", "a.json", "--seed", "x"], "--seed"),
    ],
)
def test_bad_combinations_exit_2_with_one_line_and_write_nothing(
    args: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "DIR" / "database").mkdir(parents=True)  # a dataset folder (empty) for --spider
    code, out, err = run_cli(args, capsys)
    assert code == 2, (out, err)
    assert err.startswith(f"hexflow {args[0]}: error: ") and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == "" and not _demo_files(tmp_path)


def test_the_console_command_exits_2_on_a_bad_combination(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "answers", "--demo", "--spider", str(tmp_path), "--out", "a.json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "hexflow answers: error: --demo and --spider exclude each other: give one of them"
    assert proc.stdout == "" and not _demo_files(tmp_path)

"""``hexflow plan`` end to end at smoke size: the answer and its margin, the JSON, exit 1 when the budget is too
low, exit 2 with one clear line for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.config import DEFAULT_GPU_CATALOG
from tests.cli_run import run_cli
from tests.fakes import FakeClock

SMALL = ["plan", "--gpus", "A100,L40S", "--max-workers", "4", "--workflows", "60", "--seeds", "1", "--quiet"]


def test_plan_prints_the_answer_its_margin_and_the_cheaper_mixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    # SLO 4x at 0.2/s: of the cheaper mixes, some are pruned by their bound and some simulated and missed (at
    # SLO 5x, with a query's calls sharing their prefix in the engines, the first simulated mix meets it).
    tight = [*SMALL, "--slo-scale", "4", "--rate", "0.2"]
    code, stdout, _ = run_cli([*tight, "--json", str(out)], capsys)
    assert code == 0
    doc = json.loads(out.read_text())
    answer = doc["answer"]
    assert doc["met"] is True and answer["verdict"] == "met"
    assert f"answer: {answer['label']} ({answer['workers']} workers" in stdout
    assert "margin: " in stdout and doc["margin"] >= 1.0
    assert "missed the SLO" in stdout and "pruned: bound < rate" in stdout
    assert doc["rate_qps"] == 0.2 and doc["objective"] == "cost" and doc["prefix_caching"] is True
    assert [g["gpu"] for g in doc["gpus"]] == ["A100", "L40S"]

    # A budget a cent below the answer: nothing within it meets the SLO; exit 1 with the best attainment.
    budget = answer["usd_per_hour"] - 0.01
    code, stdout, _ = run_cli([*tight, "--budget", f"{budget:.2f}"], capsys)
    assert code == 1
    assert f"no mix within the ${budget:.2f}/h budget meets the SLO at 0.2 workflows/s: best attainment" in stdout


def test_plan_without_prices_ranks_by_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(DEFAULT_GPU_CATALOG.read_text(encoding="utf-8"))
    for spec in data["gpus"].values():
        spec.pop("usd_per_hour", None)
    cat = tmp_path / "gpus.yaml"
    cat.write_text(yaml.safe_dump(data))
    code, stdout, _ = run_cli([*SMALL, "--rate", "0.05", "--catalog", str(cat), "--no-margin"], capsys)
    assert code == 0
    assert "by workers" in stdout and "margin: not searched" in stdout
    code, _, err = run_cli([*SMALL, "--rate", "0.05", "--catalog", str(cat), "--budget", "100"], capsys)
    assert code == 2 and "a budget needs a usd_per_hour on every GPU" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpus", "A100,A1000"], "--gpus: unknown GPU 'A1000'; known: A100, A40, A6000"),
        (["--gpus", " , "], "--gpus: give at least one GPU type"),
        (["--rate", "0"], "argument --rate: expected a positive number, got '0'"),
        (["--rate", "-0.5"], "argument --rate: expected a positive number, got '-0.5'"),
        (["--model", "gpt-9"], "--model: unknown model 'gpt-9'"),
        (["--max-workers", "0"], "--max-workers: expected an integer >= 1"),
        (["--budget", "-3"], "argument --budget: expected a positive number, got '-3'"),
        (["--policy", "fifo"], "unknown policy 'fifo'"),
        (["--target", "1.5"], "--target: must be in (0, 1]"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--gpus": "A100,L40S", "--rate": "0.1"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["plan", "--workflows", "20", "--seeds", "1", "--quiet"] + [x for kv in base.items() for x in kv]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_a_gpu_without_a_profile_for_the_model_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(DEFAULT_GPU_CATALOG.read_text(encoding="utf-8"))
    del data["profiles"]["llama-3.1-8b"]["L4"]
    cat = tmp_path / "gpus.yaml"
    cat.write_text(yaml.safe_dump(data))
    argv = ["plan", "--gpus", "A100,L4", "--model", "llama-3.1-8b", "--rate", "0.1", "--catalog", str(cat)]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert "--gpus: no profile for llama-3.1-8b on L4; profiled GPUs: A100" in err


def test_plan_off_a_terminal_prints_a_progress_line_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    """stderr is not a terminal here (a pipe, a log): a bar would draw nothing, so plain lines say what runs."""
    code, out, err = run_cli([a for a in SMALL if a != "--quiet"] + ["--rate", "0.1"], capsys)
    assert code == 0 and "answer: " in out and "... " not in out
    lines = err.splitlines()
    assert lines and all(line.startswith("... ") and " simulated run" in line for line in lines), err
    assert any(line.endswith(", seed 0") for line in lines) and any("margin of " in line for line in lines), err


def test_progress_lines_say_each_step_at_once_and_otherwise_every_few_seconds() -> None:
    import io

    from gateway.cli.plan import ProgressLines

    now = FakeClock(100.0)
    stream = io.StringIO()
    lines = ProgressLines(stream, every_s=5.0, clock=now)
    now.t += 2.0
    lines.describe("2xA100, seed 0")
    lines.update(1)
    now.t += 4.0
    lines.update(1)  # 4 s since the last line: nothing
    now.t += 1.5
    lines.update(1)
    assert stream.getvalue().splitlines() == [
        "... 2 s, 0 simulated runs done: 2xA100, seed 0",
        "... 8 s, 3 simulated runs done: 2xA100, seed 0",
    ]

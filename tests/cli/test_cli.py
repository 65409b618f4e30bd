"""``hexflow``: bad input stops with one clear line and exit status 2; good input produces output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

FAST = ["--workflows", "30", "--trace", "chess-bird"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("make_args", "expected"),
    [
        (lambda p: ["simulate", "--policy", "nope", *FAST], "unknown policy 'nope'"),
        (lambda p: ["bench", "--policies", "hexgen,fifo", *FAST], "unknown policy 'fifo'"),
        (lambda p: ["simulate", "--cluster", "no-such-cluster", *FAST], "unknown cluster 'no-such-cluster'"),
        (lambda p: ["simulate", "--trace", "no-such-trace", "--workflows", "5"], "unknown workload 'no-such-trace'"),
        (lambda p: ["simulate", "--cluster", str(p["cluster_bad_gpu"]), *FAST], "workers.1.gpu"),
        (lambda p: ["simulate", "--cluster", str(p["cluster_bad_capacity"]), *FAST], "workers.0.capacity"),
        (lambda p: ["simulate", "--cluster", str(p["cluster_not_yaml"]), *FAST], "cluster_not_yaml.yaml"),
        (
            lambda p: ["simulate", "--trace", str(p["trace_bad"]), "--workflows", "5"],
            "[1].Text2SQLRequest[0].input_length",
        ),
        (lambda p: ["simulate", "--trace", str(p["trace_not_json"]), "--workflows", "5"], "not_json.json"),
        (lambda p: ["simulate", "--trace", str(p["missing"]), "--workflows", "5"], "missing.json"),
        (lambda p: ["simulate", "--tenants", "gold:share=abc", *FAST], "--tenants"),
        (lambda p: ["tune", "--policy", "lw-fcfs", *FAST], "does not use alpha"),
        (lambda p: ["simulate", "--alpha", "2", *FAST], "--alpha"),
        (lambda p: ["simulate", "--workflows", "0"], "--workflows"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    make_args: object, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {
        "cluster_bad_gpu": tmp_path / "cluster_bad_gpu.yaml",
        "cluster_bad_capacity": tmp_path / "cluster_bad_capacity.yaml",
        "cluster_not_yaml": tmp_path / "cluster_not_yaml.yaml",
        "trace_bad": tmp_path / "bad.json",
        "trace_not_json": tmp_path / "not_json.json",
        "missing": tmp_path / "missing.json",
    }
    paths["cluster_bad_gpu"].write_text("name: x\nworkers:\n  - gpu: A100\n  - gpu: A1000\n")
    paths["cluster_bad_capacity"].write_text("name: x\nworkers:\n  - gpu: A100\n    capacity: -3\n")
    paths["cluster_not_yaml"].write_text("name: [unclosed\n")
    good = {"Text2SQLRequest": [{"step": "revise", "input_length": 10, "output_length": 2}]}
    bad = {"Text2SQLRequest": [{"step": "revise", "input_length": -1, "output_length": 2}]}
    paths["trace_bad"].write_text(json.dumps([good, bad]))
    paths["trace_not_json"].write_text("{not json")
    code, _, err = run(make_args(paths), capsys)  # type: ignore[operator]
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_simulate_prints_summary_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    code, stdout, _ = run(["simulate", "--policy", "hexgen", *FAST, "--json", str(out)], capsys)
    assert code == 0
    assert "p95_s" in stdout and "calls/s" in stdout
    doc = json.loads(out.read_text())
    assert doc["summary"]["all"]["workflows"] == 30


def test_simulate_with_admission_reports_refusals_and_promises_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    argv = [
        "simulate",
        "--trace",
        "chess-bird",
        "--workflows",
        "60",
        "--rate",
        "2.0",
        "--admission",
        "--json",
        str(out),
    ]
    code, stdout, _ = run(argv, capsys)
    assert code == 0 and "admission:" in stdout
    adm = json.loads(out.read_text())["admission"]
    assert adm["arrived"] == 60 and 0 < adm["rejected"] < 60  # 10x the cluster's bound: most refused
    assert adm["met_share_of_accepted"] >= 0.9


def test_simulate_reports_each_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(
        ["simulate", *FAST, "--tenants", "gold:share=0.5:slo_scale=0.5,chat:kind=chat:share=0.5"], capsys
    )
    assert code == 0
    assert "gold" in stdout and "chat" in stdout


def test_bench_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    j, png = tmp_path / "b.json", tmp_path / "b.png"
    argv = ["bench", "--policies", "hexgen,rr-fcfs", *FAST, "--alpha", "0.3", "--quiet", "--jobs", "1"]
    code, stdout, _ = run([*argv, "--json", str(j), "--plot", str(png)], capsys)
    assert code == 0, stdout
    doc = json.loads(j.read_text())
    assert set(doc["capacity_qps"]) == {"hexgen", "rr-fcfs"} and doc["results"]
    assert png.stat().st_size > 0
    assert "fluid bound" in stdout


def test_bench_prints_a_table_for_each_rate_asked(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--policies", "hexgen,lw-fcfs", *FAST, "--no-capacity", "--rate", "0.02,0.04", "--quiet"]
    code, stdout, _ = run(argv, capsys)
    assert code == 0, stdout
    for rate in ("0.0200", "0.0400"):
        table = stdout.split(f"at {rate} qps:\n", 1)[1]
        lines = table.splitlines()
        assert lines[0].split() == ["policy", "p50_s", "p95_s", "p99_s", "slo", "p95_gain_vs_best"]
        assert [ln.split()[0] for ln in lines[2:4]] == ["hexgen", "lw-fcfs"]


def test_tune_prints_the_grid(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(["tune", *FAST, "--grid", "0,0.5,1"], capsys)
    assert code == 0
    assert "alpha =" in stdout and stdout.count("\n") >= 6


def test_simulate_replays_a_timestamp_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "arrivals.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s:02d}.0000000,100,10" for s in (0, 1, 1, 2, 9, 10, 30, 31, 31, 40)]
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "sim.json"
    code, _, err = run(["simulate", *FAST, "--arrivals", str(csv), "--rate", "0.05", "--json", str(out)], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["summary"]["all"]["workflows"] == 30


def test_bad_arrivals_file_names_the_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "arrivals.csv"
    csv.write_text("when,x\nyesterday,1\n")
    code, _, err = run(["simulate", *FAST, "--arrivals", str(csv)], capsys)
    assert code == 2 and "arrivals.csv" in err and "Traceback" not in err


def test_every_command_group_registers_its_commands_in_the_documented_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    listed = out.split("{", 1)[1].split("}", 1)[0].split(",")
    assert listed == [
        "simulate",
        "bench",
        "tune",
        "sim-speed",
        "plan",
        "emulate",
        "emulate-cluster",
        "serve",
        "replay",
        "overhead",
        "calibrate",
        "demo",
        "eval",
        "databases",
        "answers",
        "discover",
        "config-reference",
        "tenants",
    ]


def test_tune_window_counts_workflows(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(["tune", *FAST, "--grid", "0,1", "--window", "12"], capsys)
    assert code == 0
    assert "window: 12 workflows" in stdout

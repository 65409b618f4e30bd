"""``hexflow``: bad input stops with one clear line and exit status 2; good input produces output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.errors import GatewayError
from tests.cli_run import run_cli

FAST = ["--workflows", "30", "--trace", "chess-bird"]


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
    code, _, err = run_cli(make_args(paths), capsys)  # type: ignore[operator]
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_simulate_prints_summary_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    code, stdout, _ = run_cli(["simulate", "--policy", "hexgen", *FAST, "--json", str(out)], capsys)
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
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0 and "admission:" in stdout
    adm = json.loads(out.read_text())["admission"]
    assert adm["arrived"] == 60 and 0 < adm["rejected"] < 60  # 10x the cluster's bound: most refused
    assert adm["met_share_of_accepted"] >= 0.9


def test_simulate_reports_each_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(
        ["simulate", *FAST, "--tenants", "gold:share=0.5:slo_scale=0.5,chat:kind=chat:share=0.5"], capsys
    )
    assert code == 0
    assert "gold" in stdout and "chat" in stdout


def test_bench_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    j, png = tmp_path / "b.json", tmp_path / "b.png"
    argv = ["bench", "--policies", "hexgen,rr-fcfs", *FAST, "--alpha", "0.3", "--quiet", "--jobs", "1"]
    code, stdout, _ = run_cli([*argv, "--json", str(j), "--plot", str(png)], capsys)
    assert code == 0, stdout
    doc = json.loads(j.read_text())
    assert set(doc["capacity_qps"]) == {"hexgen", "rr-fcfs"} and doc["results"]
    assert png.stat().st_size > 0
    assert "fluid bound" in stdout


def test_bench_prints_a_table_for_each_rate_asked(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--policies", "hexgen,lw-fcfs", *FAST, "--no-capacity", "--rate", "0.02,0.04", "--quiet"]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0, stdout
    for rate in ("0.0200", "0.0400"):
        table = stdout.split(f"at {rate} qps:\n", 1)[1]
        lines = table.splitlines()
        assert lines[0].split() == ["policy", "p50_s", "p95_s", "p99_s", "slo", "p95_gain_vs_best"]
        assert [ln.split()[0] for ln in lines[2:4]] == ["hexgen", "lw-fcfs"]


def test_tune_prints_the_grid(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(["tune", *FAST, "--grid", "0,0.5,1"], capsys)
    assert code == 0
    assert "alpha =" in stdout and stdout.count("\n") >= 6


def test_simulate_replays_a_timestamp_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "arrivals.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s:02d}.0000000,100,10" for s in (0, 1, 1, 2, 9, 10, 30, 31, 31, 40)]
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "sim.json"
    code, _, err = run_cli(["simulate", *FAST, "--arrivals", str(csv), "--rate", "0.05", "--json", str(out)], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["summary"]["all"]["workflows"] == 30


def test_bad_arrivals_file_names_the_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "arrivals.csv"
    csv.write_text("when,x\nyesterday,1\n")
    code, _, err = run_cli(["simulate", *FAST, "--arrivals", str(csv)], capsys)
    assert code == 2 and "arrivals.csv" in err and "Traceback" not in err


def test_every_command_group_registers_its_commands_in_the_documented_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(["--help"], capsys)
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
    code, stdout, _ = run_cli(["tune", *FAST, "--grid", "0,1", "--window", "12"], capsys)
    assert code == 0
    assert "window: 12 workflows" in stdout


@pytest.mark.parametrize(
    ("argv", "prog", "option"),
    [
        (["tune", "--grid", "a,b"], "hexflow tune", "--grid"),
        (["tune", "--grid", "0,2"], "hexflow tune", "--grid"),
        (["bench", "--rate", "0.1,abc"], "hexflow bench", "--rate"),
        (["bench", "--rate", "0.1,-1"], "hexflow bench", "--rate"),
        (["bench", "--seeds", "0"], "hexflow bench", "--seeds"),
        (["bench", "--rel-tol", "1"], "hexflow bench", "--rel-tol"),
        (["bench", "overload", "--bursts", "0"], "hexflow bench overload", "--bursts"),
        (["simulate", "--workflows", "0"], "hexflow simulate", "--workflows"),
        (["simulate", "--alpha", "2"], "hexflow simulate", "--alpha"),
        (["simulate", "--rate", "nan"], "hexflow simulate", "--rate"),
        (["simulate", "--slo-scale", "-1"], "hexflow simulate", "--slo-scale"),
        (["sim-speed", "--repeats", "x"], "hexflow sim-speed", "--repeats"),
        (["serve", "--port", "99999"], "hexflow serve", "--port"),
        (["serve", "--port", "0"], "hexflow serve", "--port"),
        (["replay", "--rate", "abc"], "hexflow replay", "--rate"),
        (["overhead", "--duration", "0"], "hexflow overhead", "--duration"),
        (["plan", "--rate", "0", "--gpus", "A100"], "hexflow plan", "--rate"),
        (["calibrate", "--worker", "http://x", "--model", "m", "--tp", "0"], "hexflow calibrate", "--tp"),
        (["demo", "--questions", "0"], "hexflow demo", "--questions"),
        (["emulate", "--gpu", "A100", "--port", "99999"], "hexflow emulate", "--port"),
        (["emulate", "--gpu", "A100", "--time-scale", "0"], "hexflow emulate", "--time-scale"),
        (["emulate-cluster", "--base-port", "70000"], "hexflow emulate-cluster", "--base-port"),
    ],
)
def test_a_bad_number_stops_at_parse_time_with_the_subcommands_usage(
    argv: list[str], prog: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith(f"usage: {prog} ")
    assert f"{prog}: error: argument {option}" in err.splitlines()[-1]
    assert "Traceback" not in err


def test_an_error_found_after_parsing_names_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["bench", "--live", "--rate", "0.1,0.2", "--policies", "hexgen"], capsys)
    assert code == 2 and err.strip() == "hexflow bench: error: --rate: with --live give one rate in workflows/s, got 2"


def _all_parsers() -> list[argparse.ArgumentParser]:
    from gateway.cli import _walk
    from workers.cluster import build_parser as cluster_parser
    from workers.emulator import build_parser as emulator_parser

    return [*_walk(build_parser()), emulator_parser("hexflow emulate"), cluster_parser("hexflow emulate-cluster")]


def test_every_option_has_help_and_its_default_shows() -> None:
    for parser in _all_parsers():
        if parser.prog in ("hexflow emulate", "hexflow emulate-cluster") and parser.add_help is False:
            continue  # the placeholders main() hands over before parsing
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            assert action.help, (parser.prog, action.option_strings)
            default = action.default
            if default not in (None, False, argparse.SUPPRESS):
                assert "default" in (action.help or "") or f"(default: {default})" in " ".join(text.split()), (
                    parser.prog,
                    action.option_strings,
                )
            if action.required:
                assert f"{action.option_strings[0]} {action.metavar or action.dest.upper()}" in text
                assert "(required)" in " ".join(text.split())


def test_every_subcommands_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``hexflow CMD --help`` of every subcommand (the handed-over emulators too) has a description: a paragraph
    between the usage and the options."""
    commands = [parser.prog.split()[1:] for parser in _all_parsers() if parser.prog != "hexflow"]
    assert ["emulate"] in commands and ["bench", "overload"] in commands and ["tenants", "hash-key"] in commands
    lacking = []
    for command in commands:
        code, out, _ = run_cli([*command, "--help"], capsys)
        assert code == 0, command
        paragraphs = out.split("\n\n")
        assert paragraphs[0].startswith(f"usage: hexflow {' '.join(command)}"), out
        described = len(paragraphs) > 1 and not paragraphs[1].startswith(("options:", "positional arguments:"))
        if not described or len(paragraphs[1].split()) < 8:
            lacking.append(" ".join(command))
    assert not lacking, f"no description in --help: {lacking}"


def test_help_names_the_command_as_typed_and_shows_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0 and "``" not in out and "HexGen-Flow" in out
    for cmd in ("emulate", "emulate-cluster"):
        code, out, _ = run_cli([cmd, "--help"], capsys)
        assert code == 0 and out.startswith(f"usage: hexflow {cmd} ")
        assert "python -m" not in out and "``" not in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway import __version__

    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"hexflow {__version__}"


def test_bench_without_capacity_or_rates_says_which_rates_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--policies", "hexgen", *FAST, "--no-capacity", "--alpha", "0.3", "--quiet", "--jobs", "1"]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0
    assert stdout.startswith("--no-capacity without --rate: measuring at 0.2, 0.3, 0.4, 0.5, 0.6, 0.7 x the fluid")
    assert stdout.count("qps:\n") == 6  # a table per rate


def test_an_unknown_trace_name_says_where_trace_names_are_looked_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.sim.workload import resolve_trace

    missing = tmp_path / "no-such-folder"
    with pytest.raises(GatewayError) as info:
        resolve_trace("trace1", missing)
    msg = str(info.value)
    assert f"A trace name is a file NAME.json in {missing}, which does not exist here" in msg
    assert "$HEXFLOW_TRACE_DIR" in msg and "chess-bird is built in" in msg


def test_the_trace_folder_comes_from_the_environment(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    good = {"Text2SQLRequest": [{"step": "revise", "input_length": 10, "output_length": 2}]}
    (tmp_path / "mine.json").write_text(json.dumps([good, good]))
    env = {**os.environ, "HEXFLOW_TRACE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "gateway.cli", "simulate", "--trace", "mine", "--workflows", "3"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mine on paper-4gpu")

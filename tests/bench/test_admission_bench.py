"""``hexflow bench admission`` (``gateway.bench.admission``), smoke-sized: the report's structure and the
behaviour it measures (admission off admits all; refusing counts as missing); the figures are the command's."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.bench.admission import bench_steps, format_admission_report, parse_variant, run_admission_bench
from gateway.bench.simbench import Setup
from gateway.cli import main
from gateway.config import load_cluster
from gateway.sim.workload import load_queries


def small_setup() -> Setup:
    workers = load_cluster("paper-4gpu")
    queries = load_queries("chess-bird", 60, random.Random(0))
    return Setup(workers=workers, queries=queries, trace="chess-bird", n_workflows=60, slo_scale=3.0, n_seeds=2)


def test_variants_parse_and_bad_ones_say_what_is_wrong() -> None:
    assert parse_variant("off").share is None
    v = parse_variant("best_effort@0.5")
    assert (v.name, v.share, v.miss) == ("best_effort@0.5", 0.5, "best_effort")
    assert parse_variant(" reject@1 ").name == "reject@1"
    for bad, msg in (
        ("shed@0.5", "expected off"),
        ("reject", "expected off"),
        ("reject@x", "not a number"),
        ("reject@0", "in \\(0, 1\\]"),
        ("reject@2", "in \\(0, 1\\]"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_variant(bad)


def test_the_bench_measures_every_policy_variant_load_and_seed() -> None:
    steps: list[int] = []
    variants = [parse_variant(v) for v in ("off", "reject@0.25", "best_effort@0.25")]
    r = run_admission_bench(
        small_setup(),
        policies=["hexgen", "lw-fcfs"],
        variants=variants,
        loads=[1.0, 3.0],
        alpha=0.3,
        rel_tol=0.1,
        progress=steps.append,
    )
    assert sum(steps) == bench_steps(2, 3, 2, 2)
    assert set(r.capacity) == {(p, v.name) for p in ("hexgen", "lw-fcfs") for v in variants}
    assert r.reference_qps == r.capacity[("hexgen", "off")].mean > 0
    assert len(r.points) == 2 * 3 * 2 * 2
    for p in r.points:
        assert p.rate_qps == pytest.approx(p.load * r.reference_qps)
        assert p.met <= p.arrived
        if p.variant == "off":
            assert p.refused == p.demoted == p.shed == 0 and p.kept == p.attainment
        elif p.variant == "reject@0.25":
            assert p.demoted == 0 and p.met_admitted == p.met
        else:  # only a deadline no wait can meet is refused whatever the tenant says
            assert p.refused < 0.1 * p.arrived and p.shed <= p.demoted
    # At three times the capacity, refusing what cannot make it keeps the admitted in time where admitting
    # everything keeps almost nothing.
    for pol in ("hexgen", "lw-fcfs"):
        assert r.mean(pol, "reject@0.25", 3.0, lambda q: q.kept) >= 0.9
        assert r.mean(pol, "reject@0.25", 3.0, lambda q: q.goodput_qps) > r.mean(
            pol, "off", 3.0, lambda q: q.goodput_qps
        )
    text = format_admission_report(r)
    assert "reject@0.25" in text and "best_effort@0.25" in text and "lw-fcfs" in text
    doc = r.to_json()
    json.dumps(doc, allow_nan=False)
    assert {c["variant"] for c in doc["capacity_qps"]} == {v.name for v in variants}


def test_the_bench_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="variants repeat"):
        run_admission_bench(small_setup(), variants=[parse_variant("off"), parse_variant("off")], loads=[1.0])
    with pytest.raises(ValueError, match="loads"):
        run_admission_bench(small_setup(), loads=[0.0])


def test_cli_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "a.json", tmp_path / "a.png"
    rc = main(
        [
            "bench",
            "admission",
            "--workflows",
            "40",
            "--seeds",
            "1",
            "--policies",
            "lw-fcfs",
            "--variants",
            "off,reject@0.5",
            "--loads",
            "1,2",
            "--rel-tol",
            "0.2",
            "--quiet",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["policies"] == ["lw-fcfs"] and len(doc["points"]) == 2 * 2
    assert png.stat().st_size > 0
    assert "capacity" in capsys.readouterr().out


def test_cli_says_what_is_wrong_with_a_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "admission", "--variants", "reject@7", "--quiet"]) == 2
    assert "--variants" in capsys.readouterr().err


def test_cli_says_a_variant_is_listed_twice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "admission", "--variants", "off,off", "--workflows", "10", "--quiet"]) == 2
    assert "repeat" in capsys.readouterr().err

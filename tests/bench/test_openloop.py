"""``hexflow bench open-loop``: a workload's calls sent open loop to one worker, each against the profile's
simulated engine; an emulated worker runs as its own profile predicts, and a profile that leaves out the
engine time each arriving request costs (``admit_s``) is caught under load."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gateway.bench.fidelity.compare import simulate_arrivals
from gateway.bench.fidelity.openloop import format_open_loop_report, make_calls, run_open_loop
from gateway.cli import main
from gateway.core.profile import PerfProfile, time_scaled
from tests.emulator_process import emulated_client, emulator_process

MODEL = "tiny"
TIME_SCALE = 1.0
# A CPU server's shape: 10 ms steps, an intake on the engine's core of 8 ms per request.
TRUTH = PerfProfile("cpu", MODEL, 0.01, 1e-4, 1e-7, 0.002, 200_000, 4, 2048, admit_s=0.008)


def test_calls_are_drawn_from_the_workload_scaled_and_seeded() -> None:
    a = make_calls("chess-bird", 50, 8.0, 0.05, 3)
    assert a == make_calls("chess-bird", 50, 8.0, 0.05, 3)
    assert a != make_calls("chess-bird", 50, 8.0, 0.05, 4)
    assert len(a) == 50 and a[0].at == 0.0 and all(x.at <= y.at for x, y in itertools.pairwise(a))
    assert {c.kind for c in a} >= {"generate_candidate", "information_retriever"}
    assert max(c.prompt for c in a) < max(c.prompt for c in make_calls("chess-bird", 50, 8.0, 1.0, 3))
    assert 3.0 < 49 / a[-1].at < 20.0  # Poisson at about the rate
    with pytest.raises(ValueError, match="rate"):
        make_calls("chess-bird", 5, 0.0, 0.1, 0)


async def test_an_emulated_worker_matches_its_profile_and_a_profile_without_intake_is_caught() -> None:
    wall = time_scaled(TRUTH, TIME_SCALE)
    async with emulated_client(TRUTH, MODEL, TIME_SCALE) as client:
        rep = await run_open_loop(
            "http://emulator",
            MODEL,
            wall,
            rates=[20.0],
            calls=60,
            token_scale=0.05,
            seed=1,
            client=client,
            progress=False,
        )
    (r,) = rep.rates
    s = r.summary()
    assert s["completed"] == 60 and r.complete and s["client_waits"] == 0
    assert 0.85 <= s["mean_ratio"] <= 1.2, s
    # The same arrivals under a profile with the intake folded into the overhead (latency only): alone it
    # predicts the same, under load it misses the stalls every arrival puts on the calls running.
    blind = replace(wall, admit_s=0.0, request_overhead_s=wall.request_overhead_s + wall.admit_s)
    assert blind.single_latency(100, 10) == pytest.approx(wall.single_latency(100, 10))
    arrivals = [(c.at, c.prompt, c.output) for c in r.calls]
    assert sum(simulate_arrivals(blind, arrivals)) < 0.93 * sum(r.sim_s)
    text = format_open_loop_report(rep)
    assert "live/sim" in text and "generate_candidate" in text
    doc = rep.to_json()
    assert doc["rates"][0]["completed"] == 60 and doc["admit_s"] == wall.admit_s


def test_cli_runs_against_a_worker_and_names_a_missing_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "llama-3.1-70b"  # the emulator serves catalogue models
    entry = {k: getattr(TRUTH, k) for k in ("iter_base_s", "token_s", "ctx_s", "request_overhead_s", "admit_s")}
    entry |= {"tp": 1, "kv_capacity_tokens": 200_000, "max_num_seqs": 4, "max_batched_tokens": 2048}
    prof = tmp_path / "profiles.yaml"
    prof.write_text(yaml.safe_dump({"profiles": {model: {"cpu": entry}}}))
    assert main(["bench", "open-loop", "--worker", "http://x", "--model", "other", "--profile", str(prof)]) == 2
    assert "no profile for model 'other'" in capsys.readouterr().err
    catalog = tmp_path / "gpus.yaml"
    doc = yaml.safe_load(Path("config/gpus.yaml").read_text())
    doc["profiles"][model]["A100"] = entry
    catalog.write_text(yaml.safe_dump(doc))
    js = tmp_path / "ol.json"
    with emulator_process(["--gpu", "A100", "--model", model, "--catalog", str(catalog)], tmp_path / "emu.log") as url:
        head = ["bench", "open-loop", "--worker", url, "--model", model, "--profile", str(prof), "--quiet"]
        code = main([*head, "--rates", "10", "--calls", "20", "--token-scale", "0.03", "--json", str(js)])
    assert code == 0, capsys.readouterr().err
    out = json.loads(js.read_text())
    assert out["rates"][0]["completed"] == 20 and out["rates"][0]["mean_ratio"] > 0
    with pytest.raises(SystemExit) as info:
        main(["bench", "open-loop", "--worker", "http://x", "--model", model, "--profile", str(prof), "--rates", "a"])
    assert info.value.code == 2

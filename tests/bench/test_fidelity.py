"""``hexflow bench fidelity`` at smoke size: emulated workers of non-catalogue speed, calibrated, replayed live
and simulated with the calibrated profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.bench.fidelity.emulated import FACTOR_SETS, format_fidelity_report, perturbed_catalog, run_fidelity
from gateway.bench.rig import LiveSettings
from gateway.config import DEFAULT_GPU_CATALOG, load_gpu_catalog
from gateway.profiling.plan import PlanSettings

MODEL = "llama-3.1-70b"


def test_perturbed_catalog_changes_each_gpu_type_by_its_own_factors(tmp_path: Path) -> None:
    base = yaml.safe_load(Path(DEFAULT_GPU_CATALOG).read_text())
    doc = perturbed_catalog(base, MODEL, ["A100", "L40S"])
    path = tmp_path / "truth.yaml"
    path.write_text(yaml.safe_dump(doc))
    truth, packaged = load_gpu_catalog(path), load_gpu_catalog()
    for i, gpu in enumerate(["A100", "L40S"]):
        t, p = truth.profile(gpu, MODEL), packaged.profile(gpu, MODEL)
        assert t.iter_base_s / p.iter_base_s == pytest.approx(FACTOR_SETS[i]["iter_base_s"], rel=1e-5)
        assert t.token_s / p.token_s == pytest.approx(FACTOR_SETS[i]["token_s"], rel=1e-5)
        assert t.kv_capacity_tokens % 16 == 0
    assert truth.profile("H100", MODEL) == packaged.profile("H100", MODEL)  # others untouched
    assert (
        base["profiles"][MODEL]["A100"]
        == yaml.safe_load(Path(DEFAULT_GPU_CATALOG).read_text())["profiles"][MODEL]["A100"]
    )  # the input is not modified


def test_fidelity_calibrates_every_gpu_type_then_compares_live_with_the_simulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = PlanSettings(max_prompt=512, max_output=16, max_concurrency=2, repeats=1, step_output=32)
    # A relative log folder (as `--log-dir out/x` gives): the gateway it starts must still find its files.
    monkeypatch.chdir(tmp_path.parent)
    rep = run_fidelity(
        LiveSettings("paper-4gpu", 0.02, log_dir=Path(tmp_path.name)),
        workflows=4,
        budget_s=20.0,
        progress=False,
        settings=settings,
    )
    assert [c.gpu for c in rep.calibrations] == ["A100", "A6000", "L40S"]
    calibrated = load_gpu_catalog(tmp_path / "calibrated-gpus.yaml")
    for c in rep.calibrations:
        spec = calibrated.profile_spec(c.gpu, MODEL)
        assert spec.basis.startswith("measured")
        assert spec.kv_capacity_tokens == c.truth.kv_capacity_tokens  # read from the worker's metrics
    # The gateway of the live run read the calibrated catalogue.
    gw = yaml.safe_load((tmp_path / "live" / "gateway-hexgen.yaml").read_text())
    assert Path(gw["gpu_catalog"]).name == "calibrated-gpus.yaml"
    (run,) = rep.live.runs
    assert run.live.completed + sum(v for k, v in run.live.by_status.items() if k != "200") == 4
    doc = json.loads(json.dumps(rep.to_json(), allow_nan=False))
    assert set(doc["gaps"]["hexgen"]) == {"p95", "slo"}
    assert "live against the simulator with the calibrated profiles" in format_fidelity_report(rep)

"""The benchmark switch (``benchmark: true`` in gateway.yaml): ablation policies only in benchmark mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.gateway import load_gateway_config
from gateway.core.policy import POLICIES
from gateway.errors import ConfigError

WORKERS = "cluster:\n  name: c\n  workers:\n    - {gpu: L40S, url: 'http://w:8000'}\n"


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text + WORKERS)
    return path


def test_production_runs_ours_and_baselines_and_benchmark_mode_is_off_by_default(tmp_path: Path) -> None:
    for name, policy in POLICIES.items():
        if policy.role != "ablation":
            loaded = load_gateway_config(_config(tmp_path, f"policy: {name}\n"))
            assert loaded.cfg.policy == name and not loaded.cfg.benchmark


def test_an_ablation_policy_needs_the_benchmark_switch(tmp_path: Path) -> None:
    ablations = [n for n, p in POLICIES.items() if p.role == "ablation"]
    assert ablations
    for name in ablations:
        with pytest.raises(ConfigError) as err:
            load_gateway_config(_config(tmp_path, f"policy: {name}\n"))
        msg = str(err.value)
        assert "policy" in msg and "ablation" in msg and "benchmark: true" in msg and "hexgen" in msg
        assert load_gateway_config(_config(tmp_path, f"policy: {name}\nbenchmark: true\n")).cfg.benchmark


def test_the_command_line_switch_turns_benchmark_mode_on_before_the_policy_is_checked(tmp_path: Path) -> None:
    name = next(n for n, p in POLICIES.items() if p.role == "ablation")
    loaded = load_gateway_config(_config(tmp_path, f"policy: {name}\n"), benchmark=True)
    assert loaded.cfg.benchmark and loaded.cfg.policy == name
    assert load_gateway_config(_config(tmp_path, "policy: hexgen\nbenchmark: false\n"), benchmark=True).cfg.benchmark

"""An emulated worker says what it started, once, before it serves: GPU, model, URL, time scale, answers."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.emulator_process import emulator_process


def test_the_emulator_prints_what_it_started(tmp_path: Path) -> None:
    log = tmp_path / "emulator.log"
    with emulator_process(["--gpu", "L40S", "--time-scale", "0.05", "--demo"], log) as url:
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        first = log.read_text().splitlines()[0]
    assert first == (
        f"emulated worker (a test double) L40S/llama-3.1-70b on {url}: time scale 0.05, answers the demo script, "
        "prefix caching on"
    )

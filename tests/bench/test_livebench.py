"""``hexflow bench --live`` end to end (emulated cluster and gateway as subprocesses), its config writer,
and ``hexflow emulate-cluster``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.bench import procs
from gateway.bench.procs import write_gateway_config
from gateway.bench.rig import bench_tenant
from gateway.config import build_workers, load_cluster_config
from gateway.live.tenants import TenantStore, check_deadline
from tests.cli_run import run_cli
from tests.emulator_process import free_port

LIVE = ["bench", "--live", "--cluster", "paper-4gpu", "--trace", "chess-bird", "--time-scale", "0.02", "--quiet"]


def test_bench_live_measures_both_policies_and_their_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "live.json"
    plot = tmp_path / "live.png"
    argv = [*LIVE, "--policies", "hexgen,rr-fcfs", "--workflows", "10", "--json", str(out), "--plot", str(plot)]
    code, stdout, err = run_cli([*argv, "--log-dir", str(tmp_path / "logs")], capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert [p["policy"] for p in doc["policies"]] == ["hexgen", "rr-fcfs"]
    assert doc["workflows"] == 10 and doc["rate_qps"] == pytest.approx(0.55 * doc["fluid_bound_qps"], rel=1e-4)
    for p in doc["policies"]:
        live, sim = p["live"], p["simulated"]
        assert live["completed"] == live["workflows"] == 10 and live["by_status"] == {"200": 10}
        assert sim["completed"] == sim["workflows"] == 10
        for key in ("p50_s", "p95_s", "p99_s", "slo_attainment", "throughput_qps"):
            assert live[key] is not None and sim[key] is not None and live[key] > 0 and sim[key] > 0
        assert p["ratios"]["p95_live_over_sim"] == pytest.approx(live["p95_s"] / sim["p95_s"])
        low, median, high = p["simulated_jitter_band"]["p95_s"]
        assert low <= median <= high
        # Every call of the workload was served live, as many as the simulator dispatched.
        assert sum(p["calls_per_worker"]["live"].values()) == sum(p["calls_per_worker"]["simulated"].values())
    assert doc["policies"][0]["alpha"] is not None and doc["policies"][1]["alpha"] is None
    gain = doc["gain_vs_rr_fcfs"]["hexgen"]
    assert gain["p95_live"] > 0 and gain["p95_sim"] > 0
    assert "p95_live/sim" in stdout and "P95 gain over rr-fcfs" in stdout
    assert plot.stat().st_size > 0
    logs = {p.name for p in (tmp_path / "logs").iterdir()}
    assert {"gateway-hexgen.yaml", "gateway-rr-fcfs.log", "cluster-hexgen.out", "tenants.yaml"} <= logs


def test_bench_live_reports_a_subprocess_that_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "START_TIMEOUT_S", 0.0)
    argv = [*LIVE, "--policies", "rr-fcfs", "--workflows", "3", "--json", str(tmp_path / "x.json")]
    code, _, err = run_cli([*argv, "--log-dir", str(tmp_path / "logs")], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("hexflow bench: error:") and "the emulated cluster did not start" in last
    assert f"last lines of {tmp_path / 'logs' / 'cluster-rr-fcfs.log'}" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--policies", "hexgen", "--rate", "0.1,0.2"], "--rate"),
        (["--policies", "hexgen", "--time-scale", "0"], "--time-scale"),
        (["--policies", "nope"], "unknown policy 'nope'"),
        (["--policies", "hexgen", "--tenants", "a:share=1"], "--tenants"),
    ],
)
def test_bad_live_bench_arguments_exit_2(extra: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([*LIVE, "--workflows", "3", *extra], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and expected in lines[-1] and lines[-1].startswith("hexflow bench: error: ")
    assert len(lines) == 1 or lines[0].startswith("usage: hexflow bench ")  # argparse's: after the usage


def test_written_gateway_config_loads_and_the_tenant_accepts_the_key(tmp_path: Path) -> None:
    key = bench_tenant(tmp_path, max_concurrent_workflows=500, deadline_s=2.5)
    tenants = tmp_path / "tenants.yaml"
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
    loaded = write_gateway_config(
        "paper-4gpu",
        urls,
        tmp_path / "gw.yaml",
        policy="wb-fcfs",
        alpha=0.4,
        time_scale=0.05,
        tuning_enabled=False,
        tenants_file=tenants.name,
        port=8123,
    )
    cfg = loaded.cfg
    assert (cfg.policy, cfg.alpha, cfg.time_scale, cfg.tuning.enabled, cfg.listen.port) == (
        "wb-fcfs",
        0.4,
        0.05,
        False,
        8123,
    )
    assert [(w.name, w.gpu, w.url) for w in loaded.resolved] == [
        (rw.name, rw.gpu, u) for rw, u in zip(load_cluster_config("paper-4gpu").expanded(), urls, strict=True)
    ]
    # The gateway's scheduler sees the profiles slowed down by the time scale.
    assert loaded.workers[0].profile.iter_base_s == pytest.approx(
        0.05 * build_workers(load_cluster_config("paper-4gpu"), loaded.catalog)[0].profile.iter_base_s
    )
    store = TenantStore.load(loaded.tenants_path)
    tenant = store.authenticate(key)
    assert tenant is not None and tenant.max_concurrent_workflows == 500
    # The simulator it is compared with admits every workflow: so does the gateway's bench tenant.
    assert tenant.predictive_admission is False
    assert check_deadline(tenant, 0.01) == pytest.approx(0.01)
    assert store.authenticate("other") is None
    with pytest.raises(ValueError, match="4 workers but 3 urls"):
        write_gateway_config(
            "paper-4gpu",
            urls[:3],
            tmp_path / "bad.yaml",
            policy="hexgen",
            alpha=None,
            time_scale=1.0,
            tuning_enabled=True,
            tenants_file="t.yaml",
        )


def test_emulate_cluster_serves_every_worker_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "cluster.out"
    cmd = [sys.executable, "-m", "workers.cluster", "--cluster", "paper-4gpu", "--base-port", "0"]
    with log.open("wb") as f:
        proc = subprocess.Popen([*cmd, "--time-scale", "0.01"], stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while len(lines := log.read_text().splitlines()[1:]) < 4:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            # First what it started (stderr), then a line per worker once every one answers (stdout).
            banner = log.read_text().splitlines()[0]
            assert banner.startswith("emulated cluster (test doubles) paper-4gpu: 4 workers (A100, A100, A6000, L40S)")
            names = [line.split()[0] for line in lines]
            assert names == ["a100-0", "a100-1", "a6000-0", "l40s-0"]  # as config/gateway.yaml names them
            assert [line.split()[2] for line in lines] == ["A100", "A100", "A6000", "L40S"]
            urls = [line.split()[1] for line in lines]
            assert len(set(urls)) == 4
            for url in urls:
                assert httpx.get(f"{url}/health", timeout=5).status_code == 200
            r = httpx.post(
                f"{urls[3]}/v1/completions",
                json={"model": "llama-3.1-70b", "prompt": [1, 2, 3], "max_tokens": 4},
                timeout=10,
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        finally:
            proc.terminate()
            code = proc.wait(timeout=15)
    assert code == 0


@pytest.mark.parametrize("case", ["port-in-use", "unknown-cluster"])
def test_emulate_cluster_bad_input_exits_2(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        if case == "port-in-use":
            argv = ["emulate-cluster", "--cluster", "small-8b", "--base-port", str(port)]
        else:
            argv = ["emulate-cluster", "--cluster", "no-such-cluster", "--base-port", str(free_port())]
        code, _, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("cannot listen" if case == "port-in-use" else "unknown cluster") in err

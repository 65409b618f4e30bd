"""The newcomer's path to a live ``/v1/text2sql`` (README, docs/text2sql.md): ``hexflow emulate-cluster --demo``
and ``hexflow serve --demo`` with the repository's own config/gateway.yaml and tenants.yaml, then the curl of
docs/text2sql.md. Real processes, as a user runs them; only the ports differ (free ones, not 8001-8004/8080)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from gateway.bench.procs import free_port
from gateway.config import CONFIG_DIR

START_S = 60.0
WORKER = re.compile(r"^(\S+) (http://\S+) (\S+)$")


def _gateway_yaml(tmp: Path, urls: list[str], port: int) -> Path:
    """config/gateway.yaml with the workers' URLs and the port of this test (nothing else changed)."""
    cfg = yaml.safe_load((CONFIG_DIR / "gateway.yaml").read_text(encoding="utf-8"))
    for worker, url in zip(cfg["cluster"]["workers"], urls, strict=True):
        worker["url"] = url
    cfg["listen"]["port"] = port
    shutil.copy(CONFIG_DIR / "tenants.yaml", tmp / "tenants.yaml")
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def test_the_documented_demo_path_answers_text2sql_with_the_gold_rows(tmp_path: Path) -> None:
    hexflow = [sys.executable, "-m", "gateway.cli"]
    cluster_out, cluster_err = tmp_path / "cluster.out", tmp_path / "cluster.err"
    gateway_err = tmp_path / "gateway.err"
    with cluster_out.open("wb") as out, cluster_err.open("wb") as err:
        cluster = subprocess.Popen(
            [*hexflow, "emulate-cluster", "--demo", "--base-port", "0", "--time-scale", "0.05"], stdout=out, stderr=err
        )
    gateway: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + START_S
        while len(urls := [m.group(2) for m in map(WORKER.match, cluster_out.read_text().splitlines()) if m]) < 4:
            assert cluster.poll() is None and time.monotonic() < deadline, cluster_err.read_text()
            time.sleep(0.05)
        assert "answers the demo script" in cluster_err.read_text()
        port = free_port()
        config = _gateway_yaml(tmp_path, urls, port)
        with gateway_err.open("wb") as err:
            gateway = subprocess.Popen(
                [*hexflow, "serve", "--demo", "--config", str(config), "--time-scale", "0.05"],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2.0)
                if ready.status_code == 200 and ready.json().get("healthy_workers") == 4:
                    break
            except httpx.HTTPError:
                pass
            assert gateway.poll() is None and time.monotonic() < deadline, gateway_err.read_text()
            time.sleep(0.1)
        # docs/text2sql.md's request, as curl sends it.
        r = httpx.post(
            f"{url}/v1/text2sql",
            headers={"Authorization": "Bearer demo-batch-key", "content-type": "application/json"},
            content=b'{"question": "How many customers are there?", "db_id": "demo_retail", "deadline_s": 30}',
            timeout=60.0,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["rows"] == [[300]], body
        # What it started, in one block: policy, workers, tenants, databases, URL.
        log = gateway_err.read_text()
        assert "policy hexgen" in log and "workers: 4 (a100-0 A100 " in log
        assert "tenants: interactive, batch" in log and f"listening on {url}" in log
        found = re.search(r"databases: demo_retail \((\S+)\)", log)
        assert found is not None, log
        demo_dir = Path(found.group(1)).parent
        assert demo_dir.is_dir()
        assert _stop(gateway) == 0
        assert not demo_dir.exists(), "the demo database's temporary folder goes with the gateway"
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(cluster)

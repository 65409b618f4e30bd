"""A real Prometheus server scrapes a live gateway and evaluates ``deploy/prometheus/rules/hexflow.yml``.

Emulated workers and the gateway run in the test's event loop; ``prometheus`` (the Debian package) runs as
a subprocess scraping the gateway's ``/metrics`` every second with the repo's rules file loaded. A short
workload is replayed in rounds spread over several scrapes (``increase``/``rate`` need two samples of a
series in the window), then the recording rules are queried through the HTTP API and checked against
values the workload determines. Skipped without ``prometheus`` unless ``HEXFLOW_REQUIRE_PROMTOOL=1``.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.emulator_process import free_port
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, chain, emulators, gateway_server, write_config

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules" / "hexflow.yml"
GPUS = ["A100", "L40S"]
KIND = "step"
ROUNDS = 4
INTERACTIVE_PER_ROUND = 5
BATCH_PER_ROUND = 3


def _prometheus() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("HEXFLOW_REQUIRE_PROMTOOL") == "1":
            pytest.fail("prometheus is not on PATH and HEXFLOW_REQUIRE_PROMTOOL=1")
        pytest.skip("prometheus is not on PATH (apt-get install -y prometheus)")
    return binary


def _recording_rules() -> dict[str, str]:
    """record name -> expr for every recording rule in the rules file."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _rule(names: dict[str, str], prefix: str, suffix: str) -> str:
    """The one recording rule named ``prefix...suffix`` (names come from the file, not from this test)."""
    hits = [n for n in names if n.startswith(prefix) and n.endswith(suffix)]
    assert len(hits) == 1, (prefix, suffix, sorted(names))
    return hits[0]


def _write_prometheus_config(tmp: Path, target: str) -> Path:
    rules = tmp / "hexflow.yml"
    rules.write_text(RULES.read_text())
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "hexflow-gateway", "static_configs": [{"targets": [target]}]}],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _query(client: httpx.AsyncClient, expr: str) -> list[dict[str, Any]]:
    r = await client.get("/api/v1/query", params={"query": expr})
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _values(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in result}


async def _wait_for(
    client: httpx.AsyncClient, expr: str, label: str, ok: Any, log: Path, timeout_s: float = 30.0
) -> dict[str, float]:
    """Poll ``expr`` until ``ok(values by label)`` holds; fail with the last values and Prometheus' log."""
    deadline = time.monotonic() + timeout_s
    values: dict[str, float] = {}
    while time.monotonic() < deadline:
        values = _values(await _query(client, expr), label)
        if ok(values):
            return values
        await asyncio.sleep(0.5)
    pytest.fail(f"{expr}: {values} after {timeout_s}s\nprometheus log:\n{log.read_text()[-3000:]}")


async def _workload(gw: str) -> tuple[int, int]:
    """Run the rounds of workflows; return how many interactive and batch workflows met their deadline."""
    met = {INTERACTIVE_KEY: 0, BATCH_KEY: 0}

    async def one(client: httpx.AsyncClient, key: str, deadline_s: float) -> None:
        r = await client.post(
            "/v1/workflows",
            json={"calls": chain(2, width=2, kind=KIND), "deadline_s": deadline_s},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok", body
        met[key] += bool(body["deadline_met"])

    async with httpx.AsyncClient(base_url=gw, timeout=60) as client:
        for _ in range(ROUNDS):
            await asyncio.gather(
                *(one(client, INTERACTIVE_KEY, 120) for _ in range(INTERACTIVE_PER_ROUND)),
                *(one(client, BATCH_KEY, 600) for _ in range(BATCH_PER_ROUND)),
            )
            await asyncio.sleep(1.2)  # at least one scrape between rounds
    return met[INTERACTIVE_KEY], met[BATCH_KEY]


async def test_recording_rules_over_a_live_gateway(tmp_path: Path) -> None:
    binary = _prometheus()
    names = _recording_rules()
    attainment = _rule(names, "tenant:hexflow_slo_attainment", "ratio_rate5m")
    stage_p95 = _rule(names, "kind:hexflow_stage_latency_seconds", "p95_5m")
    queue_p95 = _rule(names, "worker:hexflow_queue_wait_seconds", "p95_5m")
    dispatch_by_worker = _rule(names, "worker:hexflow_dispatch", "rate5m")
    dispatch_by_kind = _rule(names, "kind:hexflow_dispatch", "rate5m")
    finished = _rule(names, "tenant:hexflow_workflows_finished", "rate5m")
    errors = _rule(names, "tenant:hexflow_slo_errors", "ratio_rate5m")

    async with emulators(GPUS, time_scale=0.01) as urls:
        config = write_config(tmp_path, urls, GPUS, time_scale=0.01)
        async with gateway_server(config) as (gw, _):
            target = gw.removeprefix("http://")
            prom_port = free_port()
            log = tmp_path / "prometheus.log"
            with log.open("w") as log_f:
                proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={_write_prometheus_config(tmp_path, target)}",
                        f"--storage.tsdb.path={tmp_path / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                        "--log.level=warn",
                    ],
                    stdout=log_f,
                    stderr=subprocess.STDOUT,
                )
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{prom_port}", timeout=5) as prom:
                    deadline = time.monotonic() + 20
                    while True:
                        assert proc.poll() is None, f"prometheus exited:\n{log.read_text()}"
                        try:
                            if (await prom.get("/-/ready")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        assert time.monotonic() < deadline, f"prometheus not ready:\n{log.read_text()}"
                        await asyncio.sleep(0.2)

                    # Every rule in the file loaded and evaluates without error.
                    groups = (await prom.get("/api/v1/rules")).json()["data"]["groups"]
                    loaded = [r for g in groups for r in g["rules"]]
                    assert {r["name"] for r in loaded if r["type"] == "recording"} == set(names)
                    # The gateway is scraped (a first sample before any workflow runs).
                    scraped = 'up{job="hexflow-gateway"}'
                    await _wait_for(prom, scraped, "job", lambda v: v == {"hexflow-gateway": 1}, log)

                    met_i, met_b = await _workload(gw)
                    assert met_i == ROUNDS * INTERACTIVE_PER_ROUND and met_b == ROUNDS * BATCH_PER_ROUND

                    def both(v: dict[str, float]) -> bool:
                        return {"interactive", "batch"} <= v.keys()

                    # Every workflow met its deadline: attainment is exactly 1, the error ratio exactly 0.
                    att = await _wait_for(prom, attainment, "tenant", both, log)
                    assert att["interactive"] == 1.0 and att["batch"] == 1.0, att
                    err = await _wait_for(prom, errors, "tenant", lambda v: "interactive" in v, log)
                    assert err["interactive"] == 0.0, err

                    fin = await _wait_for(prom, finished, "tenant", both, log)
                    assert fin["interactive"] > 0 and fin["batch"] > 0, fin

                    def positive(v: dict[str, float], key: str) -> bool:
                        return key in v and math.isfinite(v[key]) and v[key] > 0

                    p95 = await _wait_for(prom, stage_p95, "kind", lambda v: positive(v, KIND), log)
                    assert set(p95) == {KIND}, p95

                    workers = {f"{g.lower()}-{i}" for i, g in enumerate(GPUS)}
                    by_worker = await _wait_for(prom, dispatch_by_worker, "worker", bool, log)
                    assert set(by_worker) <= workers and sum(by_worker.values()) > 0, by_worker
                    by_kind = await _wait_for(prom, dispatch_by_kind, "kind", lambda v: positive(v, KIND), log)
                    assert set(by_kind) == {KIND}, by_kind

                    qw = await _wait_for(prom, queue_p95, "worker", bool, log)
                    assert set(qw) <= workers, qw
                    assert all(math.isfinite(x) and x >= 0 for x in qw.values()), qw

                    # Rule evaluation is healthy, all workers are up and no worker-down alert is pending.
                    groups = (await prom.get("/api/v1/rules")).json()["data"]["groups"]
                    bad = {r["name"]: r.get("lastError") for g in groups for r in g["rules"] if r["health"] == "err"}
                    assert not bad, bad
                    up = _values(await _query(prom, "hexflow_worker_up"), "worker")
                    assert up == dict.fromkeys(workers, 1.0), up
                    assert await _query(prom, 'ALERTS{alertname=~"HexflowWorkerDown|HexflowNoHealthyWorker"}') == []
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

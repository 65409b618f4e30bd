"""A real Prometheus server scrapes a live gateway and evaluates ``deploy/prometheus/rules/hexflow.yml``.

Emulated workers and the gateway run in the test's event loop; ``prometheus`` (the Debian package) runs as
a subprocess scraping the gateway's ``/metrics`` every second with the repo's rules file loaded. A short
workload is replayed in rounds spread over several scrapes (``increase``/``rate`` need two samples of a
series in the window), then the recording rules are queried through the HTTP API and checked against
values the workload determines. Skipped without ``prometheus`` unless ``HEXFLOW_REQUIRE_PROMTOOL=1``.

Three tenants: ``interactive`` and ``batch`` meet every deadline; ``tight`` (a tenant of this test with a
1 ms minimum deadline) sends, each round, workflows with a generous deadline and workflows with a deadline
below the emulated workers' latency floor, so its met and missed counts are known exactly. Every counter
starts at zero before the first workflow and all series of the target share their scrape timestamps, so
``increase()`` extrapolates met and missed by the same factor and the SLO ratios come out exact: the checks
compare them with the workload's fractions, not within a tolerance. The burn-rate alerts are loaded as the
file has them (``for`` unchanged), so within the test they are ``pending`` (``firing`` only if the run is
slower than ``for``); that they turn to ``firing`` after ``for`` is checked by the promtool rule tests.
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

from gateway.config import load_gpu_catalog
from gateway.config.tenants import hash_key
from gateway.live.metrics import OUTCOMES
from tests.emulator_process import free_port
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, chain, emulators, gateway_server, write_config

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules" / "hexflow.yml"
GPUS = ["A100", "L40S"]
TIME_SCALE = 0.01
KIND = "step"
STAGES = 2
ROUNDS = 4
INTERACTIVE_PER_ROUND = 5
BATCH_PER_ROUND = 3
# Tenant "tight": per round, TIGHT_MET_PER_ROUND workflows that meet a generous deadline and
# TIGHT_MISSED_PER_ROUND that cannot meet MISS_DEADLINE_S (attainment 1/5, error ratio 4/5: above the
# page alert's 72% and the ticket alert's 30%).
TIGHT = "tight"
TIGHT_KEY = "prometheus-test-tight-key"
TIGHT_MET_PER_ROUND = 1
TIGHT_MISSED_PER_ROUND = 4
MET_DEADLINE_S = 60.0
MISS_DEADLINE_S = 0.001
"""Wall seconds. Every emulated call sleeps at least its lone latency on its GPU x TIME_SCALE (about 3 ms on
the A100, 5 ms on the L40S for the chain's 200-token prompt and 10 output tokens) and a workflow is STAGES
calls in sequence: about 6x the deadline at least (checked in ``test_miss_deadline_is_below_the_latency_floor``)."""

MET_T = ROUNDS * TIGHT_MET_PER_ROUND
MISSED_T = ROUNDS * TIGHT_MISSED_PER_ROUND
EXPECTED = {
    ("interactive", "met"): ROUNDS * INTERACTIVE_PER_ROUND,
    ("batch", "met"): ROUNDS * BATCH_PER_ROUND,
    (TIGHT, "met"): MET_T,
    (TIGHT, "missed"): MISSED_T,
}
"""(tenant, outcome) -> workflows; every other outcome of the three tenants stays at zero."""


def _prometheus() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("HEXFLOW_REQUIRE_PROMTOOL") == "1":
            pytest.fail("prometheus is not on PATH and HEXFLOW_REQUIRE_PROMTOOL=1")
        pytest.skip("prometheus is not on PATH (apt-get install -y prometheus)")
    return binary


def _rule_docs() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _recording_rules() -> dict[str, str]:
    """record name -> expr for every recording rule in the rules file."""
    return {r["record"]: r["expr"] for r in _rule_docs() if "record" in r}


def _burn_rate_alerts() -> set[str]:
    """The alerts built on the SLO and goodput error ratio recording rules (the burn-rate alerts; without
    rejected, failed or invalid answers in the workload, both ratios are the same)."""
    return {
        r["alert"]
        for r in _rule_docs()
        if "alert" in r and ("tenant:hexflow_slo_errors:" in r["expr"] or "tenant:hexflow_goodput_errors:" in r["expr"])
    }


def _rule(names: dict[str, str], prefix: str, suffix: str) -> str:
    """The one recording rule named ``prefix...suffix`` (names come from the file, not from this test)."""
    hits = [n for n in names if n.startswith(prefix) and n.endswith(suffix)]
    assert len(hits) == 1, (prefix, suffix, sorted(names))
    return hits[0]


def _write_tenants(tmp: Path) -> None:
    """The repo's demo tenants plus ``tight``, whose range admits a deadline no workflow can meet."""
    doc = yaml.safe_load((REPO / "config" / "tenants.yaml").read_text())
    doc["tenants"].append(
        {
            "name": TIGHT,
            "api_key_sha256": [hash_key(TIGHT_KEY)],
            "default_deadline_s": MET_DEADLINE_S,
            "min_deadline_s": 0.001,
            "max_deadline_s": 600,
            "priority_weight": 1,
            "max_concurrent_workflows": 64,
            # Admitted by its concurrency bound only: its missed deadlines are what the rules must count
            # (deadline-based admission would refuse them with 429 before they run).
            "predictive_admission": False,
        }
    )
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(doc))


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


async def _settled(client: httpx.AsyncClient, record: str, after: float, log: Path) -> dict[str, float]:
    """A recording rule's values by tenant, from evaluations that started after wall time ``after``.

    A rule group evaluates at its scheduled timestamp, so a sample stamped after ``after`` was computed
    from everything Prometheus had stored by then.
    """
    await _wait_for(client, f"timestamp({record})", "tenant", lambda v: bool(v) and min(v.values()) > after, log)
    return _values(await _query(client, record), "tenant")


async def _workload(gw: str) -> dict[tuple[str, str], int]:
    """Run the rounds of workflows; return the (tenant, met|missed) counts the gateway answered."""
    counts: dict[tuple[str, str], int] = {}

    async def one(client: httpx.AsyncClient, key: str, deadline_s: float) -> None:
        r = await client.post(
            "/v1/workflows",
            json={"calls": chain(STAGES, width=2, kind=KIND), "deadline_s": deadline_s},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok", body
        assert body["deadline_met"] == (body["latency_s"] <= deadline_s), body
        k = (body["tenant"], "met" if body["deadline_met"] else "missed")
        counts[k] = counts.get(k, 0) + 1

    async with httpx.AsyncClient(base_url=gw, timeout=60) as client:
        for _ in range(ROUNDS):
            await asyncio.gather(
                *(one(client, INTERACTIVE_KEY, 120) for _ in range(INTERACTIVE_PER_ROUND)),
                *(one(client, BATCH_KEY, 600) for _ in range(BATCH_PER_ROUND)),
                *(one(client, TIGHT_KEY, MET_DEADLINE_S) for _ in range(TIGHT_MET_PER_ROUND)),
                *(one(client, TIGHT_KEY, MISS_DEADLINE_S) for _ in range(TIGHT_MISSED_PER_ROUND)),
            )
            await asyncio.sleep(1.2)  # at least one scrape between rounds
    return counts


async def _check_slo(prom: httpx.AsyncClient, names: dict[str, str], log: Path) -> None:
    """The SLO rules and the burn-rate alerts over the finished workload (``EXPECTED``)."""
    attainment = [_rule(names, "tenant:hexflow_slo_attainment", w) for w in ("ratio_rate5m", "ratio_rate1h")]
    error_rules = sorted(n for n in names if n.startswith("tenant:hexflow_slo_errors:"))
    finished = _rule(names, "tenant:hexflow_workflows_finished", "rate5m")
    by_outcome = _rule(names, "tenant_outcome:hexflow_workflows", "rate5m")
    burn_alerts = _burn_rate_alerts()
    assert error_rules and burn_alerts, (error_rules, burn_alerts)
    tenants = ("interactive", "batch", TIGHT)

    # Prometheus holds the final counts (met, missed, and no failed or rejected workflow) ...
    want = {(t, o): float(EXPECTED.get((t, o), 0)) for t in tenants for o in OUTCOMES}
    got: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + 30
    while got != want:
        assert time.monotonic() < deadline, (got, want)
        await asyncio.sleep(0.5)
        got = {
            (s["metric"]["tenant"], s["metric"]["outcome"]): float(s["value"][1])
            for s in await _query(prom, "hexflow_workflows_total")
        }
    # ... so every rule evaluation from now on sees the whole workload.
    stored = time.time()

    # Attainment = met / (met + missed): exactly 1 for the tenants that met every deadline, exactly the
    # workload's fraction for "tight", over 5m and 1h alike; the gateway's own gauge agrees.
    att_t = MET_T / (MET_T + MISSED_T)
    err_t = MISSED_T / (MET_T + MISSED_T)
    for record in attainment:
        att = await _settled(prom, record, stored, log)
        assert att == {"interactive": 1.0, "batch": 1.0, TIGHT: pytest.approx(att_t, rel=1e-12)}, (record, att)
    gauge = _values(await _query(prom, "hexflow_slo_attainment_ratio"), "tenant")
    assert gauge == {"interactive": 1.0, "batch": 1.0, TIGHT: att_t}, gauge
    # Error ratio = (missed + failed) / (met + missed + failed), every window.
    for record in error_rules:
        err = await _settled(prom, record, stored, log)
        assert err == {"interactive": 0.0, "batch": 0.0, TIGHT: pytest.approx(err_t, rel=1e-12)}, (record, err)

    # Goodput: the workload has no rejected, failed or invalid answers, so its goodput share is the attainment
    # and its goodput error ratio the SLO's, every window; goodput per second is the met rate.
    goodput_errors = sorted(n for n in names if n.startswith("tenant:hexflow_goodput_errors:"))
    assert goodput_errors
    for record in goodput_errors:
        err = await _settled(prom, record, stored, log)
        assert err == {"interactive": 0.0, "batch": 0.0, TIGHT: pytest.approx(err_t, rel=1e-12)}, (record, err)
    share = await _settled(prom, _rule(names, "tenant:hexflow_goodput:", "ratio_rate5m"), stored, log)
    assert share == {"interactive": 1.0, "batch": 1.0, TIGHT: pytest.approx(att_t, rel=1e-12)}, share
    goodput = await _settled(prom, _rule(names, "tenant:hexflow_goodput_workflows", "rate5m"), stored, log)
    assert set(goodput) == set(tenants) and min(goodput.values()) > 0, goodput

    # Rates of the series of one target are extrapolated alike: their ratios are the workload's.
    fin = await _settled(prom, finished, stored, log)
    assert set(fin) == set(tenants) and min(fin.values()) > 0, fin
    per_tenant = {t: sum(n for (u, _), n in EXPECTED.items() if u == t) for t in tenants}
    assert fin[TIGHT] / fin["interactive"] == pytest.approx(per_tenant[TIGHT] / per_tenant["interactive"], rel=1e-12)
    await _settled(prom, by_outcome, stored, log)
    rates = {
        s["metric"]["outcome"]: float(s["value"][1]) for s in await _query(prom, f'{by_outcome}{{tenant="{TIGHT}"}}')
    }
    assert rates["missed"] / rates["met"] == pytest.approx(MISSED_T / MET_T, rel=1e-12), rates
    assert rates["failed"] == 0.0 and rates["rejected"] == 0.0, rates

    # The burn-rate alerts (as in the file, "for" unchanged) are pending, or firing on a run slower than
    # "for", for "tight" and for no other tenant; their value is the 5m/1h error ratio.
    want_alerts = {(name, TIGHT) for name in burn_alerts}

    def settled(alerts: dict[tuple[str, str], dict[str, Any]]) -> bool:
        return set(alerts) >= want_alerts and all(float(a["value"]) == pytest.approx(err_t) for a in alerts.values())

    alerts: dict[tuple[str, str], dict[str, Any]] = {}
    deadline = time.monotonic() + 20
    while not settled(alerts) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        alerts = {
            (a["labels"]["alertname"], a["labels"].get("tenant", "")): a
            for a in (await prom.get("/api/v1/alerts")).json()["data"]["alerts"]
            if a["labels"]["alertname"] in burn_alerts
        }
    assert set(alerts) == want_alerts, alerts
    for a in alerts.values():
        assert a["state"] in ("pending", "firing"), a
        assert float(a["value"]) == pytest.approx(err_t, rel=1e-12), a
        assert f"Tenant {TIGHT} " in a["annotations"]["summary"], a
    # The ALERTS series say the same.
    names_re = "|".join(sorted(burn_alerts))
    await _wait_for(prom, f'ALERTS{{tenant="{TIGHT}"}}', "alertname", lambda v: set(v) == burn_alerts, log)
    assert await _query(prom, f'ALERTS{{alertname=~"{names_re}", tenant!="{TIGHT}"}}') == []
    print(f"burn-rate alerts for {TIGHT}: " + ", ".join(f"{n} {a['state']}" for (n, _), a in sorted(alerts.items())))


def test_miss_deadline_is_below_the_latency_floor() -> None:
    """The emulated workers cannot finish a STAGES-call chain within MISS_DEADLINE_S (with a 4x margin)."""
    catalog = load_gpu_catalog()
    call = chain(1)[0]
    lone = min(
        catalog.profile(g, "llama-3.1-70b").single_latency(call["prompt_tokens"], call["max_tokens"]) for g in GPUS
    )
    floor_s = STAGES * TIME_SCALE * lone
    assert floor_s >= 4 * MISS_DEADLINE_S, floor_s


async def test_recording_rules_over_a_live_gateway(tmp_path: Path) -> None:
    binary = _prometheus()
    names = _recording_rules()
    stage_p95 = _rule(names, "kind:hexflow_stage_latency_seconds", "p95_5m")
    queue_p95 = _rule(names, "worker:hexflow_queue_wait_seconds", "p95_5m")
    dispatch_by_worker = _rule(names, "worker:hexflow_dispatch", "rate5m")
    dispatch_by_kind = _rule(names, "kind:hexflow_dispatch", "rate5m")

    async with emulators(GPUS, time_scale=TIME_SCALE) as urls:
        _write_tenants(tmp_path)
        config = write_config(tmp_path, urls, GPUS, time_scale=TIME_SCALE)
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
                    # The gateway is scraped (a first sample, every counter at zero, before any workflow runs).
                    scraped = 'up{job="hexflow-gateway"}'
                    await _wait_for(prom, scraped, "job", lambda v: v == {"hexflow-gateway": 1}, log)

                    counts = await _workload(gw)
                    assert counts == EXPECTED, counts
                    await _check_slo(prom, names, log)

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

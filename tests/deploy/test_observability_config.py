"""Prometheus rules and Grafana dashboards in deploy/ against the metrics the code really exports.

(a) every metric a PromQL expression names (rules, dashboard targets, template variables) is one the
gateway or an emulated vLLM worker exports, or a recording rule; (b) ``promtool check`` and
``promtool test rules`` pass (skipped without ``promtool`` unless ``HEXFLOW_REQUIRE_PROMTOOL=1``);
(c) the dashboards' JSON is well formed for Grafana provisioning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.live.metrics import GatewayMetrics
from gateway.profiling.promparse import parse_worker_metrics
from tests.live.harness import emulator_app

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "hexflow.yml"
PROM_CONFIG = PROM / "prometheus.yml"
PROM_TESTS = PROM / "tests" / "hexflow_test.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DS_UID = "prometheus"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# PromQL words that look like identifiers but are not metric names.
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
}
_IDENT = re.compile(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords and labels left out)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\{[^}]*\}", "{}", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "[]", s)  # ranges and subqueries
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    s = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:e[+-]?\d+)?[smhdwy]*\b", " ", s, flags=re.IGNORECASE)  # numbers, durations
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(1)
        rest = s[m.end() :].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def test_metric_names_extractor() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, kind) (rate(hexflow_stage_latency_seconds_bucket{kind=~"a|b"}[5m])))'
        ' / ignoring(x) vllm:num_requests_running offset 5m > 14.4 * 0.05 and on() up_thing{worker=~"$worker"}'
        " unless sum without (job) (deriv(q[1h:5m])) > bool 1e3"
    )
    assert metric_names(expr) == {
        "hexflow_stage_latency_seconds_bucket",
        "vllm:num_requests_running",
        "up_thing",
        "q",
    }


# --- what the code exports ------------------------------------------------------------------------


def _sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


@cache
def emulator_metrics_text() -> str:
    app = emulator_app("A100", time_scale=1.0, model="m")
    metrics = app.state.emulator.metrics
    for hist in (metrics.e2e, metrics.ttft, metrics.queue):  # labelled histograms: no samples until observed
        hist.labels(**metrics.labels).observe(1.0)
    return generate_latest(metrics.registry).decode()


@cache
def gateway_metric_names() -> frozenset[str]:
    m = GatewayMetrics(["w"], ["t"])
    m.for_worker(m.dispatches, "w", "sql").inc()
    m.for_worker(m.queue_wait_h, "w").observe(0.2)
    m.call_done("w", "sql", 1.5, 1.2, 1.0)
    m.for_worker(m.failures, "w", "worker_error").inc()
    m.for_worker(m.retries, "w").inc()
    m.for_worker(m.ejections, "w").inc()
    m.for_worker(m.up, "w").set(1)
    m.for_worker(m.draining, "w").set(0)
    m.for_worker(m.scrape_failures, "w").inc()
    m.scraped("w", parse_worker_metrics(emulator_metrics_text()))
    m.workflow_done("t", 3.0, "met")
    m.workflow_done("t", 9.0, "missed")
    m.alpha.set(0.5)
    m.tuning_runs.labels(result="applied").inc()
    m.tenant_reloads.labels(result="failed").inc()
    m.parked.set(0)
    m.active.set(1)
    m.discovery_pods.labels(state="ready").set(2)
    m.discovery_errors.inc()
    m.for_worker(m.profile_refits, "w", "applied").inc()
    m.profile_constants("w", {"token_s": 0.01})
    names = _sample_names(m.render().decode())
    # Every metric of docs/metrics.md's table has samples (else the calls above missed one).
    table = re.findall(r"^\| (hexflow_\w+) \|", METRICS_DOC.read_text(), flags=re.MULTILINE)
    assert len(table) >= 20
    missing = [n for n in table if n not in names and f"{n}_bucket" not in names]
    assert not missing, missing
    return frozenset(names)


@cache
def rules_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return doc


def _rules() -> list[dict[str, Any]]:
    return [r for g in rules_doc()["groups"] for r in g["rules"]]


@cache
def known_names() -> frozenset[str]:
    recorded = {r["record"] for r in _rules() if "record" in r}
    return gateway_metric_names() | _sample_names(emulator_metrics_text()) | recorded


def test_exported_names_include_what_the_dashboards_need() -> None:
    names = known_names()
    for n in (
        "hexflow_workflows_total",
        "hexflow_workflow_outcomes_total",
        "hexflow_goodput_workflows_total",
        "hexflow_stage_latency_seconds_bucket",
        "hexflow_estimate_ratio_bucket",
        "hexflow_worker_up",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:generation_tokens_total",
    ):
        assert n in names


def test_rule_expressions_name_only_exported_metrics() -> None:
    names = known_names()
    assert _rules()
    for rule in _rules():
        used = metric_names(rule["expr"])
        assert used, rule
        unknown = used - names
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {sorted(unknown)}"


def test_rule_groups_and_alerts() -> None:
    alerts = {r["alert"]: r for r in _rules() if "alert" in r}
    for name in (
        "HexflowSLOBurnRatePage",
        "HexflowSLOBurnRateTicket",
        "HexflowWorkerDown",
        "HexflowQueueGrowing",
        "HexflowNoHealthyWorker",
        "HexflowNoLeader",
        "HexflowSeveralLeaders",
        "HexflowTenantReloadFailing",
        "HexflowDiscoveryFailing",
        "HexflowDiscoveryInvalidPods",
        "HexflowGoodputBurnRatePage",
        "HexflowGoodputBurnRateTicket",
        "HexflowGoodputZero",
    ):
        assert name in alerts
        assert alerts[name]["labels"]["severity"] in ("page", "ticket")
        assert alerts[name]["annotations"]["summary"]
    records = [r["record"] for r in _rules() if "record" in r]
    assert len(records) == len(set(records))
    for window in ("5m", "30m", "1h", "6h"):
        assert f"tenant:hexflow_slo_errors:ratio_rate{window}" in records
        assert f"tenant:hexflow_goodput_errors:ratio_rate{window}" in records
    assert "tenant:hexflow_goodput_workflows:rate5m" in records


# --- dashboards ------------------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    dash: dict[str, Any] = json.loads(path.read_text())
    return dash


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows
    return [p for p in out if p.get("type") != "row"]


def test_dashboard_files() -> None:
    assert {p.name for p in DASHBOARDS} == {"hexflow-overview.json", "hexflow-workers.json", "hexflow-tenants.json"}
    uids = [_load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_structure(path: Path) -> None:
    dash = _load(path)
    assert dash["title"] and dash["uid"] == path.stem
    assert 36 <= dash["schemaVersion"] <= 41
    panels = _panels(dash)
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
    declared = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    for v in dash.get("templating", {}).get("list", []):
        assert v.get("datasource", {}).get("uid") == DS_UID
    for p in panels:
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["title"]
        assert set(p["gridPos"]) >= {"x", "y", "w", "h"}
        assert p.get("datasource", {}).get("uid", DS_UID) == DS_UID
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t["datasource"] == {"type": "prometheus", "uid": DS_UID}, p["title"]
            used_vars = set(re.findall(r"\$(\w+)", t["expr"])) - {v for v in declared} - {"__rate_interval"}
            assert not {v for v in used_vars if not v.startswith("__")}, f"{p['title']}: undeclared {used_vars}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_expressions_name_only_exported_metrics(path: Path) -> None:
    names = known_names()
    dash = _load(path)
    for p in _panels(dash):
        for t in p["targets"]:
            used = metric_names(t["expr"])
            assert used, t["expr"]
            unknown = used - names
            assert not unknown, f"{path.name} / {p['title']}: unknown metrics {sorted(unknown)}"
    for v in dash.get("templating", {}).get("list", []):
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q.strip())
        assert m, q
        assert metric_names(m.group(1)) <= names, q


def test_workers_dashboard_shows_vllm_series_beside_gateway_ones() -> None:
    dash = _load(GRAFANA / "dashboards" / "hexflow-workers.json")
    exprs = " ".join(t["expr"] for p in _panels(dash) for t in p["targets"])
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert n in exprs
    assert "hexflow_estimate_ratio_bucket" in exprs
    assert any(v["name"] == "worker" for v in dash["templating"]["list"])


def test_grafana_provisioning() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["uid"] == DS_UID and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "hexflow.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_config_targets() -> None:
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    assert cfg["global"]["scrape_interval"] == "5s"
    assert cfg["rule_files"] == ["rules/*.yml"]
    targets = {t for job in cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {
        "gateway:8080",
        "worker-a100-0:8000",
        "worker-a100-1:8000",
        "worker-a6000-0:8000",
        "worker-l40s-0:8000",
    }


# --- promtool --------------------------------------------------------------------------------------


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("HEXFLOW_REQUIRE_PROMTOOL") == "1":
            pytest.fail("promtool is not on PATH and HEXFLOW_REQUIRE_PROMTOOL=1")
        pytest.skip("promtool is not on PATH (apt-get install -y prometheus)")
    return exe


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", str(RULES)),
        ("check", "config", str(PROM_CONFIG)),
        ("test", "rules", str(PROM_TESTS)),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_promtool(args: tuple[str, ...]) -> None:
    proc = subprocess.run([_promtool(), *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

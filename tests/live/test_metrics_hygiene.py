"""The exposition a scraper gets: no ``*_created`` series, the process and runtime collectors, ``_ratio`` on
gauges that hold fractions, and every outcome/reason/result-labelled counter created at 0."""

from __future__ import annotations

from typing import Any

from gateway.live.metrics import (
    CALL_FAILURE_REASONS,
    DEMOTED_WHEN,
    OUTCOMES,
    REJECT_REASONS,
    RELOAD_RESULTS,
    TUNING_RESULTS,
    GatewayMetrics,
)
from gateway.profiling.promparse import WorkerMetrics, parse_families


def _families() -> dict[str, list[tuple[dict[str, str], float]]]:
    m = GatewayMetrics(["w0", "w1"], ["t"])
    m.add_worker("w2")
    return parse_families(m.render().decode())


def test_no_created_series_are_exported() -> None:
    names = set(_families())
    assert not [n for n in names if n.endswith("_created")]


def test_process_and_python_collectors_are_exported() -> None:
    names = set(_families())
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert name in names, name
    assert any(n.startswith("python_gc_") for n in names)


def test_gauges_holding_fractions_end_in_ratio() -> None:
    fam = _families()
    assert "hexflow_slo_attainment" not in fam and "hexflow_worker_kv_cache_usage" not in fam
    m = GatewayMetrics(["w"], ["t"])
    m.workflow_done("t", 1.0, "met")
    nothing: dict[str, Any] = dict.fromkeys(WorkerMetrics.__dataclass_fields__)
    m.scraped("w", WorkerMetrics(**{**nothing, "kv_cache_usage": 0.25}))
    fam = parse_families(m.render().decode())
    assert fam["hexflow_slo_attainment_ratio"] == [({"tenant": "t"}, 1.0)]
    assert fam["hexflow_worker_kv_cache_usage_ratio"] == [({"worker": "w"}, 0.25)]


def test_labelled_counters_start_at_zero_with_every_value() -> None:
    fam = _families()

    def values(name: str, label: str, **fixed: str) -> dict[str, float]:
        rows = fam[name]
        return {lab[label]: v for lab, v in rows if all(lab.get(k) == x for k, x in fixed.items())}

    assert values("hexflow_workflows_total", "outcome", tenant="t") == dict.fromkeys(OUTCOMES, 0.0)
    assert values("hexflow_admission_rejections_total", "reason", tenant="t") == dict.fromkeys(REJECT_REASONS, 0.0)
    assert values("hexflow_workflows_demoted_total", "when", tenant="t") == dict.fromkeys(DEMOTED_WHEN, 0.0)
    assert values("hexflow_tuning_runs_total", "result") == dict.fromkeys(TUNING_RESULTS, 0.0)
    assert values("hexflow_tenant_reloads_total", "result") == dict.fromkeys(RELOAD_RESULTS, 0.0)
    for w in ("w0", "w1", "w2"):  # configured, and joined later (discovery)
        assert values("hexflow_call_failures_total", "reason", worker=w) == dict.fromkeys(CALL_FAILURE_REASONS, 0.0)
        for name in ("hexflow_call_retries_total", "hexflow_worker_ejections_total", "hexflow_scrape_failures_total"):
            assert values(name, "worker") and values(name, "worker").get(w) == 0.0, (name, w)

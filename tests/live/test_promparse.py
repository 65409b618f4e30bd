"""The vLLM /metrics parser: real-looking vLLM text, several engines and models, old names, the emulator."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.profiling.promparse import MetricsParseError, WorkerMetrics, parse_families, parse_worker_metrics
from tests.live.harness import emulator_app

Series = tuple[str, str, float, float, float]  # engine, model_name, running, waiting, kv usage


def vllm_text(*series: Series) -> str:
    """``/metrics`` as vLLM 0.32 prints it (prometheus_client's format), one set of series per engine."""
    out = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        'python_gc_objects_collected_total{generation="0"} 1234.0',
    ]

    def family(name: str, kind: str, lines: list[str]) -> None:
        out.extend([f"# HELP {name} Help of {name}.", f"# TYPE {name} {kind}", *lines])

    labs = [(f'engine="{e}",model_name="{m}"', r, w, kv) for e, m, r, w, kv in series]
    family("vllm:num_requests_running", "gauge", [f"vllm:num_requests_running{{{lab}}} {r}" for lab, r, _, _ in labs])
    family("vllm:num_requests_waiting", "gauge", [f"vllm:num_requests_waiting{{{lab}}} {w}" for lab, _, w, _ in labs])
    family("vllm:kv_cache_usage_perc", "gauge", [f"vllm:kv_cache_usage_perc{{{lab}}} {kv}" for lab, _, _, kv in labs])
    for name, value in (("num_preemptions", 1.0), ("prompt_tokens", 12000.0), ("generation_tokens", 700.0)):
        family(f"vllm:{name}_total", "counter", [f"vllm:{name}_total{{{lab[0]}}} {value}" for lab in labs])
        family(f"vllm:{name}_created", "gauge", [f"vllm:{name}_created{{{lab[0]}}} 1.7e+09" for lab in labs])
    reasons = (("stop", 4.0), ("length", 6.0), ("abort", 0.0))
    success = [f'vllm:request_success_total{{{lab[0]},finished_reason="{r}"}} {v}' for lab in labs for r, v in reasons]
    family("vllm:request_success_total", "counter", success)
    created = [
        f'vllm:request_success_created{{{lab[0]},finished_reason="{r}"}} 1.7e+09' for lab in labs for r, _ in reasons
    ]
    family("vllm:request_success_created", "gauge", created)
    e2e = "vllm:e2e_request_latency_seconds"
    hist: list[str] = []
    for lab in labs:
        hist += [f'{e2e}_bucket{{{lab[0]},le="{le}"}} {n}' for le, n in (("1.0", 2.0), ("10.0", 9.0), ("+Inf", 10.0))]
        hist += [f"{e2e}_count{{{lab[0]}}} 10.0", f"{e2e}_sum{{{lab[0]}}} 42.5"]
    family(e2e, "histogram", hist)
    family(f"{e2e}_created", "gauge", [f"{e2e}_created{{{lab[0]}}} 1.7e+09" for lab in labs])
    return "\n".join(out) + "\n"


ONE_ENGINE = vllm_text(("0", "m", 3, 2, 0.25))


def test_one_engine() -> None:
    m = parse_worker_metrics(ONE_ENGINE)
    assert m == WorkerMetrics(
        running=3.0,
        waiting=2.0,
        kv_cache_usage=0.25,
        prompt_tokens_total=12000.0,
        generation_tokens_total=700.0,
        preemptions_total=1.0,
        request_success_total=10.0,
        e2e_latency_sum=42.5,
        e2e_latency_count=10.0,
    )
    assert parse_worker_metrics(ONE_ENGINE, model="m") == m


def test_two_engines_are_summed_and_kv_usage_averaged() -> None:
    text = vllm_text(("0", "m", 3, 2, 0.25), ("1", "m", 5, 0, 0.75))
    m = parse_worker_metrics(text)
    assert m.running == 8.0 and m.waiting == 2.0
    assert m.kv_cache_usage == pytest.approx(0.5)
    assert m.prompt_tokens_total == 24000.0 and m.generation_tokens_total == 1400.0
    assert m.preemptions_total == 2.0 and m.request_success_total == 20.0
    assert m.e2e_latency_sum == 85.0 and m.e2e_latency_count == 20.0


def test_model_filter() -> None:
    text = vllm_text(("0", "a", 3, 2, 0.2), ("0", "b", 7, 2, 0.6))
    a, b, both = (parse_worker_metrics(text, model=x) for x in ("a", "b", None))
    assert a.running == 3.0 and a.kv_cache_usage == pytest.approx(0.2) and a.request_success_total == 10.0
    assert b.running == 7.0 and b.kv_cache_usage == pytest.approx(0.6)
    assert both.running == 10.0
    # A model the worker does not serve: every metric is absent for it.
    other = parse_worker_metrics(text, model="c")
    assert other == WorkerMetrics(None, None, None, None, None, None, None, None, None)


def test_old_gpu_cache_usage_name() -> None:
    text = ONE_ENGINE.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert "kv_cache_usage_perc" not in text
    assert parse_worker_metrics(text).kv_cache_usage == 0.25


def test_new_name_wins_over_old() -> None:
    text = ONE_ENGINE + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
    assert parse_worker_metrics(text).kv_cache_usage == 0.25


def test_absent_families_are_none() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 1\n'
    m = parse_worker_metrics(text)
    assert m.running == 1.0
    assert m.waiting is None and m.kv_cache_usage is None and m.prompt_tokens_total is None
    assert m.preemptions_total is None and m.request_success_total is None
    assert m.e2e_latency_sum is None and m.e2e_latency_count is None
    assert parse_worker_metrics("") == WorkerMetrics(None, None, None, None, None, None, None, None, None)


def test_declared_family_without_series_is_zero() -> None:
    text = "# HELP vllm:e2e_request_latency_seconds x\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
    text += "# TYPE vllm:request_success counter\n"
    m = parse_worker_metrics(text, model="m")
    assert m.e2e_latency_sum == 0.0 and m.e2e_latency_count == 0.0 and m.request_success_total == 0.0
    assert m.running is None


def test_created_samples_are_ignored() -> None:
    text = (
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{model_name="m"} 5\n'
        'vllm:prompt_tokens_created{model_name="m"} 1.7e9\n'
    )
    assert parse_worker_metrics(text).prompt_tokens_total == 5.0


@pytest.mark.parametrize(
    "text",
    [
        "garbage {{{",
        'vllm:num_requests_running{engine="0" 1\n',
        "vllm:num_requests_running notanumber\n",
        "\x00\n",
        'vllm:num_requests_running{engine="0", ="m"} 1\n',  # the parser raises IndexError here
    ],
)
def test_malformed_text(text: str) -> None:
    with pytest.raises(MetricsParseError, match="malformed metrics text"):
        parse_worker_metrics(text)
    with pytest.raises(MetricsParseError):
        parse_families(text)


def test_parse_families() -> None:
    fam = parse_families(ONE_ENGINE)
    assert fam["vllm:num_requests_running"] == [({"engine": "0", "model_name": "m"}, 3.0)]
    assert fam["python_gc_objects_collected_total"] == [({"generation": "0"}, 1234.0)]
    reasons = {labels["finished_reason"]: v for labels, v in fam["vllm:request_success_total"]}
    assert reasons == {"stop": 4.0, "length": 6.0, "abort": 0.0}
    assert [labels["le"] for labels, _ in fam["vllm:e2e_request_latency_seconds_bucket"]] == ["1.0", "10.0", "+Inf"]
    assert "vllm:prompt_tokens_created" in fam  # the raw view keeps everything


# -------------------------------------------------------------------------------------------------- the emulator


def test_emulator_registry_output() -> None:
    app = emulator_app("A100", time_scale=1.0, model="m")
    text = generate_latest(app.state.emulator.metrics.registry).decode()
    m = parse_worker_metrics(text, model="m")
    assert m.running == 0.0 and m.waiting == 0.0 and m.kv_cache_usage == 0.0
    assert m.prompt_tokens_total == 0.0 and m.generation_tokens_total == 0.0 and m.request_success_total == 0.0
    assert m.e2e_latency_count == 0.0 and m.e2e_latency_sum == 0.0  # declared, no observation yet
    assert m.preemptions_total is None  # the emulator does not export it
    assert parse_worker_metrics(text, model="other").running is None


async def test_emulator_metrics_endpoint_after_a_request() -> None:
    app = emulator_app("A100", time_scale=0.01, model="m")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator", timeout=60.0) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "w " * 40}], "max_tokens": 8}
            r = await client.post("/v1/chat/completions", json={**body, "min_tokens": 8, "ignore_eos": True})
            assert r.status_code == 200
            metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    m = parse_worker_metrics(metrics.text, model="m")
    assert m.running == 0.0 and m.waiting == 0.0 and m.kv_cache_usage is not None
    assert m.request_success_total == 1.0 and m.generation_tokens_total == 8.0
    assert m.prompt_tokens_total is not None and m.prompt_tokens_total > 40
    assert m.e2e_latency_count == 1.0 and m.e2e_latency_sum is not None and m.e2e_latency_sum > 0.0

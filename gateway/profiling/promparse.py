"""A pure parser of a vLLM worker's ``/metrics`` text (Prometheus text exposition format).

``parse_worker_metrics`` gives the load and counters the gateway reads, ``parse_families`` every sample by
name (suffixes such as ``_total`` kept, ``_created`` ignored). Malformed text raises ``MetricsParseError``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"
"""The name of the KV-cache usage gauge before vLLM's V1 engine."""
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""An info metric whose labels give the engine's KV capacity (``kv_cache_size_tokens``; before vLLM 0.32
``num_gpu_blocks`` x ``block_size``) and block size."""

_MAX_MESSAGE = 200


class MetricsParseError(ValueError):
    """The text is not in the Prometheus text exposition format."""


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    """What the gateway reads from one worker's ``/metrics``; None where the text has no such metric.

    Requests running and waiting in the engines, KV-cache usage (0..1, ``vllm:kv_cache_usage_perc`` or the older
    ``vllm:gpu_cache_usage_perc``: the mean over engines), and counters since the worker started: prefill tokens,
    generated tokens, preemptions (KV cache full), requests finished (any ``finished_reason``), the sum and
    count of finished requests' end-to-end latencies (seconds) and prompt tokens served from the prefix cache.
    Other values are summed over their series. ``kv_capacity_tokens`` and ``block_tokens``: the engine's, from
    ``vllm:cache_config_info`` (of any model).
    """

    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    preemptions_total: float | None
    request_success_total: float | None
    e2e_latency_sum: float | None
    e2e_latency_count: float | None
    prefix_hits_total: float | None = None
    kv_capacity_tokens: int | None = None
    block_tokens: int | None = None

    @property
    def queued(self) -> float:
        """Requests waiting on the worker (0 where it does not say)."""
        return self.waiting or 0.0


def _families(text: str) -> Iterator[Metric]:
    """The parsed families; any failure of the parser becomes ``MetricsParseError``."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, but also IndexError, KeyError, ...
        msg = str(exc) or type(exc).__name__
        if len(msg) > _MAX_MESSAGE:
            msg = msg[:_MAX_MESSAGE] + "..."
        raise MetricsParseError(f"malformed metrics text: {msg}") from None
    return iter(families)


def parse_families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of ``text``: sample name (with its suffix) -> ``[(labels, value), ...]`` in text order.

    ``_created`` samples are included (this is the raw view). ``MetricsParseError`` on malformed text.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in _families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _declared(family: Metric) -> list[str]:
    """Sample names a family declares even when it has no series yet (a labelled metric never set)."""
    if family.type == "counter":
        return [f"{family.name}_total"]
    if family.type in ("histogram", "gaugehistogram", "summary"):
        return [f"{family.name}_sum", f"{family.name}_count"]
    return [family.name]


class _Samples:
    """Samples by name: the ones of the wanted model, and which names appear at all."""

    def __init__(self, text: str, model: str | None) -> None:
        self.values: dict[str, list[float]] = {}
        self.present: set[str] = set()
        self.declared: set[str] = set()
        self.cache_config: list[dict[str, str]] = []
        for family in _families(text):
            self.declared.update(_declared(family))
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                if s.name == CACHE_CONFIG_INFO:
                    self.cache_config.append(s.labels)
                self.present.add(s.name)
                if model is None or s.labels.get("model_name") == model:
                    self.values.setdefault(s.name, []).append(float(s.value))

    def _values(self, name: str) -> list[float] | None:
        """The wanted series' values; [] for a declared family without series; None when absent.

        A family whose series all belong to other models is absent for the wanted model.
        """
        if name in self.values:
            return self.values[name]
        if name in self.present or name not in self.declared:
            return None
        return []

    def sum(self, name: str) -> float | None:
        vals = self._values(name)
        return None if vals is None else float(sum(vals))

    def mean(self, name: str) -> float | None:
        vals = self._values(name)
        if vals is None:
            return None
        return float(sum(vals) / len(vals)) if vals else 0.0


def _cache_config(rows: list[dict[str, str]]) -> tuple[int | None, int | None]:
    """(KV capacity in tokens, block size) from ``vllm:cache_config_info``'s labels; None: absent or below 1."""
    kv: int | None = None
    block: int | None = None
    for labels in rows:
        with contextlib.suppress(KeyError, ValueError):
            block = int(labels["block_size"])
        with contextlib.suppress(KeyError, ValueError):
            kv = int(labels["kv_cache_size_tokens"])
            continue
        with contextlib.suppress(KeyError, ValueError):
            kv = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    return (None if kv is None or kv < 1 else kv), (None if block is None or block < 1 else block)


def parse_worker_metrics(text: str, model: str | None = None) -> WorkerMetrics:
    """The load and counters of a vLLM worker from its ``/metrics`` text.

    With ``model``, only series labelled ``model_name=model`` count. A value is None when its family is not in the text,
    or when all its series belong to other models; a family that is declared but has no series yet (a labelled histogram
    before its first observation) gives 0.0. Raises ``MetricsParseError`` on malformed text.
    """
    s = _Samples(text, model)
    kv = s.mean(KV_CACHE_USAGE)
    if kv is None:
        kv = s.mean(KV_CACHE_USAGE_OLD)
    kv_tokens, block = _cache_config(s.cache_config)
    return WorkerMetrics(
        running=s.sum(RUNNING),
        waiting=s.sum(WAITING),
        kv_cache_usage=kv,
        prompt_tokens_total=s.sum(PROMPT_TOKENS),
        generation_tokens_total=s.sum(GENERATION_TOKENS),
        preemptions_total=s.sum(PREEMPTIONS),
        request_success_total=s.sum(REQUEST_SUCCESS),
        e2e_latency_sum=s.sum(f"{E2E_LATENCY}_sum"),
        e2e_latency_count=s.sum(f"{E2E_LATENCY}_count"),
        prefix_hits_total=s.sum(PREFIX_HITS),
        kv_capacity_tokens=kv_tokens,
        block_tokens=block,
    )

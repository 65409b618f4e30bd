"""Trace replay against a running gateway (``hexflow replay``): the workload ``hexflow bench`` simulates
(``replay_workload`` builds it without I/O; ``ReplayWorkflow.dag`` simulates the same) sent in real time, each
workflow at its arrival as ``POST /v1/workflows`` of exact-length synthetic calls. Figures in modelled seconds
(wall = modelled x ``time_scale``), latency from the scheduled arrival; 429/503 are *rejected* (never retried),
other failures *failed*; as in ``summarize``, a workflow that did not complete is infinitely late."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.simbench import Setup, standard_latency
from gateway.bench.stats import fmt, json_safe, positive, save_json, table
from gateway.config.workflows import CHESS_TEMPLATE, STANDARD_WORKFLOW
from gateway.core.dag import DagWorkflow, chain_nodes
from gateway.core.prefix import PrefixSeg
from gateway.core.scheduler import WorkerInfo
from gateway.core.workflow import CallSpec, Stage, deadline_met
from gateway.errors import GatewayError
from gateway.live.schemas import CallReport
from gateway.sim.metrics import LatencySummary, latency_summary
from gateway.sim.workload import TenantSpec

REJECTED_STATUSES = frozenset({429, 503})
"""Admission refusals: counted as rejected, never retried."""
TRANSPORT_ERROR = 0
"""``WorkflowResult.status`` of a request that got no HTTP answer (connection error, timeout)."""
TEMPLATE = "chess"


class ReplayError(GatewayError):
    """The replay cannot run: the gateway is unreachable, not ready, or refuses the API key."""


@dataclass(frozen=True, slots=True)
class ReplayWorkflow:
    """One workflow to replay: arrival and relative deadline in modelled seconds, and its stages."""

    wid: int
    arrival_s: float
    deadline_s: float
    stages: tuple[Stage, ...]

    def stage_calls(self) -> list[tuple[CallSpec, ...]]:
        """The calls, stage by stage."""
        return [s.calls for s in self.stages]

    def calls(self) -> list[dict[str, Any]]:
        """The ``calls`` of the ``/v1/workflows`` body: a chain of stages of exact-length synthetic calls,
        each with its prompt's shared segments (``CallSpec.prefix``) as ``shared_prefix``."""
        stages = self.stage_calls()
        specs = [spec for stage in stages for spec in stage]
        out = []
        for n, spec in zip(chain_nodes(stages), specs, strict=True):
            call: dict[str, Any] = {
                "id": n.id,
                "kind": n.kind,
                "depends_on": list(n.depends_on),
                "prompt_tokens": n.input_tokens,
                "max_tokens": n.output_tokens,
                "min_tokens": n.output_tokens,
                "ignore_eos": True,
            }
            if segments := shared_prefix(spec.prefix):
                call["shared_prefix"] = segments
            out.append(call)
        return out

    def body(self, time_scale: float) -> dict[str, Any]:
        """The ``POST /v1/workflows`` body; the deadline in wall seconds (modelled x ``time_scale``)."""
        return {
            "calls": self.calls(),
            "deadline_s": self.deadline_s * time_scale,
            "template": TEMPLATE,
            "return_outputs": False,
        }

    def dag(self, tenant: str = "replay") -> DagWorkflow:
        """The workflow as the gateway builds it (a DAG with the CHESS template), in modelled time."""
        nodes = chain_nodes(self.stage_calls())
        return DagWorkflow.build(
            self.wid, tenant, self.arrival_s, self.arrival_s + self.deadline_s, nodes, CHESS_TEMPLATE
        )


def shared_prefix(prefix: Sequence[PrefixSeg]) -> list[dict[str, Any]]:
    """A call's prefix chain as the ``shared_prefix`` of ``/v1/workflows``: per-query segments are scoped to
    the workflow, the others global (empty segments left out, as the engines skip them)."""
    return [
        {"name": seg.name, "tokens": seg.tokens, "scope": "workflow" if seg.per_query else "global"}
        for seg in prefix
        if seg.tokens > 0
    ]


def scale_queries(queries: Sequence[Sequence[CallSpec]], scale: float) -> list[list[CallSpec]]:
    """Every call's prompt and output lengths times ``scale`` (rounded, at least 1 token), and its shared
    prefix segments with them (never beyond the scaled prompt), so a trace fits a small model's context."""
    if positive("token scale", scale) == 1.0:
        return [list(q) for q in queries]
    out = []
    for q in queries:
        calls = []
        for c in q:
            n_in = max(1, round(c.input_tokens * scale))
            segs, used = [], 0
            for seg in c.prefix:
                t = min(round(seg.tokens * scale), n_in - used)
                segs.append(PrefixSeg(seg.name, t, seg.per_query))
                used += t
            calls.append(CallSpec(c.kind, n_in, max(1, round(c.output_tokens * scale)), tuple(segs)))
        out.append(calls)
    return out


def replay_setup(
    trace: str,
    workers: Sequence[WorkerInfo],
    *,
    workflows: int,
    seed: int = 0,
    slo_scale: float = 5.0,
    deadline_s: float | None = None,
    arrivals_csv: Path | None = None,
    cv: float = 1.0,
    token_scale: float = 1.0,
) -> Setup:
    """The bench scenario a replay sends: the simulator's ``Setup`` with the same arguments. The SLO is
    ``slo_scale`` x the standard workflow's cluster-mean latency on ``workers`` (the unscaled profiles), with
    its tokens times ``token_scale`` as every call's (``scale_queries``); ``deadline_s``: one fixed deadline."""
    tenants = None if deadline_s is None else [TenantSpec("default", deadline_s=deadline_s)]
    options: dict[str, Any] = {"slo_scale": slo_scale, "cv": cv, "tenants": tenants, "arrivals_csv": arrivals_csv}
    setup = Setup.of_trace(trace, workers, n_workflows=workflows, seed=seed, **options)
    if token_scale == 1.0:
        return setup
    unit = standard_latency(workers, scale_queries([STANDARD_WORKFLOW], token_scale)[0])
    return replace(setup, queries=scale_queries(setup.queries, token_scale), slo_unit_s=unit)


def replay_workload(setup: Setup, rate_qps: float) -> list[ReplayWorkflow]:
    """The workflows of ``setup.workflows(rate_qps)``: arrivals, relative deadlines, stages (modelled s)."""
    wfs = setup.workflows(positive("rate", rate_qps))
    return [ReplayWorkflow(w.wid, w.arrival, w.deadline - w.arrival, tuple(w.stages)) for w in wfs]


@dataclass(slots=True)
class WorkflowResult:
    """What happened to one workflow (times in modelled seconds; ``status`` 0: no HTTP answer)."""

    wid: int
    arrival_s: float
    deadline_s: float
    status: int
    latency_s: float | None = None
    gateway_latency_s: float | None = None
    finish_s: float | None = None
    send_lag_s: float = 0.0
    error: str | None = None
    calls: tuple[CallReport, ...] = ()
    """The gateway's report of each call, as its API model (completed workflows; empty when the response had
    none)."""

    @property
    def completed(self) -> bool:
        """Answered 200."""
        return self.status == 200 and self.latency_s is not None

    @property
    def met(self) -> bool:
        """Completed within its deadline, measured client-side (the one rule, ``deadline_met``)."""
        return self.latency_s is not None and deadline_met(self.latency_s, self.deadline_s, valid=self.completed)


@dataclass(frozen=True)
class ReplayReport(LatencySummary):
    """Headline figures of a replay, in modelled seconds, client-side and as the gateway saw them."""

    gateway: str
    trace: str
    rate_qps: float
    time_scale: float
    rejected: int
    failed: int
    by_status: dict[str, int]
    gateway_p50_s: float
    gateway_p95_s: float
    gateway_p99_s: float
    gateway_mean_s: float
    wall_s: float
    max_send_lag_s: float
    deadline_s: float | None
    results: list[WorkflowResult] = field(default_factory=list, repr=False)

    @classmethod
    def from_results(
        cls,
        results: Sequence[WorkflowResult],
        *,
        gateway: str,
        trace: str,
        rate_qps: float,
        time_scale: float,
        wall_s: float,
    ) -> ReplayReport:
        """Summarise per-workflow results (``latency_summary``, as the simulator's runs)."""
        n = len(results)
        done = [r for r in results if r.completed]
        statuses = Counter("error" if r.status == TRANSPORT_ERROR else str(r.status) for r in results)
        rejected = sum(1 for r in results if r.status in REJECTED_STATUSES)
        span = max(r.finish_s or 0.0 for r in done) - min(r.arrival_s for r in done) if done else 0.0
        client = latency_summary(
            [r.latency_s for r in done if r.latency_s is not None], n, sum(r.met for r in done), span
        )
        seen = latency_summary([x for r in done if (x := r.gateway_latency_s) is not None], n, 0, span)
        deadlines = {round(r.deadline_s, 9) for r in results}
        return cls(
            **vars(client),
            gateway=gateway,
            trace=trace,
            rate_qps=rate_qps,
            time_scale=time_scale,
            rejected=rejected,
            failed=n - len(done) - rejected,
            by_status=dict(sorted(statuses.items())),
            gateway_p50_s=seen.p50_s,
            gateway_p95_s=seen.p95_s,
            gateway_p99_s=seen.p99_s,
            gateway_mean_s=seen.mean_s,
            wall_s=wall_s,
            max_send_lag_s=max((r.send_lag_s for r in results), default=0.0),
            deadline_s=results[0].deadline_s if len(deadlines) == 1 else None,
            results=list(results),
        )

    def to_json(self, *, with_results: bool = True) -> dict[str, Any]:
        """A JSON-safe dict (non-finite numbers become null); per-workflow results under ``results``."""
        out = json_safe({f.name: getattr(self, f.name) for f in fields(self) if f.name != "results"})
        if with_results:
            keep = ("wid", "arrival_s", "deadline_s", "status", "latency_s", "gateway_latency_s", "met", "error")
            out["results"] = [{k: getattr(r, k) for k in keep} for r in self.results]
        return out

    def write_json(self, path: Path) -> None:
        """Write ``to_json()`` (strict JSON: no NaN or Infinity)."""
        save_json(path, self.to_json())


def format_report(rep: ReplayReport) -> str:
    """The short table ``hexflow replay`` prints."""
    deadline = f"deadline {rep.deadline_s:.1f} s" if rep.deadline_s is not None else "mixed deadlines"
    head = (
        f"{rep.trace} -> {rep.gateway}: {rep.workflows} workflows at {rep.rate_qps:g}/s (modelled), "
        f"time scale {rep.time_scale:g}, {deadline}\n"
        f"completed {rep.completed}, rejected {rep.rejected} (429/503), failed {rep.failed}; "
        f"HTTP status: {', '.join(f'{k} x{v}' for k, v in rep.by_status.items())}"
    )
    rows = [
        [side, *(fmt(getattr(rep, f"{pre}{k}_s")) for k in ("p50", "p95", "p99", "mean")), *extra]
        for side, pre, extra in (
            ("client", "", (fmt(rep.slo_attainment, 3), fmt(rep.throughput_qps, 4))),
            ("gateway", "gateway_", ("", "")),
        )
    ]
    foot = f"wall {rep.wall_s:.1f} s; latest send {rep.max_send_lag_s * 1000:.0f} ms behind schedule"
    return "\n".join([head, table(["latency", "p50_s", "p95_s", "p99_s", "mean_s", "slo", "tput_qps"], rows), foot])


def _answer(resp: httpx.Response, *keys: str) -> str | None:
    """The string at ``keys`` in a JSON answer's body (None when it is not there)."""
    try:
        doc: Any = resp.json()
        for k in keys:
            doc = doc[k]
    except (ValueError, KeyError, TypeError):
        return None
    return str(doc) if doc else None


def _error_message(resp: httpx.Response) -> str:
    msg = _answer(resp, "error", "message")
    return msg[:300] if msg else f"HTTP {resp.status_code}"


async def check_gateway(client: httpx.AsyncClient) -> None:
    """Fail early (``ReplayError``) when the gateway is unreachable, not ready, or refuses the key."""
    base = str(client.base_url).rstrip("/")
    try:
        ready = await client.get("/readyz", timeout=10.0)
        if ready.status_code != 200:
            why = _answer(ready, "reason") or "no reason given"
            raise ReplayError(f"the gateway at {base} is not ready (HTTP {ready.status_code}: {why})")
        models = await client.get("/v1/models", timeout=10.0)
    except httpx.HTTPError as exc:
        raise ReplayError(f"cannot reach the gateway at {base}: {type(exc).__name__}: {exc}") from None
    if models.status_code == 401:
        raise ReplayError(f"the gateway at {base} refused the API key (401: {_error_message(models)})")
    if models.status_code != 200:
        raise ReplayError(f"the gateway at {base} answered GET /v1/models with HTTP {models.status_code}")
    if not await _takes_synthetic_prompts(client):
        raise ReplayError(
            f"the gateway at {base} is not in benchmark mode, so it refuses the synthetic prompts of exact sizes "
            "(prompt_tokens) that a replay sends: start it with hexflow serve --benchmark, or benchmark: true in "
            "its gateway.yaml"
        )


async def _takes_synthetic_prompts(client: httpx.AsyncClient) -> bool:
    """Whether the gateway's OpenAPI document lists ``prompt_tokens`` for a workflow call (it does only in
    benchmark mode); True when the document cannot tell (not served, or another shape)."""
    try:
        resp = await client.get("/openapi.json", timeout=10.0)
        call = resp.json()["components"]["schemas"]["WorkflowCall"]["properties"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return True
    return not isinstance(call, dict) or "prompt_tokens" in call


async def _send(
    client: httpx.AsyncClient, body: bytes, res: WorkflowResult, at: float, origin: float, time_scale: float
) -> None:
    """Send one workflow due at wall time ``at`` and record its outcome in ``res`` (``origin``: the wall time of
    modelled time 0)."""
    res.send_lag_s = max(time.monotonic() - at, 0.0) / time_scale
    try:
        resp = await client.post("/v1/workflows", content=body)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    end = time.monotonic()
    res.status = resp.status_code
    if resp.status_code != 200:
        res.error = _error_message(resp)
        return
    res.latency_s = (end - at) / time_scale
    res.finish_s = (end - origin) / time_scale
    try:
        doc = resp.json()
        gw_latency = float(doc["latency_s"])
    except (ValueError, KeyError, TypeError):
        doc, gw_latency = None, math.nan
    if isinstance(doc, dict) and isinstance(doc.get("calls"), list):
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            res.calls = tuple(CallReport.model_validate(c) for c in doc["calls"])
    res.gateway_latency_s = gw_latency / time_scale if math.isfinite(gw_latency) else None


async def replay(
    workload: Sequence[ReplayWorkflow],
    *,
    gateway: str,
    api_key: str,
    time_scale: float = 1.0,
    trace: str = "",
    rate_qps: float = math.nan,
    timeout_s: float | None = None,
    concurrency_limit: int | None = None,
    progress: bool = True,
    desc: str = "replay",
    check: bool = True,
) -> ReplayReport:
    """Send every workflow at its arrival time (one task each); return the report when all answered.

    ``timeout_s`` bounds one request in wall seconds (default: 60 s plus 10 x the longest wall
    deadline). ``concurrency_limit`` caps workflows in flight client-side (the wait counts as
    latency). ``check`` first verifies the gateway is ready and accepts the key (``ReplayError``).
    """
    from tqdm import tqdm

    if not time_scale > 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    if concurrency_limit is not None and concurrency_limit < 1:
        raise ValueError(f"concurrency_limit must be >= 1, got {concurrency_limit}")
    if timeout_s is None:
        timeout_s = 60.0 + 10.0 * max((w.deadline_s * time_scale for w in workload), default=0.0)
    n = len(workload)
    conns = min(max(concurrency_limit or n, 1), 4096)
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns, keepalive_expiry=2.0)
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    # Bodies are encoded up front, so serialisation never delays a send.
    bodies = [json.dumps(w.body(time_scale), separators=(",", ":")).encode() for w in workload]
    a0 = min((w.arrival_s for w in workload), default=0.0)
    sem = asyncio.Semaphore(concurrency_limit) if concurrency_limit else None
    results = [WorkflowResult(w.wid, w.arrival_s, w.deadline_s, TRANSPORT_ERROR) for w in workload]

    async with httpx.AsyncClient(
        base_url=gateway, headers=headers, limits=limits, timeout=httpx.Timeout(timeout_s, connect=10.0)
    ) as client:
        if check:
            await check_gateway(client)
        with tqdm(total=n, desc=desc, unit="wf", disable=not progress or None, leave=False) as bar:
            t0 = time.monotonic()

            async def one(i: int) -> None:
                w = workload[i]
                at = t0 + (w.arrival_s - a0) * time_scale
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    async with sem if sem is not None else contextlib.nullcontext():
                        await _send(client, bodies[i], results[i], at, t0 - a0 * time_scale, time_scale)
                finally:
                    bar.update(1)

            tasks = [asyncio.create_task(one(i), name=f"replay-{w.wid}") for i, w in enumerate(workload)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            wall = time.monotonic() - t0
    return ReplayReport.from_results(
        results, gateway=gateway, trace=trace, rate_qps=rate_qps, time_scale=time_scale, wall_s=wall
    )

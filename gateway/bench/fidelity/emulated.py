"""``hexflow bench fidelity``, emulated mode: workers run a "truth" catalogue (``FACTOR_SETS``: every constant
of each GPU type off by its own factor), one per type is calibrated, the trace is replayed live with the
calibrated catalogue and simulated with it (and with the truth). Target: live P95 and SLO within 5% of the
calibrated prediction (``within_target``). Method: docs/benchmarks.md "Calibration fidelity"."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from gateway.bench.fidelity.compare import LiveGaps
from gateway.bench.livebench import LiveBenchReport, PolicyRun, format_live_report, run_live_bench
from gateway.bench.procs import cluster_process
from gateway.bench.replay import replay_setup, replay_workload
from gateway.bench.rig import LiveSettings
from gateway.bench.stats import fmt, json_safe, positive, table
from gateway.config import DEFAULT_GPU_CATALOG, build_workers, load_cluster_config, load_gpu_catalog
from gateway.config.gpus import GpuCatalog, ProfileSpec
from gateway.core.profile import PerfProfile, profile_from
from gateway.profiling.fit import workflow_latency
from gateway.profiling.output import profile_entry
from gateway.profiling.plan import PlanSettings
from gateway.profiling.probe import CalibrationResult, calibrate
from gateway.sim.metrics import summarize
from gateway.sim.simulator import Simulator

TARGET = 0.05
"""Largest relative gap between live and simulated P95 and SLO attainment (issue 14)."""

FACTOR_SETS: tuple[dict[str, float], ...] = (
    {"iter_base_s": 1.3, "token_s": 0.7, "ctx_s": 1.5, "request_overhead_s": 1.6, "kv_capacity_tokens": 0.8},
    {"iter_base_s": 0.8, "token_s": 1.25, "ctx_s": 0.6, "request_overhead_s": 0.7, "kv_capacity_tokens": 1.1},
    {"iter_base_s": 1.15, "token_s": 1.4, "ctx_s": 1.2, "request_overhead_s": 1.3, "kv_capacity_tokens": 0.9},
)
"""How the truth catalogue changes each GPU type's constants (the i-th GPU type takes set i mod 3)."""


def perturbed_catalog(base: dict[str, Any], model: str, gpus: Sequence[str]) -> dict[str, Any]:
    """``base`` (a parsed ``gpus.yaml``) with the ``model`` profile of each of ``gpus`` changed by
    ``FACTOR_SETS`` (KV capacity rounded down to whole 16-token blocks)."""
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(base))
    for i, g in enumerate(gpus):
        entry = doc["profiles"][model][g]
        for k, f in FACTOR_SETS[i % len(FACTOR_SETS)].items():
            entry[k] = int(entry[k] * f) // 16 * 16 if k == "kv_capacity_tokens" else float(f"{entry[k] * f:.6g}")
        entry["basis"] = f"fidelity benchmark: {entry.get('basis', '')} x {FACTOR_SETS[i % len(FACTOR_SETS)]}"
    return doc


def _write_catalog(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    load_gpu_catalog(path)  # validate now: a bad entry is reported here, not by a child process
    return path


@dataclass
class GpuCalibration:
    """One GPU type: its truth profile, the calibrated one (modelled seconds) and the calibration."""

    gpu: str
    truth: PerfProfile
    calibrated: PerfProfile
    result: CalibrationResult

    def workflow_error(self) -> float:
        """The standard workflow's lone latency under the calibrated profile over the truth's, minus 1."""
        return workflow_latency(self.calibrated) / workflow_latency(self.truth) - 1.0

    def decode_error(self, batch: int = 16, ctx: int = 4000) -> float:
        """A decode step of ``batch`` calls of ``ctx`` context each, calibrated over truth, minus 1."""
        return self.calibrated.iter_time(batch, batch * ctx) / self.truth.iter_time(batch, batch * ctx) - 1.0


@dataclass
class FidelityReport(LiveGaps):
    """The calibrations, the live-vs-simulated runs (the target: P95 and SLO attainment), and the simulator's
    figures with the truth profiles."""

    TARGET: ClassVar[float] = TARGET
    GAP_KEYS: ClassVar[tuple[str, ...]] = ("p95", "slo")

    calibrations: list[GpuCalibration]
    live: LiveBenchReport
    truth_sim: dict[str, dict[str, float]]
    """Policy -> ``{"p95_s", "slo_attainment"}`` simulated with the truth profiles (reference)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON document (non-finite numbers become null)."""
        cal = [
            {
                "gpu": c.gpu,
                "truth": {k: getattr(c.truth, k) for k in _CONSTANTS},
                "calibrated": {k: getattr(c.calibrated, k) for k in (*_CONSTANTS, "attn_s", "seq_s", "admit_s")},
                "workflow_latency_error": c.workflow_error(),
                "decode_step_error_16x4000": c.decode_error(),
                "probes": len(c.result.measurements),
                "calibration_wall_s": c.result.wall_s,
            }
            for c in self.calibrations
        ]
        return json_safe(
            {
                "target": TARGET,
                "within_target": self.within_target(),
                "calibrations": cal,
                "gaps": self.gaps(),
                "simulated_with_truth": self.truth_sim,
                "live_bench": self.live.to_json(),
            }
        )


FIDELITY_RIG = LiveSettings("paper-4gpu", time_scale=0.05)
"""The emulated cluster ``run_fidelity`` measures by default."""

_CONSTANTS = ("iter_base_s", "token_s", "ctx_s", "request_overhead_s", "kv_capacity_tokens")


def run_fidelity(
    live: LiveSettings = FIDELITY_RIG,
    *,
    trace: str = "chess-bird",
    policies: Sequence[str] = ("hexgen",),
    workflows: int = 150,
    budget_s: float = 90.0,
    slo_scale: float = 5.0,
    progress: bool = True,
    settings: PlanSettings | None = None,
) -> FidelityReport:
    """Calibrate, replay live, simulate. Logs, the two catalogues and the configs go to ``live.log_dir`` (kept)
    or a temporary folder removed after a successful run."""
    cluster, time_scale = live.cluster, positive("time scale", live.time_scale)
    base = yaml.safe_load(Path(DEFAULT_GPU_CATALOG).read_text())
    resolved = load_cluster_config(cluster).expanded()
    gpus = list(dict.fromkeys(rw.gpu for rw in resolved))
    models = {rw.model for rw in resolved}
    if len(models) != 1:
        raise ValueError(f"{cluster}: the fidelity benchmark needs one model, the cluster serves {sorted(models)}")
    model = models.pop()
    with live.folder("hexflow-fidelity-") as folder:
        truth_path = _write_catalog(perturbed_catalog(base, model, gpus), folder / "truth-gpus.yaml")
        truth_cat = load_gpu_catalog(truth_path)
        cal_doc = yaml.safe_load(yaml.safe_dump(base))
        with cluster_process(cluster, time_scale, folder, "calibrate", ["--catalog", str(truth_path)]) as (_, urls):
            calibrations = []
            for g in gpus:
                i = next(k for k, rw in enumerate(resolved) if rw.gpu == g)
                res = _calibrate_one(
                    urls[i], resolved[i], truth_cat, model, budget_s=budget_s, settings=settings, progress=progress
                )
                entry = cal_doc["profiles"][model][g] = profile_entry(res, scale=time_scale)
                # The calibrated profile read back from its entry, as the gateway reads it.
                calibrated = profile_from(g, model, ProfileSpec.model_validate(entry))
                calibrations.append(GpuCalibration(g, truth_cat.profile(g, model), calibrated, res))
        cal_path = _write_catalog(cal_doc, folder / "calibrated-gpus.yaml")
        runs = run_live_bench(
            replace(live, log_dir=folder / "live"),
            trace,
            policies,
            workflows=workflows,
            slo_scale=slo_scale,
            progress=progress,
            gpu_catalog=cal_path,
            emulator_catalog=truth_path,
        )
        truth_sim = _simulate_with(truth_cat, cluster, trace, runs, seed=live.seed, slo_scale=slo_scale)
    return FidelityReport(calibrations, runs, truth_sim)


def _calibrate_one(
    url: str, rw: Any, truth: GpuCatalog, model: str, *, budget_s: float, settings: PlanSettings | None, progress: bool
) -> CalibrationResult:
    """Calibrate the emulated worker ``rw`` (a resolved worker of the cluster) at ``url``."""
    spec = truth.profile_spec(rw.gpu, model)
    s = settings or PlanSettings(max_num_seqs=spec.max_num_seqs, max_batched_tokens=spec.max_batched_tokens)
    if progress:
        print(f"calibrating {rw.name} ({rw.gpu}) at {url} within {budget_s:g} s", file=sys.stderr, flush=True)
    return asyncio.run(
        calibrate(
            url, rw.served_model or model, gpu=rw.gpu, tp=spec.tp, budget_s=budget_s, settings=s, progress=progress
        )
    )


def _simulate_with(
    catalog: GpuCatalog, cluster: str, trace: str, live: LiveBenchReport, *, seed: int, slo_scale: float
) -> dict[str, dict[str, float]]:
    """The simulator on the live runs' workload (same rate, seeds, alpha: each policy's run afresh) with
    ``catalog``'s profiles; the deadlines are the live bench's (the calibrated catalogue's SLO), so both
    predictions face the same one."""
    workers = build_workers(load_cluster_config(cluster, catalog), catalog)
    setup = replay_setup(trace, workers, workflows=live.workflows, seed=seed, slo_scale=slo_scale)
    factor = live.slo_s / setup.slo_s if setup.slo_s > 0 else 1.0
    workload = replay_workload(setup, live.rate_qps)

    out = {}
    for r in live.runs:
        dags = [
            d.shifted(d.arrival, d.arrival + (d.deadline - d.arrival) * factor) for d in (w.dag() for w in workload)
        ]
        sim = Simulator(workers, r.policy, alpha=r.alpha, seed=seed, prefix_caching=True)
        s = summarize(sim.run(dags), total=len(dags))
        out[r.policy] = {"p95_s": float(s.p95_s), "slo_attainment": float(s.slo_attainment)}
    return out


def format_fidelity_report(rep: FidelityReport) -> str:
    """The tables ``hexflow bench fidelity`` prints."""
    rows = []
    for c in rep.calibrations:
        cells = []
        for key, spec, gap in _CELLS:
            k, t = getattr(c.calibrated, key), getattr(c.truth, key)
            cells.append(f"{k:{spec}} ({k / t - 1 if t else math.nan:+{gap}})")
        probes = f"{len(c.result.measurements)} in {c.result.wall_s:.0f} s"
        rows.append([c.gpu, *cells, f"{c.workflow_error():+.1%}", f"{c.decode_error():+.1%}", probes])
    head = ["gpu", "iter_base_s", "token_s", "ctx_s", "overhead_s", "kv_tokens", "workflow", "decode 16x4k", "probes"]

    def truth(r: PolicyRun) -> list[str]:
        ts = rep.truth_sim.get(r.policy, {})
        return [fmt(ts.get("p95_s", math.nan)), fmt(ts.get("slo_attainment", math.nan), 3)]

    title = f"live against the simulator with the calibrated profiles (target: within {TARGET:.0%}):"
    return "\n".join(
        [
            "calibrated profiles (modelled seconds) and their error against the truth the emulated workers ran:",
            table(head, rows),
            "",
            format_live_report(rep.live),
            "",
            *rep.gap_lines(title, 1, truth, ["truth-sim p95", "truth-sim slo"]),
        ]
    )


_CELLS: tuple[tuple[str, str, str], ...] = (("iter_base_s", ".4g", ".0%"), ("token_s", ".4g", ".0%"))
_CELLS += (("ctx_s", ".3g", ".0%"), ("request_overhead_s", ".3g", ".0%"), ("kv_capacity_tokens", "", ".1%"))

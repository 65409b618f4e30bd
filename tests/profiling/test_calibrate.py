"""``hexflow calibrate``: the probe model, the fit, the plan's bounds (budget, concurrency, back-off), and
recovery of non-catalogue constants from an emulated worker."""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from gateway.cli import main
from gateway.config import DEFAULT_GPU_CATALOG, load_gpu_catalog
from gateway.config.gpus import ProfileSpec
from gateway.core.profile import PerfProfile
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.profiling.output import format_report, profile_entry, render_profile_yaml, scaled_profile
from gateway.profiling.plan import (
    CalibrationError,
    PlanSettings,
    Probe,
    batch_features,
    fit_constants,
    make_plan,
    probe_features,
)
from gateway.profiling.probe import CalibrationResult, calibrate
from gateway.profiling.worker import ProbeWorker
from gateway.sim.engine import SimEngine
from tests.emulator_process import emulated_client, emulator_process
from tests.fakes import FakeClock, virtual_time_loop
from workers.emulator import KV_BLOCK_SIZE

MODEL = "llama-3.1-70b"


def a100() -> PerfProfile:
    return load_gpu_catalog().profile("A100", MODEL)


def unknown_profile() -> PerfProfile:
    """An A100 profile with every constant changed by its own factor: not in the catalogue."""
    p = a100()
    return replace(
        p,
        iter_base_s=p.iter_base_s * 1.3,
        token_s=p.token_s * 0.6,
        ctx_s=p.ctx_s * 2.0,
        request_overhead_s=p.request_overhead_s * 1.5,
        kv_capacity_tokens=300_000,
    )


# --------------------------------------------------------------------------------------------------
# The probe model and the fit
# --------------------------------------------------------------------------------------------------


def _engine_mean_latency(profile: PerfProfile, n: int, prompt: int, output: int) -> float:
    """Mean finish time of ``n`` identical calls added together to the simulator's engine."""
    wf = StagedWorkflow(0, "x", 0.0, float("inf"), [Stage("x", (CallSpec("x", 1, 1),))])
    eng = SimEngine(profile)
    for i in range(n):
        eng.add(Call(i, wf, CallSpec("x", prompt, output), 0.0))
    eng.kick(0.0)
    finished: list[float] = []
    while len(finished) < n:
        t = eng.wake_at
        finished += [t] * len(eng.on_wake(t))
        eng.kick(t)
    return sum(finished) / n


@pytest.mark.parametrize(
    ("n", "prompt", "output"),
    [(1, 3000, 50), (4, 64, 64), (16, 64, 64), (8, 1024, 32), (16, 2048, 64), (3, 3000, 5), (5, 700, 3)],
)
@pytest.mark.parametrize(("attn_s", "seq_s", "admit_s"), [(0.0, 0.0, 0.0), (3e-9, 0.0, 0.0), (3e-9, 4e-4, 0.006)])
def test_batch_features_give_the_simulated_engines_mean_latency(
    n: int, prompt: int, output: int, attn_s: float, seq_s: float, admit_s: float
) -> None:
    p = replace(a100(), request_overhead_s=0.0, kv_capacity_tokens=10**7, attn_s=attn_s, seq_s=seq_s, admit_s=admit_s)
    constants = np.array([p.iter_base_s, p.token_s, p.ctx_s, 0.0, p.attn_s, p.seq_s, p.admit_s])
    predicted = batch_features(n, prompt, output, p.max_batched_tokens) @ constants
    assert predicted == pytest.approx(_engine_mean_latency(p, n, prompt, output), rel=1e-9)


@pytest.mark.parametrize(("prompt", "output"), [(32, 1), (2048, 1), (5000, 7), (100, 200)])
@pytest.mark.parametrize(("attn_s", "seq_s", "admit_s"), [(0.0, 0.0, 0.0), (3e-9, 0.0, 0.0), (3e-9, 4e-4, 0.006)])
def test_lone_probe_features_give_single_latency(
    prompt: int, output: int, attn_s: float, seq_s: float, admit_s: float
) -> None:
    p = replace(a100(), attn_s=attn_s, seq_s=seq_s, admit_s=admit_s)
    row = probe_features("lone", 1, prompt, output, p.max_batched_tokens)
    assert row[6] == 1.0  # its own intake
    assert row[4] == prompt * (prompt + 1) / 2  # the prompt's attention pairs, however it is chunked
    assert row[5] == output - 1  # one decoding call in each decode step
    coef = np.array([p.iter_base_s, p.token_s, p.ctx_s, p.request_overhead_s, p.attn_s, p.seq_s, p.admit_s])
    assert row @ coef == pytest.approx(p.single_latency(prompt, output), rel=1e-12)


@pytest.mark.parametrize(("seq_s", "admit_s"), [(0.0, 0.0), (4e-4, 0.0), (4e-4, 0.002)])
def test_fit_recovers_the_constants_of_exact_latencies(seq_s: float, admit_s: float) -> None:
    """Every constant, the per-call step cost and the intake included: batches at two output lengths tell a
    cost per decoding request per step (grows with the output) from one per request (does not), and batches
    against lone requests tell the intake (n of them in a batch's latency) from the overhead (one)."""
    truth = replace(unknown_profile(), attn_s=2e-9, seq_s=seq_s, admit_s=admit_s)
    t = truth
    coef = np.array([t.iter_base_s, t.token_s, t.ctx_s, t.request_overhead_s, t.attn_s, t.seq_s, t.admit_s])
    lone = [(1, 32, 1), (1, 4096, 1), (1, 512, 64), (1, 4096, 256), (1, 32, 256), (1, 2048, 16)]
    batches = [(4, 64, 128), (16, 64, 128), (4, 64, 32), (16, 64, 32), (8, 2048, 128), (16, 2048, 128)]
    rows = [probe_features("p", n, pr, o, truth.max_batched_tokens) for n, pr, o in [*lone, *batches]]
    a = np.array(rows)
    fitted = fit_constants(a, a @ coef)
    assert fitted == pytest.approx(tuple(coef), rel=1e-4)


@pytest.mark.parametrize(("n", "prompt", "output", "short"), [(1, 64, 256, 64), (4, 64, 256, 64), (8, 2048, 128, 9)])
def test_a_step_probe_row_is_one_decode_step_of_the_simulated_engine(
    n: int, prompt: int, output: int, short: int
) -> None:
    """The difference of the two batches' simulated mean latencies over the difference of their outputs:
    prefill, the per-request overhead and the intakes cancel."""
    p = replace(a100(), kv_capacity_tokens=10**7, attn_s=3e-9, seq_s=4e-4, admit_s=0.005)
    row = probe_features("step", n, prompt, output, p.max_batched_tokens, short)
    assert row[3] == pytest.approx(0.0, abs=1e-12) and row[6] == pytest.approx(0.0, abs=1e-12)
    assert row[0] == pytest.approx(1.0) and row[5] == pytest.approx(n)  # one iteration of n decoders per step
    coef = np.array([p.iter_base_s, p.token_s, p.ctx_s, p.request_overhead_s, p.attn_s, p.seq_s, p.admit_s])
    want = (_engine_mean_latency(p, n, prompt, output) - _engine_mean_latency(p, n, prompt, short)) / (output - short)
    assert row @ coef == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="short output"):
        probe_features("step", n, prompt, output, p.max_batched_tokens, output)


def test_fit_of_nothing_is_a_calibration_error() -> None:
    with pytest.raises(CalibrationError):
        fit_constants(np.zeros((0, 7)), np.zeros(0))


def test_plan_never_exceeds_the_concurrency_bound_or_max_num_seqs() -> None:
    for cap, seqs in [(16, 64), (64, 8), (1, 64)]:
        plan = make_plan(PlanSettings(max_concurrency=cap, max_num_seqs=seqs))
        assert max(p.concurrency for p in plan) == min(cap, seqs)
    plan = make_plan(PlanSettings(max_prompt=2048, max_output=128))
    assert max(p.prompt for p in plan) == 2048 and max(p.output for p in plan if p.kind != "step") == 128
    assert max(p.prompt + p.output for p in plan) == 2048 + 128  # no request longer than the lone grid's longest
    # Lone probes never share a prompt, except the deliberate prefix repeat.
    lone = [p.seed for p in plan if p.kind != "prefix"]
    assert len(lone) == len(set(lone))
    (prefix,) = [p for p in plan if p.kind == "prefix"]
    assert any(p.kind == "lone" and p.seed == prefix.seed for p in plan)


def test_plan_measures_decode_steps_at_one_half_and_all_of_the_bound_and_at_a_long_context() -> None:
    s = PlanSettings(max_prompt=2048, max_output=64, max_concurrency=8, max_num_seqs=8, step_output=200, repeats=2)
    steps = [p for p in make_plan(s) if p.kind == "step"]
    assert sorted({(p.concurrency, p.prompt) for p in steps}) == [(1, 64), (4, 64), (8, 64), (8, 1024)]
    assert len(steps) == 8 and {p.output for p in steps} == {200}
    # A prompt plus the long output stays within the longest request the lone grid sends.
    short = PlanSettings(max_prompt=64, max_output=16, max_concurrency=2, max_num_seqs=2)
    assert {(p.prompt, p.output) for p in make_plan(short) if p.kind == "step"} == {(64, 16), (32, 48)}
    assert not [p for p in make_plan(PlanSettings(max_prompt=32, max_output=1)) if p.kind == "step"]


@pytest.mark.parametrize("bad", [{"max_concurrency": 0}, {"max_prompt": 8}, {"repeats": 0}, {"step_output": 7}])
def test_plan_rejects_settings_out_of_range(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_", "-")):
        make_plan(PlanSettings(**bad))


# --------------------------------------------------------------------------------------------------
# A fake worker: lone latencies from a profile on a fake clock, scripted /metrics
# --------------------------------------------------------------------------------------------------


class FakeWorker:
    """A worker whose requests take their modelled latency on a fake clock, and whose ``/metrics`` reports
    ``waiting`` queued requests for the first ``busy_scrapes`` reads."""

    def __init__(self, profile: PerfProfile, busy_scrapes: int = 0, cache_labels: str = "") -> None:
        self.profile = profile
        self.cache_labels = cache_labels or 'block_size="16",num_gpu_blocks="1000"'
        self.clock = FakeClock()  # moved on by the calibration's sleeps and by each request's latency
        self.busy_scrapes = busy_scrapes
        self.events: list[tuple[str, float]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            waiting = 2 if self.busy_scrapes > 0 else 0
            self.busy_scrapes -= 1
            self.events.append(("metrics-waiting" if waiting else "metrics-idle", self.clock.t))
            text = f'vllm:num_requests_waiting{{engine="0"}} {waiting}\nvllm:num_requests_running{{engine="0"}} 0\n'
            text += f"vllm:cache_config_info{{{self.cache_labels}}} 1.0\n"
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        prompt, out = len(body["prompt"]), body["max_tokens"]
        assert body["min_tokens"] == out and body["ignore_eos"] is True
        self.events.append(("complete", self.clock.t))
        self.clock.advance(self.profile.single_latency(prompt, out))
        return httpx.Response(200, json={"usage": {"prompt_tokens": prompt, "completion_tokens": out}})


async def _run_fake(fake: FakeWorker, budget_s: float, settings: PlanSettings) -> CalibrationResult:
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handler)) as client:
        return await calibrate(
            "http://fake",
            MODEL,
            budget_s=budget_s,
            settings=settings,
            client=client,
            clock=fake.clock,
            sleep=fake.clock.sleep,
            progress=False,
        )


async def test_calibration_starts_no_request_after_the_budget_and_stops() -> None:
    fake = FakeWorker(a100())
    budget = 30.0
    res = await _run_fake(fake, budget, PlanSettings(max_prompt=2048, max_output=128, max_concurrency=1))
    starts = [t for kind, t in fake.events if kind == "complete"]
    assert starts and max(starts) < budget
    assert res.stopped_by_budget or res.skipped > 0
    assert len(res.measurements) < res.planned
    # Once a fit exists, a probe that would run past the budget is skipped rather than started.
    assert fake.clock.t <= budget * 1.25


async def test_calibration_backs_off_while_others_requests_wait() -> None:
    fake = FakeWorker(a100(), busy_scrapes=3)
    await _run_fake(fake, 200.0, PlanSettings(max_prompt=256, max_output=16, max_concurrency=2, repeats=1))
    assert fake.clock.sleeps[:3] == [1.0, 2.0, 4.0]  # doubling back-off
    first_request = next(i for i, (kind, _) in enumerate(fake.events) if kind == "complete")
    assert [k for k, _ in fake.events[:first_request]] == ["metrics-waiting"] * 3 + ["metrics-idle"]
    # Every request is preceded by a read that found no queue.
    last_read = None
    for kind, _ in fake.events:
        if kind.startswith("metrics"):
            last_read = kind
        else:
            assert last_read == "metrics-idle"


@pytest.mark.parametrize(
    ("labels", "tokens", "block"),
    [
        ('block_size="16",num_gpu_blocks="1000"', 16_000, 16),  # before vLLM 0.32
        # vLLM 0.32 on the CPU: 128-token blocks
        ('block_size="128",kv_cache_size_tokens="262144",enable_prefix_caching="True"', 262_144, 128),
    ],
)
async def test_calibration_reads_kv_capacity_from_cache_config_info(labels: str, tokens: int, block: int) -> None:
    fake = FakeWorker(a100(), cache_labels=labels)
    res = await _run_fake(fake, 300.0, PlanSettings(max_prompt=256, max_output=16, max_concurrency=2, repeats=1))
    assert res.kv_capacity_tokens == tokens
    # The KV block size too: the profile's prefix cache reuses whole blocks of it.
    assert (res.block_tokens, res.block_source) == (block, "vllm:cache_config_info")
    assert res.profile().block_tokens == block and profile_entry(res)["block_tokens"] == block
    assert res.to_json()["block_tokens"] == block


async def test_calibration_assumes_vllms_gpu_block_size_where_the_worker_does_not_say() -> None:
    fake = FakeWorker(a100(), cache_labels='kv_cache_size_tokens="262144"')
    res = await _run_fake(fake, 300.0, PlanSettings(max_prompt=256, max_output=16, max_concurrency=2, repeats=1))
    assert (res.block_tokens, res.block_source) == (16, "default")
    assert "block_tokens 16 (default)" in format_report(res)


# --------------------------------------------------------------------------------------------------
# Recovery of unknown constants from an emulated worker
# --------------------------------------------------------------------------------------------------

TIME_SCALE = 0.25
"""Real seconds per model second. The in-process calibration runs in virtual time, where no scale is too fast;
the command-line one calibrates a worker process in real time, slowly enough that a busy 2-core host does not
swamp its timings."""
HELD_OUT = [(300, 40), (1500, 60), (700, 20), (100, 100), (3000, 30)]
"""Lone requests the plan does not send (prompt, output): the fitted profile must predict them."""
TOLERANCE = 0.15


def emulated(profile: PerfProfile) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    return emulated_client(profile, MODEL, TIME_SCALE)


@pytest.mark.parametrize("seq_share", [0.0, 0.06])
def test_calibration_recovers_an_emulated_workers_unknown_constants(seq_share: float) -> None:
    """And a per-call step cost (``seq_s``, here a share of ``iter_base_s``: 0.06 makes a step of 8 decoding
    calls 48% slower than without it, as on vLLM's CPU server) where the worker has one."""
    truth = replace(unknown_profile(), seq_s=seq_share * unknown_profile().iter_base_s)
    settings = PlanSettings(max_prompt=2048, max_output=64, max_concurrency=8, repeats=1, step_output=64)

    async def calibrate_emulated() -> CalibrationResult:
        async with emulated(truth) as client:
            clock = asyncio.get_running_loop().time
            return await calibrate(
                "http://emulator", MODEL, gpu="A100", budget_s=120.0, settings=settings, client=client, clock=clock
            )

    # In virtual time: the worker's model and the calibration's clock are the loop's, and only the model moves
    # it, so what is measured is the model's latencies however busy the machine (in real time, event-loop
    # lag on a loaded 2-core host added to every measured latency, and the fit came out over TOLERANCE).
    with asyncio.Runner(loop_factory=virtual_time_loop) as runner:
        res = runner.run(calibrate_emulated())
    fitted = scaled_profile(res, TIME_SCALE)
    for prompt, out in HELD_OUT:
        want, got = truth.single_latency(prompt, out), fitted.single_latency(prompt, out)
        assert abs(got / want - 1) <= TOLERANCE, (prompt, out, got, want)
    for n in (4, 8):  # decode steps of batches the plan measured
        want, got = truth.iter_time(n, n * 600, decoders=n), fitted.iter_time(n, n * 600, decoders=n)
        assert abs(got / want - 1) <= TOLERANCE, (n, got, want)
    if truth.seq_s:
        assert 0.5 * truth.seq_s <= fitted.seq_s <= 1.5 * truth.seq_s, (fitted.seq_s, truth.seq_s)
    assert res.kv_capacity_tokens == truth.kv_capacity_tokens // KV_BLOCK_SIZE * KV_BLOCK_SIZE
    assert not res.stopped_by_budget
    entry = yaml.safe_load(render_profile_yaml(res, scale=TIME_SCALE))["profiles"][MODEL]["A100"]
    spec = ProfileSpec.model_validate(entry)
    assert spec.iter_base_s == pytest.approx(fitted.iter_base_s, rel=1e-5)
    assert spec.basis.startswith("measured")


def test_cli_calibrates_a_worker_started_with_a_non_catalogue_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = unknown_profile()
    doc = yaml.safe_load(Path(DEFAULT_GPU_CATALOG).read_text())
    entry = doc["profiles"][MODEL]["A100"]
    for k in ("iter_base_s", "token_s", "ctx_s", "request_overhead_s", "kv_capacity_tokens"):
        entry[k] = getattr(truth, k)
    catalog = tmp_path / "gpus.yaml"
    catalog.write_text(yaml.safe_dump(doc))
    args = ["--gpu", "A100", "--catalog", str(catalog), "--time-scale", str(TIME_SCALE)]
    out, plot, js = tmp_path / "a100.yaml", tmp_path / "fit.png", tmp_path / "fit.json"
    with emulator_process(args, tmp_path / "emu.log") as url:
        head = ["calibrate", "--worker", url, "--model", MODEL, "--gpu", "A100", "--tp", "4", "--quiet"]
        plan = [
            "--max-prompt",
            "1024",
            "--max-output",
            "32",
            "--max-concurrency",
            "4",
            "--repeats",
            "1",
            "--step-output",
            "32",
        ]
        outs = ["--time-scale", str(TIME_SCALE), "--out", str(out), "--plot", str(plot), "--json", str(js)]
        code = main([*head, *plan, *outs])
    assert code == 0, capsys.readouterr().err
    spec = ProfileSpec.model_validate(yaml.safe_load(out.read_text())["profiles"][MODEL]["A100"])
    assert spec.tp == 4 and spec.kv_capacity_tokens == truth.kv_capacity_tokens // 16 * 16
    fitted = PerfProfile("A100", MODEL, spec.iter_base_s, spec.token_s, spec.ctx_s, spec.request_overhead_s, 1, 1, 2048)
    assert abs(fitted.single_latency(500, 20) / truth.single_latency(500, 20) - 1) <= TOLERANCE
    assert plot.stat().st_size > 0
    assert {p["kind"] for p in json.loads(js.read_text())["probes"]} == {"lone", "batch", "step", "prefix"}


def test_cli_rejects_a_bad_budget(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "--worker", "http://127.0.0.1:9", "--model", MODEL, "--budget-s", "0"])
    assert info.value.code == 2
    assert "hexflow calibrate: error: argument --budget-s: expected a positive number" in capsys.readouterr().err


def test_an_unreachable_worker_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", "--worker", "http://127.0.0.1:9", "--model", MODEL, "--budget-s", "5", "--quiet"])
    assert code == 2
    assert "request failed" in capsys.readouterr().err


async def test_each_request_of_a_batch_and_each_calibration_run_sends_its_own_prompt() -> None:
    sent: list[list[int]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body["prompt"])
        n = len(body["prompt"])
        usage = {"prompt_tokens": n, "completion_tokens": body["max_tokens"], "total_tokens": n + body["max_tokens"]}
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    probe = Probe("batch", 64, 4, 4, 7)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        first, second = ProbeWorker(client, "http://w", "m"), ProbeWorker(client, "http://w", "m")
        for j in range(probe.concurrency):
            await first.complete(probe, lambda: 0.0, 5.0, j)
        await first.complete(probe, lambda: 0.0, 5.0, 0)  # the same request again: the same prompt
        await second.complete(probe, lambda: 0.0, 5.0, 0)  # another run: another prompt
    batch = [tuple(p) for p in sent[:4]]
    assert len(set(batch)) == 4 and all(len(p) == 64 for p in batch)
    assert tuple(sent[4]) == batch[0]
    assert tuple(sent[5]) not in batch

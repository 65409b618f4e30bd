"""Outlier ejection and the whole-call bound, on a fake transport: verdicts, back-off, limits, probes."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.config import load_gpu_catalog
from gateway.config.cluster import make_worker
from gateway.config.gateway import OutlierConfig, load_gateway_config
from gateway.core.scheduler import Scheduler
from gateway.core.worker import WorkerInfo
from gateway.core.workflow import CallSpec, Stage, StagedWorkflow
from gateway.errors import CallFailed, ConfigError, WorkerError
from gateway.live.outliers import OutlierDetector
from gateway.live.pool import WorkerPool
from gateway.live.transport import CallResult, LiveCall
from gateway.live.worker_state import WorkerState, typical_ratio
from tests.fakes import FakeClock
from tests.live.fake_transport import FakeTransport, Hold, fake_pool, one_call
from tests.live.harness import write_config

OK_BODY = {"choices": [{"text": "x"}]}


class Scripted(FakeTransport):
    """Answers by worker name: ``ok``, ``fail`` (a worker error) or ``hang`` (never answers)."""

    def __init__(self, behaviour: dict[str, str]) -> None:
        super().__init__()
        self.behaviour = behaviour
        self.sent: list[tuple[str, str]] = []  # (worker, endpoint)

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        self.sent.append((worker.name, call.endpoint))
        what = self.behaviour.get(worker.name, "ok")
        if what == "fail":
            raise WorkerError("scripted failure")
        if what == "hang":
            await asyncio.Event().wait()
        return CallResult(OK_BODY)


def _pool(tmp: Path, t: Scripted, n: int = 2, *, outlier: OutlierConfig | None = None, **timeouts: float) -> WorkerPool:
    return fake_pool(
        tmp,
        t,
        workers=n,
        policy="rr-fcfs",
        timeouts=timeouts,
        outlier=outlier or OutlierConfig(min_calls=3, window=10),
    )


GPUS = ["A100", "A100", "A100", "L40S", "L40S"]
_SCHED = Scheduler(
    [
        make_worker(load_gpu_catalog(), name=f"w{i}", gpu=g, model="llama-3.1-70b", capacity=4)
        for i, g in enumerate(GPUS)
    ],
    "rr-fcfs",
    random.Random(0),
)


def _state(index: int, window: Sequence[float | None]) -> WorkerState:
    """Worker ``index`` of ``GPUS`` with the given recent window."""
    st = WorkerState(index, _SCHED, recent=deque())
    for x in window:
        st.add_recent(x)
    return st


# ---------------------------------------------------------------------------------------------- verdicts


def test_error_rate_verdict_needs_enough_calls_and_a_margin_over_the_peers() -> None:
    det = OutlierDetector(OutlierConfig(min_calls=4, error_rate=0.3, error_rate_margin=0.2))
    healthy = _state(1, [1.0] * 10)
    assert det.verdict(_state(0, [None, None, 1.0]), [healthy]) is None, "3 calls are too few to judge"
    flaky = _state(0, [None, 1.0, None, 1.0])
    assert det.verdict(flaky, [healthy]) == "2 of its last 4 calls failed (peers: 0%)"
    # Everyone fails as much (the model, not the worker): nobody is an outlier.
    assert det.verdict(flaky, [_state(1, [None, 1.0] * 5)]) is None
    assert det.verdict(flaky, []) is not None, "without peers' data the peers' error rate reads 0"
    assert OutlierDetector(OutlierConfig(enabled=False)).verdict(flaky, [healthy]) is None


def test_latency_verdict_ignores_one_stall_but_not_a_worker_slow_on_a_fifth_of_its_calls() -> None:
    det = OutlierDetector(OutlierConfig(min_calls=5, latency_ratio=3.0))
    peers = [_state(1, [1.2] * 10), _state(2, [0.9] * 10)]
    assert det.verdict(_state(0, [1.0] * 9 + [60.0]), peers) is None, "one stall"
    slow = _state(0, [1.0] * 16 + [30.0] * 4)
    reason = det.verdict(slow, peers)
    assert reason is not None and "predicted latency" in reason
    assert det.verdict(slow, [_state(1, [1.0] * 4)]) is None, "peers with fewer than min_calls: no comparison"
    assert typical_ratio([]) == 1.0 and typical_ratio([2.0]) == 2.0 and typical_ratio([1.0, 9.0]) == 1.0


def test_latency_is_compared_with_the_workers_of_the_same_profile_when_they_have_data() -> None:
    det = OutlierDetector(OutlierConfig(min_calls=5, latency_ratio=3.0))
    a100s = [_state(0, [1.0] * 10), _state(1, [1.1] * 10)]
    # Both L40S run 3.5x their profile: the profile is off, not the worker.
    assert det.verdict(_state(3, [3.5] * 10), [*a100s, _state(4, [3.4] * 10)]) is None
    # One L40S without a same-profile peer with data: compared with everyone else.
    assert det.verdict(_state(3, [3.5] * 10), [*a100s, _state(4, [])]) is not None


def test_ratios_are_clamped_when_recorded() -> None:
    st = _state(0, [])
    st.add_recent(1e9)
    st.add_recent(0.0)
    st.add_recent(None)
    assert list(st.recent) == [100.0, 0.01, None]
    assert (st.recent_failed, st.recent_returned) == (1, 2)
    assert st.status(0.0)["recent"]["error_rate"] == pytest.approx(0.3333)
    st.clear_recent()
    assert (st.recent_failed, st.recent_returned, st.recent_typical) == (0, 0, None)


def test_backoff_doubles_up_to_its_cap_and_is_forgotten_after_a_long_admission() -> None:
    det = OutlierDetector(OutlierConfig(base_ejection_s=10, max_ejection_s=35))
    st = _state(0, [])
    lengths = []
    for _ in range(4):
        lengths.append(det.backoff(st, 0.0))
        st.ejections += 1
    assert lengths == [10, 20, 35, 35]
    st.readmitted_at = 100.0
    assert det.backoff(st, 120.0) == 35, "re-admitted 20 s ago: still remembered"
    assert det.backoff(st, 136.0) == 10, "admitted for longer than max_ejection_s: forgotten"


def test_outlier_config_is_checked() -> None:
    with pytest.raises(ValueError, match="min_calls"):
        OutlierConfig(window=5, min_calls=6)
    with pytest.raises(ValueError, match="base_ejection_s"):
        OutlierConfig(base_ejection_s=400)


def test_a_bad_outlier_section_names_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"], health={"outlier": {"window": 1}})
    with pytest.raises(ConfigError, match=r"health\.outlier\.window"):
        load_gateway_config(path)


# ------------------------------------------------------------------------------------------- pool


async def test_a_call_that_never_answers_is_failed_at_its_bound_and_retried_on_another_worker(
    tmp_path: Path,
) -> None:
    t = Scripted({"a100-0": "hang"})
    pool = _pool(tmp_path, t, call_floor_s=0.05, call_factor=1.0)
    await pool.start()
    try:
        out: list[object] = []
        c = one_call(1, out)
        pool.submit(c)
        for _ in range(200):
            if out:
                break
            await asyncio.sleep(0.01)
        assert len(out) == 1 and isinstance(out[0], CallResult)
        assert [w for w, _ in t.sent] == ["a100-0", "a100-1"]
        assert c.failed_on == {"a100-0"} and "no answer within the call's bound" in c.last_error
        assert list(pool.workers[0].recent) == [None]
    finally:
        await pool.stop()


async def test_retries_avoid_every_worker_that_failed_the_call_while_another_takes_calls(tmp_path: Path) -> None:
    t = Scripted({"a100-0": "fail", "a100-1": "fail"})
    pool = _pool(tmp_path, t, 3, outlier=OutlierConfig(enabled=False))
    pool.failures_to_down = 100
    await pool.start()
    try:
        out: list[object] = []
        pool.submit(one_call(1, out))
        await asyncio.sleep(0.05)
        assert [w for w, _ in t.sent] == ["a100-0", "a100-1", "a100-2"]
        assert isinstance(out[0], CallResult)
        # When every worker failed it, the retry may go anywhere (up to max_attempts).
        t.behaviour = {"a100-0": "fail", "a100-1": "fail", "a100-2": "fail"}
        t.sent.clear()
        pool.submit(one_call(2, out))
        await asyncio.sleep(0.05)
        assert len(t.sent) == 3 and isinstance(out[1], CallFailed) and out[1].status == 502
    finally:
        await pool.stop()


async def test_a_failing_worker_is_ejected_never_the_last_one_and_readmitted_by_a_probe_call(tmp_path: Path) -> None:
    t = Scripted({"a100-0": "fail"})
    pool = _pool(tmp_path, t, outlier=OutlierConfig(min_calls=3, window=10, base_ejection_s=0.01, max_ejection_s=1))
    pool.failures_to_down = 100
    bad, good = pool.workers
    await pool.start()
    try:
        out: list[object] = []
        for i in range(12):
            pool.submit(one_call(i, out))
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert len(out) == 12 and all(isinstance(o, CallResult) for o in out)
        assert bad.ejected and not bad.eligible and bad.ejections == 1 and good.eligible
        assert "calls failed" in bad.ejected_reason and pool.status()[0]["ejected"] is True
        assert pool.healthy == 1
        # The back-off is over: the probe call fails (the worker still fails): longer back-off.
        await asyncio.sleep(0.02)
        await asyncio.gather(*pool.monitor.probe_ejected())
        assert bad.ejected and bad.ejections == 2 and t.sent[-1] == ("a100-0", "/v1/completions")
        # It recovers: the next probe re-admits it with a clean window.
        t.behaviour = {}
        await asyncio.sleep(0.05)
        await asyncio.gather(*pool.monitor.probe_ejected())
        assert not bad.ejected and bad.eligible and not bad.recent and pool.healthy == 2
        assert [e for _, w, e in pool.events if w == "a100-0"] == ["ejected", "probe_failed", "readmitted"]
        # The good worker, now alone taking calls, is never ejected, whatever it does.
        t.behaviour = {"a100-0": "hang", "a100-1": "fail"}
        pool.eject(bad, "test")
        for i in range(6):
            pool.submit(one_call(100 + i, out))
        await asyncio.sleep(0.05)
        assert good.eligible and not good.ejected
    finally:
        await pool.stop()


async def test_at_most_max_ejected_fraction_of_the_workers_are_ejected(tmp_path: Path) -> None:
    t = Scripted({"a100-0": "fail", "a100-1": "fail", "a100-2": "fail"})
    pool = _pool(tmp_path, t, 4, outlier=OutlierConfig(min_calls=3, window=10, error_rate_margin=0.0))
    pool.failures_to_down = 100
    await pool.start()
    try:
        out: list[object] = []
        for i in range(40):
            pool.submit(one_call(i, out))
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        assert sum(st.ejected for st in pool.workers) == 2, "half of 4 workers at most"
        assert len(out) == 40, "every call ended"
    finally:
        await pool.stop()


async def test_a_calls_latency_is_judged_against_the_load_it_ran_under(tmp_path: Path) -> None:
    """Outlier ejection compares a call with the model's prediction given the load it actually saw: the batch
    it joined, the prompts sent to the worker while it ran (their prefill stalls its decode) and the calls
    that joined its batch. A worker given a burst is not an outlier for being busy."""
    clock = FakeClock()
    t = Hold()
    pool = fake_pool(tmp_path, t, clock)
    await pool.start()
    st = pool.workers[0]
    try:
        out: list[object] = []
        first = one_call(0, out)
        pool.submit(first)
        await asyncio.sleep(0.01)
        assert st.inflight == {first} and first.load_marks == (0.0, first.prefill_s, 1)
        clock.t = 1.0
        later = [one_call(i, out) for i in range(1, 4)]  # capacity 4: three join it at t=1
        for c in later:
            pool.submit(c)
        await asyncio.sleep(0.01)
        assert len(st.inflight) == 4
        clock.t = 3.0
        st.advance_load(3.0)  # as the pool does when a call returns
        mean_batch = (1 * 1.0 + 4 * 2.0) / 3.0  # one call for a second, then four for two
        joined = sum(c.prefill_s for c in later)
        expected = (
            pool.predicted_s(st, first)
            + joined
            + (mean_batch - 1) * st.info.profile.token_s * (first.spec.output_tokens - 1)
        )
        assert joined > 0 and pool.under_load_s(st, first, 3.0) == pytest.approx(expected)
        # Alone from send to return, nothing is added.
        t.release.set()
        await asyncio.sleep(0.01)
        t.release.clear()
        lone = one_call(9, out)
        pool.submit(lone)
        await asyncio.sleep(0.01)
        clock.t = 4.0
        st.advance_load(4.0)
        assert pool.under_load_s(st, lone, 4.0) == pytest.approx(pool.predicted_s(st, lone))
        t.release.set()
        await asyncio.sleep(0.01)
    finally:
        await pool.stop()


def test_a_worker_running_as_predicted_is_never_a_latency_outlier() -> None:
    """Peers whose predictions were conservative read far below 1; a worker at 1 (as predicted) is not 3x
    them for that."""
    det = OutlierDetector(OutlierConfig(min_calls=5, latency_ratio=3.0))
    peers = [_state(1, [0.3] * 10), _state(2, [0.28] * 10)]
    assert det.verdict(_state(0, [1.0] * 10), peers) is None
    assert det.verdict(_state(0, [3.2] * 10), peers) is not None, "3x its prediction: slow whatever its peers"


# ------------------------------------------------------------------- judged by the tokens processed


class Paced(FakeTransport):
    """Answers each call after the time the worker's profile gives the tokens it processed, on a fake clock.

    By worker name: ``verbosity`` multiplies the completion tokens written (and reported in the answer's
    usage) over the call's expected ones; ``slowness`` multiplies the profile's time; ``usage=False``
    answers without a usage (as a stream without ``include_usage`` does). Calls go one at a time, so the time
    a call takes is the clock's advance while it runs.
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.verbosity: dict[str, int] = {}
        self.slowness: dict[str, float] = {}
        self.usage = True

    async def send(self, worker: WorkerInfo, call: LiveCall) -> CallResult:
        spec = call.spec
        out = spec.output_tokens * self.verbosity.get(worker.name, 1)
        self.clock.t += self.slowness.get(worker.name, 1.0) * worker.profile.single_latency(spec.input_tokens, out)
        if not self.usage:
            return CallResult(OK_BODY)
        return CallResult(OK_BODY, spec.input_tokens, out)


@pytest.mark.parametrize(
    ("verbosity", "slowness", "usage", "ejected"),
    [
        (10, 1.0, True, False),  # the model wrote 10x the expected answer, at the profile's speed: healthy
        (1, 1.0, False, False),  # no usage reported: judged by the expected tokens, which it processed
        (1, 3.0, True, True),  # 3x slower per token than its profile: an outlier
        (10, 3.0, True, True),  # ... however long its answers
    ],
)
async def test_a_worker_is_judged_by_its_speed_on_the_tokens_it_processed_not_by_the_answers_length(
    tmp_path: Path, verbosity: int, slowness: float, usage: bool, ejected: bool
) -> None:
    clock = FakeClock()
    t = Paced(clock)
    t.verbosity["a100-0"] = verbosity
    t.slowness["a100-0"] = slowness
    t.usage = usage
    # latency_ratio 2.5: a call 3x its lone-request time reads a little under 3x the load-aware prediction.
    outlier = OutlierConfig(window=10, min_calls=5, latency_ratio=2.5)
    pool = fake_pool(tmp_path, t, clock, workers=3, policy="rr-fcfs", outlier=outlier)
    await pool.start()
    try:
        out: list[object] = []
        for i in range(30):  # one at a time, round-robin: ten calls each
            wf = StagedWorkflow(i, "t", clock.t, clock.t + 1000.0, [Stage("k", (CallSpec("k", 1000, 50),))])
            call = LiveCall(id=i, workflow=wf, spec=CallSpec("k", 1000, 50), ready_at=clock.t)
            call.on_done = lambda c, o: out.append(o)
            pool.submit(call)
            for _ in range(100):
                if len(out) > i:
                    break
                await asyncio.sleep(0)
        assert len(out) == 30 and all(isinstance(o, CallResult) for o in out)
        bad = pool.workers[0]
        assert bad.name == "a100-0" and bad.ejected is ejected, bad.status(clock.t)
        assert not any(st.ejected for st in pool.workers[1:])
        ratio = bad.recent_typical
        assert ratio is not None and ratio == pytest.approx(slowness, rel=0.1)
    finally:
        await pool.stop()

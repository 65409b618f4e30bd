"""The dispatch hot path (``Estimator.snapshot``, ``mean_base_latency``) equals the per-worker methods exactly."""

from __future__ import annotations

import random

from gateway.config import load_cluster
from gateway.core.estimates import Estimator
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow

KINDS = ("generate_candidate", "revise", "evaluate")


def loaded_estimator(seed: int) -> tuple[Estimator, float]:
    """mixed-12 (seven profiles, shared caches) with calls queued, in flight and observed, some ratios stale."""
    est = Estimator(load_cluster("mixed-12"), max_age_s=50.0)
    rng = random.Random(seed)
    wf = StagedWorkflow(0, "t", 0.0, 1e9, [Stage("x", (CallSpec("x", 1, 1),))])
    now = 0.0
    for i in range(400):
        now += rng.random()
        spec = CallSpec(rng.choice(KINDS), rng.randint(1, 9000), rng.randint(1, 700))
        w = rng.randrange(len(est.workers))
        call = Call(i, wf, spec, now)
        call.t_comp = est.t_comp(w, spec.kind, spec.input_tokens, spec.output_tokens, now)
        call.worker = w
        est.enqueue(call, w)
        if rng.random() < 0.7:
            est.dequeue(call, w)
            est.start(call, w, now)
            call.started_at = now
            if rng.random() < 0.5:
                est.release(call, w)
                est.observe(call, call.service_s * rng.uniform(0.5, 2.0), now)
    return est, now


def test_snapshot_equals_the_per_worker_estimates_bit_for_bit() -> None:
    for seed in range(3):
        est, now = loaded_estimator(seed)
        everyone = list(range(len(est.workers)))
        for workers in (everyone, everyone[::3], [5, 0, 11]):
            for n_in, n_out in ((1, 1), (308, 5), (11748, 678), (4096, 2)):
                for kind in KINDS:
                    t_comp, t_queue, harm, inflight = est.snapshot(workers, kind, n_in, n_out, now)
                    assert t_comp == [est.t_comp(w, kind, n_in, n_out, now) for w in workers]
                    assert t_queue == [est.t_queue(w, now) for w in workers]
                    assert harm == [est.prefill_s(w, n_in) * est.loads[w].inflight for w in workers]
                    assert inflight == [est.loads[w].inflight for w in workers]


def test_mean_base_latency_is_the_mean_of_the_per_worker_latencies() -> None:
    est = Estimator(load_cluster("mixed-12"))
    for workers in (list(range(12)), [11, 3, 3, 0], []):
        for n_in, n_out in ((1, 1), (308, 5), (11748, 678)):
            per_worker = [est.base_latency(w, n_in, n_out) for w in workers]
            expected = sum(per_worker) / len(workers) if workers else 0.0
            assert est.mean_base_latency_runs(est.group_runs(workers), n_in, n_out) == expected


def test_a_capacity_change_reaches_the_snapshot() -> None:
    est, now = loaded_estimator(7)
    before = est.snapshot([2], "revise", 5963, 79, now)
    est.set_capacity(2, 1)
    after = est.snapshot([2], "revise", 5963, 79, now)
    assert after[1] == [est.t_queue(2, now)] and after[0] == [est.t_comp(2, "revise", 5963, 79, now)]
    assert after != before


def test_queue_view_equals_the_per_worker_queue_and_backlog_bit_for_bit() -> None:
    for seed in range(3):
        est, now = loaded_estimator(seed)
        everyone = list(range(len(est.workers)))
        for workers in (everyone, everyone[::3], [5, 0, 11], []):
            for at in (now, now + 0.5, now + 50.0):  # in-flight calls ahead of, at and past their predicted end
                t_queue, backlog = est.queue_view(workers, at)
                assert t_queue == [est.t_queue(w, at) for w in workers]
                assert backlog == [est.queue_view([w], at)[1][0] for w in workers]


def test_full_batch_rate_is_the_sum_of_the_per_worker_rates_bit_for_bit() -> None:
    for seed in range(3):
        est, now = loaded_estimator(seed)
        everyone = list(range(len(est.workers)))
        for workers in (everyone, everyone[::3], [5, 0, 11], []):
            for n_in, n_out in ((1, 1), (308, 5), (11748, 678)):
                for kind in KINDS:
                    expected = 0.0
                    for w in workers:
                        g = est.gpu_s(w, n_in, n_out) * est.ratio(w, kind, now)
                        if g > 0:
                            expected += 1.0 / g
                    assert est.full_batch_rate(workers, kind, n_in, n_out, now) == expected


def test_the_snapshot_forgets_ratios_as_the_worker_does_and_reads_a_new_worker_as_unlearned() -> None:
    est, now = loaded_estimator(3)
    learned = [w for w in range(len(est.workers)) if any(k == "revise" for k in est.ratios(w, now))]
    assert len(learned) >= 2, "the loaded estimator learned revise ratios on several workers"
    a, b = learned[:2]
    est.reset_worker(a, est.workers[a])  # a new worker in the slot: nothing learned
    est.set_profile(b, est.workers[b].profile, "refit")  # a refit: its ratios restart
    c = est.add_worker(est.workers[0])  # a slot beyond every learned row
    for w in (a, b, c):
        assert est.ratio(w, "revise", now) == 1.0
    workers = [a, b, c, *learned[2:]]
    for n_in, n_out in ((308, 5), (11748, 678)):
        t_comp, _, _, _ = est.snapshot(workers, "revise", n_in, n_out, now)
        assert t_comp == [est.t_comp(w, "revise", n_in, n_out, now) for w in workers]


def test_scan_fills_each_workers_row_and_returns_the_least_t_comp() -> None:
    est, now = loaded_estimator(4)
    everyone = list(range(len(est.workers)))
    for workers in (everyone, [7, 2, 9]):
        for cached in (None, [((w * 37) % 5) * 512 for w in workers]):
            t_comp, t_queue, harm, inflight = est.snapshot(workers, "revise", 6000, 80, now, cached)
            for w in everyone:  # stale rows: what the scan writes must not depend on them
                est.rows[w].t_comp = est.rows[w].t_queue = est.rows[w].harm = -1.0
            if cached is not None:
                for w, c in zip(workers, cached, strict=True):
                    est.rows[w].credit = c
            else:
                for w in workers:  # ignored unless credited
                    est.rows[w].credit = 4096
            least = est.scan(workers, "revise", 6000, 80, now, credited=cached is not None)
            assert least == min(t_comp)
            rows = [est.rows[w] for w in workers]
            assert [r.t_comp for r in rows] == t_comp
            assert [r.t_queue for r in rows] == t_queue
            assert [r.harm for r in rows] == harm
            assert [r.inflight for r in rows] == inflight
            credit = cached or [0] * len(workers)
            assert t_comp == [est.t_comp(w, "revise", 6000, 80, now, c) for w, c in zip(workers, credit, strict=True)]
    assert est.scan([], "revise", 6000, 80, now) == float("inf")


def test_a_worker_added_later_gets_a_row() -> None:
    est, now = loaded_estimator(5)
    w = est.add_worker(est.workers[0])
    est.scan([w], "evaluate", 900, 20, now)
    assert est.rows[w].t_comp == est.t_comp(w, "evaluate", 900, 20, now)

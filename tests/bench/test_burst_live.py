"""The live burst bench's pieces: the demo workload recorded as the emulator runs it, its deadline unit, and
(slow) one small live run beside its simulated prediction."""

from __future__ import annotations

import pytest

from gateway.bench.burst_live import demo_latency, live_setup, record_demo
from gateway.cli.common import load_workers
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TEST
from gateway.text2sql.demo import demo_questions


def test_the_demo_workload_is_recorded_call_by_call() -> None:
    queries = record_demo(seed=0)[0]
    assert len(queries) == len(demo_questions())
    kinds = {c.kind for q in queries for c in q}
    assert (
        {KEYWORDS, IR, CANDIDATE, UNIT_TEST, EVALUATE}
        <= kinds
        <= {KEYWORDS, IR, CANDIDATE, REVISE, UNIT_TEST, EVALUATE}
    )
    for q in queries:
        assert [c.kind for c in q][:2] == [KEYWORDS, IR]
        assert sum(c.kind == CANDIDATE for c in q) == 2  # full quality: two candidates
        assert all(c.input_tokens > 0 and 0 < c.output_tokens <= 4096 for c in q)
    # A wrong first candidate that fails or returns nothing is revised: some questions have revise rounds.
    assert any(c.kind == REVISE for q in queries for c in q)
    assert record_demo(seed=0)[0] == queries  # deterministic


def test_a_live_setup_measures_deadlines_in_demo_questions() -> None:
    workers = load_workers("paper-4gpu")
    st = live_setup(workers, workflows=50, slo_scale=3.0, seed=0, n_seeds=1)
    unit = demo_latency(workers, st.queries)
    assert 0 < unit < 60 and st.slo_s == pytest.approx(3.0 * unit)
    assert st.bound.rate_qps > 0 and len(st.workflows(1.0)) == 50


def test_the_pipeline_predicts_with_its_own_shapes_once_it_has_answered_enough() -> None:
    """After the demo questions, the live pipeline's template is CHESS fitted to them: no unit-tester agent,
    candidate prompts of about a thousand tokens (CHESS on BIRD: about eleven thousand)."""
    from gateway.config.workflows import CHESS_TEMPLATE
    from gateway.core.workflow import UNIT_TESTER

    _, template = record_demo(seed=0)
    assert template is not CHESS_TEMPLATE and UNIT_TESTER not in {p.kind for p in template.phases}
    [cand] = [p for p in template.phases if p.kind == CANDIDATE]
    [chess] = [p for p in CHESS_TEMPLATE.phases if p.kind == CANDIDATE]
    assert cand.input_tokens < chess.input_tokens / 5 and cand.width == chess.width


def test_a_small_live_burst_runs_beside_its_simulation() -> None:
    """Smoke size: a dozen demo questions through a real gateway (with ``quality: adaptive``) on an emulated
    cluster at a fast time scale, beside the simulator's run; every question is accounted in both worlds and
    the dump holds each side by side."""
    from gateway.bench.burst_live import LiveBurstReport, format_live_report, run_live_burst
    from gateway.core.degrade import Knobs, QualityModel, knob_grid

    workers = load_workers("paper-4gpu")
    base = live_setup(workers, workflows=12, slo_scale=3.0, seed=0, n_seeds=1)
    quality = QualityModel({k: 1.0 - 0.01 * i for i, k in enumerate(knob_grid(Knobs(2, 10, True)))}, "smoke")
    dump: list[dict[str, object]] = []
    rep = run_live_burst(
        base, ("poisson", None), 0.3, ["hexgen+adaptive"], quality, cluster="paper-4gpu", time_scale=0.1, dump=dump
    )
    assert isinstance(rep, LiveBurstReport)
    [v] = rep.variants
    assert [o.arrived for o in v.live] == [12] and [o.arrived for o in v.sim] == [12]
    [run] = dump
    qs = run["questions"]
    assert isinstance(qs, list) and len(qs) == 12
    for q in qs:
        assert q["sim"]["latency"] > 0 and q["sim"]["decisions"], "the simulated workflow decided at arrival"
        assert q["live"]["status"] in ("ok", "no_valid_sql", "deadline_exceeded", "failed"), q["live"]
        assert q["live"]["calls"], "the live answer lists its calls"
    assert "hexgen+adaptive" in format_live_report(rep)


def test_each_systems_admission_runs_live_beside_its_simulation() -> None:
    """Ours with its predictive admission (and the burst regime), a baseline with a queue-length 429 at the limit
    tuned in the simulator: a dozen questions each, every one accounted in both worlds."""
    from gateway.bench.burst_live import run_live_burst
    from gateway.core.degrade import Knobs, QualityModel, knob_grid

    workers = load_workers("paper-4gpu")
    base = live_setup(workers, workflows=12, slo_scale=3.0, seed=0, n_seeds=1)
    quality = QualityModel({k: 1.0 - 0.01 * i for i, k in enumerate(knob_grid(Knobs(2, 10, True)))}, "smoke")
    variants = ["hexgen+adaptive+admit", "edf+admit"]
    rep = run_live_burst(base, ("flash", "flash"), 0.45, variants, quality, cluster="paper-4gpu", time_scale=0.1)
    assert [v.variant for v in rep.variants] == variants
    for v in rep.variants:
        assert [o.arrived for o in v.live] == [12] and [o.arrived for o in v.sim] == [12]
        assert v.sim[0].met + v.sim[0].refused + v.sim[0].shed <= 12

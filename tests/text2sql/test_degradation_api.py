"""``POST /v1/text2sql`` degrades for an ``adaptive`` tenant under an impossible deadline, through the live
gateway on emulated workers answering from a script; a ``full`` tenant never does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.core.admission import ADMISSION_HEADROOM
from gateway.core.predict import CompletionPredictor
from gateway.text2sql.answers import build_demo_answers
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, emulators, gateway_client, write_config
from workers.scripted import AnswersResponder

REPO = Path(__file__).resolve().parents[2]


def _setup(tmp: Path, quality: str) -> None:
    db = write_sqlite(tmp / f"{DB_ID}.sqlite")
    (tmp / "databases.yaml").write_text(yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{db.name}"}}}))
    tenants = yaml.safe_load((REPO / "config" / "tenants.yaml").read_text())
    for t in tenants["tenants"]:
        # Admission would refuse an impossible deadline; let it in, to see what the pipeline does with it.
        t.update(min_deadline_s=0.001, predictive_admission=False)
        if t["name"] == "batch":
            t["quality"] = quality
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(tenants))


async def _ask(tmp: Path, key: str, deadline_s: float) -> tuple[dict[str, object], str]:
    responder = AnswersResponder(dict(build_demo_answers()))
    q = demo_questions()[0].question
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=key) as (client, _):
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID, "deadline_s": deadline_s})
            assert r.status_code == 200, r.text
            metrics = (await client.get("/metrics")).text
    return dict(r.json()), metrics


async def test_an_adaptive_tenant_under_an_impossible_deadline_gets_the_floor_and_is_told_why(tmp_path: Path) -> None:
    _setup(tmp_path, "adaptive")
    body, metrics = await _ask(tmp_path, BATCH_KEY, 0.01)
    assert body["quality_mode"] == "adaptive"
    degraded = body["degraded"]
    assert isinstance(degraded, list)
    assert [d["step"] for d in degraded] == ["candidates", "evaluation"]  # no revision was needed
    first = degraded[0]
    assert first["at"] == "arrival" and first["reason"] == "predicted to miss the deadline"
    assert first["predicted_s"] > first["time_left_s"]
    assert len(body["candidates"]) == 1  # type: ignore[arg-type]
    kinds = [s["kind"] for s in body["stages"]]  # type: ignore[attr-defined]
    assert "evaluate" not in kinds and "generate_unit_test" not in kinds
    for step, n in (("candidates", 1), ("revisions", 0), ("evaluation", 1)):
        assert f'hexflow_degraded_workflows_total{{step="{step}",tenant="batch"}} {n}.0' in metrics
    assert 'hexflow_degraded_workflows_total{step="candidates",tenant="interactive"} 0.0' in metrics


async def test_a_full_tenant_is_never_degraded(tmp_path: Path) -> None:
    _setup(tmp_path, "adaptive")  # batch adaptive; interactive keeps the default, full
    body, metrics = await _ask(tmp_path, INTERACTIVE_KEY, 0.01)
    assert body["quality_mode"] == "full" and body["degraded"] == []
    assert len(body["candidates"]) == 2  # type: ignore[arg-type]
    assert 'hexflow_degraded_workflows_total{step="candidates",tenant="interactive"} 0.0' in metrics


@pytest.mark.parametrize(("quality", "status"), [("full", 422), ("adaptive", 200)])
async def test_an_adaptive_tenant_is_admitted_when_its_floor_fits(tmp_path: Path, quality: str, status: int) -> None:
    db = write_sqlite(tmp_path / f"{DB_ID}.sqlite")
    (tmp_path / "databases.yaml").write_text(yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{db.name}"}}}))
    tenants = yaml.safe_load((REPO / "config" / "tenants.yaml").read_text())
    for t in tenants["tenants"]:
        t.update(min_deadline_s=0.001)
        if t["name"] == "interactive":  # on_predicted_miss: reject
            t["quality"] = quality
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    responder = AnswersResponder(dict(build_demo_answers()))
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=INTERACTIVE_KEY) as (client, app):
            gw = app.state.gateway
            q = demo_questions()[0].question
            # One question first, in no hurry: the model is observed (a plan before that is a guess, not refused on).
            warm = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID, "deadline_s": 60})
            assert warm.status_code == 200, warm.text
            pred = CompletionPredictor(gw.scheduler, gw.clock(), committed_s=gw.admitter.committed_s)
            service = app.state.text2sql
            db = service.registry.get(DB_ID)
            full_plan, floor_plan = [await service.pipeline.plan(db, m) for m in ("full", "adaptive")]
            full, floor = pred.duration(full_plan.rest()), pred.duration(floor_plan.rest())
            assert floor < full
            # The floor fits, the full pipeline does not, even on idle workers: no wait helps it (422).
            deadline = (floor + full) / 2 / ADMISSION_HEADROOM
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID, "deadline_s": deadline})
            assert r.status_code == status, r.text


async def test_a_burst_caps_an_adaptive_tenants_questions_and_says_so(tmp_path: Path) -> None:
    """Arriving work over ``admission.burst_capacity`` with the backlog forming (here: a deadline no forecast
    fits): the gateway is in a burst, caps the adaptive tenant's question, and says so in the answer, the status
    and the metrics; a full tenant's question counts as arriving work but is never capped."""
    _setup(tmp_path, "adaptive")
    responder = AnswersResponder(dict(build_demo_answers()))
    q = demo_questions()[0].question
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(
            tmp_path,
            urls,
            ["A100"],
            time_scale=0.01,
            databases_file="databases.yaml",
            admission={"burst_capacity": 1e-6},
        )
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID, "deadline_s": 0.01})
            assert r.status_code == 200, r.text
            body = r.json()
            status = (await client.get("/v1/status")).json()
            metrics = (await client.get("/metrics")).text
    reasons = {d["step"]: d["reason"] for d in body["degraded"]}
    assert reasons["candidates"].startswith("capped in a burst")
    burst = status["overload"]["burst"]
    assert burst["in_burst"] is True and burst["bursts"] == 1 and burst["capped_questions"] == 1
    assert burst["load"] > 1 and "candidates 2 -> 1" in burst["trades"]
    assert "hexflow_burst_active 1.0" in metrics and "hexflow_bursts_total 1.0" in metrics
    assert "hexflow_burst_capped_questions_total 1.0" in metrics

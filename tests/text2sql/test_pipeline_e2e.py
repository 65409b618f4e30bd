"""``POST /v1/text2sql`` end to end: emulated workers answering from a script, the demo database, the gateway.

The script (``build_demo_answers``) gives about a quarter of the questions a wrong first candidate:
one that fails to execute, one that returns no rows, or one that returns other rows. The pipeline must
revise exactly the candidates whose execution failed or came back empty, the evaluator must reject the
candidate that returns other rows, and so every question must end with the gold result.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.text2sql.answers import build_demo_answers
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from gateway.text2sql.evaluate import execute_sqlite, gold_is_ordered, results_match
from gateway.text2sql.prompt_templates import Prompts
from gateway.text2sql.service import NO_DATABASES, Text2SqlService
from tests.live.harness import BATCH_KEY, emulators, gateway_client, write_config
from workers.scripted import AnswersResponder

GPUS = ["A100", "A6000", "L40S"]


def _setup(tmp: Path, db_url: str | None = None, **overrides: Any) -> tuple[Path, Path]:
    db = write_sqlite(tmp / f"{DB_ID}.sqlite")
    (tmp / "databases.yaml").write_text(
        yaml.safe_dump({"databases": {DB_ID: {"url": db_url or f"sqlite:///{db.name}", "statement_timeout_s": 2.0}}})
    )
    return db, tmp / "databases.yaml"


async def test_every_demo_question_ends_with_the_gold_result(tmp_path: Path) -> None:
    db, _ = _setup(tmp_path)
    answers = build_demo_answers()
    responder = AnswersResponder(dict(answers))
    questions = demo_questions()
    async with emulators(GPUS, time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, GPUS, time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, app):
            sem = asyncio.Semaphore(12)

            async def ask(q: Any) -> dict[str, Any]:
                async with sem:
                    body = {"question": q.question, "db_id": DB_ID, "deadline_s": 600}
                    if q.evidence:
                        body["evidence"] = q.evidence
                    r = await client.post("/v1/text2sql", json=body)
                    assert r.status_code == 200, r.text
                    return dict(r.json())

            results = await asyncio.gather(*(ask(q) for q in questions))
            gw = app.state.gateway
            assert gw.active_total == 0
    n_revised = n_rejected_by_evaluator = 0
    for q, out in zip(questions, results, strict=True):
        entry = answers[q.question]
        note = str(entry.get("note", ""))
        assert out["status"] == "ok", (q.question, out)
        gold = execute_sqlite(db, q.query)
        assert results_match(
            gold.rows if hasattr(gold, "rows") else gold, out["rows"], ordered=gold_is_ordered(q.query)
        ), (
            q.question,
            out["sql"],
        )
        cands = out["candidates"]
        assert len(cands) == 2
        kinds = [s["kind"] for s in out["stages"]]
        assert kinds[:2] == ["extract_keywords", "information_retriever"]
        assert kinds.count("generate_candidate") == 2
        # Revisions happen exactly when the first execution failed or came back empty.
        failed_first = note.startswith(("error", "empty"))
        assert out["revisions"] == (1 if failed_first else 0), (q.question, note, out["revisions"])
        assert kinds.count("revise") == out["revisions"]
        assert cands[0]["revisions"] == (1 if failed_first else 0) and cands[1]["revisions"] == 0
        n_revised += failed_first
        if note.startswith("different"):
            # Both candidates execute; the evaluator rejects the wrong one and selection follows the verdicts.
            assert cands[0]["verdict"] is False and cands[1]["verdict"] is True
            assert out["sql"] == cands[1]["sql"]
            n_rejected_by_evaluator += 1
        assert out["deadline_met"] and out["latency_s"] <= out["deadline_s"]
        for s in out["stages"]:
            assert s["worker"] in ("a100-0", "a6000-1", "l40s-2") and s["run_s"] > 0
    assert n_revised >= 5 and n_rejected_by_evaluator >= 5


async def test_bad_input_and_a_database_that_is_down(tmp_path: Path) -> None:
    db, _ = _setup(tmp_path)
    responder = AnswersResponder(dict(build_demo_answers()))
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            q = demo_questions()[0].question
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": "nope"})
            assert r.status_code == 404 and "demo_retail" in r.json()["error"]["message"]
            r = await client.post("/v1/text2sql", json={"question": "   ", "db_id": DB_ID})
            assert r.status_code == 422 and "question" in r.json()["error"]["message"]
            r = await client.post("/v1/text2sql", json={"question": "x" * 5000, "db_id": DB_ID})
            assert r.status_code == 422 and "exceed the limit of 2000" in r.json()["error"]["message"]
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID, "deadline_s": 1})
            assert r.status_code == 422 and "outside tenant batch" in r.json()["error"]["message"]
            r = await client.post("/v1/text2sql", json={"db_id": DB_ID})
            assert r.status_code == 422
            # The database goes away: 503, and the body says which stage failed.
            db.unlink()
            r = await client.post("/v1/text2sql", json={"question": q, "db_id": DB_ID})
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["status"] == "failed" and body["failed_stage"] == "schema" and DB_ID in body["error"]


async def test_stream_sends_each_stage_then_the_result(tmp_path: Path) -> None:
    _setup(tmp_path)
    responder = AnswersResponder(dict(build_demo_answers()))
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            q = demo_questions()[0].question
            events = []
            async with client.stream("POST", "/v1/text2sql", json={"question": q, "db_id": DB_ID, "stream": True}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
            assert events[-1] == "[DONE]"
            parsed = [json.loads(e) for e in events[:-1]]
            assert [p["event"] for p in parsed][-1] == "result" and parsed[-1]["status"] == "ok"
            stages = [p["kind"] for p in parsed if p["event"] == "stage"]
            assert stages[:3] == ["extract_keywords", "information_retriever", "generate_candidate"]


async def test_a_tenant_only_reaches_its_databases(tmp_path: Path) -> None:
    _setup(tmp_path)
    tenants = (Path(__file__).resolve().parents[2] / "config" / "tenants.yaml").read_text()
    # The batch tenant may use another database only.
    marker = "  - name: batch\n"
    assert marker in tenants
    (tmp_path / "tenants.yaml").write_text(tenants.replace(marker, marker + "    databases: [finance]\n"))
    async with emulators(["A100"], time_scale=0.01) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            r = await client.post("/v1/text2sql", json={"question": "How many?", "db_id": DB_ID})
            assert r.status_code == 404
            assert "allowed for tenant batch: (none)" in r.json()["error"]["message"]


async def test_the_route_owns_one_service_built_at_start_and_closed_after_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup(tmp_path)
    loads: list[int] = []
    real_load = Prompts.load.__func__  # type: ignore[attr-defined]

    def counting_load(cls: type[Prompts]) -> Prompts:
        loads.append(1)
        return real_load(cls)  # type: ignore[no-any-return]

    monkeypatch.setattr(Prompts, "load", classmethod(counting_load))
    responder = AnswersResponder(dict(build_demo_answers()))
    closed_after_stop: list[bool] = []
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, app):
            service, gw = app.state.text2sql, app.state.gateway
            assert isinstance(service, Text2SqlService) and not hasattr(gw, "databases")
            for q in demo_questions()[:2]:
                r = await client.post("/v1/text2sql", json={"question": q.question, "db_id": DB_ID})
                assert r.status_code == 200, r.text
            assert loads == [1]  # the prompt templates were read once, at start-up, not per request
            real_close = service.close

            async def close() -> None:
                closed_after_stop.append(gw.draining and not gw.ready)
                await real_close()

            monkeypatch.setattr(service, "close", close)
    assert closed_after_stop == [True]


async def test_without_a_databases_file_every_question_is_a_404(tmp_path: Path) -> None:
    async with emulators(["A100"], time_scale=0.01) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01)
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            r = await client.post("/v1/text2sql", json={"question": "How many?", "db_id": DB_ID})
            assert r.status_code == 404
            err = r.json()["error"]
            assert err["message"] == NO_DATABASES and "--demo" in err["message"]  # says how to get one
            assert (err["type"], err["param"]) == ("not_found_error", "db_id")

"""``POST /v1/text2sql`` on the paths around the pipeline: admission's committed work is released on every path,
a streamed question that fails inside the gateway says so, the status shows each database's predicted plan, and
work admitted with a later deadline is not counted ahead of an urgent question."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from gateway.config.gateway import load_gateway_config
from gateway.core.predict import CompletionPredictor, calls_plan
from gateway.core.workflow import CallSpec
from gateway.errors import Rejected
from gateway.live.service import Gateway
from gateway.live.tenants import TenantStore
from gateway.text2sql.answers import build_demo_answers
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from tests.live.fake_transport import Hold
from tests.live.harness import emulators, gateway_client, write_config
from workers.scripted import AnswersResponder

QUESTION = demo_questions()[0].question


@contextlib.asynccontextmanager
async def _demo_gateway(tmp: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """The demo database behind a gateway on one emulated A100 answering from the demo script."""
    db = write_sqlite(tmp / f"{DB_ID}.sqlite")
    (tmp / "databases.yaml").write_text(yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{db.name}"}}}))
    responder = AnswersResponder(dict(build_demo_answers()))
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg) as (client, app):
            yield client, app


class Boom(RuntimeError):
    """A bug inside the gateway, after admission."""


async def _explode(*_: Any, **__: Any) -> Any:
    raise Boom("a bug")


async def test_committed_work_is_released_when_a_question_fails_before_its_workflow_opens(tmp_path: Path) -> None:
    async with _demo_gateway(tmp_path) as (authed, app):
        gw = app.state.gateway
        app.state.text2sql.pipeline.answer = _explode
        # (the 500 a server sends, not the exception the test transport would re-raise)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=authed.headers)
        seen: list[float] = []
        admit = gw.admit

        def spy(*a: Any, **kw: Any) -> Any:
            adm = admit(*a, **kw)
            seen.append(gw.admitter.committed_s)
            return adm

        gw.admit = spy
        for stream in (False, True):
            body = {"question": QUESTION, "db_id": DB_ID, "deadline_s": 60, "stream": stream}
            r = await client.post("/v1/text2sql", json=body)
            assert r.status_code == (200 if stream else 500)
        await client.aclose()
        assert len(seen) == 2 and all(c > 0.0 for c in seen), "admission committed the question's work"
        assert gw.admitter.committed_s == 0.0 and gw.active_total == 0


async def test_a_streamed_question_that_fails_inside_the_gateway_ends_with_an_error_event(tmp_path: Path) -> None:
    async with _demo_gateway(tmp_path) as (client, app):
        app.state.text2sql.pipeline.answer = _explode
        body = {"question": QUESTION, "db_id": DB_ID, "deadline_s": 60, "stream": True}
        r = await client.post("/v1/text2sql", json=body)
        events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["event"] == "error" and last["error"]["code"] == 500
        assert last["id"].startswith("t2s-") and last["id"] in last["error"]["message"]


async def test_the_status_shows_each_databases_predicted_plan(tmp_path: Path) -> None:
    async with _demo_gateway(tmp_path) as (client, _):
        before = (await client.get("/v1/status")).json()
        entry = before["text2sql"]["databases"][DB_ID]
        assert entry["source"].startswith("prior: CHESS's prompt sizes (schema not read yet)")
        r = await client.post("/v1/text2sql", json={"question": QUESTION, "db_id": DB_ID, "deadline_s": 60})
        assert r.status_code == 200, r.text
        after = (await client.get("/v1/status")).json()
        entry = after["text2sql"]["databases"][DB_ID]
        assert entry["source"].startswith(f"prior: prompts at {DB_ID}'s schema size")
        kinds = [s["kind"] for s in entry["stages"]]
        assert kinds[:3] == ["extract_keywords", "information_retriever", "generate_candidate"]
        assert entry["predicted_s"] > 0.0
        assert "chess_predicted_s" not in after["overload"]


@pytest.mark.parametrize(("queue", "admitted"), [("urgency", True), ("fcfs", False)])
async def test_work_due_later_is_not_ahead_under_a_deadline_ordered_queue(
    tmp_path: Path, queue: str, admitted: bool
) -> None:
    """Batch work committed with a far deadline delays an interactive question only where the queues serve in
    arrival order: hexgen's urgency queues serve the interactive question first, so admission does not count it."""
    policy = "hexgen" if queue == "urgency" else "wb-fcfs"
    loaded = load_gateway_config(write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"], policy=policy))
    gw = Gateway(loaded, TenantStore.load(loaded.tenants_path), Hold(), background=False)
    assert gw.scheduler.policy.queue == queue
    batch, interactive = gw.tenants.get("batch"), gw.tenants.get("interactive")
    assert batch is not None and interactive is not None
    call = CallSpec("generate_candidate", 2000, 200)
    for _ in range(40):  # batch workflows admitted with a 30-minute deadline, none of their calls submitted yet
        adm = gw.admit(batch, 2, calls_plan([[call, call]] * 3), 1800.0)
        gw.open_workflow(batch, 1800.0, None, admission=adm, route="text2sql")
    assert gw.admitter.committed_s > 0.0
    one = calls_plan([[call]] * 3)
    alone = CompletionPredictor(gw.scheduler, gw.clock()).duration(one)
    deadline = 3 * alone / loaded.cfg.admission.headroom
    if admitted:
        gw.admit(interactive, 1, one, deadline).release()
    else:
        with pytest.raises(Rejected):
            gw.admit(interactive, 1, one, deadline)

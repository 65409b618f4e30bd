"""The scenario of a hard question on the README's live gateway: the demo cluster (A100, A100, A6000, L40S)
emulated at time scale 0.05 answering from the demo script, interactive questions answered, then ONE batch
question the model cannot answer (every revision round, long outputs it chose to write), then more interactive
questions and questions in other languages. Nothing after it is refused, every scripted one is answered in
time, and no worker is ejected: the long answers are the model's, not a slow GPU's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from gateway.text2sql.demo import DB_ID, demo_questions, write_demo_databases
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, emulators, gateway_client, write_config
from workers.scripted import AnswersResponder

GPUS = ["A100", "A100", "A6000", "L40S"]
HARD = "How many customers live in France?"
"""Not in the demo script: the emulated model answers it with filler, so no candidate ever has SQL."""
FOREIGN = ["Wie viele Kunden gibt es?", "顧客は何人いますか？"]


async def _ask(client: httpx.AsyncClient, key: str, question: str, deadline_s: float) -> tuple[int, dict[str, Any]]:
    r = await client.post(
        "/v1/text2sql",
        json={"question": question, "db_id": DB_ID, "deadline_s": deadline_s},
        headers={"Authorization": f"Bearer {key}"},
    )
    return r.status_code, r.json()


async def test_one_hard_question_neither_blocks_the_interactive_tenant_nor_ejects_a_worker(tmp_path: Path) -> None:
    write_demo_databases(tmp_path / "databases.yaml")
    questions = [q.question for q in demo_questions()]
    async with emulators(GPUS, time_scale=0.05, responder=AnswersResponder.demo()) as urls:
        cfg = write_config(tmp_path, urls, GPUS, time_scale=0.05, databases_file="databases.yaml")
        async with gateway_client(cfg) as (client, _):
            before = await asyncio.gather(*(_ask(client, INTERACTIVE_KEY, q, 6.0) for q in questions[:12]))
            assert all(code == 200 and body["deadline_met"] for code, body in before), before
            code, hard = await _ask(client, BATCH_KEY, HARD, 120.0)
            assert code == 200 and hard["status"] == "no_valid_sql" and hard["revisions"] >= 10, hard
            after = await asyncio.gather(*(_ask(client, INTERACTIVE_KEY, q, 6.0) for q in questions[12:24]))
            refused = [(code, body) for code, body in after if code != 200]
            assert not refused, refused
            assert all(body["status"] == "ok" and body["deadline_met"] for _, body in after), after
            for q in FOREIGN:  # not in the script: tried (and not answerable), never refused unseen
                code, body = await _ask(client, INTERACTIVE_KEY, q, 6.0)
                assert code == 200, body
            ready = (await client.get("/readyz")).json()
            assert not ready.get("ejected_workers"), ready
            status = (await client.get("/v1/status")).json()
            assert not [w["name"] for w in status["workers"] if w["ejected"]]
            entry = status["text2sql"]["databases"][DB_ID]
            assert entry["source"].startswith("fitted") and entry["answered_in_window"] == 24

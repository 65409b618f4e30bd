"""``/v1/text2sql`` on the demo database loaded into the local PostgreSQL server.

The scripted model's first candidates try a write, a multi-statement and a runaway recursive query:
each is refused or cut off (and revised to the gold query), and the database is unchanged afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from gateway.text2sql.answers import normalise_sql
from gateway.text2sql.demo import DB_ID, demo_questions, postgres_script
from gateway.text2sql.evaluate import gold_is_ordered, results_match
from tests.live.harness import BATCH_KEY, emulators, gateway_client, write_config
from tests.text2sql.conftest import PgTestDb
from workers.scripted import AnswersResponder

ATTACKS = {
    "write": "DELETE FROM order_items",
    "multi": "SELECT 1; DROP TABLE customers",
    "runaway": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "ddl": "CREATE TABLE pwned (x int)",
}


async def _table_counts(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        names = [r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")]
        return {n: int(await conn.fetchval(f'SELECT count(*) FROM "{n}"')) for n in sorted(names)}
    finally:
        await conn.close()


async def _gold(url: str, sql: str) -> list[list[Any]]:
    conn = await asyncpg.connect(url)
    try:
        return [list(r.values()) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_demo_on_postgres_refuses_writes_and_runaways(tmp_path: Path, pg: PgTestDb) -> None:
    conn = await asyncpg.connect(pg.admin_url)  # the admin loads the data; the gateway reads as pg.url
    try:
        await conn.execute(postgres_script())
    finally:
        await conn.close()
    before = await _table_counts(pg.admin_url)
    assert before["orders"] > 0 and "pwned" not in before
    (tmp_path / "databases.yaml").write_text(
        yaml.safe_dump({"databases": {DB_ID: {"url": pg.url, "statement_timeout_s": 1.0}}})
    )
    questions = demo_questions()[:12]
    answers: dict[str, Any] = {}
    attack_of: dict[str, str] = {}
    for i, q in enumerate(questions):
        entry: dict[str, Any] = {"gold": (q.query_pg or q.query)}
        if i < len(ATTACKS):
            kind = list(ATTACKS)[i]
            entry["wrong"] = [ATTACKS[kind]]
            attack_of[q.question] = kind
        answers[q.question] = entry
    responder = AnswersResponder(answers)
    async with emulators(["A100", "L40S"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100", "L40S"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):

            async def ask(q: Any) -> dict[str, Any]:
                r = await client.post("/v1/text2sql", json={"question": q.question, "db_id": DB_ID, "deadline_s": 600})
                assert r.status_code == 200, r.text
                return dict(r.json())

            results = await asyncio.gather(*(ask(q) for q in questions))
    for q, out in zip(questions, results, strict=True):
        gold_sql = q.query_pg or q.query
        assert out["status"] == "ok", (q.question, out)
        assert results_match(await _gold(pg.admin_url, gold_sql), out["rows"], ordered=gold_is_ordered(gold_sql))
        assert normalise_sql(out["sql"]) == normalise_sql(gold_sql)
        attack = attack_of.get(q.question)
        first = out["candidates"][0]
        if attack is None:
            assert out["revisions"] == 0
            continue
        assert first["revisions"] == 1, (attack, first)
        assert out["revisions"] == 1
    # The database is exactly as it was.
    assert await _table_counts(pg.admin_url) == before


async def test_a_superuser_database_is_503_with_the_reason_and_the_reader_one_works(
    tmp_path: Path, pg: PgTestDb
) -> None:
    conn = await asyncpg.connect(pg.admin_url)
    try:
        await conn.execute(postgres_script())
    finally:
        await conn.close()
    q = demo_questions()[0]
    (tmp_path / "databases.yaml").write_text(
        yaml.safe_dump({"databases": {"root_pg": {"url": pg.admin_url}, DB_ID: {"url": pg.url}}})
    )
    responder = AnswersResponder({q.question: {"gold": (q.query_pg or q.query)}})
    async with emulators(["A100"], time_scale=0.01, responder=responder) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.01, databases_file="databases.yaml")
        async with gateway_client(cfg, key=BATCH_KEY) as (client, _):
            r = await client.post("/v1/text2sql", json={"question": q.question, "db_id": "root_pg", "deadline_s": 600})
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["status"] == "failed"
            assert "role 'postgres'" in body["error"] and "superuser" in body["error"]
            r = await client.post("/v1/text2sql", json={"question": q.question, "db_id": DB_ID, "deadline_s": 600})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "ok"

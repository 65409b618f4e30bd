"""``Idempotency-Key`` (``gateway/live/idempotency.py``): the store on its own, then through the routes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from starlette.responses import Response

from gateway.errors import Rejected
from gateway.live.idempotency import IdempotencyKeyReused, IdempotencyStore, StoredResponse, fingerprint
from gateway.live.responses import JSONResponse
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from tests.fakes import FakeClock
from tests.live.harness import BATCH_KEY, chain, emulators, gateway_client, wait_for, write_config


class Work:
    """Work that counts its runs and finishes when released."""

    def __init__(self, status: int = 200, body: bytes = b'{"ok":true}') -> None:
        self.runs = 0
        self.cancelled = 0
        self.status = status
        self.body = body
        self.release = asyncio.Event()

    async def __call__(self) -> Response:
        self.runs += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Response(self.body + str(self.runs).encode(), status_code=self.status)


def store(clock: FakeClock, **kw: int) -> IdempotencyStore:
    return IdempotencyStore(
        ttl_s=60, max_keys=kw.get("max_keys", 100), max_bytes=kw.get("max_bytes", 1 << 20), clock=clock
    )


async def test_a_retry_while_running_waits_for_the_same_answer_and_one_after_gets_it_stored() -> None:
    s, work = store(FakeClock()), Work()
    first = asyncio.create_task(s.run("t", "k", "fp", work))
    second = asyncio.create_task(s.run("t", "k", "fp", work))
    await asyncio.sleep(0)
    work.release.set()
    (a, replay_a), (b, replay_b) = await asyncio.gather(first, second)
    assert work.runs == 1
    assert a == b and a.body == b'{"ok":true}1'
    assert (replay_a, replay_b) == (False, True)
    c, replay_c = await s.run("t", "k", "fp", work)
    assert c == a and replay_c and work.runs == 1
    assert c.response(replayed=True).headers["idempotent-replayed"] == "true"


async def test_the_same_key_for_another_request_is_refused_and_tenants_do_not_share_keys() -> None:
    s, work = store(FakeClock()), Work()
    work.release.set()
    await s.run("t", "k", fingerprint("/v1/workflows", {"a": 1, "b": 2}), work)
    # The same JSON in another key order is the same request.
    _, replayed = await s.run("t", "k", fingerprint("/v1/workflows", {"b": 2, "a": 1}), work)
    assert replayed
    with pytest.raises(IdempotencyKeyReused) as err:
        await s.run("t", "k", fingerprint("/v1/workflows", {"a": 2}), work)
    assert err.value.status == 422 and "'k'" in err.value.message
    with pytest.raises(IdempotencyKeyReused):
        await s.run("t", "k", fingerprint("/v1/text2sql", {"a": 1, "b": 2}), work)
    _, replayed = await s.run("other", "k", fingerprint("/v1/workflows", {"a": 2}), work)
    assert not replayed and work.runs == 2


@pytest.mark.parametrize(
    ("status", "stored"), [(200, True), (404, True), (422, True), (429, False), (502, False), (503, False)]
)
async def test_only_final_answers_are_stored(status: int, stored: bool) -> None:
    s, work = store(FakeClock()), Work(status)
    work.release.set()
    await s.run("t", "k", "fp", work)
    _, replayed = await s.run("t", "k", "fp", work)
    assert replayed is stored and work.runs == (1 if stored else 2)


async def test_a_refusal_raised_by_the_work_is_its_answer_and_is_not_stored() -> None:
    s = store(FakeClock())

    async def refused() -> Response:
        raise Rejected("queues full", 429, 2)

    resp, _ = await s.run("t", "k", "fp", refused)
    assert resp.status == 429 and dict(resp.headers)["retry-after"] == "2"
    assert len(s) == 0


async def test_answers_expire_after_the_ttl_and_the_least_recently_used_go_first() -> None:
    clock = FakeClock()
    s, work = store(clock, max_keys=2), Work()
    work.release.set()
    for key in ("a", "b"):
        await s.run("t", key, "fp", work)
    await s.run("t", "a", "fp", work)  # a is used again: b is now the least recently used
    await s.run("t", "c", "fp", work)
    assert len(s) == 2
    assert (await s.run("t", "a", "fp", work))[1] is True
    assert (await s.run("t", "b", "fp", work))[1] is False  # dropped: ran again
    clock.t += 61
    assert (await s.run("t", "a", "fp", work))[1] is False  # expired: ran again
    assert work.runs == 5


async def test_stored_bytes_are_bounded() -> None:
    s = store(FakeClock(), max_bytes=1 << 16)
    big = Work(body=b"x" * 40_000)
    big.release.set()
    for key in ("a", "b", "c"):
        await s.run("t", key, "fp", big)
    assert s.bytes <= 1 << 16 and len(s) == 1
    huge = Work(body=b"x" * (1 << 17))
    huge.release.set()
    await s.run("t", "h", "fp", huge)
    assert (await s.run("t", "h", "fp", huge))[1] is False  # too large to keep: never stored


async def test_running_keys_are_never_evicted() -> None:
    s, slow, fast = store(FakeClock(), max_keys=1), Work(), Work()
    fast.release.set()
    running = asyncio.create_task(s.run("t", "slow", "fp", slow))
    await asyncio.sleep(0)
    await s.run("t", "fast", "fp", fast)
    retry = asyncio.create_task(s.run("t", "slow", "fp", slow))
    await asyncio.sleep(0)
    slow.release.set()
    await asyncio.gather(running, retry)
    assert slow.runs == 1


async def test_the_work_is_cancelled_only_when_every_waiting_client_left() -> None:
    s, work = store(FakeClock()), Work()
    first = asyncio.create_task(s.run("t", "k", "fp", work))
    second = asyncio.create_task(s.run("t", "k", "fp", work))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    assert work.cancelled == 0
    second.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert await wait_for(lambda: work.cancelled == 1, 5)
    assert len(s) == 0  # forgotten: the next retry runs it anew
    work.release.set()
    _, replayed = await s.run("t", "k", "fp", work)
    assert not replayed and work.runs == 2


def test_a_stored_response_keeps_status_body_and_headers() -> None:
    resp = JSONResponse({"a": 1}, status_code=201, headers={"X-A": "b"})
    stored = StoredResponse.of(resp)
    again = stored.response(replayed=False)
    assert again.status_code == 201 and again.body == resp.body and again.headers["x-a"] == "b"
    assert "idempotent-replayed" not in again.headers


async def test_workflows_route_runs_a_keyed_request_once(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"])
        async with gateway_client(cfg) as (client, app):
            gw = app.state.gateway
            body = {"calls": chain(2, width=2), "deadline_s": 60}
            key = {"Idempotency-Key": "order-17"}
            a, b = await asyncio.gather(
                client.post("/v1/workflows", json=body, headers=key),
                client.post("/v1/workflows", json=body, headers=key),
            )
            assert a.status_code == b.status_code == 200, a.text
            assert a.json()["id"] == b.json()["id"]
            assert sorted(r.headers.get("idempotent-replayed", "") for r in (a, b)) == ["", "true"]
            again = await client.post("/v1/workflows", json=body, headers=key)
            assert again.json() == a.json() and again.headers["idempotent-replayed"] == "true"
            assert gw.idempotency.runs == 1
            metrics = (await client.get("/metrics")).text
            assert 'hexflow_workflows_total{outcome="met",tenant="interactive"} 1.0' in metrics
            # Another tenant's same key is its own request.
            other = await client.post(
                "/v1/workflows", json=body, headers={**key, "Authorization": f"Bearer {BATCH_KEY}"}
            )
            assert other.status_code == 200 and other.json()["id"] != a.json()["id"]
            changed = await client.post("/v1/workflows", json={**body, "deadline_s": 61}, headers=key)
            assert changed.status_code == 422
            err = changed.json()["error"]
            assert err["param"] == "Idempotency-Key" and "different request" in err["message"]
            bad = await client.post("/v1/workflows", json=body, headers={"Idempotency-Key": "x" * 256})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"
            stream = await client.post(
                "/v1/text2sql", json={"question": "q?", "db_id": "d", "stream": True}, headers=key
            )
            assert stream.status_code == 422 and stream.json()["error"]["param"] == "stream"
            status = (await client.get("/v1/status")).json()["idempotency"]
            assert status["keys"] == 2 and status["running"] == 0


async def test_idempotency_off_ignores_the_header(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], idempotency={"enabled": False})
        async with gateway_client(cfg) as (client, _):
            body = {"calls": chain(1), "deadline_s": 60}
            key = {"Idempotency-Key": "k"}
            a = await client.post("/v1/workflows", json=body, headers=key)
            b = await client.post("/v1/workflows", json=body, headers=key)
            assert a.status_code == b.status_code == 200
            assert a.json()["id"] != b.json()["id"]


async def test_text2sql_route_answers_a_keyed_retry_from_the_first_run(tmp_path: Path) -> None:
    write_sqlite(tmp_path / f"{DB_ID}.sqlite")
    (tmp_path / "databases.yaml").write_text(
        yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{DB_ID}.sqlite", "statement_timeout_s": 2.0}}})
    )
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], databases_file="databases.yaml")
        async with gateway_client(cfg) as (client, app):
            body = {"question": demo_questions()[0].question, "db_id": DB_ID, "deadline_s": 120}
            key = {"Idempotency-Key": "q-1"}
            a, b = await asyncio.gather(
                client.post("/v1/text2sql", json=body, headers=key),
                client.post("/v1/text2sql", json=body, headers=key),
            )
            assert a.status_code == b.status_code, a.text
            assert a.json() == b.json() and a.json()["id"].startswith("t2s-")
            again = await client.post("/v1/text2sql", json=body, headers=key)
            assert again.json() == a.json() and again.headers["idempotent-replayed"] == "true"
            assert app.state.gateway.idempotency.runs == 1
            unknown = await client.post("/v1/text2sql", json={**body, "db_id": "nope"}, headers=key)
            assert unknown.status_code == 422  # the key named another question

"""The live status page's routes: off without admin keys, its data behind an admin key, ``/v1/status`` and
``/metrics`` behind it when configured, and the state it shows after real traffic (emulated workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.gateway import load_gateway_config
from gateway.config.tenants import hash_key
from gateway.errors import ConfigError
from gateway.live.service import Gateway
from gateway.live.statuspage import tenant_shares
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, chain, emulators, gateway_client, write_config
from tests.live.status_sample import sample_state

GPUS = ["A100", "L40S"]
ADMIN_KEY = "ops-secret-key"
ADMIN = {"api_key_sha256": [hash_key(ADMIN_KEY)]}


def _bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


async def _get(client: httpx.AsyncClient, path: str, key: str | None) -> httpx.Response:
    # The harness's client sends the interactive tenant's key by default: replace (or drop) it per request.
    request = client.build_request("GET", path)
    del request.headers["authorization"]
    request.headers.update(_bearer(key))
    return await client.send(request)


def _message(r: httpx.Response) -> str:
    body: dict[str, Any] = r.json()
    return str(body["error"]["message"])


async def test_status_page_is_off_without_admin_keys_and_says_how_to_turn_it_on(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        for path in ("/ui", "/ui/api/state"):
            r = await _get(client, path, ADMIN_KEY)
            assert r.status_code == 404, path
            assert "admin.api_key_sha256" in _message(r) and "hexflow tenants hash-key" in _message(r)
        # /v1/status and /metrics stay open, as before.
        assert (await _get(client, "/v1/status", None)).status_code == 200
        assert (await _get(client, "/metrics", None)).status_code == 200


async def test_state_needs_an_admin_key_and_the_page_shell_does_not(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], admin=ADMIN)
        async with gateway_client(cfg) as (client, _):
            page = await _get(client, "/ui", None)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "/ui/static/app.js" in page.text and "/ui/static/style.css" in page.text
            assert "script-src 'self'" in page.headers["content-security-policy"]
            for asset in ("app.js", "style.css"):
                assert (await _get(client, f"/ui/static/{asset}", None)).status_code == 200, asset
            missing = await _get(client, "/ui/api/state", None)
            assert missing.status_code == 401 and "missing admin key" in _message(missing)
            tenant = await _get(client, "/ui/api/state", INTERACTIVE_KEY)  # a tenant's key opens nothing here
            assert tenant.status_code == 401 and "not an admin key" in _message(tenant)
            wrong = await _get(client, "/ui/api/state", "nope")
            assert wrong.status_code == 401 and "not an admin key" in _message(wrong)
            ok = await _get(client, "/ui/api/state", ADMIN_KEY)
            assert ok.status_code == 200 and ok.headers["cache-control"] == "no-store"
            state = ok.json()
            assert [w["name"] for w in state["workers"]] == ["a100-0"]
            assert set(state["tenants"]) == {"interactive", "batch"}
            # Not protected unless configured: both stay open with admin keys present.
            assert (await _get(client, "/v1/status", None)).status_code == 200
            assert (await _get(client, "/metrics", None)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/status", "/metrics"])
async def test_status_and_metrics_can_be_put_behind_the_admin_key(tmp_path: Path, path: str) -> None:
    async with emulators(["A100"]) as urls:
        admin = {**ADMIN, "protect_status": True, "protect_metrics": True}
        async with gateway_client(write_config(tmp_path, urls, ["A100"], admin=admin)) as (client, _):
            missing = await _get(client, path, None)
            assert missing.status_code == 401 and "missing admin key" in _message(missing)
            assert (await _get(client, path, BATCH_KEY)).status_code == 401
            assert (await _get(client, path, ADMIN_KEY)).status_code == 200
            assert (await _get(client, "/healthz", None)).status_code == 200  # probes stay open
            assert (await _get(client, "/readyz", None)).status_code == 200


async def test_state_shows_workers_goodput_and_the_slowest_workflow_after_traffic(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls, gateway_client(write_config(tmp_path, urls, GPUS, admin=ADMIN)) as (client, _):
        before = (await _get(client, "/ui/api/state", ADMIN_KEY)).json()
        assert before["tenants"]["interactive"]["finished"] == 0
        assert before["tenants"]["interactive"]["attainment"] is None
        assert before["tenants"]["interactive"]["arrivals"] == 0
        assert before["tenants"]["interactive"]["answered_in_time"] is None
        assert all(not w["ejected"] and w["ejected_reason"] is None for w in before["workers"])
        r = await client.post("/v1/workflows", json={"calls": chain(3, width=2), "deadline_s": 60})
        assert r.status_code == 200 and r.json()["deadline_met"], r.text
        state = (await _get(client, "/ui/api/state", ADMIN_KEY)).json()
        metrics = (await _get(client, "/metrics", None)).text
    assert state["policy"] == "hexgen" and state["uses_alpha"] and 0.0 <= state["alpha"] <= 1.0
    workers = {w["name"]: w for w in state["workers"]}
    assert set(workers) == {"a100-0", "l40s-1"}
    assert workers["a100-0"]["gpu"] == "A100" and workers["l40s-1"]["gpu"] == "L40S"
    assert all(w["state"] == "up" and w["model"] == "llama-3.1-70b" for w in workers.values())
    assert sum(w["completed"] for w in workers.values()) == 6
    assert any(w["latency_ratio"] is not None for w in workers.values())
    t = state["tenants"]["interactive"]
    assert t["outcomes"]["met"] == 1 and t["finished"] == 1 and t["attainment"] == 1.0
    assert t["goodput_per_s"] == pytest.approx(1 / state["window_s"])
    assert state["tenants"]["batch"]["finished"] == 0
    assert state["tuning"] == {"enabled": False, "runs": 0, "history": []}
    [wf] = state["slowest"]
    assert wf["route"] == "workflows" and wf["tenant"] == "interactive" and wf["outcome"] == "met"
    assert wf["id"] == r.json()["id"] and wf["deadline_s"] == pytest.approx(60.0)  # the id the client got
    assert wf["lost_at"] is None and len(wf["calls"]) == 6
    for c in wf["calls"]:
        assert c["worker"] in workers and c["ok"] and c["attempts"] == 1
        assert 0.0 <= c["ready_s"] <= c["sent_s"] <= c["done_s"] <= wf["latency_s"]
        assert 0.0 < c["budget_s"] <= 60.0
    # A later stage was queued after an earlier one returned.
    assert wf["calls"][2]["ready_s"] >= min(wf["calls"][0]["done_s"], wf["calls"][1]["done_s"])
    assert 'hexflow_goodput_workflows_total{tenant="interactive"} 1.0' in metrics
    assert 'hexflow_workflow_outcomes_total{outcome="met",tenant="interactive"} 1.0' in metrics
    assert 'hexflow_workflow_outcomes_total{outcome="no_valid_answer",tenant="batch"} 0.0' in metrics


async def test_a_rejected_workflow_is_a_goodput_outcome_and_in_the_window(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], admin=ADMIN, limits={"max_queued_calls": 2})
        async with gateway_client(cfg) as (client, _):
            r = await client.post("/v1/workflows", json={"calls": chain(3), "deadline_s": 60})
            assert r.status_code == 429, r.text
            state = (await _get(client, "/ui/api/state", ADMIN_KEY)).json()
            metrics = (await _get(client, "/metrics", None)).text
    t = state["tenants"]["interactive"]
    assert t["outcomes"]["rejected"] == 1 and t["finished"] == 0 and t["attainment"] is None
    assert t["arrivals"] == 1 and t["answered_in_time"] == 0.0  # nothing finished, yet not "–": none in time
    assert state["slowest"] == []  # it never ran: no timeline
    assert 'hexflow_workflow_outcomes_total{outcome="rejected",tenant="interactive"} 1.0' in metrics
    assert 'hexflow_goodput_workflows_total{tenant="interactive"} 0.0' in metrics


@pytest.mark.parametrize(
    ("admin", "where", "says"),
    [
        ({"protect_status": True}, "admin.protect_status", "needs admin.api_key_sha256"),
        ({"protect_metrics": True}, "admin.protect_metrics", "needs admin.api_key_sha256"),
        ({"api_key_sha256": ["ops-secret-key"]}, "admin.api_key_sha256", "looks like a plaintext key"),
        ({"window_s": 5}, "admin.window_s", "30"),
        ({"bogus": 1}, "admin.bogus", ""),
    ],
)
def test_bad_admin_config_names_the_field(tmp_path: Path, admin: dict[str, Any], where: str, says: str) -> None:
    cfg = write_config(tmp_path, ["http://127.0.0.1:9"], ["A100"], admin=admin)
    with pytest.raises(ConfigError) as info:
        load_gateway_config(cfg)
    assert where in str(info.value) and says in str(info.value)
    assert "ops-secret-key" not in str(info.value)  # a plaintext key is never repeated


async def test_attainment_is_shown_beside_the_share_of_all_arrivals_answered_in_time(tmp_path: Path) -> None:
    # 13 workflows in time and 7 refused at admission (429: more calls than the queue holds): attainment
    # counts only the 13 that ran (100 %), the share of arrivals answered in time all 20 (65 %).
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], admin=ADMIN, limits={"max_queued_calls": 2})
        async with gateway_client(cfg) as (client, _):
            for _ in range(13):
                r = await client.post("/v1/workflows", json={"calls": chain(1), "deadline_s": 60})
                assert r.status_code == 200 and r.json()["deadline_met"], r.text
            for _ in range(7):
                r = await client.post("/v1/workflows", json={"calls": chain(3), "deadline_s": 60})
                assert r.status_code == 429, r.text
            t = (await _get(client, "/ui/api/state", ADMIN_KEY)).json()["tenants"]["interactive"]
    assert t["outcomes"]["met"] == 13 and t["outcomes"]["rejected"] == 7
    assert t["finished"] == 13 and t["attainment"] == 1.0
    assert t["arrivals"] == 20 and t["answered_in_time"] == pytest.approx(0.65)


@pytest.mark.parametrize(
    ("outcomes", "arrivals", "in_time"),
    [
        ({"met": 0, "late": 0, "cancelled": 0}, 0, None),  # nothing arrived: no share, not 0 % nor 100 %
        ({"met": 3, "late": 1, "cancelled": 0}, 4, 0.75),
        ({"met": 2, "late": 0, "cancelled": 2}, 4, 0.5),  # a client that went away was not answered in time
    ],
)
def test_tenant_shares_count_every_arrival(outcomes: dict[str, int], arrivals: int, in_time: float | None) -> None:
    shares = tenant_shares({"outcomes": outcomes, "attainment": None})
    assert shares["arrivals"] == arrivals and shares["answered_in_time"] == in_time
    assert shares["outcomes"] == outcomes  # the window's own figures are kept as they are


async def test_an_ejected_worker_says_why_and_until_when(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls:
        cfg = write_config(tmp_path, urls, GPUS, admin=ADMIN)
        async with gateway_client(cfg) as (client, app):
            gw: Gateway = app.state.gateway
            st = gw.pool.workers[1]
            reason = "its last 20 calls took 3.1x their predicted latency (peers: 1.02x)"
            gw.pool.eject(st, reason)
            length = st.ejected_until - gw.clock() if st.ejected_until is not None else 0.0
            workers = {w["name"]: w for w in (await _get(client, "/ui/api/state", ADMIN_KEY)).json()["workers"]}
            gw.pool.readmit(st)
            after = {w["name"]: w for w in (await _get(client, "/ui/api/state", ADMIN_KEY)).json()["workers"]}
    ejected = workers[st.name]
    assert ejected["state"] == "ejected" and ejected["ejected"] and ejected["ejected_reason"] == reason
    assert 0.0 < ejected["ejected_for_s"] <= length + 1e-3 and ejected["ejections"] == 1
    other = next(w for name, w in workers.items() if name != st.name)
    assert not other["ejected"] and other["ejected_reason"] is None and other["ejected_for_s"] is None
    back = after[st.name]
    assert back["state"] == "up" and not back["ejected"] and back["ejected_reason"] is None
    assert back["ejected_for_s"] is None


def _shape(value: Any) -> Any:
    """The keys of ``value`` at every level (lists by their first item), for comparing shapes, not values;
    ``estimate_ratios`` is keyed by the stage kinds seen, so only its presence counts."""
    if isinstance(value, dict):
        return {k: None if k == "estimate_ratios" else _shape(v) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [_shape(value[0])]
    return None


async def test_the_browser_tests_sample_state_has_the_gateways_shape(tmp_path: Path) -> None:
    # tests/live/status_sample.py feeds the browser tests' exact figures: it must stay what the gateway sends.
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], admin=ADMIN)
        async with gateway_client(cfg) as (client, _):
            r = await client.post("/v1/workflows", json={"calls": chain(2), "deadline_s": 60})
            assert r.status_code == 200, r.text
            real = (await _get(client, "/ui/api/state", ADMIN_KEY)).json()
    sample = sample_state()
    assert set(sample) == set(real)
    for key in ("workers", "slowest"):
        assert _shape(sample[key]) == _shape(real[key]), key
    assert _shape(sample["tenants"]["interactive"]) == _shape(real["tenants"]["interactive"])
    assert {k for k in sample["tuning"] if k != "history"} == {k for k in real["tuning"] if k != "history"}
    assert set(sample["burst"]) == set(real["burst"]) and real["burst"]["in_burst"] is False

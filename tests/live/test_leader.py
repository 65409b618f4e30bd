"""Leader election (``gateway/live/leader.py``) against the fake Kubernetes API's Leases, on a fake clock,
and a gateway that follows: not ready, refusing work, no leader-only task, until it takes the Lease."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.gateway import load_gateway_config
from gateway.config.operations import LeaderElectionConfig
from gateway.errors import ConfigError
from gateway.live.discovery import KubeApi, KubeConflict
from gateway.live.leader import LeaderElector, micro_time
from gateway.live.server import build_app
from gateway.live.service import Gateway
from tests.fakes import FakeClock
from tests.live.fake_kube import FakeKube, fake_kube
from tests.live.harness import chain, emulators, gateway_client, wait_for, write_config

CFG = LeaderElectionConfig(enabled=True, lease_duration_s=4, renew_deadline_s=3, retry_period_s=1)
LEASE = "/apis/coordination.k8s.io/v1/namespaces/hexflow/leases"


class Replica:
    """One elector and the leadership changes it reported."""

    def __init__(self, kube: FakeKube, name: str, clock: FakeClock, cfg: LeaderElectionConfig = CFG) -> None:
        self.changes: list[bool] = []
        self.api = KubeApi(kube.url, "hexflow", token_file=None, ca_file=None, timeout_s=2)
        self.api._auth = lambda: b"Authorization: Bearer test-token\r\n"  # type: ignore[method-assign]
        self.el = LeaderElector(cfg, self.api, name, self.changes.append, clock=clock, wall=clock.wall)


def spec(kube: FakeKube) -> dict[str, Any]:
    return dict(kube.leases["hexflow-gateway"]["spec"])


async def test_first_replica_creates_the_lease_and_the_next_one_follows() -> None:
    clock = FakeClock(100.0)
    async with fake_kube() as kube:
        a, b = Replica(kube, "gw-a", clock), Replica(kube, "gw-b", clock)
        await a.el.step()
        assert a.el.leading and a.changes == [True]
        s = spec(kube)
        assert s["holderIdentity"] == "gw-a"
        assert s["leaseDurationSeconds"] == 4
        assert s["leaseTransitions"] == 0
        assert s["acquireTime"] == s["renewTime"] == micro_time(clock.wall())
        await b.el.step()
        assert not b.el.leading and b.changes == []
        assert b.el.holder == "gw-a"
        for r in (a, b):
            await r.api.close()


async def test_a_follower_takes_over_once_the_record_went_unchanged_for_the_lease_duration() -> None:
    clock = FakeClock(100.0)
    async with fake_kube() as kube:
        a, b = Replica(kube, "gw-a", clock), Replica(kube, "gw-b", clock)
        await a.el.step()
        acquired = spec(kube)["acquireTime"]
        await b.el.step()
        # The leader renews: the record changes, so the follower's wait starts again.
        clock.t += 2.5
        await a.el.step()
        assert spec(kube)["acquireTime"] == acquired and spec(kube)["renewTime"] != acquired
        clock.t += 2.0
        await b.el.step()  # 4.5 s since B first saw gw-a, but the record changed 2 s ago
        assert not b.el.leading
        # The leader dies (no more renewals): after a lease duration of the same record, B takes over.
        clock.t += 3.9
        await b.el.step()
        assert not b.el.leading
        clock.t += 0.2
        await b.el.step()
        assert b.el.leading and b.changes == [True]
        s = spec(kube)
        assert s["holderIdentity"] == "gw-b" and s["leaseTransitions"] == 1
        assert s["acquireTime"] == s["renewTime"] == micro_time(clock.wall())
        # Were A alive after all, it would see B's record and step down at once.
        await a.el.step()
        assert not a.el.leading and a.changes == [True, False]
        for r in (a, b):
            await r.api.close()


async def test_a_leader_that_cannot_renew_steps_down_within_its_renew_deadline() -> None:
    clock = FakeClock(100.0)
    async with fake_kube() as kube:
        a = Replica(kube, "gw-a", clock)
        await a.el.step()
        kube.lease_fail = True  # the API server is unreachable for it
        clock.t += 2.9
        await a.el.step()
        assert a.el.leading and a.el.errors == 1  # still within renew_deadline_s (3)
        clock.t += 0.2
        await a.el.step()
        assert not a.el.leading and a.changes == [True, False]
        # ... before a follower may take over: renew_deadline_s < lease_duration_s.
        assert CFG.renew_deadline_s < CFG.lease_duration_s
        kube.lease_fail = False
        await a.el.step()  # its own record: it takes it back at once
        assert a.el.leading and spec(kube)["leaseTransitions"] == 0
        await a.api.close()


async def test_an_update_with_an_old_resource_version_is_refused_and_one_racer_wins() -> None:
    clock = FakeClock(100.0)
    async with fake_kube() as kube:
        a, b, c = (Replica(kube, n, clock) for n in ("gw-a", "gw-b", "gw-c"))
        await a.el.step()
        stale = await b.api.request_json("GET", f"{LEASE}/hexflow-gateway")
        clock.t += 1
        await a.el.step()  # a renewal: a new resourceVersion
        with pytest.raises(KubeConflict):
            await b.api.request_json("PUT", f"{LEASE}/hexflow-gateway", stale)
        await a.el.release()
        assert spec(kube)["holderIdentity"] is None and spec(kube)["leaseDurationSeconds"] == 1
        # Two followers race for the released lease: exactly one wins, the other's write conflicts or follows.
        await asyncio.gather(b.el.step(), c.el.step())
        assert [b.el.leading, c.el.leading].count(True) == 1
        assert spec(kube)["leaseTransitions"] == 1
        for r in (a, b, c):
            await r.api.close()


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"lease_duration_s": 5, "renew_deadline_s": 5}, "leader_election.renew_deadline_s"),
        ({"lease_duration_s": 5, "renew_deadline_s": 3, "retry_period_s": 2.6}, "leader_election.retry_period_s"),
        ({"lease_name": "Not_A_Name"}, "leader_election.lease_name"),
        ({"lease_duration_s": 0}, "leader_election.lease_duration_s"),
        ({"lease_duration_s": 1.5}, "leader_election.lease_duration_s"),
    ],
)
def test_leader_election_config_errors_name_the_key(tmp_path: Path, section: dict[str, Any], field: str) -> None:
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"], leader_election={"enabled": True, **section})
    with pytest.raises(ConfigError) as err:
        load_gateway_config(cfg)
    assert err.value.field == field


def _gw(app: Any) -> Gateway:
    gw = app.state.gateway
    assert isinstance(gw, Gateway)
    return gw


async def test_a_follower_is_unready_refuses_work_and_runs_no_tuner_until_it_leads(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, fake_kube() as kube:
        token = tmp_path / "token"
        token.write_text("test-token")
        # Another replica holds the lease and keeps renewing it for now.
        kube.leases["hexflow-gateway"] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "hexflow-gateway", "namespace": "hexflow", "resourceVersion": "1"},
            "spec": {"holderIdentity": "gw-other", "leaseDurationSeconds": 3600, "leaseTransitions": 3},
        }
        cfg = write_config(
            tmp_path,
            urls,
            ["A100"],
            tuning={"enabled": True},
            refit={"enabled": True},
            leader_election={
                "enabled": True,
                "identity": "gw-me",
                "lease_duration_s": 2,
                "renew_deadline_s": 1.5,
                "retry_period_s": 0.2,
                "api_url": kube.url,
                "token_file": str(token),
                "namespace": "hexflow",
            },
        )
        async with gateway_client(cfg) as (client, app):
            gw = _gw(app)
            assert await wait_for(lambda: gw.elector is not None and gw.elector.holder == "gw-other", 30)
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json() == {"ready": False, "reason": "not the leader", "leader": "gw-other"}
            body = {"calls": chain(1), "deadline_s": 60}
            refused = await client.post("/v1/workflows", json=body)
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert "not the leader (gw-other is)" in refused.json()["error"]["message"]
            assert 'reason="not_leader",tenant="interactive"} 1.0' in (await client.get("/metrics")).text
            assert not gw.lifecycle.leader_tasks
            status = (await client.get("/v1/status")).json()
            assert status["ready"] is False and status["leader_election"]["leader"] == "gw-other"
            # The other replica releases the lease (shutdown): this one takes over and serves.
            kube.leases["hexflow-gateway"]["spec"] = {"holderIdentity": None, "leaseDurationSeconds": 1}
            assert await wait_for(lambda: gw.leading, 30)
            assert spec(kube)["holderIdentity"] == "gw-me" and spec(kube)["leaseTransitions"] == 1
            assert [t.get_name() for t in gw.lifecycle.leader_tasks] == ["alpha-tuner", "profile-refit"]
            assert await wait_for(lambda: gw.pool.healthy > 0, 30)
            assert (await client.get("/readyz")).status_code == 200
            ok = await client.post("/v1/workflows", json=body)
            assert ok.status_code == 200, ok.text
            metrics = (await client.get("/metrics")).text
            assert "hexflow_leader 1.0" in metrics
            assert 'hexflow_leader_changes_total{event="acquired"} 1.0' in metrics
            # Someone else takes the lease (this replica was partitioned away): it stops serving at once.
            kube.leases["hexflow-gateway"]["spec"]["holderIdentity"] = "gw-other"
            assert await wait_for(lambda: not gw.leading, 30)
            assert not gw.lifecycle.leader_tasks
            assert (await client.get("/readyz")).json()["reason"] == "not the leader"
        # Shut down as a follower: the lease is left alone.
        assert spec(kube)["holderIdentity"] == "gw-other"


async def test_a_leader_gives_the_lease_up_when_it_shuts_down(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, fake_kube() as kube:
        token = tmp_path / "token"
        token.write_text("test-token")
        cfg = write_config(
            tmp_path,
            urls,
            ["A100"],
            leader_election={
                "enabled": True,
                "identity": "gw-me",
                "api_url": kube.url,
                "token_file": str(token),
                "namespace": "hexflow",
            },
        )
        async with gateway_client(cfg) as (client, app):
            gw = _gw(app)
            assert await wait_for(lambda: gw.leading, 30)
            assert (await client.get("/v1/status")).json()["leader_election"]["leading"] is True
        s = spec(kube)
        assert s["holderIdentity"] is None and s["leaseDurationSeconds"] == 1
        assert kube.writes[0] == "gw-me" and kube.writes[-1] is None
        left = {t.get_name() for t in asyncio.all_tasks()} & {
            "leader-election",
            "alpha-tuner",
            "profile-refit",
            "idempotent-work",
        }
        assert not left, f"tasks left after shutdown: {left}"


async def test_the_rbac_hint_names_leases_on_403(tmp_path: Path) -> None:
    async with fake_kube() as kube:
        api = KubeApi(kube.url, "hexflow", token_file=str(tmp_path / "none"), ca_file=None, timeout_s=2)
        async with httpx.AsyncClient() as raw:
            assert (await raw.get(f"{kube.url}{LEASE}/x")).status_code == 401
        with pytest.raises(Exception, match="leases"):
            await api.request_json("GET", f"{LEASE}/x")
        await api.close()


def test_leader_election_outside_a_pod_needs_an_api_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"], leader_election={"enabled": True})
    with pytest.raises(ConfigError) as err:
        build_app(load_gateway_config(cfg))
    assert err.value.field == "leader_election.api_url"

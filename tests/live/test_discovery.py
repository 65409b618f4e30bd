"""Worker discovery from Kubernetes, against a fake API server (``tests/live/fake_kube.py``)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config import load_gpu_catalog
from gateway.config.gateway import load_gateway_config
from gateway.config.operations import KubernetesDiscoveryConfig
from gateway.core.scheduler import Scheduler, WorkerInfo
from gateway.core.workflow import Call, CallSpec, Stage, StagedWorkflow
from gateway.errors import ConfigError
from gateway.live.discovery import PodError, pod_ready, pod_worker
from gateway.live.pool import WorkerPool
from gateway.live.server import build_app
from gateway.live.worker_state import WorkerState
from tests.live.fake_kube import fake_kube, make_pod
from tests.live.harness import chain, emulators, gateway_client, record_sends, wait_for, write_config

KCFG = KubernetesDiscoveryConfig()


# ------------------------------------------------------------------------------------------------ pods


def test_pod_worker_reads_labels_annotations_and_ports() -> None:
    pod = make_pod("w0", "http://10.0.0.7:8001", "A100", capacity=6)
    pw = pod_worker(pod, KCFG, "llama-3.1-8b")
    assert pw is not None
    assert (pw.name, pw.url, pw.gpu, pw.model, pw.served_model, pw.capacity, pw.ready) == (
        "w0", "http://10.0.0.7:8001", "A100", "llama-3.1-70b", "llama-3.1-70b", 6, True,
    )  # fmt: skip
    # Defaults: model and capacity from the config; port from the annotation when no port is named http.
    bare = make_pod("w1", "http://10.0.0.8:9000", "L40S", capacity=None, model=None, named_port=False)
    pw = pod_worker(bare, KCFG, "llama-3.1-8b")
    assert pw is not None and (pw.model, pw.capacity, pw.url) == (
        "llama-3.1-8b",
        None,
        "http://10.0.0.8:9000",
    )  # None: derived
    bare["metadata"]["annotations"].pop("hexflow.io/port")
    pw = pod_worker(bare, KCFG, "llama-3.1-8b")
    assert pw is not None and pw.url == "http://10.0.0.8:8000"  # default_port
    bare["metadata"]["annotations"]["hexflow.io/served-model"] = "meta-llama/Llama-3.1-8B-Instruct"
    bare["status"]["podIP"] = "fd00::5"
    pw = pod_worker(bare, KCFG, "llama-3.1-8b")
    assert pw is not None and pw.url == "http://[fd00::5]:8000"
    assert pw.served_model == "meta-llama/Llama-3.1-8B-Instruct" and pw.model == "llama-3.1-8b"


def test_pod_readiness_and_bad_pods() -> None:
    pod = make_pod("w0", "http://10.0.0.7:8000", "A100")
    assert pod_ready(pod)
    pod["status"]["conditions"][-1]["status"] = "False"
    assert not pod_ready(pod)
    pod = make_pod("w0", "http://10.0.0.7:8000", "A100")
    pod["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    assert not pod_ready(pod), "a terminating pod takes no new calls"
    pod = make_pod("w0", "http://10.0.0.7:8000", "A100")
    pod["status"]["phase"] = "Pending"
    assert not pod_ready(pod)
    pod["status"].pop("podIP")
    assert pod_worker(pod, KCFG, "llama-3.1-70b") is None, "no IP yet: pending, not an error"
    pod = make_pod("w0", "http://10.0.0.7:8000", "A100")
    pod["metadata"]["labels"].pop("hexflow.io/gpu")
    with pytest.raises(PodError, match=r"hexflow\.io/gpu"):
        pod_worker(pod, KCFG, "llama-3.1-70b")
    for bad in ("eight", "0", "5000"):
        pod = make_pod("w0", "http://10.0.0.7:8000", "A100")
        pod["metadata"]["annotations"]["hexflow.io/capacity"] = bad
        with pytest.raises(PodError, match=r"hexflow\.io/capacity"):
            pod_worker(pod, KCFG, "llama-3.1-70b")


# ------------------------------------------------------------------------------------------------ scheduler


def test_scheduler_membership_reuses_freed_slots_and_rebudgets() -> None:
    cat = load_gpu_catalog()
    a100 = WorkerInfo("a", cat.profile("A100", "llama-3.1-70b"), 4)
    l40s = WorkerInfo("b", cat.profile("L40S", "llama-3.1-70b"), 4)
    s = Scheduler([], "hexgen", random.Random(0))
    assert s.reference_cost("x", 1000, 100) == 0.0  # no members: a stage gets all the time left
    wa = s.add_worker(a100)
    cost_a = s.reference_cost("x", 1000, 100)
    wb = s.add_worker(l40s)
    assert (wa, wb) == (0, 1) and s.members() == [0, 1]
    assert s.reference_cost("x", 1000, 100) > cost_a  # the L40S is slower: the mean rises
    wf = StagedWorkflow(1, "t", 0.0, 100.0, [Stage("x", (CallSpec("x", 1000, 100),))])
    call = Call(1, wf, CallSpec("x", 1000, 100), 0.0)
    w = s.submit(call, 0.0)
    with pytest.raises(RuntimeError, match="queued or in-flight"):
        s.remove_worker(w)
    s.set_eligible(w, False)
    assert s.drain_worker(w) == [call]
    s.remove_worker(w)
    assert s.members() == [1 - w] and not s.eligible[w]
    assert s.submit(call, 0.0) == 1 - w
    again = s.add_worker(WorkerInfo("c", cat.profile("A6000", "llama-3.1-70b"), 2))
    assert again == w, "a freed slot is reused"
    assert s.estimator.loads[again].queued == 0 and s.workers[again].capacity == 2


# ------------------------------------------------------------------------------------------------ live rig


def discovery_config(tmp: Path, api_url: str, *, period_s: float, watch: bool = True, **over: Any) -> Path:
    """A gateway.yaml (``write_config``'s) whose workers all come from the fake API (no ``cluster`` unless
    ``over`` gives one); ``over["discovery"]`` is merged into the discovery section."""
    (tmp / "token").write_text("test-token\n")
    kubernetes = {
        "api_url": api_url,
        "namespace": "hexflow",
        "period_s": period_s,
        "watch": watch,
        "token_file": str(tmp / "token"),
        "ca_file": None,
        "timeout_s": 2.0,
    }
    over["discovery"] = {"kubernetes": kubernetes, "remove_grace_s": 30, **over.get("discovery", {})}
    over.setdefault("cluster", None)
    return write_config(tmp, [], [], **over)


async def until(pred: Callable[[], object], timeout: float, what: str) -> float:
    """Wait for ``pred``; returns the seconds it took (fails the test after ``timeout``)."""
    t0 = time.monotonic()
    if not await wait_for(pred, timeout):
        raise AssertionError(f"not within {timeout:g} s: {what}")
    return time.monotonic() - t0


class Load:
    """Workflows sent back to back by ``n`` clients until stopped; every response is kept."""

    def __init__(self, client: httpx.AsyncClient, n: int = 4) -> None:
        self.client = client
        self.results: list[tuple[int, dict[str, Any]]] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._one()) for _ in range(n)]

    async def _one(self) -> None:
        while not self._stop.is_set():
            r = await self.client.post("/v1/workflows", json={"calls": chain(3, width=2), "deadline_s": 60})
            self.results.append((r.status_code, r.json()))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


class Changes:
    """The pool's membership changes with the scheduler-clock time they took effect."""

    def __init__(self, pool: WorkerPool) -> None:
        self.log: list[tuple[float, str, str]] = []
        for method in ("set_ready", "remove_worker"):
            orig = getattr(pool, method)

            def wrapped(st: WorkerState, *a: Any, _orig: Any = orig, _m: str = method) -> None:
                before = (st.ready, st.removing)
                _orig(st, *a)
                if (st.ready, st.removing) != before:
                    action = "removed" if _m == "remove_worker" else ("ready" if st.ready else "unready")
                    self.log.append((pool.clock(), st.name, action))

            setattr(pool, method, wrapped)

    def at(self, name: str, action: str) -> float:
        return next(t for t, n, a in self.log if n == name and a == action)


def sends(sent: list[tuple[float, str]], name: str, after: float, before: float = float("inf")) -> int:
    return sum(1 for t, n in sent if n == name and after <= t < before)


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "poll"])
async def test_workers_follow_pods_without_losing_a_call(tmp_path: Path, watch: bool) -> None:
    # With a watch, the periodic re-list is pushed far beyond the test (30 s), so every change applied here
    # came through the watch; polling re-lists every 0.5 s. How fast each change was applied is printed, not
    # asserted (a busy 2-core machine delays the event loop): the test asserts that each change happens.
    period = 30.0 if watch else 0.5
    settle_s = 10.0
    async with emulators(["A100", "A6000", "L40S"]) as urls, fake_kube() as kube:
        kube.add(make_pod("w-a", urls[0], "A100"))
        kube.add(make_pod("w-b", urls[1], "A6000"))
        kube.add(make_pod("w-x", urls[2], "H100-unknown"))  # invalid: skipped, counted
        kube.add(make_pod("other", urls[2], "L40S", role="database"))  # not selected
        cfg = discovery_config(tmp_path, kube.url, period_s=period, watch=watch)
        async with gateway_client(cfg) as (client, app):
            gw = app.state.gateway
            pool: WorkerPool = gw.pool
            sent = record_sends(pool)
            changes = Changes(pool)
            assert {st.name for st in pool.workers} == {"w-a", "w-b"}, "the first list is awaited at start"
            load = Load(client)
            await until(lambda: sends(sent, "w-a", 0) and sends(sent, "w-b", 0), 10, "calls reach both workers")

            # A pod added: a worker, and it takes calls.
            t0 = pool.clock()
            kube.add(make_pod("w-c", urls[2], "L40S", capacity=2))
            t_add = await until(lambda: (st := pool.by_name("w-c")) is not None and st.eligible, settle_s, "add")
            assert pool.by_name("w-c").info.capacity == 2  # type: ignore[union-attr]
            await until(lambda: sends(sent, "w-c", t0), 10, "calls reach the added worker")

            # A pod made unready: drained (no new calls, queue re-dispatched).
            kube.ready("w-b", False)
            t_drain = await until(lambda: not pool.by_name("w-b").eligible, settle_s, "unready")  # type: ignore[union-attr]
            t_unready = changes.at("w-b", "unready")
            await until(lambda: not pool.by_name("w-b").inflight, 10, "in-flight calls of w-b finish")  # type: ignore[union-attr]
            assert gw.scheduler.queue_len(pool.by_name("w-b").index) == 0  # type: ignore[union-attr]
            text = (await client.get("/metrics")).text
            assert 'hexflow_worker_draining{worker="w-b"} 1.0' in text and 'hexflow_worker_up{worker="w-b"} 0.0' in text

            # A pod deleted: removed (after its in-flight calls returned).
            kube.delete("w-a")
            t_gone = await until(lambda: pool.by_name("w-a") is None, settle_s, "removal")
            print(
                f"discovery ({'watch' if watch else 'poll'}, period {period} s): added {t_add:.3f} s, "
                f"drained {t_drain:.3f} s, removed {t_gone:.3f} s after the API change"
            )
            t_removed = changes.at("w-a", "removed")

            # Back to ready: calls again.
            kube.ready("w-b", True)
            await until(lambda: pool.by_name("w-b").eligible, settle_s, "ready again")  # type: ignore[union-attr]
            t_ready = changes.at("w-b", "ready")
            await until(lambda: sends(sent, "w-b", t_ready), 10, "calls reach w-b again")
            # Enough whole workflows ran across the changes (how many depends on the machine's speed: wait for them).
            await until(lambda: len(load.results) >= 8, 30, "eight workflows answered")
            await load.stop()

            assert sends(sent, "w-b", t_unready, t_ready) == 0, "a call was sent to an unready worker"
            assert sends(sent, "w-a", t_removed) == 0, "a call was sent to a removed worker"
            bad = [(code, body) for code, body in load.results if code != 200 or body["status"] != "ok"]
            assert not bad, bad[:2]
            for _, body in load.results:
                assert len(body["calls"]) == 6 and all(c["output"] for c in body["calls"])
            metrics = (await client.get("/metrics")).text
            assert 'worker="w-a"' not in metrics, "a removed worker's series are deleted"
            assert 'hexflow_worker_up{worker="w-c"} 1.0' in metrics
            assert 'hexflow_worker_draining{worker="w-b"} 0.0' in metrics
            assert 'hexflow_discovery_pods{state="invalid"} 1.0' in metrics
            assert 'hexflow_discovery_pods{state="ready"} 2.0' in metrics
            status = (await client.get("/v1/status")).json()
            assert status["discovery"]["workers"] == ["w-b", "w-c"]
            assert "H100-unknown" in status["discovery"]["invalid"]["w-x"]
            if watch:
                assert kube.watches >= 1 and kube.lists == 1, "the watch carried every change (one list at start)"
            else:
                assert kube.watches == 0 and kube.lists >= 3


async def test_pod_recreated_under_the_same_name_rejoins_with_its_new_address(tmp_path: Path) -> None:
    """A StatefulSet pod keeps its name across restarts; the new address replaces the old one."""
    async with emulators(["A100", "A100"]) as urls, fake_kube() as kube:
        kube.add(make_pod("vllm-a100-0", urls[0], "A100"))
        async with gateway_client(discovery_config(tmp_path, kube.url, period_s=0.5)) as (client, app):
            pool: WorkerPool = app.state.gateway.pool
            first = pool.by_name("vllm-a100-0")
            assert first is not None and first.info.url == urls[0]
            kube.update("vllm-a100-0", lambda p: p["status"].update(podIP="127.0.0.1"))  # same IP: nothing changes
            kube.update(
                "vllm-a100-0",
                lambda p: p["spec"]["containers"][0]["ports"][0].update(containerPort=int(urls[1].rsplit(":", 1)[1])),
            )
            await until(
                lambda: (st := pool.by_name("vllm-a100-0")) is not None and st.info.url == urls[1] and st.eligible,
                1.0,
                "the pod's new address replaces the old",
            )
            assert pool.by_name("vllm-a100-0") is not first
            r = await client.post("/v1/workflows", json={"calls": chain(2), "deadline_s": 60})
            assert r.status_code == 200 and r.json()["status"] == "ok"


async def test_expired_watch_relists_and_api_failures_keep_the_workers(tmp_path: Path) -> None:
    async with emulators(["A100", "L40S"]) as urls, fake_kube() as kube:
        kube.add(make_pod("w-a", urls[0], "A100"))
        cfg = discovery_config(tmp_path, kube.url, period_s=0.5)
        async with gateway_client(cfg) as (client, app):
            gw = app.state.gateway
            pool: WorkerPool = gw.pool
            lists = kube.lists
            # etcd compaction while the watch is between requests: the next watch gets 410 -> list again.
            kube.compact()
            kube.add(make_pod("w-b", urls[1], "L40S"))
            await until(lambda: pool.by_name("w-b") is not None, 1.0, "the pod added around a compaction")
            await until(lambda: kube.lists > lists, 1.0, "a fresh list")
            # The API fails for a while (server errors, then a rotated token the gateway has not read yet).
            kube.fail_next = 3
            await until(lambda: kube.fail_next == 0, 5, "the failures are seen")
            assert {st.name for st in pool.workers} == {"w-a", "w-b"}, "an API outage removes nobody"
            r = await client.post("/v1/workflows", json={"calls": chain(2, width=2), "deadline_s": 60})
            assert r.status_code == 200 and r.json()["status"] == "ok"
            kube.token = "rotated-token"
            unauthorized = kube.unauthorized
            await until(lambda: kube.unauthorized > unauthorized, 2.0, "a refused request")
            (tmp_path / "token").write_text("rotated-token\n")  # the kubelet rotates the projected token
            kube.delete("w-b")
            await until(lambda: pool.by_name("w-b") is None, 2.0, "discovery works again with the new token")
            status = (await client.get("/v1/status")).json()["discovery"]
            metrics = (await client.get("/metrics")).text
            assert status["workers"] == ["w-a"]
            errors = next(ln for ln in metrics.splitlines() if ln.startswith("hexflow_discovery_errors_total"))
            assert float(errors.split()[-1]) >= 4


async def test_removed_worker_with_a_stuck_call_hands_it_to_another(tmp_path: Path) -> None:
    """A pod that vanished without closing its connections: its calls are re-dispatched after the grace."""
    slow_worker = emulators(["A100"], time_scale=5.0, force_exit=True)
    async with slow_worker as slow, emulators(["A100"]) as fast, fake_kube() as kube:
        kube.add(make_pod("slow", slow[0], "A100"))
        cfg = discovery_config(tmp_path, kube.url, period_s=0.5, discovery={"remove_grace_s": 0.5})
        async with gateway_client(cfg) as (client, app):
            pool: WorkerPool = app.state.gateway.pool
            run = asyncio.create_task(
                client.post("/v1/workflows", json={"calls": chain(1, out=400), "deadline_s": 300})
            )
            await until(lambda: (st := pool.by_name("slow")) is not None and st.inflight, 5, "the call is running")
            kube.add(make_pod("fast", fast[0], "A100"))
            await until(lambda: pool.by_name("fast") is not None, 1.0, "the new worker")
            kube.delete("slow")
            r = await asyncio.wait_for(run, 10)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["status"] == "ok" and body["calls"][0]["worker"] == "fast"
            assert pool.by_name("slow") is None
            assert body["calls"][0]["attempts"] == 1, "a hand-over is not a failed attempt"
            assert app.state.gateway.pool.by_name("fast").sent == 1


async def test_static_workers_and_discovered_ones_side_by_side(tmp_path: Path) -> None:
    async with emulators(["A100", "L40S"]) as urls, fake_kube() as kube:
        kube.add(make_pod("static-0", urls[1], "L40S"))  # same name as a static worker: skipped
        kube.add(make_pod("pod-0", urls[1], "L40S"))
        cfg = discovery_config(
            tmp_path,
            kube.url,
            period_s=0.5,
            cluster={"name": "mixed", "workers": [{"name": "static-0", "gpu": "A100", "url": urls[0], "capacity": 4}]},
        )
        async with gateway_client(cfg) as (client, app):
            gw = app.state.gateway
            assert [(st.name, st.info.url) for st in gw.pool.workers] == [("static-0", urls[0]), ("pod-0", urls[1])]
            kube.delete("pod-0")
            kube.delete("static-0")
            await until(lambda: len(gw.pool.workers) == 1, 1.0, "the pod is removed")
            assert gw.pool.workers[0].name == "static-0", "static workers are never removed by discovery"
            models = (await client.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["llama-3.1-70b"]


async def test_no_pods_yet_means_503_then_work_when_one_is_ready(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, fake_kube() as kube:
        kube.add(make_pod("w-a", urls[0], "A100", ready=False))  # starting: not a worker yet
        async with gateway_client(discovery_config(tmp_path, kube.url, period_s=0.5)) as (client, app):
            r = await client.post("/v1/workflows", json={"calls": chain(1), "deadline_s": 60})
            assert r.status_code == 503 and "no healthy worker" in r.text and r.headers["retry-after"]
            assert (await client.get("/readyz")).status_code == 503
            kube.ready("w-a", True)
            await until(lambda: app.state.gateway.pool.healthy == 1, 1.0, "the pod joins once ready")
            r = await client.post("/v1/workflows", json={"calls": chain(1), "deadline_s": 60})
            assert r.status_code == 200 and r.json()["status"] == "ok"


def test_config_needs_workers_and_an_api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = discovery_config(tmp_path, "http://127.0.0.1:1", period_s=1)
    raw = yaml.safe_load(cfg.read_text())
    raw.pop("discovery")
    cfg.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"cluster.*no workers"):
        load_gateway_config(cfg)
    cfg = discovery_config(tmp_path, "http://127.0.0.1:1", period_s=1)
    raw = yaml.safe_load(cfg.read_text())
    raw["discovery"]["kubernetes"].pop("api_url")
    cfg.write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        build_app(load_gateway_config(cfg))
    raw["discovery"]["kubernetes"]["default_model"] = "gpt-17"
    cfg.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"default_model.*gpt-17"):
        load_gateway_config(cfg)


async def _hexflow(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_hexflow_discover_shows_what_discovery_makes_of_each_pod(tmp_path: Path) -> None:
    async with fake_kube() as kube:
        kube.add(make_pod("w-a", "http://10.0.0.1:8000", "A100", capacity=6))
        w_b = make_pod("w-b", "http://10.0.0.2:8000", "L40S", ready=False)
        w_b["metadata"]["annotations"]["hexflow.io/profile"] = "A100"  # an L40S scheduled as an A100
        kube.add(w_b)
        kube.add(make_pod("w-x", "http://10.0.0.3:8000", "TPU"))
        kube.add(make_pod("other", "http://10.0.0.4:8000", "A100", role="database"))
        starting = make_pod("w-p", "http://10.0.0.5:8000", "A100", ready=False)
        starting["status"].pop("podIP")
        kube.add(starting)
        cfg = discovery_config(tmp_path, kube.url, period_s=1)
        code, out, err = await _hexflow("discover", "--config", str(cfg), "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["namespace"] == "hexflow" and doc["selector"] == "hexflow.io/role=worker"
        pods = {p["pod"]: p for p in doc["pods"]}
        assert set(pods) == {"w-a", "w-b", "w-x", "w-p"}
        assert pods["w-a"] == {
            "pod": "w-a", "state": "ready", "url": "http://10.0.0.1:8000", "gpu": "A100",
            "model": "llama-3.1-70b", "profile": "A100/llama-3.1-70b", "capacity": 6, "problem": None,
        }  # fmt: skip
        assert pods["w-b"]["state"] == "unready" and pods["w-p"]["state"] == "pending"
        assert (pods["w-b"]["gpu"], pods["w-b"]["profile"]) == ("L40S", "A100/llama-3.1-70b")
        assert pods["w-x"]["state"] == "invalid" and "unknown GPU 'TPU'" in pods["w-x"]["problem"]
        code, out, _ = await _hexflow("discover", "--config", str(cfg))
        assert code == 0 and out.startswith("4 pods match 'hexflow.io/role=worker' in namespace hexflow")
        [line_b] = [ln for ln in out.splitlines() if "w-b" in ln]
        [line_a] = [ln for ln in out.splitlines() if "w-a" in ln]
        assert "L40S/llama-3.1-70b" in line_b and "profile A100/llama-3.1-70b" in line_b
        assert "profile" not in line_a  # the catalogue's profile of its GPU: nothing to add
        (tmp_path / "token").write_text("wrong\n")
        code, _, err = await _hexflow("discover", "--config", str(cfg))
        assert code == 1 and "HTTP 401" in err and "Role" in err


def test_a_pod_names_its_profile_with_an_annotation() -> None:
    from gateway.config import load_gpu_catalog
    from gateway.live.discovery import pod_state

    cat = load_gpu_catalog()
    pod = make_pod("w0", "http://10.0.0.7:8001", "L40S", capacity=6)
    state, got, _ = pod_state(pod, KCFG, cat, "llama-3.1-70b", 1.0)
    assert state == "ready" and got is not None and got[1].profile.name == "L40S/llama-3.1-70b"
    pod["metadata"]["annotations"]["hexflow.io/profile"] = "A100"
    state, got, _ = pod_state(pod, KCFG, cat, "llama-3.1-70b", 1.0)
    assert got is not None
    pw, info = got
    assert (info.profile.name, info.profile_source, pw.same_engine(info)) == ("A100/llama-3.1-70b", "catalogue", True)
    pod["metadata"]["annotations"]["hexflow.io/profile"] = "nope"
    state, got, problem = pod_state(pod, KCFG, cat, "llama-3.1-70b", 1.0)
    assert state == "invalid" and got is None
    assert "'nope'" in problem and "A100" in problem and "L40S" in problem

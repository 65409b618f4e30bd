"""A fake Kubernetes API server for discovery tests: the pods API's list and watch, as the real one.

What it implements of ``GET /api/v1/namespaces/{ns}/pods``:
- ``labelSelector`` with ``k=v``, ``k==v``, ``k!=v``, ``k`` and ``!k`` terms (comma = and);
- a list answers a ``PodList`` with ``metadata.resourceVersion`` (a global counter bumped by every change);
- ``watch=1&resourceVersion=RV`` streams newline-delimited ``{"type", "object"}`` events newer than RV
  (ADDED, MODIFIED, DELETED; BOOKMARK when ``allowWatchBookmarks``), then waits for new ones until
  ``timeoutSeconds``; an RV older than the compaction point gets an ``ERROR`` event with a 410 Status, as
  etcd compaction does; a selector change of a pod emits ADDED/DELETED for the watchers it enters/leaves;
- bearer-token authentication (401 otherwise), and injectable failures (``fail_next``).

And of ``coordination.k8s.io/v1`` Leases (leader election), as the real server:
- ``GET .../leases/{name}`` (404 Status when absent), ``POST .../leases`` (201; 409 AlreadyExists),
  ``PUT .../leases/{name}`` (404 when absent; 409 Conflict when the body's ``metadata.resourceVersion`` is
  not the stored one; every write gets a new resourceVersion from the same counter as the pods');
- ``lease_fail`` makes every lease request answer 500 (the API unreachable for leader election only),
  and ``writes`` records each lease write's holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from tests.emulator_process import free_port

Pod = dict[str, Any]


def make_pod(
    name: str,
    url: str,
    gpu: str,
    *,
    ready: bool = True,
    capacity: int | None = 4,
    model: str | None = "llama-3.1-70b",
    role: str = "worker",
    named_port: bool = True,
) -> Pod:
    """A pod object as the API returns it, for a worker listening at ``url`` (``http://ip:port``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    ann: dict[str, str] = {}
    if capacity is not None:
        ann["hexflow.io/capacity"] = str(capacity)
    if model is not None:
        ann["hexflow.io/model"] = model
    if not named_port:
        ann["hexflow.io/port"] = port
    pod: Pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "hexflow",
            "uid": f"uid-{name}",
            "labels": {"hexflow.io/role": role, "hexflow.io/gpu": gpu, "app.kubernetes.io/name": "hexflow-worker"},
            "annotations": ann,
        },
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "ports": [
                        {"name": "http" if named_port else "other", "containerPort": int(port), "protocol": "TCP"}
                    ],
                }
            ]
        },
        "status": {"phase": "Running", "podIP": host, "conditions": []},
    }
    set_ready(pod, ready)
    return pod


def set_ready(pod: Pod, ready: bool) -> None:
    """Set the pod's ``Ready`` condition."""
    conds = [c for c in pod["status"].get("conditions", []) if c.get("type") != "Ready"]
    conds.append({"type": "Ready", "status": "True" if ready else "False"})
    pod["status"]["conditions"] = conds


def _matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKube:
    """The fake API server (an aiohttp app on a loopback port).

    Args:
        namespace: the only namespace it serves (others answer 404).
        token: the bearer token it accepts (``None``: no authentication).
    """

    def __init__(self, namespace: str = "hexflow", token: str | None = "test-token") -> None:
        self.namespace = namespace
        self.token = token
        self.pods: dict[str, Pod] = {}
        self.rv = 100
        self.history: list[tuple[int, Pod | None, Pod | None]] = []  # (rv, before, after)
        self.compacted_rv = 0
        self.fail_next = 0
        self.fail_status = 500
        self.lists = 0
        self.watches = 0
        self.unauthorized = 0
        self.leases: dict[str, dict[str, Any]] = {}
        self.lease_fail = False
        self.writes: list[str | None] = []
        self.conflicts = 0
        self._changed = asyncio.Event()
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ------------------------------------------------------------------ state changes (the test's side)

    def _commit(self, before: Pod | None, after: Pod | None) -> None:
        self.rv += 1
        if after is not None:
            after["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, copy.deepcopy(before), copy.deepcopy(after)))
        self._changed.set()
        self._changed = asyncio.Event()

    def add(self, pod: Pod) -> None:
        """Create a pod."""
        name = pod["metadata"]["name"]
        assert name not in self.pods, name
        self.pods[name] = pod
        self._commit(None, pod)

    def update(self, name: str, change: Callable[[Pod], None]) -> None:
        """Change a pod in place (a MODIFIED event)."""
        before = copy.deepcopy(self.pods[name])
        change(self.pods[name])
        self._commit(before, self.pods[name])

    def ready(self, name: str, ready: bool) -> None:
        """Flip a pod's readiness."""
        self.update(name, lambda p: set_ready(p, ready))

    def delete(self, name: str) -> None:
        """Delete a pod (a DELETED event)."""
        before = self.pods.pop(name)
        self._commit(before, None)
        # A DELETED event carries the object's last state with the deletion's version.
        self.history[-1] = (self.rv, before, None)

    def compact(self) -> None:
        """Forget the history (etcd compaction): watches from older versions get 410 Gone."""
        self.compacted_rv = self.rv
        self.history.clear()

    # ------------------------------------------------------------------ HTTP

    async def start(self) -> str:
        """Serve on a loopback port; returns the base URL."""
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        leases = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        app.router.add_post(leases, self._lease_create)
        app.router.add_get(leases + "/{name}", self._lease_get)
        app.router.add_put(leases + "/{name}", self._lease_update)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving (open watches are closed)."""
        self._stopping = True
        self._changed.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def _status(self, code: int, message: str) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
        return web.json_response(body, status=code)

    def _lease_refusal(self, request: web.Request) -> web.Response | None:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return self._status(401, "Unauthorized")
        if request.match_info["ns"] != self.namespace:
            return self._status(404, f"namespace {request.match_info['ns']} not found")
        if self.lease_fail:
            return self._status(500, "injected failure")
        return None

    def _store_lease(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        lease.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        name = lease["metadata"]["name"]
        self.leases[name] = copy.deepcopy(lease)
        self.writes.append((lease.get("spec") or {}).get("holderIdentity"))
        return lease

    async def _lease_get(self, request: web.Request) -> web.Response:
        refusal = self._lease_refusal(request)
        if refusal is not None:
            return refusal
        lease = self.leases.get(request.match_info["name"])
        if lease is None:
            return self._status(404, f'leases.coordination.k8s.io "{request.match_info["name"]}" not found')
        return web.json_response(lease)

    async def _lease_create(self, request: web.Request) -> web.Response:
        refusal = self._lease_refusal(request)
        if refusal is not None:
            return refusal
        body = await request.json()
        name = body["metadata"]["name"]
        if name in self.leases:
            return self._status(409, f'leases.coordination.k8s.io "{name}" already exists')
        body["metadata"].pop("resourceVersion", None)
        return web.json_response(self._store_lease(body), status=201)

    async def _lease_update(self, request: web.Request) -> web.Response:
        refusal = self._lease_refusal(request)
        if refusal is not None:
            return refusal
        name = request.match_info["name"]
        body = await request.json()
        if body.get("metadata", {}).get("name") != name:
            return self._status(400, "the name of the object does not match the name on the URL")
        stored = self.leases.get(name)
        if stored is None:
            return self._status(404, f'leases.coordination.k8s.io "{name}" not found')
        rv = body["metadata"].get("resourceVersion")
        if rv and rv != stored["metadata"]["resourceVersion"]:
            self.conflicts += 1
            return self._status(
                409, f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )  # fmt: skip
        return web.json_response(self._store_lease(body))

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return self._status(401, "Unauthorized")
        if request.match_info["ns"] != self.namespace:
            return self._status(404, f"namespace {request.match_info['ns']} not found")
        if self.fail_next > 0:
            self.fail_next -= 1
            return self._status(self.fail_status, "injected failure")
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, selector)
        self.lists += 1
        items = [copy.deepcopy(p) for p in self.pods.values() if _matches(selector, p["metadata"]["labels"])]
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}, "items": items}
        )

    async def _watch(self, request: web.Request, selector: str) -> web.StreamResponse:
        self.watches += 1
        try:
            return await self._stream(request, selector)
        except ConnectionResetError:  # the client ended the watch: as the real server, just stop
            return web.Response(status=499)

    async def _stream(self, request: web.Request, selector: str) -> web.StreamResponse:
        rv = int(request.query.get("resourceVersion") or self.rv)
        timeout = float(request.query.get("timeoutSeconds", "30"))
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if rv < self.compacted_rv:
            await send(
                "ERROR",
                {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
                 "message": f"too old resource version: {rv} ({self.compacted_rv})"},
            )  # fmt: skip
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for ev_rv, before, after in list(self.history):
                if ev_rv <= rv:
                    continue
                rv = ev_rv
                was = before is not None and _matches(selector, before["metadata"]["labels"])
                now = after is not None and _matches(selector, after["metadata"]["labels"])
                if now and was:
                    await send("MODIFIED", copy.deepcopy(after))  # type: ignore[arg-type]
                elif now:
                    await send("ADDED", copy.deepcopy(after))  # type: ignore[arg-type]
                elif was:
                    gone = copy.deepcopy(before if after is None else after)
                    assert gone is not None
                    gone["metadata"]["resourceVersion"] = str(ev_rv)
                    await send("DELETED", gone)
            left = deadline - loop.time()
            if left <= 0:
                break
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                break
            if self._stopping:
                break
        if bookmarks:
            await send("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}})
        return resp


@contextlib.asynccontextmanager
async def fake_kube() -> AsyncIterator[FakeKube]:
    """A started ``FakeKube`` (default namespace and token), stopped on exit."""
    kube = FakeKube()
    await kube.start()
    try:
        yield kube
    finally:
        await kube.stop()

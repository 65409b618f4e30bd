"""Worker discovery from Kubernetes: the gateway's worker list follows pods selected by label.

A list, then a watch from its ``resourceVersion``, relisted every ``period_s``, on ``410 Gone`` and after
an error; each event reconciles the pool. Pod states, reconcile rules and RBAC: deploy/k8s/README.md
("Worker discovery"). Workers of ``cluster.workers`` are never touched. The API client (leader election's
too) re-reads the service-account token on every request (projected tokens rotate)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gateway.config import GpuCatalog
from gateway.config.cluster import ResolvedWorker, entry_worker
from gateway.config.operations import KubernetesDiscoveryConfig, LeaderElectionConfig
from gateway.core.worker import WorkerInfo
from gateway.errors import UnknownNameError
from gateway.live.httpclient import HttpClient, Prepared
from gateway.live.metrics import GatewayMetrics
from gateway.live.monitor import stopped_within
from gateway.live.pool import WorkerPool

log = logging.getLogger("hexflow.discovery")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_STATES = ("ready", "unready", "pending", "invalid")
_MAX_LINE = 4 << 20  # one watch event (a pod object) is a few KiB; refuse absurd ones
_MAX_BODY = 256 << 20  # a list of many pods
_RBAC_HINT = (
    " (check the service account and its Role: get/list/watch on pods; get/create/update on leases with leader "
    "election)"
)


class KubeApiError(Exception):
    """The API server refused or failed a request."""


class WatchExpired(KubeApiError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class KubeNotFound(KubeApiError):
    """The object does not exist (404)."""


class KubeConflict(KubeApiError):
    """An update named an older ``resourceVersion`` than the object's, or a create found it (409)."""


class PodError(ValueError):
    """A selected pod cannot be a worker (unknown GPU, bad annotation)."""


@dataclass(frozen=True, slots=True)
class PodWorker(ResolvedWorker):
    """What a pod says about the worker it runs (``profile`` None: the catalogue's profile of ``gpu``)."""

    ready: bool = False

    def same_engine(self, info: WorkerInfo) -> bool:
        """True when ``info`` is this pod's engine (same address, profile label and model; capacity may differ)."""
        p = info.profile
        return (
            info.url == self.url
            and info.served_model == self.served_model
            and (p.gpu, p.model) == (self.profile or self.gpu, self.model)
        )


def _meta(pod: dict[str, Any], key: str) -> dict[str, str]:
    m = pod.get("metadata") or {}
    v = m.get(key) or {}
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def _int(value: str, what: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise PodError(f"{what} {value!r} is not an integer") from None
    if not lo <= n <= hi:
        raise PodError(f"{what} {n} is outside [{lo}, {hi}]")
    return n


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running, not terminating, and its ``Ready`` condition is true."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def pod_worker(pod: dict[str, Any], cfg: KubernetesDiscoveryConfig, default_model: str) -> PodWorker | None:
    """The worker a pod stands for; None while it has no IP yet; ``PodError`` when it cannot be one."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    if not name:
        raise PodError("the pod has no name")
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    labels, ann = _meta(pod, "labels"), _meta(pod, "annotations")
    gpu = labels.get(cfg.gpu_label)
    if not gpu:
        raise PodError(f"label {cfg.gpu_label} (the GPU type) is missing")
    model = ann.get(cfg.model_annotation) or labels.get(cfg.model_annotation) or default_model
    cap_s = ann.get(cfg.capacity_annotation) or labels.get(cfg.capacity_annotation)
    capacity = cfg.default_capacity if cap_s is None else _int(cap_s, cfg.capacity_annotation, 1, 1024)
    port_s = ann.get(cfg.port_annotation)
    if port_s is not None:
        port = _int(port_s, cfg.port_annotation, 1, 65535)
    else:
        port = cfg.default_port
        for c in (pod.get("spec") or {}).get("containers") or []:
            for p in (c or {}).get("ports") or []:
                if isinstance(p, dict) and p.get("name") == "http" and isinstance(p.get("containerPort"), int):
                    port = p["containerPort"]
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    served = ann.get(cfg.served_model_annotation) or model
    profile = ann.get(cfg.profile_annotation) or labels.get(cfg.profile_annotation) or None
    url = f"http://{host}:{port}"
    return PodWorker(name, gpu, model, capacity, url, served, profile, ready=pod_ready(pod))


def pod_state(
    pod: dict[str, Any], cfg: KubernetesDiscoveryConfig, catalog: GpuCatalog, default_model: str, time_scale: float
) -> tuple[str, tuple[PodWorker, WorkerInfo] | None, str]:
    """``(state, (worker, its scheduler profile), problem)``: state is one of ``POD_STATES``."""
    try:
        pw = pod_worker(pod, cfg, default_model)
        if pw is None:
            return "pending", None, ""
        info = entry_worker(catalog, pw, time_scale)
    except (PodError, UnknownNameError) as exc:
        return "invalid", None, str(exc)
    return ("ready" if pw.ready else "unready"), (pw, info), ""


class KubeApi:
    """The Kubernetes API calls discovery and leader election need, in one namespace, over the gateway's own HTTP
    client (``token_file``: re-read on every request; ``ca_file``: absent, the system's CAs; ``timeout_s``: connect,
    and a request's whole answer; a watch's stream gets a gap of its ``timeout_s`` more)."""

    def __init__(
        self, base_url: str, namespace: str, *, token_file: str | None, ca_file: str | None, timeout_s: float
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.namespace = namespace
        self.token_file = token_file
        self.timeout_s = timeout_s
        self._ssl: ssl.SSLContext | None = None
        if ca_file and Path(ca_file).is_file():
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._client: HttpClient | None = None

    def _auth(self) -> bytes:
        """The ``Authorization`` header line of the token file's token, read now (none without a token)."""
        if self.token_file:
            with contextlib.suppress(OSError):
                token = Path(self.token_file).read_text().strip()
                if token and token.isascii() and token.isprintable():
                    return f"Authorization: Bearer {token}\r\n".encode()
        return b""

    def _pods(self, selector: str, **params: str) -> str:
        q = "&".join(f"{k}={quote(v, safe='')}" for k, v in {"labelSelector": selector, **params}.items())
        return f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods?{q}"

    def _prepare(self, method: str, path: str) -> tuple[HttpClient, Prepared]:
        """The client (created on first use, in the running loop) and the request, with the token read now."""
        if self._client is None:
            self._client = HttpClient(connect_s=self.timeout_s, max_connections=4, ssl_context=self._ssl)
        return self._client, HttpClient.prepare(self.base_url, path, method=method, headers=self._auth())

    async def close(self) -> None:
        """Close the HTTP client's connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """The selected pods and the list's ``resourceVersion``."""
        body = await self.request_json("GET", self._pods(selector))
        if not isinstance(body.get("items"), list):
            raise KubeApiError("the pod list is not a PodList")
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return [p for p in body["items"] if isinstance(p, dict)], rv

    async def request_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One JSON request to ``path`` (from the API root); ``KubeNotFound``, ``KubeConflict`` or ``KubeApiError``."""
        data = b"" if body is None else json.dumps(body).encode()
        client, prepared = self._prepare(method, path)
        async with asyncio.timeout(self.timeout_s):
            status, raw = await client.fetch(prepared, data, headers_s=None, idle_s=None, cap=_MAX_BODY)
        _raise_for(status, raw)
        out = json.loads(raw)
        if not isinstance(out, dict):
            raise KubeApiError(f"the answer to {method} {path} is not a JSON object")
        return out

    async def watch_pods(
        self, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncGenerator[tuple[str, dict[str, Any]]]:
        """Watch events ``(type, object)`` after ``resource_version`` for up to ``timeout_s`` seconds."""
        path = self._pods(
            selector,
            watch="1",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout_s),
        )
        # The server ends the watch after timeoutSeconds; the read timeout only guards a hung server.
        idle_s = timeout_s + self.timeout_s
        client, prepared = self._prepare("GET", path)
        r = await client.request(prepared, b"", headers_s=idle_s)
        try:
            if r.status >= 400:
                _raise_for(r.status, await r.read_all(self.timeout_s, _MAX_LINE))
            pending = b""
            while chunk := await r.read_chunk(idle_s):
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > _MAX_LINE:
                    raise KubeApiError(f"a watch event is over {_MAX_LINE} bytes")
                for raw in lines:
                    if not raw.strip():
                        continue
                    try:
                        ev = json.loads(raw)
                    except ValueError as exc:
                        raise KubeApiError(f"a watch event is not JSON: {exc}") from exc
                    if not isinstance(ev, dict) or not isinstance(ev.get("object"), dict):
                        raise KubeApiError("a watch event has no object")
                    kind, obj = str(ev.get("type")), ev["object"]
                    if kind == "ERROR":
                        code = obj.get("code")
                        if code == 410:
                            raise WatchExpired(str(obj.get("message", "resource version expired")))
                        raise KubeApiError(f"watch error {code}: {obj.get('message')}")
                    yield kind, obj
        finally:
            r.release()


def _raise_for(status: int, body: bytes) -> None:
    """``KubeApiError`` (or the kind the status says) for an error status of the API."""
    if status < 400:
        return
    text = body.decode(errors="replace")[:500]
    if status == 410:
        raise WatchExpired(text)
    kind = {404: KubeNotFound, 409: KubeConflict}.get(status, KubeApiError)
    hint = _RBAC_HINT if status in (401, 403) else ""
    raise kind(f"HTTP {status} from the Kubernetes API{hint}: {text}")


def default_api_url() -> str | None:
    """The in-cluster API server URL from the environment Kubernetes gives every pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{port}"


def kube_api(section: str, cfg: KubernetesDiscoveryConfig | LeaderElectionConfig, timeout_s: float) -> KubeApi:
    """An API client from a config section's connection settings; ``ValueError`` (naming ``section``) when no
    API server URL is known."""
    base = cfg.api_url or default_api_url()
    if base is None:
        raise ValueError(
            f"{section}.api_url is not set and KUBERNETES_SERVICE_HOST is not in the environment "
            "(is the gateway running in a pod?)"
        )
    namespace = cfg.namespace
    if not namespace:  # the gateway's own (from its service account), else ``default``
        with contextlib.suppress(OSError):
            namespace = (SA_DIR / "namespace").read_text().strip()
    return KubeApi(base, namespace or "default", token_file=cfg.token_file, ca_file=cfg.ca_file, timeout_s=timeout_s)


def api_from_config(cfg: KubernetesDiscoveryConfig) -> KubeApi:
    """The API client ``cfg`` describes (``ValueError`` when no API server URL is known)."""
    return kube_api("discovery.kubernetes", cfg, cfg.timeout_s)


class KubernetesDiscovery:
    """Keeps the pool's discovered workers in step with the pods ``cfg`` selects (``api``: default from ``cfg``)."""

    def __init__(
        self,
        cfg: KubernetesDiscoveryConfig,
        pool: WorkerPool,
        catalog: GpuCatalog,
        *,
        time_scale: float,
        default_model: str,
        metrics: GatewayMetrics,
        api: KubeApi | None = None,
    ) -> None:
        self.api = api if api is not None else api_from_config(cfg)
        self.cfg = cfg
        self.pool = pool
        self.catalog = catalog
        self.time_scale = time_scale
        self.default_model = default_model
        self.metrics = metrics
        self.pods: dict[str, dict[str, Any]] = {}
        self.managed: set[str] = set()
        self.synced = asyncio.Event()
        self.last_list_at: float | None = None
        self.last_error: str | None = None
        self.lists = 0
        self.events = 0
        self._warned: dict[str, str] = {}
        self._reconciling = False
        self._again = False
        self._clock: Callable[[], float] = time.monotonic
        pool.on_removed = self._on_removed

    def _on_removed(self, name: str) -> None:
        if name in self.managed:
            self.managed.discard(name)
            self.reconcile()  # a pod recreated under the same name can join now

    def _warn(self, name: str, problem: str) -> None:
        if self._warned.get(name) != problem:
            self._warned[name] = problem
            log.warning("pod %s is not a usable worker: %s", name, problem)

    def reconcile(self) -> None:
        """Bring the pool's discovered workers in line with ``self.pods``."""
        if self._reconciling:  # a removal finished inside a reconcile: go round once more
            self._again = True
            return
        self._reconciling = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._reconcile_once()
        finally:
            self._reconciling = False

    def _reconcile_once(self) -> None:
        desired: dict[str, tuple[PodWorker, WorkerInfo]] = {}
        counts = dict.fromkeys(POD_STATES, 0)
        for name, pod in self.pods.items():
            state, got, problem = pod_state(pod, self.cfg, self.catalog, self.default_model, self.time_scale)
            counts[state] += 1
            if problem:
                self._warn(name, problem)
                continue
            self._warned.pop(name, None)
            if got is not None:
                desired[name] = got
        for gone in self._warned.keys() - self.pods.keys():
            del self._warned[gone]
        for state, n in counts.items():
            self.metrics.discovery_pods.labels(state=state).set(n)
        for name in sorted(self.managed):
            st = self.pool.by_name(name)
            if st is None:
                self.managed.discard(name)
                continue
            if st.removing:
                continue
            want = desired.get(name)
            if want is None or not want[0].same_engine(st.info):
                self.pool.remove_worker(st)
                continue
            pw = want[0]
            self.pool.set_capacity(st, want[1].capacity)
            self.pool.set_ready(st, pw.ready)
        for name, (pw, info) in desired.items():
            if name in self.managed or not pw.ready:
                continue
            if self.pool.by_name(name) is not None:
                self._warn(name, "a worker of cluster.workers has the same name")
                continue
            self.pool.add_worker(info, ready=True)
            self.managed.add(name)

    def _apply_event(self, kind: str, obj: dict[str, Any]) -> str | None:
        """Fold one watch event into ``self.pods`` and reconcile; returns the event's resourceVersion."""
        meta = obj.get("metadata") or {}
        name, rv = meta.get("name"), meta.get("resourceVersion")
        if kind != "BOOKMARK" and isinstance(name, str):
            self.events += 1
            if kind == "DELETED":
                self.pods.pop(name, None)
            elif kind in ("ADDED", "MODIFIED"):
                self.pods[name] = obj
            self.reconcile()
        return str(rv) if rv else None

    async def sync_once(self) -> str:
        """List the pods and reconcile; returns the list's resourceVersion."""
        items, rv = await self.api.list_pods(self.cfg.label_selector)
        self.pods = {str(p["metadata"]["name"]): p for p in items if isinstance(p.get("metadata"), dict)}
        self.lists += 1
        self.last_list_at = self._clock()
        self.last_error = None
        self.reconcile()
        self.synced.set()
        return rv

    async def run(self, stop: asyncio.Event) -> None:
        """List, watch and re-list until ``stop`` is set."""
        period = self.cfg.period_s
        while not stop.is_set():
            try:
                rv = await self.sync_once()
                if not self.cfg.watch:
                    await stopped_within(stop, period)
                    continue
                loop = asyncio.get_running_loop()
                deadline = loop.time() + period
                while not stop.is_set() and (left := deadline - loop.time()) > 0:
                    events = self.api.watch_pods(self.cfg.label_selector, rv, max(1, round(left)))
                    async with contextlib.aclosing(events):  # leaving early closes the watch's connection
                        async for kind, obj in events:
                            rv = self._apply_event(kind, obj) or rv
                            if loop.time() >= deadline:
                                break
            except WatchExpired:
                log.info("the pods watch expired; listing again")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # API down, bad answer: keep the current workers, retry
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.metrics.discovery_errors.inc()
                log.warning("worker discovery failed: %s (retrying in %g s)", self.last_error, period)
                await stopped_within(stop, period)

    async def close(self) -> None:
        """Close the API client."""
        await self.api.close()

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` shows of discovery."""
        now = self._clock()
        return {
            "selector": self.cfg.label_selector,
            "namespace": self.api.namespace,
            "pods": len(self.pods),
            "workers": sorted(self.managed),
            "lists": self.lists,
            "events": self.events,
            "last_list_age_s": None if self.last_list_at is None else round(now - self.last_list_at, 3),
            "last_error": self.last_error,
            "invalid": dict(self._warned),
        }

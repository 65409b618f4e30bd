"""Leader election among gateway replicas: one ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection
(docs/live-gateway.md, "High availability"). Expiry is judged on this replica's monotonic clock, never by
comparing ``renewTime`` with its wall clock; a leader that has not renewed for ``renew_deadline_s`` steps
down at once."""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from gateway.config.operations import LeaderElectionConfig
from gateway.live.discovery import KubeApi, KubeApiError, KubeConflict, KubeNotFound, kube_api
from gateway.live.httpclient import HttpError
from gateway.live.monitor import stopped_within

log = logging.getLogger("hexflow.leader")

JITTER = 0.2
"""A follower waits ``retry_period_s`` times 1 to 1 + JITTER between rounds, so replicas started together
do not all ask at the same instant."""


def default_identity() -> str:
    """This replica's name: ``$POD_NAME`` (the downward API), else the host name (a pod's is its name)."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def micro_time(t: datetime) -> str:
    """A Kubernetes ``MicroTime``: RFC 3339 in UTC with microseconds (``2026-01-02T03:04:05.000006Z``)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_api(cfg: LeaderElectionConfig) -> KubeApi:
    """The API client of ``cfg`` (``ValueError`` when no API server URL is known)."""
    # A request may take at most the renew deadline: a leader must be able to step down in time.
    return kube_api("leader_election", cfg, cfg.renew_deadline_s)


def _spec(lease: dict[str, Any]) -> dict[str, Any]:
    spec = lease.get("spec")
    return spec if isinstance(spec, dict) else {}


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False)
class LeaderElector:
    """Acquires and renews the Lease; tells ``on_change`` when this replica starts or stops leading (``clock``:
    monotonic, for expiry; ``wall``: written into ``renewTime`` and ``acquireTime``)."""

    cfg: LeaderElectionConfig
    api: KubeApi
    identity: str
    on_change: Callable[[bool], None]
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = _utc_now
    rng: random.Random = field(default_factory=random.Random)
    leading: bool = field(default=False, init=False)
    holder: str | None = field(default=None, init=False)
    renewed_at: float | None = field(default=None, init=False)
    observed: dict[str, Any] | None = field(default=None, init=False)
    observed_at: float | None = field(default=None, init=False)
    acquired: int = field(default=0, init=False)
    lost: int = field(default=0, init=False)
    errors: int = field(default=0, init=False)
    last_error: str | None = field(default=None, init=False)
    _released: bool = field(default=False, init=False)

    @property
    def path(self) -> str:
        """The Lease collection's path in the API."""
        return f"/apis/coordination.k8s.io/v1/namespaces/{quote(self.api.namespace, safe='')}/leases"

    @property
    def lease_path(self) -> str:
        """The Lease's path in the API."""
        return f"{self.path}/{quote(self.cfg.lease_name, safe='')}"

    def _record(self, now_wall: str, old: dict[str, Any] | None) -> dict[str, Any]:
        """The spec this replica writes as holder: a renewal keeps acquireTime and transitions."""
        mine = old is not None and old.get("holderIdentity") == self.identity
        transitions = int((old or {}).get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.cfg.lease_duration_s,
            "acquireTime": (old or {}).get("acquireTime") if mine else now_wall,
            "renewTime": now_wall,
            "leaseTransitions": transitions if mine or old is None else transitions + 1,
        }

    def _observe(self, spec: dict[str, Any], now: float) -> None:
        if spec != self.observed:
            self.observed = copy.deepcopy(spec)
            self.observed_at = now
        holder = spec.get("holderIdentity")
        self.holder = str(holder) if holder else None

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease after it (acquired or renewed)."""
        now = self.clock()
        now_wall = micro_time(self.wall())
        try:
            lease = await self.api.request_json("GET", self.lease_path)
        except KubeNotFound:
            spec = self._record(now_wall, None)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.cfg.lease_name, "namespace": self.api.namespace},
                "spec": spec,
            }
            try:
                await self.api.request_json("POST", self.path, body)
            except KubeConflict:  # another replica created it first
                return False
            self._observe(spec, now)
            return True
        spec = _spec(lease)
        self._observe(spec, now)
        holder = self.holder
        if holder is not None and holder != self.identity:
            duration = spec.get("leaseDurationSeconds")
            duration_s = float(duration) if isinstance(duration, int | float) else float(self.cfg.lease_duration_s)
            assert self.observed_at is not None
            if now - self.observed_at < duration_s:
                return False  # held, and renewed within its duration as far as we have seen
        new_spec = self._record(now_wall, spec)
        lease["spec"] = new_spec  # metadata.resourceVersion stays: the update is refused if it changed
        try:
            await self.api.request_json("PUT", self.lease_path, lease)
        except KubeConflict:
            return False
        self._observe(new_spec, now)
        return True

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        if leading:
            self.acquired += 1
            log.info("%s is the leader now (lease %s)", self.identity, self.cfg.lease_name)
        else:
            self.lost += 1
            log.warning("%s stopped leading (lease %s): it no longer serves", self.identity, self.cfg.lease_name)
        self.on_change(leading)

    async def step(self) -> None:
        """One round, bounded by the time left to the renew deadline; steps down when it has passed."""
        now = self.clock()
        left = self.cfg.renew_deadline_s
        if self.leading and self.renewed_at is not None:
            left = self.cfg.renew_deadline_s - (now - self.renewed_at)
        held = False
        try:
            held = await asyncio.wait_for(self.try_acquire_or_renew(), max(left, 0.05))
        except asyncio.CancelledError:
            raise
        except (KubeApiError, HttpError, TimeoutError, ValueError, OSError) as exc:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("lease %s: %s", self.cfg.lease_name, self.last_error)
        if held:
            # Counted from when the round started: the record the others see was written after that.
            self.renewed_at = now
            self.last_error = None
            self._set_leading(True)
        elif self.leading and (
            (self.holder is not None and self.holder != self.identity)
            or self.renewed_at is None
            or self.clock() - self.renewed_at >= self.cfg.renew_deadline_s
        ):
            self._set_leading(False)

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set (the leader every ``retry_period_s``, followers with jitter)."""
        while not stop.is_set():
            await self.step()
            wait = self.cfg.retry_period_s
            if not self.leading:
                wait *= 1.0 + JITTER * self.rng.random()
            await stopped_within(stop, wait)

    async def release(self) -> None:
        """Give the Lease up (shutdown): stop leading now, then clear the holder (bounded; errors logged)."""
        if self._released:
            return
        self._released = True
        was = self.leading
        self._set_leading(False)
        if not was:
            return
        try:
            lease = await asyncio.wait_for(self.api.request_json("GET", self.lease_path), self.cfg.renew_deadline_s)
            spec = _spec(lease)
            if spec.get("holderIdentity") != self.identity:
                return
            now_wall = micro_time(self.wall())
            lease["spec"] = {
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "acquireTime": now_wall,
                "renewTime": now_wall,
                "leaseTransitions": spec.get("leaseTransitions") or 0,
            }
            await asyncio.wait_for(self.api.request_json("PUT", self.lease_path, lease), self.cfg.renew_deadline_s)
            log.info("%s released lease %s", self.identity, self.cfg.lease_name)
        except (KubeApiError, HttpError, TimeoutError, ValueError, OSError) as exc:
            log.warning("could not release lease %s (it expires by itself): %s", self.cfg.lease_name, exc)

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` shows of leader election."""
        now = self.clock()
        return {
            "identity": self.identity,
            "leading": self.leading,
            "leader": self.holder,
            "lease": f"{self.api.namespace}/{self.cfg.lease_name}",
            "renewed_age_s": None if self.renewed_at is None else round(now - self.renewed_at, 3),
            "acquired": self.acquired,
            "lost": self.lost,
            "errors": self.errors,
            "last_error": self.last_error,
        }

    async def close(self) -> None:
        """Close the API client."""
        await self.api.close()

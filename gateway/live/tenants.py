"""Tenants of the live gateway (``config/tenants.yaml``; models in ``gateway.config.tenants``). ``TenantStore``
serves lookups and hot reload: one immutable snapshot, replaced by a single assignment (readers never lock)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType

from gateway.config.base import load_yaml_model
from gateway.config.tenants import DEFAULT_TENANTS, TenantConfig, TenantsFile, hash_key
from gateway.core.degrade import QualityMode
from gateway.errors import ConfigError, Unprocessable
from gateway.live.monitor import stopped_within

log = logging.getLogger("hexflow.tenants")


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as lookups return it (its key hashes stay inside the store)."""

    name: str
    default_deadline_s: float
    min_deadline_s: float
    max_deadline_s: float
    priority_weight: float
    max_concurrent_workflows: int
    databases: tuple[str, ...] = ("*",)
    predictive_admission: bool = True
    on_predicted_miss: str = "reject"
    quality: QualityMode = "full"

    def allows(self, db_id: str) -> bool:
        """Whether the tenant may query database ``db_id``."""
        return "*" in self.databases or db_id in self.databases

    @classmethod
    def from_config(cls, c: TenantConfig) -> Tenant:
        """The tenant of one file entry."""
        kept = {f.name: getattr(c, f.name) for f in fields(cls)}
        return cls(**{**kept, "databases": tuple(c.databases)})


class DeadlineOutOfRange(Unprocessable, ValueError):
    """A caller asked for a deadline outside its tenant's ``[min_deadline_s, max_deadline_s]`` (422)."""

    param = "deadline_s"

    def __init__(self, tenant: Tenant, deadline_s: float) -> None:
        self.tenant = tenant.name
        self.deadline_s = deadline_s
        self.min_deadline_s = tenant.min_deadline_s
        self.max_deadline_s = tenant.max_deadline_s
        super().__init__(
            f"deadline_s={deadline_s:g} is outside tenant {tenant.name}'s range "
            f"[{tenant.min_deadline_s:g}, {tenant.max_deadline_s:g}]"
        )


def check_deadline(tenant: Tenant, deadline_s: float | None) -> float:
    """The effective deadline: the tenant's default for None, else ``deadline_s`` if finite and in range
    (``DeadlineOutOfRange`` otherwise)."""
    if deadline_s is None:
        return tenant.default_deadline_s
    d = float(deadline_s)
    if not (math.isfinite(d) and tenant.min_deadline_s <= d <= tenant.max_deadline_s):
        raise DeadlineOutOfRange(tenant, d)
    return d


AUTH_CACHE_SIZE = 1024
"""API keys whose tenant ``TenantStore.authenticate`` remembers (least recently used first out)."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Everything readers use, replaced whole on a reload (``known_keys``, the recent valid keys' tenants,
    with it)."""

    tenants: tuple[Tenant, ...]
    by_name: Mapping[str, Tenant]
    by_hash: Mapping[str, Tenant]
    generation: int
    known_keys: OrderedDict[str, Tenant] = field(default_factory=OrderedDict)

    @classmethod
    def build(cls, config: TenantsFile, generation: int) -> _Snapshot:
        tenants = tuple(Tenant.from_config(c) for c in config.tenants)
        by_hash = {h: t for c, t in zip(config.tenants, tenants, strict=True) for h in c.api_key_sha256}
        return cls(
            tenants,
            MappingProxyType({t.name: t for t in tenants}),
            MappingProxyType(by_hash),
            generation,
        )


_StatKey = tuple[int, int, int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


class TenantStore:
    """The tenants in force: ``TenantStore.load(path)``, or ``TenantStore(config)`` without a file."""

    def __init__(self, config: TenantsFile, path: Path | str | None = None) -> None:
        self.path = None if path is None else Path(path)
        """The file the tenants come from (None for a store built from a model)."""
        self._state = _Snapshot.build(config, 0)
        self._lock = threading.Lock()  # one reload at a time; readers never take it
        self._seen_key: _StatKey | None = None  # stat of the file last looked at; None: missing/unread
        self._seen_sha: str | None = None  # SHA-256 of the content last parsed (good or bad)
        self.last_error: str | None = None
        """Why the latest reload failed; None once a reload succeeds (or none has failed)."""
        self.reload_failures = 0
        """Reloads that failed since the store was built (each broken version of the file counts once)."""

    @classmethod
    def load(cls, path: Path | str = DEFAULT_TENANTS) -> TenantStore:
        """Parse a tenants file; ``ConfigError`` (one line naming file and field) on a bad one."""
        seen: tuple[_StatKey | None, str | None] = (None, None)
        with contextlib.suppress(OSError):  # unreadable: the parse says why
            seen = _stat_key(Path(path).stat()), hashlib.sha256(Path(path).read_bytes()).hexdigest()
        store = cls(load_yaml_model(path, TenantsFile), path)
        store._seen_key, store._seen_sha = seen
        return store

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        """The tenants in force, in file order."""
        return self._state.tenants

    @property
    def generation(self) -> int:
        """0 after loading; +1 on each successful reload."""
        return self._state.generation

    def authenticate(self, api_key: str) -> Tenant | None:
        """The tenant owning ``api_key`` (looked up by SHA-256 digest), or None. The last ``AUTH_CACHE_SIZE`` valid
        keys are remembered (never invalid ones, so made-up keys cannot grow or flush the cache)."""
        if not api_key:
            return None
        state = self._state
        known = state.known_keys
        tenant = known.get(api_key)
        if tenant is not None:
            with contextlib.suppress(KeyError):  # evicted meanwhile by another thread: still the right tenant
                known.move_to_end(api_key)
            return tenant
        tenant = state.by_hash.get(hash_key(api_key))
        if tenant is not None:
            known[api_key] = tenant
            if len(known) > AUTH_CACHE_SIZE:
                with contextlib.suppress(KeyError):
                    known.popitem(last=False)
        return tenant

    def get(self, name: str) -> Tenant | None:
        """The tenant called ``name``, or None."""
        return self._state.by_name.get(name)

    def reload_if_changed(self) -> bool:
        """Re-read the file if it changed (its stat gates the read, its SHA-256 the parse); True when a new, valid
        version was swapped in. A failure is logged once and kept in ``last_error``; the old tenants stay."""
        if self.path is None:
            return False
        with self._lock:
            try:
                st = self.path.stat()
            except OSError as exc:
                if self._seen_key is None and self._seen_sha is None:
                    return False  # still missing: reported already
                self._seen_key, self._seen_sha = None, None
                problem = "file not found" if isinstance(exc, FileNotFoundError) else f"cannot stat the file: {exc}"
                return self._fail(str(ConfigError(str(self.path), "", problem)))
            key = _stat_key(st)
            if key == self._seen_key:
                return False
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                self._seen_key, self._seen_sha = key, None
                return self._fail(str(ConfigError(str(self.path), "", f"cannot read the file: {exc}")))
            self._seen_key = key
            sha = hashlib.sha256(data).hexdigest()
            if sha == self._seen_sha:
                return False
            self._seen_sha = sha
            try:
                config = load_yaml_model(self.path, TenantsFile)
            except ConfigError as exc:
                return self._fail(str(exc))
            self._state = _Snapshot.build(config, self._state.generation + 1)  # the one atomic swap
            self.last_error = None
            log.info(
                "tenants reloaded from %s: generation %d, %d tenants",
                self.path,
                self._state.generation,
                len(self._state.tenants),
            )
            return True

    def _fail(self, problem: str) -> bool:
        self.last_error = problem
        self.reload_failures += 1
        log.error("tenants reload failed, keeping generation %d: %s", self._state.generation, problem)
        return False

    async def watch(
        self, period_s: float, stop: asyncio.Event, on_reload: Callable[[bool], None] | None = None
    ) -> None:
        """Call ``reload_if_changed`` (in a thread) every ``period_s`` seconds until ``stop`` is set;
        ``on_reload(ok)`` after each reload that swapped a new version in (True) or failed (False)."""
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be a positive number of seconds, got {period_s!r}")
        before = (self.generation, self.reload_failures)
        while not await stopped_within(stop, period_s):
            try:
                changed = await asyncio.to_thread(self.reload_if_changed)
            except Exception:  # keep watching: the next change may be fine
                log.exception("tenants reload raised")
                continue
            after = (self.generation, self.reload_failures)
            if after != before and on_reload is not None:
                on_reload(changed)
            before = after

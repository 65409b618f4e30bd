"""``Idempotency-Key``: a client's retry of ``POST /v1/workflows`` or ``/v1/text2sql`` gets the first answer
(the rules: docs/live-gateway.md, "Retries and idempotency keys")."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from gateway.errors import BadRequest, DomainError, GatewayError, Unprocessable
from gateway.live.responses import error_response

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
STORED_STATUSES = frozenset(range(200, 500)) - {408, 425, 429, 499}
"""Answers kept for retries: successes and the client's own errors (a retry would get the same). Not a
refusal that asks for a retry (408, 425, 429), a disconnect (499) or any 5xx."""


OPENAPI_PARAMETER: dict[str, Any] = {
    "name": HEADER,
    "in": "header",
    "required": False,
    "description": "Optional, per tenant: a retry with the same key and body gets the first run's answer "
    "(``Idempotent-Replayed: true``) instead of running again; the same key with another body is 422. "
    "Kept in this gateway replica's memory for ``idempotency.ttl_s``.",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS, "pattern": "^[!-~]([ -~]*[!-~])?$"},
}
"""The header as the OpenAPI document declares it on the routes that honour it."""


class IdempotencyKeyReused(Unprocessable):
    """The key was used before by the same tenant for another request (422)."""


def check_key(raw: str) -> str:
    """The key as sent: 1 to 255 visible ASCII characters or spaces inside (400 otherwise)."""
    if not 0 < len(raw) <= MAX_KEY_CHARS or raw != raw.strip() or not all(" " <= ch <= "~" for ch in raw):
        raise BadRequest(f"the {HEADER} header must be 1 to {MAX_KEY_CHARS} visible ASCII characters", param=HEADER)
    return raw


def fingerprint(route: str, body: Any) -> str:
    """A digest of the route and the request's JSON (keys sorted: the same request in any key order)."""
    text = json.dumps([route, body], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """An answer as sent: status, body and headers (without the length, which the response sets)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, response: Response) -> StoredResponse:
        """Keep a response (a plain one: its body is in memory)."""
        headers = tuple((k, v) for k, v in response.headers.items() if k.lower() != "content-length")
        return cls(response.status_code, bytes(response.body), headers)

    def response(self, *, replayed: bool) -> Response:
        """A fresh response with the stored answer; ``Idempotent-Replayed: true`` when it was not made for
        this request."""
        headers = dict(self.headers)
        if replayed:
            headers[REPLAYED] = "true"
        return Response(self.body, status_code=self.status, headers=headers)

    @property
    def size(self) -> int:
        """Bytes it holds, roughly (body and headers)."""
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + 64


@dataclass(eq=False, slots=True)
class _Entry:
    fingerprint: str
    task: asyncio.Task[StoredResponse] | None = None
    response: StoredResponse | None = None
    expires_at: float | None = None
    waiters: int = 0


class IdempotencyStore:
    """Answers by (tenant, key), for retries, within ``ttl_s``, ``max_keys`` and ``max_bytes`` (running ones are
    never dropped)."""

    def __init__(self, ttl_s: float, max_keys: int, max_bytes: int, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._expiry: deque[tuple[float, tuple[str, str], _Entry]] = deque()
        self.bytes = 0
        self.runs = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, k: tuple[str, str], entry: _Entry) -> None:
        if self._entries.get(k) is entry:
            del self._entries[k]
            if entry.response is not None:
                self.bytes -= entry.response.size

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, k, entry = self._expiry.popleft()
            self._drop(k, entry)

    def _evict(self) -> None:
        """Drop the least recently used finished keys while over a bound."""
        if len(self._entries) <= self.max_keys and self.bytes <= self.max_bytes:
            return
        for k, entry in list(self._entries.items()):
            if len(self._entries) <= self.max_keys and self.bytes <= self.max_bytes:
                return
            if entry.response is not None:
                self._drop(k, entry)

    async def _work(self, k: tuple[str, str], entry: _Entry, work: Callable[[], Awaitable[Response]]) -> StoredResponse:
        try:
            try:
                resp = StoredResponse.of(await work())
            except (GatewayError, DomainError) as exc:
                resp = StoredResponse.of(error_response(exc))
        except BaseException:
            self._drop(k, entry)
            raise
        entry.task = None
        if resp.status in STORED_STATUSES and resp.size <= self.max_bytes and self._entries.get(k) is entry:
            entry.response = resp
            entry.expires_at = self._clock() + self.ttl_s
            self.bytes += resp.size
            self._expiry.append((entry.expires_at, k, entry))
            self._evict()
        else:
            self._drop(k, entry)
        return resp

    async def run(
        self, tenant: str, key: str, fp: str, work: Callable[[], Awaitable[Response]]
    ) -> tuple[StoredResponse, bool]:
        """The answer for ``key`` and whether it is a replay; ``work`` runs at most once at a time per key, in its own
        task, cancelled only when no request of the key waits."""
        self._expire(self._clock())
        k = (tenant, key)
        entry = self._entries.get(k)
        if entry is not None and entry.fingerprint != fp:
            raise IdempotencyKeyReused(
                f"{HEADER} {key!r} was already used for a different request (another route or body); "
                "use a new key for a new request",
                param=HEADER,
            )
        if entry is not None and entry.response is not None:
            self._entries.move_to_end(k)
            self.replays += 1
            return entry.response, True
        first = entry is None
        if entry is None:
            entry = _Entry(fp)
            self._entries[k] = entry
            entry.task = asyncio.create_task(self._work(k, entry, work), name="idempotent-work")
            self.runs += 1
            self._evict()
        else:
            self.replays += 1
        task = entry.task
        assert task is not None
        entry.waiters += 1
        try:
            resp = await asyncio.shield(task)
        except asyncio.CancelledError:
            entry.waiters -= 1
            if entry.waiters == 0 and not task.done():
                task.cancel()  # nobody waits for it any more: the workflow is abandoned as without a key
            raise
        entry.waiters -= 1
        return resp, not first

    async def close(self) -> None:
        """Cancel work still running (at shutdown, after the drain) and forget every key."""
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._entries.clear()
        self._expiry.clear()
        self.bytes = 0

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` shows of the store."""
        self._expire(self._clock())
        running = sum(1 for e in self._entries.values() if e.response is None)
        return {
            "keys": len(self._entries),
            "running": running,
            "stored_bytes": self.bytes,
            "runs": self.runs,
            "replays": self.replays,
        }

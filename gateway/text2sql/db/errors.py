"""The database layer's errors, ``GatewayError``s with their status: ``QueryFailed`` (422; 504 for a
timeout), ``DatabaseUnavailable`` (503), ``UnknownDatabase`` (404). ``SqlRejected`` (400) is in ``sqlsafe``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from gateway.errors import GatewayError, UnknownNameError


class QueryFailed(GatewayError):
    """The engine refused or aborted a query that passed the static check: ``kind`` ``"timeout"`` (504),
    ``"too_large"`` (a value or row over ``max_result_bytes``, 422) or ``"error"`` (422)."""

    status = 422
    error_type = "invalid_request_error"

    def __init__(self, kind: Literal["error", "timeout", "too_large"], message: str) -> None:
        self.kind = kind
        if kind == "timeout":
            self.status = 504
            self.error_type = "timeout_error"
        super().__init__(message)


class DatabaseUnavailable(GatewayError):
    """A database cannot be opened or reached; the message names the database and the cause."""

    status = 503
    error_type = "service_unavailable"


class UnknownDatabase(UnknownNameError, KeyError):
    """A db_id not configured (or not allowed to the tenant); ``known`` lists those that are, ``message``
    replaces the default text."""

    status = 404
    error_type = "not_found_error"
    param = "db_id"

    def __init__(self, db_id: str, known: Iterable[str], *, message: str | None = None) -> None:
        super().__init__("database", db_id, list(known))
        if message is not None:
            self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])

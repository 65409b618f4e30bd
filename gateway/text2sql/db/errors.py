"""The database layer's errors, all ``GatewayError``\\ s that know their HTTP status and OpenAI error type.

    QueryFailed          422 (504 for a timeout)  the engine refused or aborted a query that passed the check
                                                  (``kind``: "error", "timeout", "too_large")
    DatabaseUnavailable  503                      a database cannot be opened or reached
    UnknownDatabase      404                      no database by that db_id (for this tenant)

``SqlRejected`` (400, the static check refused the text) lives with the check, in ``gateway.text2sql.sqlsafe``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from gateway.errors import GatewayError, UnknownNameError


class QueryFailed(GatewayError):
    """The engine refused or aborted a query that passed the static check.

    ``kind`` is ``"timeout"`` (the statement timeout fired: status 504), ``"too_large"`` (a value or a
    single row is larger than the database's ``max_result_bytes``: status 422; the engine stopped it
    before it reached the gateway's memory) or ``"error"`` (the engine's message: status 422, the
    statement was well formed but could not be run).
    """

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
    """A db_id that is not configured (or not allowed to the tenant asking); ``.known`` lists those that are.

    ``message`` replaces the default ``unknown database 'x'; known: a, b`` text (the route names the
    tenant's databases only).
    """

    status = 404
    error_type = "not_found_error"
    param = "db_id"

    def __init__(self, db_id: str, known: Iterable[str], *, message: str | None = None) -> None:
        super().__init__("database", db_id, list(known))
        if message is not None:
            self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])

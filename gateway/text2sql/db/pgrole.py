"""The PostgreSQL role check: the gateway refuses to query as a role that can do more than read (docs/text2sql.md,
"PostgreSQL: the reader role, enforced"; ``deploy/postgres/reader-role.sql``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DANGEROUS_ROLES: dict[str, str] = {
    "pg_read_server_files": "reads files on the database server",
    "pg_write_server_files": "writes files on the database server",
    "pg_execute_server_program": "runs programs on the database server",
    "pg_signal_backend": "cancels and terminates other sessions",
    "pg_read_all_data": "reads every table, whatever its grants",
    "pg_write_all_data": "writes every table, whatever its grants",
    "pg_read_all_settings": "reads every server setting (data_directory, ...)",
    "pg_read_all_stats": "reads every session's query text and server statistics",
    "pg_monitor": "reads every setting and every session's query text",
}
"""Predefined roles a Text-to-SQL reader may not be a member of -> what each would let a query do."""

_ATTRIBUTES: dict[str, str] = {
    "rolsuper": "is a superuser",
    "rolbypassrls": "has BYPASSRLS (row-level security would not apply)",
    "rolcreaterole": "has CREATEROLE (it could grant itself server-file and server-program roles)",
    "rolreplication": "has REPLICATION (it could create replication slots that hold WAL forever)",
}

ROLE_QUERY = """
SELECT r.rolname, r.rolname = session_user AS is_self,
       r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolreplication
FROM pg_roles r
WHERE pg_has_role(session_user, r.oid, 'MEMBER')
ORDER BY r.rolname = session_user DESC, r.rolname
"""
"""The login role and every role it is a member of, with the attributes ``role_problems`` judges."""


def role_problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """What disqualifies the login role, from the rows of ``ROLE_QUERY`` (empty: it may be used); an attribute
    of a role it is a member of (NOINHERIT included) counts as its own, ``SET ROLE`` reaches it."""
    problems: list[str] = []
    for row in rows:
        name = str(row["rolname"])
        if row["is_self"] and row["rolsuper"]:
            return [_ATTRIBUTES["rolsuper"]]  # a superuser is a member of every role: the rest is noise
        via = "" if row["is_self"] else f" through membership of {name!r}"
        problems.extend(f"{text}{via}" for attr, text in _ATTRIBUTES.items() if row[attr])
        if name in DANGEROUS_ROLES:
            problems.append(f"is a member of {name} ({DANGEROUS_ROLES[name]})")
    return list(dict.fromkeys(problems))

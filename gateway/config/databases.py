"""The Text-to-SQL databases file (``databases_file`` in ``gateway.yaml``): db_id -> where the database is and
the limits every query on it runs under. The runtime side (connections, schema, execution) is
``gateway.text2sql.db``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import ConfigDict, Field, field_validator

from gateway.config.base import _Strict, load_yaml_model

Dialect = Literal["sqlite", "postgres"]
DbId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
_SQLITE_PREFIX = "sqlite:///"


def _redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class DatabaseConfig(_Strict):
    """One database: where it is and the limits every query on it runs under."""

    model_config = ConfigDict(populate_by_name=True)  # merged with _Strict's

    url: str = Field(
        description="sqlite:///relative/path.sqlite, sqlite:////absolute/path.sqlite, "
        "or postgresql://user[:password]@host[:port]/dbname."
    )
    description: str = Field("", description="Free text: what the database holds.")
    statement_timeout_s: float = Field(5.0, gt=0.0, le=3600.0, allow_inf_nan=False, description="Per query.")
    connect_timeout_s: float = Field(10.0, gt=0.0, le=600.0, allow_inf_nan=False, description="PostgreSQL.")
    max_rows: int = Field(1000, ge=1, le=10_000_000, description="Rows a result keeps; more -> truncated.")
    max_result_bytes: int = Field(
        1_048_576,
        ge=1024,
        description="JSON size a result keeps; more -> truncated. Also the largest value or row a query may "
        "build or return (SQLite: the engine's length limit; PostgreSQL: checked by the server): "
        "a first row over it is refused as too large.",
    )
    sample_values: int = Field(3, ge=0, le=20, description="Distinct example values per column in the schema.")
    pool_size: int = Field(4, ge=1, le=64, description="PostgreSQL connections at most.")
    db_schema: str = Field(
        "public", alias="schema", min_length=1, max_length=63, description="PostgreSQL schema to introspect."
    )
    allow_schemas: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list,
        max_length=16,
        description="PostgreSQL: schemas besides `schema` that model-written queries may read (names as the "
        "server spells them, e.g. `reporting`). System catalogs are refused unless listed here: `pg_catalog` "
        "(then also unqualified `pg_*` names) or `information_schema`. Every other schema is refused. "
        "SQLite ignores it: a query reads the `main` database only.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if v.startswith(_SQLITE_PREFIX):
            if not v[len(_SQLITE_PREFIX) :].strip():
                raise ValueError("sqlite URL without a path; expected sqlite:///path/to/file.sqlite")
            return v
        if v.startswith("sqlite:"):
            raise ValueError("sqlite URLs start with 'sqlite:///' (then a relative path, or '/' and an absolute one)")
        parts = urlsplit(v)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"unsupported URL {_redact(v)!r}; expected sqlite:///path.sqlite or postgresql://user@host:port/dbname"
            )
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"invalid port in {_redact(v)!r}: {exc}") from None
        if not parts.hostname or not parts.path.strip("/"):
            raise ValueError(f"PostgreSQL URL {_redact(v)!r} needs a host and a database name")
        return v

    @property
    def dialect(self) -> Dialect:
        """``"sqlite"`` or ``"postgres"``, from the URL."""
        return "sqlite" if self.url.startswith(_SQLITE_PREFIX) else "postgres"

    def sqlite_path(self, base_dir: Path | str | None = None) -> Path:
        """The SQLite file; a relative path is taken relative to ``base_dir`` (default: the cwd)."""
        if self.dialect != "sqlite":
            raise ValueError(f"not a sqlite URL: {_redact(self.url)}")
        path = Path(self.url[len(_SQLITE_PREFIX) :])
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        return path

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages and logs."""
        return _redact(self.url)


class DatabasesFile(_Strict):
    """A databases file: db_id -> ``DatabaseConfig``."""

    databases: dict[DbId, DatabaseConfig] = Field(min_length=1, description="db_id -> database.")


def load_databases(path: Path | str) -> DatabasesFile:
    """Load a databases file; relative SQLite paths are made absolute against the file's folder.

    Every failure (missing file, bad YAML, invalid field) is a one-line ``ConfigError``.
    """
    loaded = load_yaml_model(path, DatabasesFile)
    base = Path(path).resolve().parent
    resolved = {
        db_id: (
            cfg.model_copy(update={"url": _SQLITE_PREFIX + str(cfg.sqlite_path(base))})
            if cfg.dialect == "sqlite"
            else cfg
        )
        for db_id, cfg in loaded.databases.items()
    }
    return loaded.model_copy(update={"databases": resolved})

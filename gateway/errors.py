"""The gateway's error tree.

    GatewayError
    ├── ConfigError        a config, cluster, GPU catalogue or trace file is invalid (names file and field)
    ├── UnknownNameError   an unknown policy, GPU, model or workload name was asked for
    └── BadRequest         a caller's input is invalid

Foreign exceptions (yaml, pydantic, json) are translated into these at the loading boundary, so the CLI
can print one clear line and exit with status 2.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """A file the user gave is invalid. The message names the file and the field."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        where = f"{path}: {field}" if field else path
        super().__init__(f"{where}: {problem}")


class UnknownNameError(GatewayError):
    """A name (policy, GPU, model, workload) is not registered."""

    def __init__(self, what: str, name: str, known: list[str]) -> None:
        self.what = what
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {what} {name!r}; known: {', '.join(self.known)}")


class BadRequest(GatewayError):
    """Invalid input from a caller."""

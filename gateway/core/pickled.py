"""Pickling support for the frozen dataclasses that the native build compiles with mypyc."""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def field_values(obj: Any) -> tuple[object, ...]:
    """The dataclass ``obj``'s field values in ``__init__`` order: the arguments of its ``__reduce__`` (a frozen
    dataclass compiled by mypyc cannot be unpickled by setting attributes)."""
    return tuple(getattr(obj, f.name) for f in fields(obj))

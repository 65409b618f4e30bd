"""Pickling support for the frozen dataclasses that the native build compiles with mypyc."""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def field_values(obj: Any) -> tuple[object, ...]:
    """The dataclass ``obj``'s field values in ``__init__`` order: the arguments of its ``__reduce__``.

    A frozen dataclass compiled by mypyc (the native build) cannot be unpickled by setting attributes, so
    each one sent to a bench's worker processes pickles by ``(type(self), field_values(self))``."""
    return tuple(getattr(obj, f.name) for f in fields(obj))

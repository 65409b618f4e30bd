"""Hints for the native build (``setup.py``: hot modules compiled with mypyc): ``mypy_extensions.mypyc_attr``
where installed, else a no-op decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["mypyc_attr"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - an install without mypy_extensions (pure Python)

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        """No-op stand-in for ``mypy_extensions.mypyc_attr`` (only the mypyc compiler reads the hint)."""
        return lambda cls: cls

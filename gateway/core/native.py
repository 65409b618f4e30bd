"""Hints for the native build (``setup.py``: the hot modules compiled with mypyc), inert without it.

``mypyc_attr`` is ``mypy_extensions.mypyc_attr`` where that package is installed (the build environment and
the development lock), else a no-op decorator: a pure-Python install runs every module interpreted and never
reads the hint. The one core module that imports outside the standard library, and only a marker.
"""

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

"""gateway/core stays pure, and the package layers hold.

* Every module of ``gateway/core`` imports only the standard library, ``gateway.core`` itself and
  ``gateway.errors`` (absolute and relative imports alike, ``TYPE_CHECKING`` blocks included), and of the
  standard library none of the modules that do I/O or read a clock or a random source: the drivers pass
  time and randomness in.
* ``lint-imports`` checks the import-linter contracts of ``pyproject.toml`` (cli -> bench -> live,
  text2sql -> sim -> config -> core, and the forbidden edges), so the architecture is also checked by pytest.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "gateway" / "core"
PROJECT_ALLOWED = ("gateway.core", "gateway.errors")
"""The project modules core may import (each with its submodules)."""
MARKERS_ALLOWED = {"native.py": ("mypy_extensions",)}
"""Per core module, the third-party modules it may import: ``native.py`` imports the native build's class hints
(with a no-op stand-in where the package is absent)."""
STDLIB_DENIED = frozenset(
    {
        "asyncio",
        "concurrent",
        "datetime",
        "http",
        "importlib",
        "logging",
        "multiprocessing",
        "os",
        "pathlib",
        "random",
        "secrets",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "subprocess",
        "sys",
        "tempfile",
        "threading",
        "time",
        "urllib",
        "uuid",
    }
)
"""Standard-library modules that do I/O, read a clock or a random source, or import by name."""


def _package(path: Path) -> str:
    """The dotted package a module file belongs to (``gateway/core/dag.py`` -> ``gateway.core``)."""
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1])


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, as absolute dotted names (relative imports resolved), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package(path)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, node.module or ""))
                continue
            base = package.split(".")
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:  # `from . import x`: each name is a module of the package (or a name in its __init__)
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
    return found


def forbidden_imports(path: Path) -> list[tuple[int, str]]:
    """The imports of ``path`` that a core module may not have."""
    bad = []
    markers = MARKERS_ALLOWED.get(path.name, ()) if path.parent == CORE else ()
    for line, name in imported_modules(path):
        top = name.split(".")[0]
        if name == "__future__" or name in markers:
            continue
        if any(name == allowed or name.startswith(allowed + ".") for allowed in PROJECT_ALLOWED):
            continue
        if top in sys.stdlib_module_names and top not in STDLIB_DENIED:
            continue
        bad.append((line, name))
    return bad


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_only_the_pure_standard_library_core_and_errors(path: Path) -> None:
    bad = forbidden_imports(path)
    assert not bad, f"{path.relative_to(REPO)} imports {bad}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os\n", ["os"]),
        ("from time import monotonic\n", ["time"]),
        ("import random as r\n", ["random"]),
        ("import pydantic\n", ["pydantic"]),
        ("from mypy_extensions import mypyc_attr\n", ["mypy_extensions"]),
        ("from gateway.live import server\n", ["gateway.live"]),
        ("from ..live.pool import WorkerPool\n", ["gateway.live.pool"]),
        ("from .. import config\n", ["gateway.config"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.sim import engine\n", ["gateway.sim"]),
        ("import math\nfrom . import dag\nfrom .workflow import Call\nfrom .. import errors\n", []),
        ("from gateway.errors import GatewayError\nfrom gateway.core.dag import DagWorkflow\n", []),
    ],
)
def test_the_purity_check_catches_absolute_and_relative_imports(
    source: str, expected: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_core = tmp_path / "gateway" / "core"
    fake_core.mkdir(parents=True)
    module = fake_core / "bad.py"
    module.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [name for _, name in forbidden_imports(module)] == expected


def test_the_import_contracts_hold() -> None:
    beside = Path(sys.executable).parent / "lint-imports"  # this venv's, before any other on PATH
    lint_imports = str(beside) if beside.exists() else shutil.which("lint-imports")
    if lint_imports is None:
        pytest.skip("import-linter is not installed (it is in the dev extras)")
    done = subprocess.run([lint_imports, "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

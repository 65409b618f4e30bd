"""gateway/core must stay pure: no I/O, clock or randomness imports."""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "gateway" / "core"
FORBIDDEN = {
    "asyncio",
    "httpx",
    "fastapi",
    "starlette",
    "prometheus_client",
    "time",
    "random",
    "socket",
    "requests",
    "threading",
    "subprocess",
    "os",
    "datetime",
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_no_io_clock_or_rng(path: Path) -> None:
    bad = [(line, mod) for line, mod in _imports(path) if mod in FORBIDDEN]
    assert not bad, f"{path.name} imports {bad}"


def test_purity_check_detects_a_forbidden_import(tmp_path: Path) -> None:
    f = tmp_path / "bad.py"
    f.write_text("import os\nfrom time import monotonic\nimport random as r\n")
    assert {m for _, m in _imports(f)} >= {"time", "random"}

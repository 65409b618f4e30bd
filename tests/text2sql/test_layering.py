"""gateway/text2sql is a domain below the server: it may import sim, config, core and errors,
never live, bench, cli or the workers (which import it).

The pipeline reaches the gateway only through its own port (``gateway.text2sql.port.StageRunner``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TEXT2SQL = Path(__file__).resolve().parents[2] / "gateway" / "text2sql"
FORBIDDEN = ("gateway.live", "gateway.bench", "gateway.cli", "workers")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("path", sorted(TEXT2SQL.rglob("*.py")), ids=lambda p: p.relative_to(TEXT2SQL).as_posix())
def test_text2sql_imports_nothing_above_it(path: Path) -> None:
    bad = [(line, mod) for line, mod in _imports(path) if _forbidden(mod)]
    assert not bad, f"{path.name} imports {bad}"


def test_the_check_sees_a_server_import(tmp_path: Path) -> None:
    f = tmp_path / "bad.py"
    f.write_text(
        "from gateway.live.service import Gateway\nimport gateway.bench.demo\nfrom gateway.core import tokens\n"
    )
    assert [m for _, m in _imports(f) if _forbidden(m)] == ["gateway.live.service", "gateway.bench.demo"]

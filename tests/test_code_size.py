"""The size limits the code keeps (docs/architecture.md, "Keeping the house small"): no module of gateway/ over
600 lines, no function or method over 80."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    found = sorted(GATEWAY.rglob("*.py"))
    assert found, f"no modules under {GATEWAY}"
    return found


def test_no_module_over_the_file_limit() -> None:
    long = {
        str(p.relative_to(GATEWAY)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"modules over {MAX_FILE_LINES} lines (split them by a real seam): {long}"


def test_no_function_over_the_function_limit() -> None:
    long: dict[str, int] = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(GATEWAY)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"

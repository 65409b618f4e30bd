"""Installs are reproducible: the locks pin every dependency with hashes, and every installer uses them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", re.M)


def _pins(path: Path) -> dict[str, str]:
    text = path.read_text()
    pins = {m.group(1).lower().replace("_", "-"): m.group(2) for m in PIN.finditer(text)}
    assert pins, f"{path.name} pins nothing"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    unhashed = [b.split()[0] for b in blocks if PIN.match(b) and "--hash=sha256:" not in b]
    assert not unhashed, f"{path.name}: pins without hashes: {unhashed}"
    return pins


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_locks_pin_every_declared_dependency_and_agree() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    full = _pins(ROOT / "requirements.lock")
    runtime = _pins(ROOT / "requirements-runtime.lock")
    for req in project["dependencies"]:
        assert _name(req) in runtime, f"{req} is not in requirements-runtime.lock"
    for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
        assert _name(req) in full, f"{req} is not in requirements.lock"
    differ = {n: (v, full.get(n)) for n, v in runtime.items() if full.get(n) != v}
    assert not differ, f"the runtime lock is not the runtime subset of requirements.lock (make lock): {differ}"
    dev_only = {"pytest", "mypy", "ruff", "import-linter"}
    assert not dev_only & set(runtime), "dev tools in the runtime lock"


def test_make_and_the_image_install_exactly_the_locks() -> None:
    make = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r $(LOCK)" in make and "LOCK ?= requirements.lock" in make
    assert "-q --no-deps -e ." in make


def test_make_setup_says_what_it_installs_instead_of_staying_silent() -> None:
    """The long step (the dependencies, about 90 s) is announced and not quiet: pip prints each package."""
    recipe = (ROOT / "Makefile").read_text().split("$(BIN)/hexflow: pyproject.toml $(LOCK)\n", 1)[1].split("\n\n")[0]
    steps = [line.strip() for line in recipe.splitlines()]
    lock_step = next(i for i, line in enumerate(steps) if "--require-hashes -r $(LOCK)" in line)
    assert steps[lock_step - 1].startswith("@echo ") and " -q " not in steps[lock_step]
    assert sum(line.startswith("@echo ") for line in steps) >= 3
    docker = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements-runtime.lock" in docker
    assert "pip install --no-deps /wheels/" in docker
    assert "requirements-runtime.lock" not in (ROOT / ".dockerignore").read_text().split("\n", 2)[2]

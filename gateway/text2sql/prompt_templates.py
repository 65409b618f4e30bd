"""The pipeline's prompt templates (``gateway/text2sql/prompts/*.txt``, ``$name`` placeholders)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from string import Template


class Prompts:
    """The prompt templates by name (``NAMES``)."""

    NAMES = ("system", "extract_keywords", "schema_linking", "candidate", "revise", "unit_tests", "evaluate")

    def __init__(self, templates: Mapping[str, Template]) -> None:
        missing = [n for n in self.NAMES if n not in templates]
        if missing:
            raise ValueError(f"prompt templates missing: {', '.join(missing)}")
        self.templates = dict(templates)

    @classmethod
    def load(cls) -> Prompts:
        """The package's templates (blocking: read at start-up only)."""
        base = resources.files("gateway.text2sql") / "prompts"
        return cls({n: Template((base / f"{n}.txt").read_text(encoding="utf-8")) for n in cls.NAMES})

    def render(self, name: str, **values: object) -> str:
        """Fill a template; every placeholder must be given (a missing one is a bug: KeyError)."""
        return self.templates[name].substitute({k: str(v) for k, v in values.items()})

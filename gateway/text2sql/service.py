"""``Text2SqlService``: what ``POST /v1/text2sql`` serves from (databases, pipeline, question limits), built
once at start-up and closed at shutdown; no HTTP and no gateway here. Errors: ``UnknownDatabase`` (404,
listing the databases the tenant may use), ``InvalidQuestion`` (422, ``param`` names the field)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.config.gateway import Text2SqlConfig
from gateway.errors import Unprocessable
from gateway.text2sql.db import Database, DatabaseRegistry, UnknownDatabase
from gateway.text2sql.pipeline import PipelineConfig, Text2SqlPipeline
from gateway.text2sql.prompt_templates import Prompts

NO_DATABASES = (
    "no databases are configured on this gateway: set databases_file in its gateway.yaml, or start it with "
    "hexflow serve --demo for the demo database"
)


class InvalidQuestion(Unprocessable):
    """A question or evidence the route refuses (422); ``param`` is the field at fault."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}", param=param)


class Text2SqlService:
    """The databases (``registry``; None: no ``databases_file``, every request is a 404), the pipeline and the
    question limits (the gateway config's ``text2sql`` section) of ``/v1/text2sql``."""

    def __init__(self, settings: Text2SqlConfig, registry: DatabaseRegistry | None, pipeline: Text2SqlPipeline) -> None:
        self.settings = settings
        self.registry = registry
        self.pipeline = pipeline

    @classmethod
    def from_config(cls, settings: Text2SqlConfig, databases_path: Path | None) -> Text2SqlService:
        """Read the databases file (``ConfigError`` when it is invalid) and the prompt templates, now."""
        registry = None if databases_path is None else DatabaseRegistry.from_file(databases_path)
        knobs = ("candidates", "max_revisions", "evaluate", "unit_tests", "schema_max_chars")
        config = PipelineConfig(**{k: getattr(settings, k) for k in knobs})
        return cls(settings, registry, Text2SqlPipeline(config, Prompts.load()))

    def database(self, db_id: str, *, tenant: str, allows: Callable[[str], bool]) -> Database:
        """The database ``db_id`` for a tenant that ``allows`` it; ``UnknownDatabase`` (404) otherwise."""
        if self.registry is None:
            raise UnknownDatabase(db_id, [], message=NO_DATABASES)
        allowed = [d for d in self.registry.ids() if allows(d)]
        if db_id not in allowed:
            names = ", ".join(allowed) or "(none)"
            raise UnknownDatabase(
                db_id, allowed, message=f"unknown database {db_id!r}; allowed for tenant {tenant}: {names}"
            )
        return self.registry.get(db_id)

    def check_question(self, question: str, evidence: str | None) -> tuple[str, str]:
        """The question and evidence, stripped; ``InvalidQuestion`` (422) when over the limits as sent (the
        ``maxLength`` the OpenAPI document states) or empty once stripped."""
        for param, text, limit in (
            ("question", question, self.settings.max_question_chars),
            ("evidence", evidence or "", self.settings.max_evidence_chars),
        ):
            if len(text) > limit:
                raise InvalidQuestion(param, f"{len(text)} characters exceed the limit of {limit}")
        q, ev = question.strip(), (evidence or "").strip()
        if not q:
            raise InvalidQuestion("question", "must not be empty")
        return q, ev

    async def close(self) -> None:
        """Close the databases opened so far (connection pools)."""
        if self.registry is not None:
            await self.registry.close()

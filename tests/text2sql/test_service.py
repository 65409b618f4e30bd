"""``Text2SqlService``: the state ``/v1/text2sql`` serves from, and the errors it answers with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config.gateway import Text2SqlConfig
from gateway.errors import ConfigError
from gateway.text2sql.db import DatabaseUnavailable, SqliteDatabase, UnknownDatabase
from gateway.text2sql.service import NO_DATABASES, InvalidQuestion, Text2SqlService


def _service(tmp_path: Path, **settings: int) -> Text2SqlService:
    (tmp_path / "databases.yaml").write_text(
        "databases:\n  shop: {url: 'sqlite:///shop.sqlite'}\n  hr: {url: 'sqlite:///hr.sqlite'}\n"
    )
    return Text2SqlService.from_config(Text2SqlConfig.model_validate(settings), tmp_path / "databases.yaml")


def test_from_config_reads_the_databases_and_the_pipeline_settings(tmp_path: Path) -> None:
    service = _service(tmp_path, candidates=3, max_revisions=1, unit_tests=2, schema_max_chars=5000)
    assert service.registry is not None and service.registry.ids() == ["hr", "shop"]
    cfg = service.pipeline.cfg
    assert (cfg.candidates, cfg.max_revisions, cfg.unit_tests, cfg.schema_max_chars) == (3, 1, 2, 5000)
    assert set(service.pipeline.prompts.templates) >= {"system", "candidate", "revise", "evaluate"}


def test_a_bad_databases_file_fails_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "databases.yaml").write_text("databases:\n  shop: {url: 'mysql://x'}\n")
    with pytest.raises(ConfigError, match=r"databases\.yaml"):
        Text2SqlService.from_config(Text2SqlConfig(), tmp_path / "databases.yaml")


def test_a_tenant_gets_only_the_databases_it_may_use(tmp_path: Path) -> None:
    service = _service(tmp_path)
    assert isinstance(service.database("shop", tenant="a", allows=lambda d: True), SqliteDatabase)
    with pytest.raises(UnknownDatabase) as info:
        service.database("shop", tenant="a", allows=lambda d: d == "hr")
    assert str(info.value) == "unknown database 'shop'; allowed for tenant a: hr"
    assert (info.value.status, info.value.error_type, info.value.param) == (404, "not_found_error", "db_id")
    with pytest.raises(UnknownDatabase, match=r"allowed for tenant a: \(none\)"):
        service.database("nope", tenant="a", allows=lambda d: False)


def test_without_a_databases_file_every_database_is_unknown() -> None:
    service = Text2SqlService.from_config(Text2SqlConfig(), None)
    with pytest.raises(UnknownDatabase, match=re.escape(NO_DATABASES)) as info:
        service.database("shop", tenant="a", allows=lambda d: True)
    assert info.value.status == 404


@pytest.mark.parametrize(
    ("question", "evidence", "param", "problem"),
    [
        ("   ", None, "question", "question: must not be empty"),
        ("x" * 11, None, "question", "question: 11 characters exceed the limit of 10"),
        ("ok", "e" * 6, "evidence", "evidence: 6 characters exceed the limit of 5"),
    ],
)
def test_a_bad_question_is_a_422_naming_the_field(
    tmp_path: Path, question: str, evidence: str | None, param: str, problem: str
) -> None:
    service = _service(tmp_path, max_question_chars=10, max_evidence_chars=5)
    with pytest.raises(InvalidQuestion) as info:
        service.check_question(question, evidence)
    assert (str(info.value), info.value.param, info.value.status) == (problem, param, 422)


def test_questions_are_stripped(tmp_path: Path) -> None:
    assert _service(tmp_path).check_question("  How many?\n", None) == ("How many?", "")


async def test_close_closes_the_databases_opened(tmp_path: Path) -> None:
    service = _service(tmp_path)
    db = service.database("shop", tenant="a", allows=lambda d: True)
    await service.close()
    assert service.database("shop", tenant="a", allows=lambda d: True) is not db  # reopened lazily
    with pytest.raises(DatabaseUnavailable):
        await db.schema()  # the file does not exist: 503 at the schema stage
    await Text2SqlService.from_config(Text2SqlConfig(), None).close()

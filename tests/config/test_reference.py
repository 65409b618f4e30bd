"""docs/configuration.md is what ``hexflow config-reference`` generates from the models (kept in sync)."""

from __future__ import annotations

from pathlib import Path

from gateway.config.reference import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_in_sync_with_the_models() -> None:
    assert DOC.read_text(encoding="utf-8") == reference(), "run: hexflow config-reference > docs/configuration.md"


def test_reference_covers_every_file_and_section() -> None:
    text = reference()
    for title in ("config/gateway.yaml", "config/tenants.yaml", "databases file", "config/clusters/*.yaml"):
        assert f"## {title}" in text
    for section in ("`limits`", "`timeouts`", "`tuning`", "`text2sql`", "`tenants`", "`databases`"):
        assert f"### {section}" in text
    assert "| `max_queued_calls` |" in text and "| `api_key_sha256` |" in text

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


def test_priority_weight_is_described_one_way_everywhere() -> None:
    """What the weight does (the vtc policy's share; hexgen ignores it), in the reference and the guide alike."""
    from gateway.config.tenants import TenantConfig

    described = TenantConfig.model_fields["priority_weight"].description or ""
    assert "under the vtc policy" in described and "Other policies ignore it" in described
    guide = (DOC.parent / "live-gateway.md").read_text(encoding="utf-8")
    assert "`priority_weight`: its share of the cluster under the `vtc`" in " ".join(guide.split())

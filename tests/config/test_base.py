"""``load_yaml_model``: a misspelled key is reported as the unknown key, with the key it was probably meant to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.base import load_yaml_model
from gateway.config.tenants import TenantsFile
from gateway.errors import ConfigError

TENANT = """tenants:
  - name: gold
    api_key_sha256: [0ca740ac75617c4a9d53b79e9cd6b0c56466dcef9823fc14addebe8e1ad60af5]
    default_deadline_s: 60
    min_deadline_s: 5
    {key}: 600
"""


def test_a_misspelled_required_key_is_reported_as_unknown_with_a_suggestion(tmp_path: Path) -> None:
    """The typo also leaves a required key missing; the unknown key is what the error names."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANT.format(key="max_deadine_s"), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_yaml_model(path, TenantsFile)
    assert info.value.field == "tenants.0.max_deadine_s"
    assert info.value.problem.startswith("unknown key; did you mean 'max_deadline_s'?; allowed: name, ")


def test_an_unknown_key_like_no_allowed_one_gets_no_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANT.format(key="max_deadline_s") + "    colour: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_yaml_model(path, TenantsFile)
    assert info.value.field == "tenants.0.colour"
    assert "did you mean" not in info.value.problem and "allowed: name, " in info.value.problem

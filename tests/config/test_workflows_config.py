"""gateway/config/workflows.yaml (packaged data): templates and the calibration workflow, as core types."""

from pathlib import Path

import pytest

from gateway.config.workflows import (
    CHESS_PARALLEL_KINDS,
    CHESS_TEMPLATE,
    STANDARD_WORKFLOW,
    TEMPLATES,
    load_workflows,
)
from gateway.core.workflow import CANDIDATE, EVALUATE, REVISE, CallSpec, PhaseSpec
from gateway.errors import ConfigError


def test_the_repository_file_gives_the_chess_template_and_calibration_workflow() -> None:
    assert TEMPLATES == {"chess": CHESS_TEMPLATE}
    assert frozenset({CANDIDATE, EVALUATE}) == CHESS_PARALLEL_KINDS
    revise = next(p for p in CHESS_TEMPLATE.phases if p.kind == REVISE)
    assert revise == PhaseSpec(REVISE, 6988, 129, rounds=3.39, repeatable=True)
    assert len(STANDARD_WORKFLOW) == 15  # the published standard workflow: 4 revise calls among them
    assert STANDARD_WORKFLOW[5] == CallSpec(CANDIDATE, 11748, 678)


def test_a_custom_file_is_loaded(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(
        "templates:\n  chess:\n    phases:\n      - {kind: a, input_tokens: 10, output_tokens: 2, rounds: 2.5}\n"
        "  other:\n    parallel_kinds: [b]\n    phases: [{kind: b, input_tokens: 1, output_tokens: 1, width: 3}]\n"
        "standard_workflow:\n  - {kind: a, input_tokens: 10, output_tokens: 2}\n"
    )
    w = load_workflows(f)
    assert w.templates["chess"].phases == (PhaseSpec("a", 10, 2, rounds=2.5),)
    assert w.parallel_kinds["other"] == frozenset({"b"})
    assert w.standard_workflow == (CallSpec("a", 10, 2),)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("templates: {}\nstandard_workflow: [{kind: a, input_tokens: 1, output_tokens: 1}]\n", "templates"),
        (
            "templates:\n  x:\n    phases: [{kind: a, input_tokens: 1, output_tokens: 1}]\n"
            "standard_workflow: [{kind: a, input_tokens: 1, output_tokens: 1}]\n",
            "templates",
        ),
        (
            "templates:\n  chess:\n    phases: [{kind: a, input_tokens: -1, output_tokens: 1}]\n"
            "standard_workflow: [{kind: a, input_tokens: 1, output_tokens: 1}]\n",
            "templates.chess.phases.0.input_tokens",
        ),
        (
            "templates:\n  chess:\n    phases: [{kind: a, input_tokens: 1, output_tokens: 1, speed: 2}]\n"
            "standard_workflow: [{kind: a, input_tokens: 1, output_tokens: 1}]\n",
            "templates.chess.phases.0.speed",
        ),
    ],
)
def test_a_bad_file_is_one_config_error_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_workflows(f)
    assert err.value.field == field

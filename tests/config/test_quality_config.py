"""``gateway/config/quality.yaml``: the measured quality model and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.quality import QUALITY, load_quality
from gateway.core.degrade import Knobs
from gateway.errors import ConfigError

GOOD = """source: test
command: hexflow bench quality
questions: 10
seeds: [0]
rows:
  - {candidates: 2, max_revisions: 10, evaluate: true, accuracy: 0.9}
  - {candidates: 1, max_revisions: 1, evaluate: false, accuracy: 0.7}
"""


def test_a_quality_file_loads_as_the_core_model(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(GOOD)
    model = load_quality(path)
    assert model.table == {Knobs(2, 10, True): 0.9, Knobs(1, 1, False): 0.7}
    assert model.source.startswith("test (10 questions x 1 seeds")


def test_the_packaged_file_is_loaded_once_as_a_constant() -> None:
    assert QUALITY.table == load_quality().table


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (GOOD.replace("accuracy: 0.9", "accuracy: 1.5"), "rows.0.accuracy", "1"),
        (GOOD.replace("candidates: 1,", "candidates: 0,"), "rows.1.candidates", "1"),
        (GOOD + "  - {candidates: 2, max_revisions: 10, evaluate: true, accuracy: 0.5}\n", "rows.2", "twice"),
        (GOOD.replace("seeds: [0]", "seeds: []"), "seeds", ""),
        (GOOD.replace("source: test\n", ""), "source", ""),
        (GOOD + "extra: 1\n", "extra", ""),
    ],
)
def test_a_bad_quality_file_says_where(tmp_path: Path, text: str, field: str, words: str) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_quality(path)
    msg = str(err.value)
    assert str(path) in msg and field in msg and words in msg and "\n" not in msg


def test_a_missing_quality_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_quality(tmp_path / "none.yaml")

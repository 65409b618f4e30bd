"""``gateway/config/quality.yaml``: answer accuracy per knob setting of the Text-to-SQL pipeline, as measured
by ``hexflow bench quality`` (packaged data, not an operator setting), loaded once as ``QUALITY``; the
degradation policy ranks the settings that fit a deadline by it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from gateway.config.base import FieldError, _Strict, load_yaml_model
from gateway.core.degrade import Knobs, QualityModel

DEFAULT_QUALITY = Path(__file__).with_name("quality.yaml")
"""The packaged quality file."""


class QualityRow(_Strict):
    """The accuracy measured at one knob setting."""

    candidates: int = Field(ge=1, le=64, description="SQL candidates generated in parallel.")
    max_revisions: int = Field(ge=0, le=1000, description="Most revise rounds per candidate.")
    evaluate: bool = Field(description="Unit tests generated and candidates evaluated.")
    accuracy: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="Share of correct answers, [0, 1].")
    by_source: dict[str, Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="The accuracy on each question set (information; not used)."
    )


class QualityFile(_Strict):
    """``gateway/config/quality.yaml``: rows of measured accuracy, each knob setting at most once."""

    source: str = Field(min_length=1, description="What the accuracies were measured on.")
    command: str = Field(min_length=1, description="The command that wrote the file.")
    questions: int = Field(ge=1, description="Questions per setting (each over every seed).")
    seeds: list[int] = Field(min_length=1, description="Seeds of the wrong-candidate assignment, averaged.")
    rows: list[QualityRow] = Field(min_length=1, description="The measured settings.")

    @model_validator(mode="after")
    def _unique(self) -> QualityFile:
        seen: dict[tuple[int, int, bool], int] = {}
        for i, r in enumerate(self.rows):
            key = (r.candidates, r.max_revisions, r.evaluate)
            if key in seen:
                raise FieldError(
                    f"rows.{i}",
                    f"setting candidates={key[0]} max_revisions={key[1]} evaluate={str(key[2]).lower()} "
                    f"is measured twice (also rows.{seen[key]})",
                )
            seen[key] = i
        return self


def load_quality(path: Path | str | None = None) -> QualityModel:
    """Load a quality file (default: the packaged one) as a ``QualityModel``; errors are one-line ``ConfigError``."""
    f = load_yaml_model(DEFAULT_QUALITY if path is None else path, QualityFile)
    table = {Knobs(r.candidates, r.max_revisions, r.evaluate): r.accuracy for r in f.rows}
    return QualityModel(table, f"{f.source} ({f.questions} questions x {len(f.seeds)} seeds: {f.command})")


QUALITY: QualityModel = load_quality()
"""The packaged, measured quality model (``gateway/config/quality.yaml``)."""

"""Shared pieces of every config model: the config folder, field types, the strict base model and the one
YAML loader (``load_yaml_model``), the boundary where foreign errors become ``ConfigError``."""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository (or install) root: the folder that holds ``gateway/`` and ``config/``."""
CONFIG_DIR = Path(os.environ.get("HEXFLOW_CONFIG_DIR") or REPO_ROOT / "config")
"""``config/`` of the checkout, or ``$HEXFLOW_CONFIG_DIR`` (set in the container image)."""
DEFAULT_GPU_CATALOG = CONFIG_DIR / "gpus.yaml"
CLUSTERS_DIR = CONFIG_DIR / "clusters"

PosFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
"""A share that may be zero (``Fraction`` may not); also an alpha."""
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]

M = TypeVar("M", bound=BaseModel)


class FieldError(ValueError):
    """A cross-field check failed at ``field``, a dotted path relative to the model whose validator raises it
    (``load_yaml_model`` prefixes that model's own location in the file)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _known(names: typing.Iterable[str]) -> str:
    return ", ".join(sorted(names))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at_most: ClassVar[dict[str, str]] = {}
    """Fields whose value must not exceed another field's: field -> that field (checked after validation)."""

    @model_validator(mode="after")
    def _ordered_fields(self) -> Self:
        for field, bound in self.at_most.items():
            value, limit = getattr(self, field), getattr(self, bound)
            if value > limit:
                raise FieldError(field, f"must not exceed {bound} ({limit:g}), got {value:g}")
        return self


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated[...]`` and ``X | None`` down to the bare type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
            continue
        return tp


def _allowed_keys(model_cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys allowed in the mapping at ``loc`` (walking model fields, lists and dicts), if known."""
    tp: Any = model_cls
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif origin is list:
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return None


def _describe(err: Mapping[str, Any], model_cls: type[BaseModel]) -> tuple[str, str]:
    """``(field, problem)`` for one pydantic error dict."""
    loc: tuple[int | str, ...] = tuple(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    exc = ctx.get("error") if isinstance(ctx, Mapping) else None
    if isinstance(exc, FieldError):
        return _dotted((*loc, exc.field)), exc.problem
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model_cls, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed or (), n=1) if loc else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        hint += f"; allowed: {', '.join(allowed)}" if allowed else ""
        return _dotted(loc), f"unknown key{hint}"
    if kind == "missing":
        return _dotted(loc), "required key is missing"
    if isinstance(exc, ValueError):
        return _dotted(loc), str(exc)
    problem = str(err.get("msg", "invalid value"))
    if "input" in err and kind not in ("model_type", "dict_type", "list_type"):
        problem = f"{problem} (got {err['input']!r})"
    return _dotted(loc), problem


def load_yaml_model(
    path: Path | str,
    model_cls: type[M],
    *,
    context: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> M:
    """Read a YAML file into ``model_cls``; every failure is a one-line ``ConfigError`` (file, dotted field
    path, problem; the first of several, with the count of the rest). ``context`` goes to the validators;
    ``overrides`` replace top-level keys of the file before validation (command-line flags)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(where, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, "", f"cannot read the file: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "syntax error"
        field = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(where, field, f"invalid YAML: {problem}") from exc
    if data is None:
        raise ConfigError(where, "", "the file is empty; expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(where, "", f"expected a mapping at the top level, got {type(data).__name__}")
    if overrides:
        data = {**data, **overrides}
    try:
        return model_cls.model_validate(data, context=dict(context) if context is not None else None)
    except ValidationError as exc:
        # An unknown key first: a misspelled key is also a missing one, and the typo is the news.
        errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
        field, problem = _describe(errors[0], model_cls)
        if len(errors) > 1:
            problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        raise ConfigError(where, field, problem) from None

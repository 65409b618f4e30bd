"""The configuration reference (``docs/configuration.md``), generated from the pydantic models.

    hexflow config-reference > docs/configuration.md

``tests/test_reference.py`` regenerates it and compares, so the document cannot drift from the code.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.cluster import ClusterConfig
from gateway.config.databases import DatabasesFile
from gateway.config.gateway import GatewayConfig
from gateway.config.gpus import GpuCatalog
from gateway.config.quality import QualityFile
from gateway.config.tenants import TenantsFile
from gateway.config.workflows import WorkflowsFile

FILES: tuple[tuple[str, type[BaseModel]], ...] = (
    ("config/gateway.yaml", GatewayConfig),
    ("config/tenants.yaml", TenantsFile),
    ("databases file (gateway.yaml `databases_file`)", DatabasesFile),
    ("config/clusters/*.yaml", ClusterConfig),
    ("config/gpus.yaml", GpuCatalog),
    ("gateway/config/workflows.yaml (packaged data)", WorkflowsFile),
    ("gateway/config/quality.yaml (packaged data: hexflow bench quality)", QualityFile),
)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type refers to (for nested sections)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for a in typing.get_args(tp):
        out.extend(_models_in(a))
    return out


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        try:
            value = f.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(section defaults)"
        return f"`{value!r}`"
    if f.default is PydanticUndefined:
        return "required"
    return f"`{f.default!r}`"


def _section(model: type[BaseModel], path: str, seen: set[type[BaseModel]], out: list[str]) -> None:
    doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    out.append(f"### `{path}` ({model.__name__})\n" if path else f"### top level ({model.__name__})\n")
    if doc:
        out.append(f"{doc}\n")
    out.append("| key | type | default | description |")
    out.append("|---|---|---|---|")
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, f in model.model_fields.items():
        key = f.alias or name
        models = _models_in(f.annotation)
        desc = f.description or (f"See `{path + '.' if path else ''}{key}` below." if models else "")
        desc = desc.replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{key}` | {_type_name(f.annotation).replace('|', chr(92) + '|')} | {_default(f)} | {desc} |")
        for m in _models_in(f.annotation):
            if m not in seen:
                nested.append((f"{path}.{key}" if path else key, m))
    out.append("")
    for sub_path, m in nested:
        seen.add(m)
        _section(m, sub_path, seen, out)


def reference() -> str:
    """The whole configuration reference as Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models by `hexflow config-reference` (a test keeps it in sync). Every file",
        "is validated once at start; an invalid one stops the command with one line naming the file and field.",
        "",
    ]
    for title, model in FILES:
        out.append(f"## {title}\n")
        _section(model, "", {model}, out)
    return "\n".join(out).rstrip() + "\n"

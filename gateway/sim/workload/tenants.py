"""Tenants of a synthetic workload (``TenantSpec``) and the command-line tenant mix (``parse_tenants``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast, get_args

from gateway.core.degrade import QUALITY_MODES, QualityMode

TenantKind = Literal["text2sql", "chat"]

_TENANT_KINDS: tuple[str, ...] = get_args(TenantKind)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant of a synthetic workload: relative ``share``, deadline (``deadline_s``, else ``slo_scale`` x the base
    SLO), ``kind`` (Text-to-SQL or chat) and ``quality`` mode."""

    name: str
    deadline_s: float | None = None
    slo_scale: float | None = None
    share: float = 1.0
    kind: TenantKind = "text2sql"
    quality: QualityMode = "full"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tenant name must not be empty")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"tenant {self.name!r}: share must be a positive number, got {self.share}")
        for key, value in (("deadline_s", self.deadline_s), ("slo_scale", self.slo_scale)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"tenant {self.name!r}: {key} must be a positive number, got {value}")
        if self.kind not in _TENANT_KINDS:
            raise ValueError(f"tenant {self.name!r}: kind must be text2sql or chat, got {self.kind!r}")
        if self.quality not in QUALITY_MODES:
            modes = ", ".join(QUALITY_MODES)
            raise ValueError(f"tenant {self.name!r}: quality must be one of {modes}, got {self.quality!r}")

    def relative_deadline(self, slo_s: float) -> float:
        """Seconds from arrival to deadline, given the workload's base SLO."""
        if self.deadline_s is not None:
            return self.deadline_s
        if self.slo_scale is not None:
            return self.slo_scale * slo_s
        return slo_s


_TENANT_KEYS = ("deadline_s", "kind", "quality", "share", "slo_scale")


def parse_tenants(spec: str) -> list[TenantSpec]:
    """Parse a tenant mix ``name[:key=value]...,...`` (keys ``share``, ``slo_scale``, ``deadline_s``, ``kind``,
    ``quality``); ``ValueError`` names the offending part."""
    if not spec.strip():
        raise ValueError("empty tenant spec; expected name[:key=value]... separated by commas")
    tenants: list[TenantSpec] = []
    seen: set[str] = set()
    for raw_part in spec.split(","):
        part = raw_part.strip()
        fields = part.split(":")
        name = fields[0].strip()
        if not name or "=" in name:
            raise ValueError(f"tenant spec part {part!r}: expected a tenant name first")
        if name in seen:
            raise ValueError(f"tenant spec part {part!r}: tenant {name!r} given twice")
        seen.add(name)
        values: dict[str, str] = {}
        for field_text in fields[1:]:
            key, eq, value = (s.strip() for s in field_text.partition("="))
            if not eq or not key or not value:
                raise ValueError(f"tenant spec part {part!r}: expected key=value, got {field_text!r}")
            if key not in _TENANT_KEYS:
                raise ValueError(f"tenant spec part {part!r}: unknown key {key!r} (known: {', '.join(_TENANT_KEYS)})")
            if key in values:
                raise ValueError(f"tenant spec part {part!r}: key {key!r} given twice")
            values[key] = value
        tenants.append(_tenant_from_fields(name, part, values))
    return tenants


def _tenant_from_fields(name: str, part: str, values: dict[str, str]) -> TenantSpec:
    numbers: dict[str, float] = {}
    for key in ("deadline_s", "slo_scale", "share"):
        if key in values:
            try:
                numbers[key] = float(values[key])
            except ValueError:
                raise ValueError(f"tenant spec part {part!r}: {key} must be a number, got {values[key]!r}") from None
    try:
        return TenantSpec(
            name,
            deadline_s=numbers.get("deadline_s"),
            slo_scale=numbers.get("slo_scale"),
            share=numbers.get("share", 1.0),
            kind=cast(TenantKind, values.get("kind", "text2sql")),  # both checked by TenantSpec
            quality=cast(QualityMode, values.get("quality", "full")),
        )
    except ValueError as exc:
        raise ValueError(f"tenant spec part {part!r}: {exc}") from None

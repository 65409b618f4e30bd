"""The figures and tables every bench tool prints: percentiles (the simulator's, so live and simulated runs
are summarised alike), number format, text tables, strict-JSON records, plots."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gateway.sim.metrics import percentile

__all__ = [
    "RunHeader",
    "Spread",
    "finite_or_none",
    "fmt",
    "json_safe",
    "percentile",
    "pyplot",
    "save_figure",
    "save_json",
    "spread",
    "table",
]


def fmt(x: float, digits: int = 1) -> str:
    """A number for a table: ``digits`` decimals; ``inf`` for +infinity (never finished), ``-`` for NaN or -inf."""
    return f"{x:.{digits}f}" if math.isfinite(x) else ("inf" if x == math.inf else "-")


def cells(obj: Any, columns: str) -> list[str]:
    """Table cells of ``obj``'s attributes, ``columns`` like ``"name calls rate_qps:.4f"`` (each ``attr:spec``,
    formatted as ``format(value, spec)``; a float that is not finite as ``fmt`` writes it)."""
    out = []
    for col in columns.split():
        attr, _, spec = col.partition(":")
        v = getattr(obj, attr)
        out.append(fmt(v) if isinstance(v, float) and not math.isfinite(v) else format(v, spec))
    return out


def positive(what: str, x: float) -> float:
    """``x`` if it is a positive finite number, else ``ValueError("{what} must be a positive number, got x")``."""
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{what} must be a positive number, got {x}")
    return x


def finite_or_none(x: float | None) -> float | None:
    """``x`` when it is a finite number, else ``None`` (strict JSON has no NaN or Infinity)."""
    return x if x is not None and math.isfinite(x) else None


def json_safe(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with every float that is not finite, at any depth of dicts and lists, as ``None``."""
    return {k: _safe(v) for k, v in doc.items()}


def _safe(v: Any) -> Any:
    if isinstance(v, float):
        return finite_or_none(v)
    if isinstance(v, Mapping):
        return json_safe(v)
    return [_safe(x) for x in v] if isinstance(v, list | tuple) else v


@dataclass
class RunHeader:
    """What a simulated benchmark's report (and its JSON) opens with: trace, cluster, SLO, workflows and seeds."""

    trace: str
    cluster: list[str]
    slo_scale: float
    slo_s: float
    n_workflows: int
    seeds: list[int]

    def header(self) -> dict[str, Any]:
        """The header fields, in the order above: the JSON document's first keys."""
        return {f.name: getattr(self, f.name) for f in fields(RunHeader)}


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the Agg backend (no display needed), imported when a plot is asked for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` as a PNG (its folder made) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def save_json(path: Path | str, doc: Any, *, end: str = "\n", **dumps: Any) -> Path:
    """Write ``doc`` as JSON to ``path``, its folder made (by default indented by 2 and strict: no NaN or
    Infinity); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, **{"indent": 2, "allow_nan": False, **dumps}) + end, encoding="utf-8")
    return out


@dataclass(frozen=True)
class Spread:
    """Mean and spread of a few repeated measurements (one per seed)."""

    mean: float
    std: float
    """Sample standard deviation (n - 1); 0.0 for a single value."""
    min: float
    max: float
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, float | list[float | None] | None]:
        """For JSON: non-finite numbers become ``None``."""
        figures = {k: finite_or_none(getattr(self, k)) for k in ("mean", "std", "min", "max")}
        return {**figures, "per_seed": [finite_or_none(v) for v in self.values]}


def spread(values: Sequence[float]) -> Spread:
    """Mean, sample standard deviation, min and max of ``values`` (at least one; an infinite value makes the
    mean infinite, as an unfinished run's percentile should)."""
    if not values:
        raise ValueError("spread of no values")
    n = len(values)
    mean = sum(values) / n
    if n > 1 and math.isfinite(mean):
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    else:
        std = 0.0 if n == 1 else math.nan
    return Spread(mean, std, min(values), max(values), tuple(values))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 0, rule: bool = True) -> str:
    """A plain-text table, columns two spaces apart, each as wide as its widest cell.

    The first ``left`` columns are left-aligned (labels), the others right-aligned (numbers); ``rule``
    puts a line of dashes under the headers.
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(headers)]
    if rule:
        out.append("  ".join("-" * w for w in widths))
    out += [line(r) for r in rows]
    return "\n".join(out)

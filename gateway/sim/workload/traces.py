"""Workload names (``chess-bird``, a trace name in ``SHARED_TRACE_DIR`` or a path) and hexgen trace files:
``load_queries`` gives queries as flat lists of ``CallSpec`` in issue order."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from gateway.config.workflows import CHESS_PARALLEL_KINDS
from gateway.core.workflow import CANDIDATE, CallSpec, Stage, group_calls
from gateway.errors import ConfigError, UnknownNameError
from gateway.sim.workload.generator import generate_chess_bird
from gateway.sim.workload.prefixes import chess_prefixes

CHESS_BIRD = "chess-bird"
"""Name of the built-in synthetic CHESS-on-BIRD workload (``generate_chess_bird``)."""

TRACE_DIR_ENV = "HEXFLOW_TRACE_DIR"
"""The environment variable naming another folder of trace files."""
SHARED_TRACE_DIR = Path(
    os.environ.get(TRACE_DIR_ENV) or Path(__file__).resolve().parents[3].parent / "shared" / "data" / "hexgen-traces"
)
"""Where bare trace names (``trace1``, ``financial``, ...) are looked up: ``$HEXFLOW_TRACE_DIR``, else
``../shared/data/hexgen-traces`` next to the repository (the project's shared data folder)."""

_REQUEST_KEY = "Text2SQLRequest"


def normalise_step(step: str) -> str:
    """Map a trace's step name to a stage kind: lower case, spaces to underscores ("Information Retriever" ->
    ``information_retriever``), and every ``generate_candidate*`` step (its name carries the agent) ``CANDIDATE``."""
    kind = step.strip().lower().replace(" ", "_")
    if kind.startswith(CANDIDATE):
        return CANDIDATE
    return kind


def _length(value: object, path: str, where: str) -> int:
    # bool is an int subclass; a JSON true is not a token count.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(path, where, f"expected a non-negative integer, got {value!r}")
    return value


def load_trace(path: Path) -> list[list[CallSpec]]:
    """Load a hexgen trace file (a JSON list of ``{"Text2SQLRequest": [{"step", "input_length", "output_length"}]}``):
    one list of calls per query, in issue order. Malformed input raises ``ConfigError`` naming the value's path."""
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read the trace: {exc.strerror or exc}") from exc
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(where, "", f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, list):
        raise ConfigError(where, "", f"expected a JSON list of queries, got {type(data).__name__}")
    if not data:
        raise ConfigError(where, "", "expected at least one query, got an empty list")
    queries: list[list[CallSpec]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or _REQUEST_KEY not in item:
            raise ConfigError(where, f"[{i}]", f'expected an object with key "{_REQUEST_KEY}"')
        steps = item[_REQUEST_KEY]
        at = f"[{i}].{_REQUEST_KEY}"
        if not isinstance(steps, list) or not steps:
            raise ConfigError(where, at, "expected a non-empty list of calls")
        calls: list[CallSpec] = []
        for j, raw in enumerate(steps):
            call_at = f"{at}[{j}]"
            if not isinstance(raw, dict):
                raise ConfigError(where, call_at, "expected an object with step, input_length, output_length")
            step = raw.get("step")
            if not isinstance(step, str) or not step.strip():
                raise ConfigError(where, f"{call_at}.step", f"expected a non-empty string, got {step!r}")
            tokens_in = _length(raw.get("input_length"), where, f"{call_at}.input_length")
            tokens_out = _length(raw.get("output_length"), where, f"{call_at}.output_length")
            calls.append(CallSpec(normalise_step(step), tokens_in, tokens_out))
        queries.append(calls)
    return queries


def to_stages(calls: Sequence[CallSpec]) -> list[Stage]:
    """Stages of one CHESS query: consecutive candidates and consecutive evaluations run in parallel."""
    return group_calls(calls, CHESS_PARALLEL_KINDS)


def trace_names(trace_dir: Path | None = None) -> list[str]:
    """Workload names ``resolve_trace`` knows: ``chess-bird`` and the trace files of the shared folder."""
    folder = SHARED_TRACE_DIR if trace_dir is None else trace_dir
    names = [CHESS_BIRD]
    if folder.is_dir():
        names += sorted(p.stem for p in folder.glob("*.json"))
    return names


def resolve_trace(name_or_path: str | Path, trace_dir: Path | None = None) -> Path | Literal["chess-bird"]:
    """Resolve a workload name: ``chess-bird``, a bare trace name looked up as ``<trace_dir>/<name>.json``
    (unknown: ``UnknownNameError`` listing the known ones), or a file path (returned as it is)."""
    if name_or_path == CHESS_BIRD:
        return "chess-bird"
    path = Path(name_or_path)
    bare = path.name == str(name_or_path) and not path.suffix
    if not bare or path.exists():
        return path
    folder = SHARED_TRACE_DIR if trace_dir is None else trace_dir
    candidate = folder / f"{path.name}.json"
    if candidate.is_file():
        return candidate
    where = "" if folder.is_dir() else ", which does not exist here"
    raise UnknownNameError(
        "workload",
        str(name_or_path),
        trace_names(trace_dir),
        hint=f"A trace name is a file NAME.json in {folder}{where} (the hexgen-traces folder of the shared data; "
        f"${TRACE_DIR_ENV} points elsewhere); or give a trace file's path; {CHESS_BIRD} is built in "
        "(generated from those traces' statistics, nothing to download)",
    )


def load_queries(
    name_or_path: str | Path,
    n: int | None,
    rng: random.Random,
    trace_dir: Path | None = None,
) -> list[list[CallSpec]]:
    """The queries of a workload name: ``n`` generated ones for ``chess-bird``, else the trace's (cycled or cut to
    ``n`` when given); every call carries its shared prefixes (``prefixes.chess_prefixes``)."""
    source = resolve_trace(name_or_path, trace_dir)
    if source == CHESS_BIRD:
        if n is None:
            raise ValueError(f"the {CHESS_BIRD} workload needs a number of queries")
        return [chess_prefixes(q) for q in generate_chess_bird(n, rng)]
    queries = [chess_prefixes(q) for q in load_trace(Path(source))]
    return queries if n is None else repeat_to(queries, n)


def workload_queries(trace: str, n: int, seed: int, trace_dir: Path | None = None) -> tuple[str, list[list[CallSpec]]]:
    """The workload's name and queries as ``hexflow bench`` draws them: ``chess-bird`` generates ``n`` queries
    from ``random.Random(seed)``; a trace is loaded as recorded (``build_workload`` cycles it)."""
    src = resolve_trace(trace, trace_dir)
    name = CHESS_BIRD if src == CHESS_BIRD else Path(src).stem
    return name, load_queries(trace, n if src == CHESS_BIRD else None, random.Random(seed), trace_dir)


def repeat_to(queries: Sequence[list[CallSpec]], n: int) -> list[list[CallSpec]]:
    """Exactly ``n`` queries: ``queries`` cycled in order (query i is ``queries[i % len(queries)]``)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and not queries:
        raise ValueError("cannot repeat an empty list of queries")
    return [queries[i % len(queries)] for i in range(n)]

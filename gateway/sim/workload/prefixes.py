"""Which parts of a CHESS query's prompts other calls share (what the traces' token counts prove, no more:
docs/benchmarks.md, "Prefix caching")."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from gateway.core.prefix import PrefixSeg
from gateway.core.workflow import CANDIDATE, EVALUATE, IR, KEYWORDS, REVISE, UNIT_TESTER, CallSpec

KEYWORDS_TEMPLATE = 512
"""Tokens of extract_keywords' fixed template counted as shared (every traced prompt is longer: 635+)."""
REVISE_TAIL = 256
"""Tokens at the end of the shortest revise prompt of a query not counted as shared (its SQL and result)."""
EVALUATE_TAIL = 64
"""Tokens at the end of the shortest evaluation prompt of a query not counted as shared (its unit test)."""


def chess_prefixes(query: Sequence[CallSpec]) -> list[CallSpec]:
    """The calls of one CHESS query with their shared prefixes filled in (where not set already)."""
    revise = [c.input_tokens for c in query if c.kind == REVISE]
    evaluate = [c.input_tokens for c in query if c.kind == EVALUATE]
    revise_shared = min(revise) - REVISE_TAIL if revise else 0
    evaluate_shared = min(evaluate) - EVALUATE_TAIL if evaluate else 0
    out: list[CallSpec] = []
    for kind, run in itertools.groupby(query, key=lambda c: c.kind):
        group = list(run)
        if kind != CANDIDATE:
            out += [c if c.prefix else _with_prefix(c, revise_shared, evaluate_shared) for c in group]
            continue
        longest = max(x.input_tokens for x in group)
        gap = longest - min(x.input_tokens for x in group)
        shared = (PrefixSeg(f"{CANDIDATE}/longer-template", gap),)
        out += [
            replace(x, prefix=shared) if not x.prefix and gap > 0 and x.input_tokens == longest else x for x in group
        ]
    return out


def _with_prefix(c: CallSpec, revise_shared: int, evaluate_shared: int) -> CallSpec:
    kind = c.kind
    if kind in (IR, UNIT_TESTER):
        return replace(c, prefix=(PrefixSeg(f"{kind}/{c.input_tokens}", c.input_tokens),))
    if kind == KEYWORDS and c.input_tokens > KEYWORDS_TEMPLATE:
        return replace(c, prefix=(PrefixSeg(KEYWORDS, KEYWORDS_TEMPLATE),))
    if kind == REVISE and revise_shared > 0:
        return replace(c, prefix=(PrefixSeg(REVISE, revise_shared, per_query=True),))
    if kind == EVALUATE and evaluate_shared > 0:
        return replace(c, prefix=(PrefixSeg(EVALUATE, evaluate_shared, per_query=True),))
    return c

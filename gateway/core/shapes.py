"""What questions cost: robust statistics of answered questions' stages, the source of every prediction of one
(docs/architecture.md, "Degradation and question shapes"). Pure and bounded."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.core.workflow import PhaseSpec, WorkflowTemplate

CLIP = 0.05
"""The share of the highest values ``robust_mean`` clips."""
MIN_QUESTIONS = 5
"""Samples a window needs before its figures replace the prior's."""
INPUT_SCALE_LIMIT = 4.0
"""``ShapeWindow.input_scale`` stays within [1/this, this]: a tokenizer differs from characters/4 by far less,
and a worker misreporting its usage cannot skew it further."""


def robust_mean(values: Sequence[float], clip: float = CLIP) -> float:
    """The mean of ``values`` with the highest ``floor(clip x n)`` (at least one from ``MIN_QUESTIONS`` on)
    clipped to the largest value below them (not dropped); ``nan`` for none."""
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    k = max(math.floor(clip * n), 1) if n >= MIN_QUESTIONS else 0
    if k == 0:
        return sum(s) / n
    cap = s[n - 1 - k]
    return (sum(s[: n - k]) + k * cap) / n


@dataclass(frozen=True, slots=True)
class QuestionSample:
    """One answered question: its stages in order (kind, then each call's (input, output) tokens), whether it ran unit
    tests and evaluation, and its calls' (estimated, worker-counted) prompt tokens where the worker said."""

    stages: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
    evaluated: bool
    prompt_sizes: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(
        cls,
        stages: Iterable[tuple[str, Iterable[tuple[int, int]]]],
        *,
        evaluated: bool,
        prompt_sizes: Iterable[tuple[int, int]] = (),
    ) -> QuestionSample:
        """A sample from lists (copied into tuples)."""
        return cls(
            tuple((k, tuple(calls)) for k, calls in stages),
            evaluated,
            tuple((e, s) for e, s in prompt_sizes if e > 0 and s > 0),
        )


class ShapeWindow:
    """The last ``maxlen`` answered questions and their robust summaries (cached until the next ``add``);
    ``skippable``: kinds that run only when a question evaluates (rounds counted over those that did)."""

    def __init__(self, maxlen: int, skippable: frozenset[str] = frozenset()) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        self._samples: deque[QuestionSample] = deque(maxlen=maxlen)
        self.skippable = skippable
        self._cache: dict[str, dict[str, float]] | None = None

    @property
    def questions(self) -> int:
        """Samples in the window."""
        return len(self._samples)

    @property
    def ready(self) -> bool:
        """At least ``MIN_QUESTIONS`` samples: its figures replace the prior's."""
        return len(self._samples) >= MIN_QUESTIONS

    def add(self, sample: QuestionSample) -> None:
        """Record one answered question (the oldest leaves a full window)."""
        self._samples.append(sample)
        self._cache = None

    def _summary(self) -> dict[str, dict[str, float]]:
        if self._cache is not None:
            return self._cache
        inputs: dict[str, list[float]] = {}
        outputs: dict[str, list[float]] = {}
        widths: dict[str, list[float]] = {}
        counts: list[dict[str, int]] = []
        for s in self._samples:
            per: dict[str, int] = {}
            tokens: dict[str, list[float]] = {}  # kind -> [calls, tokens in, tokens out] of this question
            for kind, calls in s.stages:
                per[kind] = per.get(kind, 0) + 1
                widths.setdefault(kind, []).append(float(len(calls)))
                t = tokens.setdefault(kind, [0.0, 0.0, 0.0])
                for i, o in calls:
                    t[0] += 1
                    t[1] += i
                    t[2] += o
            for kind, (n, t_in, t_out) in tokens.items():
                if n:  # one value per question: a question of many calls weighs as much as one of few
                    inputs.setdefault(kind, []).append(t_in / n)
                    outputs.setdefault(kind, []).append(t_out / n)
            counts.append(per)
        kinds = set(widths)
        rounds: dict[str, float] = {}
        for kind in kinds:
            among = [
                c.get(kind, 0)
                for c, s in zip(counts, self._samples, strict=True)
                if kind not in self.skippable or s.evaluated
            ]
            rounds[kind] = robust_mean([float(v) for v in among]) if among else 0.0
        self._cache = {
            "inputs": {k: robust_mean(v) for k, v in inputs.items() if v},
            "outputs": {k: robust_mean(v) for k, v in outputs.items() if v},
            "widths": {k: robust_mean(v) for k, v in widths.items()},
            "rounds": rounds,
        }
        return self._cache

    def inputs(self) -> dict[str, float]:
        """Per kind: a call's input tokens (robust mean)."""
        return self._summary()["inputs"]

    def outputs(self) -> dict[str, float]:
        """Per kind: a call's output tokens (robust mean)."""
        return self._summary()["outputs"]

    def widths(self) -> dict[str, float]:
        """Per kind: calls per stage (robust mean)."""
        return self._summary()["widths"]

    def rounds(self) -> dict[str, float]:
        """Per kind: stages per question (robust mean; the evaluation kinds over the questions that evaluated)."""
        return self._summary()["rounds"]

    @property
    def input_scale(self) -> float | None:
        """Worker-counted over estimated prompt tokens over the window, within the limits (None: no pair)."""
        est = seen = 0
        for s in self._samples:
            for e, c in s.prompt_sizes:
                est += e
                seen += c
        if est <= 0:
            return None
        return min(max(seen / est, INPUT_SCALE_LIMIT**-1), INPUT_SCALE_LIMIT)


def fit(
    base: WorkflowTemplate,
    window: ShapeWindow,
    *,
    inputs: bool = True,
    outputs: bool = True,
    rounds: bool = True,
    fixed_width: frozenset[str] = frozenset(),
    name: str | None = None,
) -> WorkflowTemplate:
    """``base`` with the window's tokens, rounds (a kind never run: dropped) and widths (not for ``fixed_width``
    kinds) for each phase's kind; phases sharing a kind keep their share of its rounds."""
    if window.questions == 0:
        return base
    ins, outs, widths, rnds = window.inputs(), window.outputs(), window.widths(), window.rounds()
    base_rounds: dict[str, float] = {}
    for p in base.phases:
        base_rounds[p.kind] = base_rounds.get(p.kind, 0.0) + p.rounds
    phases: list[PhaseSpec] = []
    for p in base.phases:
        n_in, n_out, r, w = p.input_tokens, p.output_tokens, p.rounds, p.width
        if inputs and p.kind in ins:
            n_in = max(1, round(ins[p.kind]))
        if outputs and p.kind in outs:
            n_out = max(1, round(outs[p.kind]))
        if rounds:
            seen = rnds.get(p.kind, 0.0)
            total = base_rounds[p.kind]
            r = seen * p.rounds / total if total > 0 else seen
            if p.kind not in fixed_width and p.kind in widths:
                w = max(1, round(widths[p.kind]))
        if r <= 0.0:
            continue
        phases.append(PhaseSpec(p.kind, n_in, n_out, r, w, p.repeatable))
    return WorkflowTemplate(name or f"{base.name}-fitted", tuple(phases))


class OutputWindow:
    """The model's output lengths: the last ``maxlen`` calls' output tokens per stage kind, over every database."""

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        self.maxlen = maxlen
        self._by_kind: dict[str, deque[float]] = {}
        self._shares: deque[float] = deque(maxlen=maxlen)

    @property
    def observed(self) -> bool:
        """At least ``MIN_QUESTIONS`` calls returned: the model's output lengths are known."""
        return len(self._shares) >= MIN_QUESTIONS

    def add(self, kind: str, output_tokens: int, budget: int) -> None:
        """One call of ``kind`` returned ``output_tokens`` tokens of its ``budget`` (``max_tokens``)."""
        window = self._by_kind.get(kind)
        if window is None:
            window = self._by_kind[kind] = deque(maxlen=self.maxlen)
        window.append(float(output_tokens))
        if budget > 0:
            self._shares.append(min(output_tokens / budget, 1.0))

    def expected(self, kind: str, budget: int) -> int | None:
        """A ``kind`` call's expected output tokens (see the class docstring), at most ``budget``."""
        window = self._by_kind.get(kind)
        if window is not None and len(window) >= MIN_QUESTIONS:
            return max(1, min(budget, round(robust_mean(window))))
        if not self.observed:
            return None
        return max(1, min(budget, round(budget * robust_mean(self._shares))))

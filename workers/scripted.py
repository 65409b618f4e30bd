"""Scripted answers for the emulated worker: a stand-in model that answers the Text-to-SQL pipeline's prompts.

    python -m workers.emulator --gpu A100 --answers answers.json ...

The answers file (``gateway.text2sql.answers``) maps question text to its gold SQL and, optionally,
deliberately wrong first attempts. The pipeline's prompts carry ``### Task: <kind>``, ``Question: <text>``
and ``Candidate: <k>`` lines; this responder reads them and answers like a model that:

* ``extract_keywords``: lists the scripted keywords (or the question's longer words) as a JSON list;
* ``schema_linking``: lists the tables the gold SQL reads, as ``table.*`` items;
* ``generate_candidate`` k: gives ``wrong[k]`` if the script has one, else the gold SQL, in a sql block;
* ``revise``: gives the gold SQL (a revision after an execution failure fixes the query);
* ``generate_unit_test``: two generic unit tests;
* ``evaluate``: "VERDICT: correct" iff the candidate SQL in the prompt equals the gold SQL (normalised).

A prompt it does not recognise (another task, an unknown question) gets the filler text of the plain
emulator, of the requested length. It is a test double: nothing here understands SQL.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.emulator import FillerResponder, GenRequest

if TYPE_CHECKING:
    from gateway.text2sql.answers import AnswerEntry

_TASK = re.compile(r"^\s*### Task:\s*(\S+)\s*$", re.MULTILINE)
_QUESTION = re.compile(r"^\s*Question:\s*(.+?)\s*$", re.MULTILINE)
_CANDIDATE = re.compile(r"^\s*Candidate:\s*(\d+)\s*$", re.MULTILINE)
_CANDIDATE_SQL = re.compile(r"Candidate SQL:\s*```sql\s*(.*?)```", re.DOTALL)
_TABLES = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def _normalise(sql: str) -> str:
    from gateway.text2sql.answers import normalise_sql

    return str(normalise_sql(sql))


class AnswersResponder(FillerResponder):
    """Answers the pipeline's prompts from an answers file (see the module doc)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers: dict[str, AnswerEntry] = {" ".join(q.split()): a for q, a in answers.items()}

    @classmethod
    def from_file(cls, path: Path | str) -> AnswersResponder:
        """Load an answers file (validated by ``gateway.text2sql.answers.load_answers``)."""
        from gateway.text2sql.answers import load_answers

        return cls(load_answers(Path(path)))

    @classmethod
    def demo(cls, seed: int = 0) -> AnswersResponder:
        """The demo questions' scripted answers (``hexflow answers --demo``), built in memory."""
        from gateway.text2sql.answers import build_demo_answers

        return cls(dict(build_demo_answers(seed=seed)))

    def answer(self, request: GenRequest) -> str | None:
        """The scripted answer, or None (filler) for prompts the script does not cover."""
        text = request.prompt_text
        task_m = _TASK.search(text)
        q_m = _QUESTION.search(text)
        if task_m is None or q_m is None:
            return None
        entry = self.answers.get(" ".join(q_m.group(1).split()))
        if not isinstance(entry, dict):
            return None
        task = task_m.group(1)
        gold = str(entry.get("gold", ""))
        if task == "extract_keywords":
            kws = entry.get("keywords") or [w.strip("?.,'\"") for w in q_m.group(1).split() if len(w) > 4]
            return json.dumps(list(kws)[:12])
        if task == "schema_linking":
            tables = list(dict.fromkeys(t.lower() for t in _TABLES.findall(gold)))
            return json.dumps([f"{t}.*" for t in tables])
        if task == "generate_candidate":
            from gateway.text2sql.answers import candidate_sql

            c_m = _CANDIDATE.search(text)
            sql = candidate_sql(entry, int(c_m.group(1)) if c_m else 0)
            return f"Here is the query.\n```sql\n{sql}\n```"
        if task == "revise":
            return f"The corrected query:\n```sql\n{gold}\n```"
        if task == "generate_unit_test":
            return "- The query returns the columns the question asks for.\n- The result is not empty."
        if task == "evaluate":
            s_m = _CANDIDATE_SQL.search(text)
            ok = s_m is not None and _normalise(s_m.group(1)) == _normalise(gold)
            return "The candidate was checked against the unit tests.\nVERDICT: " + ("correct" if ok else "incorrect")
        return None

    def text(self, request: GenRequest, n_tokens: int, rng: random.Random) -> str:
        """Filler of the requested length (for prompts ``answer`` does not cover)."""
        return super().text(request, n_tokens, rng)

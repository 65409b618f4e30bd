"""Structured answers out of free-form model output: SQL, evaluator verdicts, keyword lists. All three
extractors are pure and never raise on any ``str``."""

from __future__ import annotations

import itertools
import json
import re

import sqlglot
from sqlglot import exp

MAX_ITEMS = 100
"""At most this many items come out of ``extract_list``."""
MAX_ITEM_CHARS = 100
"""Each ``extract_list`` item is cut to this many characters."""
_MAX_SCAN_CHARS = 200_000

_SQL_LANGS = frozenset(
    {"sql", "sqlite", "sqlite3", "postgresql", "postgres", "psql", "pgsql", "plpgsql", "mysql", "tsql", "plsql"}
)
_PLAIN_LANGS = frozenset({"", "text", "txt", "plain", "plaintext", "sql92"})
_FENCE = re.compile(r"```([^\n`]*)\n?(.*?)(?:```|\Z)", re.DOTALL)
_START = re.compile(r"\b(select|with)\b", re.IGNORECASE)
_WITH_CTE = re.compile(
    r"with\s+(?:recursive\s+)?[\w\"`\[\]]+\s*(?:\([^()]*\))?\s+as\s*(?:not\s+)?(?:materialized\s*)?\(", re.IGNORECASE
)
_LINE_PREFIX = re.compile(
    r"^[\s>*_#-]*(?:(?:sql|query|answer|final answer|final query|result)\s*:\s*)?$", re.IGNORECASE
)
_FROM = re.compile(r"\bfrom\b", re.IGNORECASE)
_SQL_WORDS = frozenset({
    "select", "from", "where", "and", "or", "not", "group", "order", "by", "having", "limit", "offset", "join",
    "inner", "left", "right", "full", "outer", "cross", "natural", "on", "using", "union", "intersect", "except",
    "all", "distinct", "as", "case", "when", "then", "else", "end", "in", "exists", "between", "like", "glob", "is",
    "null", "asc", "desc", "with", "recursive", "over", "partition", "window", "values", "collate", "escape", "cast",
    "filter", "nulls", "first", "last", "fetch", "rows", "only",
})  # fmt: skip
_PROSE_START = re.compile(
    r"^(?:this|these|the|here|it|note|explanation|i|we|that|which|above|output|result|results|assuming|"
    r"alternatively|answer|reasoning|step|final|let|now|so|because|since|if|to)\b",
    re.IGNORECASE,
)


def _strip_sql(sql: str) -> str:
    s = sql.strip()
    while True:
        before = s
        s = s.strip().strip("`").strip()
        s = s.rstrip(";").rstrip()
        if s.endswith(".") and not re.search(r"\d\.$", s):
            s = s[:-1].rstrip()
        for q in ('"', "'"):
            if s.endswith(q) and s.count(q) % 2 == 1:
                s = s[:-1].rstrip()
            if s.startswith(q) and s.count(q) % 2 == 1:
                s = s[1:].lstrip()
        if s == before:
            return s


def _is_prose(line: str) -> bool:
    """Whether a line that follows SQL ends the statement: blank, a fence, or prose."""
    stripped = line.strip()
    if not stripped or stripped.startswith("```"):
        return True
    first = re.match(r"[A-Za-z_]+", stripped)
    if first is not None and first.group(0).lower() in _SQL_WORDS:
        return False
    if line[:1] in " \t":  # SQL continuation lines are often indented, prose rarely
        return False
    bullet = re.match(r"^(?:[-*•]|\d{1,3}[.)])\s+([A-Za-z]+)\s+[a-z]", stripped)
    if bullet is not None and bullet.group(1).lower() not in _SQL_WORDS:
        return True
    if re.match(r"^[A-Z][A-Za-z ]{0,30}:(\s|$)", stripped):  # "Explanation:", "Note:"
        return True
    if _PROSE_START.match(stripped) and re.match(r"^\S+\s+[a-z]", stripped):  # "This query ...", "The result"
        return True
    return bool(re.match(r"^[A-Z][a-z]*(\s+[a-z][a-z']*,?){3,}", stripped))  # a sentence


def _scan_statement(text: str, start: int, inline: bool) -> tuple[str, int]:
    """The statement starting at ``start`` and the index just past it."""
    i, n = start, len(text)
    quote: str | None = None
    while i < n:
        ch = text[i]
        if quote is not None:
            if ch == quote:
                if i + 1 < n and text[i + 1] == quote:  # doubled quote inside a literal
                    i += 2
                    continue
                quote = None
            elif ch == "\n" and quote == "`":
                quote = None
            i += 1
            continue
        if ch == ";":
            return text[start:i], i + 1
        if ch == "`":
            if inline or text.startswith("```", i):
                return text[start:i], i
            quote = "`"
        elif ch in "'\"":
            quote = ch
        elif ch == "\n":
            end_of_line = text.find("\n", i + 1)
            next_line = text[i + 1 : n if end_of_line < 0 else end_of_line]
            if _is_prose(next_line):
                return text[start:i], i + 1
        i += 1
    return text[start:], n


def _statements(sql: str) -> int:
    """How many non-empty statements ``sql`` holds (0 when it does not parse)."""
    try:
        return sum(1 for e in sqlglot.parse(sql) if e is not None)
    except Exception:
        return 0


def parse_sqlite(sql: str) -> exp.Expr | None:
    """``sql`` parsed as SQLite by sqlglot; None when it does not parse."""
    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except Exception:
        return None


def _parses(sql: str) -> bool:
    return isinstance(parse_sqlite(sql), exp.Query)


def _candidates(text: str) -> list[tuple[int, int, str]]:
    """``(strength, position, sql)`` for each statement found in ``text`` (strength 2: parses, 1: has FROM)."""
    found: list[tuple[int, int, str]] = []
    pos = 0
    while pos < len(text):
        m = _START.search(text, pos)
        if m is None:
            break
        begin, word = m.start(), m.group(1)
        before = text[text.rfind("\n", 0, begin) + 1 : begin]
        inline = begin > 0 and text[begin - 1] == "`" and not text.startswith("```", max(begin - 3, 0))
        at_start = bool(_LINE_PREFIX.match(before)) or before.rstrip().endswith(":") or inline
        is_with = word.lower() == "with"
        if not ((at_start and _WITH_CTE.match(text, begin)) if is_with else (at_start or word == "SELECT")):
            pos = m.end()
            continue
        raw, end = _scan_statement(text, begin, inline)
        sql = _strip_sql(raw)
        if sql:
            strength = 2 if _parses(sql) else (1 if _FROM.search(sql) else 0)
            if strength:
                found.append((strength, begin, sql))
        pos = max(end, m.end())
    return found


def _best(found: list[tuple[int, int, str]]) -> str | None:
    return max(found)[2] if found else None  # the strongest, then the last (positions differ)


def extract_sql(text: str) -> str | None:
    """The SQL query in a model's answer: the last ``sql``-tagged (or parseable untagged) fenced block, else the
    last statement starting ``SELECT``/``WITH name AS (`` (parseable ones first), trimmed; None when none."""
    try:
        return _extract_sql(text[:_MAX_SCAN_CHARS])
    except Exception:  # pragma: no cover - defensive: extraction must never fail a pipeline
        return None


def _extract_sql(text: str) -> str | None:
    blocks: list[str] = []
    rest: list[str] = []
    last = 0
    for m in _FENCE.finditer(text):
        rest.append(text[last : m.start()])
        last = m.end()
        info, body = m.group(1).strip(), m.group(2)
        if _START.match(info):  # ```SELECT ...``` on one line
            lang, body = "", info + "\n" + body
        else:
            lang = info.split()[0].lower() if info else ""
        if lang in _SQL_LANGS:
            whole = _strip_sql(body)
            if _statements(whole) > 1:
                # A SQL block with several statements is kept whole, not cut to its first statement, so the
                # safety check refuses it and the model is asked to revise (a smuggled write never slips by).
                blocks.append(whole)
                continue
            sql = _best(_candidates(body)) or (whole if whole and _parses(whole) else None)
            if sql is not None:
                blocks.append(sql)
        elif lang in _PLAIN_LANGS:
            sql = _best([c for c in _candidates(body) if c[0] == 2])
            if sql is not None:
                blocks.append(sql)
            else:  # not parseable: its text still takes part in the plain scan below
                rest.append(body)
    if blocks:
        return blocks[-1]
    rest.append(text[last:])
    return _best(_candidates("\n\n".join(rest)))


_POSITIVE = frozenset({"correct", "yes", "pass", "passed", "passes", "true", "valid", "right", "accept", "accepted"})
_NEGATIVE = frozenset({"incorrect", "no", "fail", "failed", "fails", "false", "invalid", "wrong", "reject", "rejected"})
_WORDS = "|".join(sorted(_POSITIVE | _NEGATIVE, key=len, reverse=True))
_LABELLED = re.compile(
    rf"\b(?:verdict|answer|result|judg(?:e)?ment|decision|evaluation|conclusion)\b[\s*_`\"']*[:=\-]?[\s*_`\"']*"
    rf"(not\s+)?({_WORDS})\b",
    re.IGNORECASE,
)
_ALONE = re.compile(rf"^[\s*_`\"'>#-]*(not\s+)?({_WORDS})[\s*_`\"'.!]*$", re.IGNORECASE | re.MULTILINE)
_ANY = re.compile(rf"\b(not\s+)?({_WORDS})\b", re.IGNORECASE)


def extract_verdict(text: str) -> bool | None:
    """An evaluator's verdict, True (correct) or False, from a labelled verdict, else a verdict-only line, else
    any verdict word (the last in the best tier; ``not correct`` is incorrect); None when none."""
    try:
        text = text[-_MAX_SCAN_CHARS:]
        for pattern in (_LABELLED, _ALONE, _ANY):
            matches = list(pattern.finditer(text))
            if matches:
                return (matches[-1].group(2).lower() in _POSITIVE) != bool(matches[-1].group(1))
    except Exception:  # pragma: no cover - defensive
        return None
    return None


_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)]|\(\d{1,3}\))\s+")
_LABEL = re.compile(r"^\s*[A-Za-z][A-Za-z _-]{0,40}:\s*")
_MAX_JSON_TRIES = 50


def _json_items(text: str) -> list[str] | None:
    decoder = json.JSONDecoder()
    for m in itertools.islice(re.finditer(r"[\[{]", text), _MAX_JSON_TRIES):
        try:
            value, _end = decoder.raw_decode(text, m.start())
        except Exception:
            continue
        if isinstance(value, dict):
            lists = [v for v in value.values() if isinstance(v, list)]
            if not lists:
                continue
            value = [item for lst in lists for item in lst]
        if isinstance(value, list):
            return [_scalar(v) for v in _flatten(value) if _scalar(v)]
    return None


def _flatten(values: list[object], depth: int = 0) -> list[object]:
    out: list[object] = []
    for v in values:
        if isinstance(v, list) and depth < 3:
            out.extend(_flatten(v, depth + 1))
        else:
            out.append(v)
    return out


def _scalar(value: object) -> str:
    if value is None or isinstance(value, dict | list):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def _split_items(text: str) -> list[str]:
    items: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            continue
        line = _BULLET.sub("", line)
        label = _LABEL.match(line)
        if label is not None:
            line = line[label.end() :]
        for part in line.split(","):
            item = part.strip().strip("`'\"[]").strip()
            item = _BULLET.sub("", item).strip()
            if item:
                items.append(item)
    return items


def extract_list(text: str) -> list[str]:
    """The items of a list answer: the first JSON list (or an object's list values), else comma/newline items
    without bullets, labels and quotes; deduplicated in order, at most ``MAX_ITEMS`` of ``MAX_ITEM_CHARS``."""
    try:
        text = text[:_MAX_SCAN_CHARS]
        items = _json_items(text)
        if items is None:
            items = _split_items(text)
    except Exception:  # pragma: no cover - defensive
        return []
    return list(dict.fromkeys(item[:MAX_ITEM_CHARS] for item in items if item))[:MAX_ITEMS]

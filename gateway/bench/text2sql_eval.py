"""Execution accuracy of a running gateway on a Spider-format dataset, through ``POST /v1/text2sql``
(``hexflow eval``; the end-to-end recipe on emulated workers is in README.md).

A Spider-format dataset is a folder with ``dev.json`` (``{db_id, question, query}``; BIRD's ``SQL``,
``evidence`` and ``difficulty`` too) and ``database/<db_id>/<db_id>.sqlite`` (or BIRD's
``dev_databases/...``); questions without their database file are skipped and counted. An answer is right
when its status is ``ok`` and its rows match the gold query's, executed here (``results_match`` with
``gold_is_ordered``); a result cut at a cap shorter than the gold's is wrong."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.bench.stats import finite_or_none, percentile, save_json, table
from gateway.errors import GatewayError
from gateway.text2sql.evaluate import ExecutionAccuracy, Tally, execute_sqlite, matches_gold

DATABASE_FOLDERS: tuple[str, ...] = ("database", "dev_databases")
"""Where a dataset keeps ``<db_id>/<db_id>.sqlite`` (Spider, BIRD); the first that exists is used."""
_DB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class EvalError(GatewayError):
    """The evaluation cannot run: an unreadable dataset, or a gateway that is unreachable or refuses the key."""


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One question of a dataset: its database, text, gold SQL and (BIRD) evidence and difficulty."""

    db_id: str
    question: str
    gold: str
    db_path: Path
    evidence: str | None = None
    difficulty: str | None = None


class EvalItems(list[EvalItem]):
    """The runnable questions of a dataset; ``skipped`` counts, per db_id, those whose database is missing."""

    def __init__(self, items: Sequence[EvalItem] = (), skipped: Mapping[str, int] | None = None) -> None:
        super().__init__(items)
        self.skipped: dict[str, int] = dict(skipped or {})


def _database_root(dataset_dir: Path) -> Path:
    for name in DATABASE_FOLDERS:
        if (dataset_dir / name).is_dir():
            return dataset_dir / name
    return dataset_dir / DATABASE_FOLDERS[0]


def database_files(dataset_dir: Path | str) -> dict[str, Path]:
    """db_id -> SQLite file, for every ``<root>/<db_id>/<db_id>.sqlite`` of the dataset (sorted by db_id)."""
    root = _database_root(Path(dataset_dir))
    if not root.is_dir():
        return {}
    out = {}
    for folder in sorted(root.iterdir()):
        f = folder / f"{folder.name}.sqlite"
        if folder.is_dir() and f.is_file():
            out[folder.name] = f.resolve()
    return out


def spider_items(dataset_dir: Path | str, limit: int | None = None) -> EvalItems:
    """The questions of ``<dataset_dir>/dev.json`` whose database file exists; ``limit`` takes the first
    entries before skipping (as ``answers_from_spider``). ``EvalError`` for a missing or malformed file."""
    path = Path(dataset_dir) / "dev.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalError(f"{path}: cannot read the dataset: {exc}") from None
    if not isinstance(data, list):
        raise EvalError(f"{path}: expected a JSON list of questions")
    if limit is not None:
        data = data[: max(limit, 0)]
    files = database_files(dataset_dir)
    items: list[EvalItem] = []
    skipped: Counter[str] = Counter()
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise EvalError(f"{path}: [{i}]: expected an object")
        gold = raw.get("query", raw.get("SQL"))
        db_id, question = raw.get("db_id"), raw.get("question")
        if not isinstance(db_id, str) or not isinstance(question, str) or not isinstance(gold, str) or not gold:
            raise EvalError(f"{path}: [{i}]: expected string fields 'db_id', 'question' and 'query' (or 'SQL')")
        if db_id not in files:
            skipped[db_id] += 1
            continue
        evidence, difficulty = raw.get("evidence"), raw.get("difficulty")
        evidence = evidence if isinstance(evidence, str) and evidence.strip() else None
        difficulty = str(difficulty) if difficulty is not None else None
        items.append(EvalItem(db_id, question, gold, files[db_id], evidence, difficulty))
    return EvalItems(items, dict(sorted(skipped.items())))


def write_databases_file(
    dataset_dir: Path | str,
    out_path: Path | str,
    *,
    statement_timeout_s: float = 5.0,
    max_rows: int | None = None,
) -> Path:
    """Write a databases file naming every database of the dataset by absolute URL; returns its path.
    ``max_rows`` overrides the row cap. ``EvalError`` when the dataset has no database."""
    files = {k: v for k, v in database_files(dataset_dir).items() if _DB_ID.match(k)}
    if not files:
        where = " or ".join(f"{Path(dataset_dir) / d}/<db_id>/<db_id>.sqlite" for d in DATABASE_FOLDERS)
        raise EvalError(f"no database found: expected {where}")
    name = Path(dataset_dir).resolve().name
    cap = {} if max_rows is None else {"max_rows": max_rows}
    entries = {
        db_id: {
            "url": f"sqlite:///{f.as_posix()}",
            "description": f"{name}: {db_id}",
            "statement_timeout_s": statement_timeout_s,
        }
        | cap
        for db_id, f in files.items()
    }
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump({"databases": entries}, sort_keys=True), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------- report


@dataclass
class ItemRecord:
    """One question's outcome: ``status`` the pipeline's (``ok``, ``no_valid_sql``, ...) or ``http_<code>`` /
    ``client_error``, ``http_status`` 0 when no HTTP response came back, ``latency_s`` the client's wall time."""

    question: str
    db_id: str
    status: str
    http_status: int
    correct: bool
    sql: str | None
    gold: str
    latency_s: float
    gateway_latency_s: float | None = None
    local_s: float | None = None
    revisions: int = 0
    deadline_met: bool = False
    row_count: int = 0
    truncated: bool = False
    difficulty: str | None = None
    error: str | None = None


@dataclass
class EvalReport:
    """Execution accuracy and latency of one evaluation run (see ``as_dict`` for the JSON view)."""

    gateway: str
    items: list[ItemRecord] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    concurrency: int = 0
    deadline_s: float | None = None
    wall_s: float = 0.0

    @property
    def n(self) -> int:
        """Questions asked."""
        return len(self.items)

    @property
    def correct(self) -> int:
        """Questions answered with the gold result."""
        return sum(r.correct for r in self.items)

    @property
    def accuracy(self) -> float:
        """Execution accuracy (0.0 when nothing was asked)."""
        return self.correct / self.n if self.items else 0.0

    def execution_accuracy(self) -> ExecutionAccuracy:
        """Overall and per-difficulty tallies (``errors``: answers whose status was not ``ok``)."""
        acc = ExecutionAccuracy()
        for r in self.items:
            acc.add(r.correct, r.difficulty, error=r.status != "ok")
        return acc

    def by_db(self) -> dict[str, dict[str, Any]]:
        """db_id -> count, correct, accuracy (sorted by db_id)."""
        tallies: dict[str, Tally] = {}
        for r in sorted(self.items, key=lambda r: r.db_id):
            tallies.setdefault(r.db_id, Tally()).add(r.correct)
        return {db_id: t.as_dict() for db_id, t in tallies.items()}

    def statuses(self) -> dict[str, int]:
        """Status -> questions (most common first)."""
        return dict(Counter(r.status for r in self.items).most_common())

    def http_statuses(self) -> dict[str, int]:
        """HTTP status code (as text; ``"0"``: no response) -> questions."""
        return {str(k): v for k, v in sorted(Counter(r.http_status for r in self.items).items())}

    def summary(self) -> dict[str, float | None]:
        """Latency percentiles (client, gateway, non-LLM ``local_s``), deadline-met fraction, mean revisions."""
        lat = {
            "latency": sorted(r.latency_s for r in self.items),
            "gateway_latency": sorted(r.gateway_latency_s for r in self.items if r.gateway_latency_s is not None),
            "local": sorted(r.local_s for r in self.items if r.local_s is not None),
        }
        n = self.n
        return {
            **{f"{k}_p{q}_s": finite_or_none(percentile(v, q)) for k, v in lat.items() for q in (50, 95)},
            "deadline_met": sum(r.deadline_met for r in self.items) / n if n else None,
            "revisions_mean": sum(r.revisions for r in self.items) / n if n else None,
            "truncated": sum(r.truncated for r in self.items),
        }

    def as_dict(self) -> dict[str, Any]:
        """The JSON view: counts, accuracy (overall, by difficulty, by db_id), statuses, latency, items."""
        acc = self.execution_accuracy().as_dict()
        return {
            "gateway": self.gateway,
            "n": self.n,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "by_difficulty": acc["by_difficulty"],
            "by_db": self.by_db(),
            "statuses": self.statuses(),
            "http_statuses": self.http_statuses(),
            **self.summary(),
            "skipped": self.skipped,
            "concurrency": self.concurrency,
            "deadline_s": self.deadline_s,
            "wall_s": self.wall_s,
            "items": [asdict(r) for r in self.items],
        }

    def write_json(self, path: Path | str) -> Path:
        """Write ``as_dict()`` as JSON (strict: no NaN); returns the path."""
        return save_json(path, self.as_dict(), ensure_ascii=False)


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_report(report: EvalReport) -> str:
    """A short text summary: accuracy, statuses, latency, then accuracy per difficulty and per db_id."""
    s = report.summary()
    skipped = sum(report.skipped.values())
    lines = [
        f"{report.n} questions via {report.gateway}"
        + (f" ({skipped} skipped: no database file for {', '.join(report.skipped)})" if skipped else ""),
        f"execution accuracy {report.accuracy:.2%} ({report.correct}/{report.n})",
        "statuses: " + ", ".join(f"{k} {v}" for k, v in report.statuses().items()),
        f"latency p50/p95: client {_f(s['latency_p50_s'], '.3f')}/{_f(s['latency_p95_s'], '.3f')} s, "
        f"gateway {_f(s['gateway_latency_p50_s'], '.3f')}/{_f(s['gateway_latency_p95_s'], '.3f')} s, "
        f"non-LLM (local_s) {_f(s['local_p50_s'], '.4f')}/{_f(s['local_p95_s'], '.4f')} s",
        f"deadline met {_f(s['deadline_met'], '.1%')}, revisions per question {_f(s['revisions_mean'], '.2f')}, "
        f"wall {report.wall_s:.1f} s",
    ]
    acc = report.execution_accuracy()
    groups: list[tuple[str, Mapping[str, Mapping[str, float]]]] = []
    if acc.by_difficulty:
        groups.append(("difficulty", {k: v.as_dict() for k, v in sorted(acc.by_difficulty.items())}))
    groups.append(("db_id", report.by_db()))
    for title, rows in groups:
        cells = [[k, str(int(v["count"])), str(int(v["correct"])), f"{v['accuracy']:.1%}"] for k, v in rows.items()]
        lines.append("")
        lines.append(table([title, "n", "correct", "accuracy"], cells, left=1, rule=False))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ running


def question_body(question: str, db_id: str, evidence: str | None, deadline_s: float | None) -> dict[str, Any]:
    """The ``POST /v1/text2sql`` body of a question (its evidence and deadline, wall seconds, when given)."""
    body: dict[str, Any] = {"question": question, "db_id": db_id}
    if evidence:
        body["evidence"] = evidence
    if deadline_s is not None:
        body["deadline_s"] = deadline_s
    return body


async def post_question(
    client: httpx.AsyncClient, body: dict[str, Any], key: str | None = None
) -> tuple[httpx.Response | None, dict[str, Any]]:
    """POST a question to the client's gateway (as ``key`` when given); the response and its JSON body (``{}``
    when not a JSON object). A request that got no answer is no response (None) and an ``error`` naming why, so
    one lost connection never ends a run."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    try:
        r = await client.post("/v1/text2sql", json=body, headers=headers)
    except httpx.HTTPError as exc:
        return None, {"error": f"{type(exc).__name__}: {exc}"}
    try:
        data = r.json()
    except ValueError:
        data = {}
    return r, data if isinstance(data, dict) else {}


async def _check_gateway(client: httpx.AsyncClient) -> None:
    from gateway.bench.replay import ReplayError, check_gateway

    try:
        await check_gateway(client)
    except ReplayError as exc:
        raise EvalError(str(exc)) from None


def gold_rows(item: EvalItem) -> tuple[list[tuple[object, ...]] | None, str | None]:
    """The gold query's rows, or None and why it failed here."""
    try:
        return execute_sqlite(item.db_path, item.gold), None
    except Exception as exc:  # sqlite3.Error, or a file that went away
        return None, f"the gold query failed here: {type(exc).__name__}: {exc}"


def _error_text(data: Mapping[str, Any]) -> str | None:
    err = data.get("error")
    if isinstance(err, Mapping):
        return str(err.get("message", err))
    return None if err is None else str(err)


async def _ask(client: httpx.AsyncClient, item: EvalItem, deadline_s: float | None) -> ItemRecord:
    t = time.monotonic()
    r, data = await post_question(client, question_body(item.question, item.db_id, item.evidence, deadline_s))
    elapsed = time.monotonic() - t
    code = 0 if r is None else r.status_code
    status = data.get("status")
    if not isinstance(status, str):
        status = "client_error" if r is None else f"http_{code}"
    sql = data.get("sql") if isinstance(data.get("sql"), str) else None
    rec = ItemRecord(
        *(item.question, item.db_id, status, code, False, sql, item.gold, elapsed),
        gateway_latency_s=_float(data.get("latency_s")),
        local_s=_float(data.get("local_s")),
        revisions=int(data.get("revisions") or 0),
        deadline_met=bool(data.get("deadline_met")),
        row_count=int(data.get("row_count") or 0),
        truncated=bool(data.get("truncated")),
        difficulty=item.difficulty,
        error=_error_text(data),
    )
    if status == "ok" and code == 200:
        gold, problem = await asyncio.to_thread(gold_rows, item)
        rows = data.get("rows")
        if gold is None:
            rec.error = problem
        elif isinstance(rows, list):
            rec.correct = matches_gold(item.gold, gold, rows)
    return rec


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


async def evaluate(
    items: Sequence[EvalItem],
    *,
    gateway: str,
    api_key: str,
    concurrency: int = 8,
    deadline_s: float | None = None,
    timeout_s: float = 600,
    progress: bool = True,
) -> EvalReport:
    """Ask every item through ``POST /v1/text2sql`` (``concurrency`` at a time) and judge the answers, in the
    order given. ``EvalError`` when the gateway is not ready or refuses ``api_key``."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    base = gateway.rstrip("/")
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    report = EvalReport(
        gateway=base,
        skipped=dict(items.skipped) if isinstance(items, EvalItems) else {},
        concurrency=concurrency,
        deadline_s=deadline_s,
    )
    t0 = time.monotonic()
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s, limits=limits
    ) as client:
        await _check_gateway(client)
        from tqdm import tqdm

        sem = asyncio.Semaphore(concurrency)
        records: list[ItemRecord | None] = [None] * len(items)
        tally = Counter[bool]()
        with tqdm(total=len(items), desc="eval", unit="q", disable=not progress, leave=False) as bar:

            async def one(i: int, item: EvalItem) -> None:
                async with sem:
                    rec = records[i] = await _ask(client, item, deadline_s)
                tally[rec.correct] += 1
                bar.set_postfix(acc=f"{tally[True] / tally.total():.3f}", refresh=False)
                bar.update(1)

            await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    report.items = [r for r in records if r is not None]
    report.wall_s = time.monotonic() - t0
    return report

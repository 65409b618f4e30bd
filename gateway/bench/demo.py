"""``hexflow demo``: demo questions from two tenants (tight and loose deadlines) through ``POST /v1/text2sql`` on a
live rig answering from the demo script, each answer checked against the gold result, an SLO summary per tenant.
A question refused for its deadline is resent to a ``<name>-unchecked`` twin tenant without admission: a false
refusal when that met the deadline (``hexflow bench refusals``). Deadlines are wall seconds."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.bench.rig import LiveSettings, scheduled
from gateway.bench.stats import percentile, table
from gateway.bench.text2sql_eval import post_question, question_body
from gateway.config import CONFIG_DIR
from gateway.config.tenants import hash_key
from gateway.text2sql.answers import build_demo_answers, write_answers
from gateway.text2sql.demo import demo_questions, write_demo_databases
from gateway.text2sql.evaluate import execute_sqlite, matches_gold

DB_ID = "demo_retail"
TENANTS = (("interactive", "demo-interactive-key", 6.0), ("batch", "demo-batch-key", 30.0))
DEMO_RIG = LiveSettings("paper-4gpu", time_scale=0.25)
"""The demo's cluster, emulated at a quarter of real time."""
DEFAULT_RATE = 20.0
"""Questions a second the demo sends (alternating tenants)."""
ROWS_KEPT = 10
"""Rows of each answer kept in the report (``out/demo.json``); ``row_count`` has the full count."""
ROWS_SHOWN = 3
"""Rows of each answer printed under it, each cell cut to ``CELL_CHARS``."""
CELL_CHARS = 24
LEGEND = {
    "mark": "printed before each answer: 'ok' its rows match the gold SQL's result, '!!' valid SQL whose rows "
    "differ from the gold result, '--' no answer (the status says why)",
    "questions": "questions the tenant asked",
    "ok": "answers with status ok: a candidate SQL executed and was chosen (before or after the deadline)",
    "correct": "ok answers whose rows match the gold SQL's result (what the demo checks)",
    "deadline_met": "share of the tenant's questions answered ok within their deadline ('met' in the table); a "
    "refused question counts as not met",
    "refused": "questions admission refused for their deadline (429: predicted to miss; 422: no wait can meet it)",
    "false_refusals": "refused questions that, sent again at once without admission, met their deadline "
    "('false_ref' in the table; the false-refusal rate is false_refusals / refused)",
    "p50_s, p95_s": "latency percentiles in wall seconds of the emulation",
    "rows": f"the first {ROWS_KEPT} rows of each answer (row_count: all of them)",
}
"""What the columns of the summary and the fields of each answer mean (printed, and in the JSON report)."""


@dataclass
class DemoAnswer:
    """One question's outcome: ``rows`` its first ``ROWS_KEPT``; ``refused`` by admission (429, or 422 for a
    deadline no wait can meet), then ``unchecked_met``: whether it met its deadline sent again at once without
    admission."""

    tenant: str
    question: str
    status: str
    http_status: int
    sql: str | None
    row_count: int
    revisions: int
    latency_s: float
    deadline_s: float
    deadline_met: bool
    correct: bool
    error: str | None = None
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    refused: bool = False
    unchecked_met: bool | None = None


@dataclass
class DemoReport:
    """The demo's answers and its per-tenant summary."""

    questions: int
    time_scale: float
    cluster: str
    answers: list[DemoAnswer] = field(default_factory=list)
    summary: dict[str, dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON view, with the legend of its fields."""
        return {**asdict(self), "legend": dict(LEGEND)}


def write_demo_files(folder: Path, seed: int) -> Path:
    """The demo database (``databases.yaml`` naming ``<DB_ID>.sqlite``) and the emulated model's scripted answers
    in ``folder``; returns the answers file (the emulator's ``--answers``)."""
    write_demo_databases(folder / "databases.yaml", seed)
    answers = folder / "answers.json"
    write_answers(answers, build_demo_answers(seed=seed))
    return answers


def unchecked_key(tenant: str) -> str:
    """The demo's key of ``tenant``'s twin without admission (``<tenant>-unchecked``), for refused questions."""
    return f"demo-{tenant}-unchecked-key"


def write_demo_tenants(path: Path) -> None:
    """The packaged tenants file plus, for each tenant, a twin ``<name>-unchecked`` without predictive admission
    (key ``unchecked_key(name)``): refused questions are sent again through it to check the refusal."""
    doc = yaml.safe_load((CONFIG_DIR / "tenants.yaml").read_text())
    doc["tenants"] += [
        {**t, "name": f"{t['name']}-unchecked", "predictive_admission": False}
        | {"api_key_sha256": [hash_key(unchecked_key(t["name"]))]}
        for t in doc["tenants"]
    ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _refused(r: httpx.Response | None, data: dict[str, Any]) -> bool:
    """Admission refused the question for its deadline (the body's ``reason``): a 429 (predicted to miss), or a
    422 (no wait can meet it). Refusals at a configured bound (queue, concurrency) are not predictions."""
    return r is not None and r.status_code in (422, 429) and data.get("reason") == "deadline"


async def _ask(client: httpx.AsyncClient, key: str, tenant: str, q: Any, deadline_s: float, db: Path) -> DemoAnswer:
    body = question_body(q.question, DB_ID, q.evidence, deadline_s)
    t = time.monotonic()
    r, data = await post_question(client, body, key)
    elapsed = time.monotonic() - t
    refused = _refused(r, data)
    unchecked_met = None
    if refused:  # was the refusal right? the same question at once, without admission
        _, again = await post_question(client, body, unchecked_key(tenant))
        unchecked_met = again.get("status") == "ok" and bool(again.get("deadline_met"))
    code = 0 if r is None else r.status_code  # (0: no response, the connection failed)
    error = data.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    status = str(data.get("status") or kind or ("connection_error" if r is None else f"http {code}"))
    rows = data.get("rows") or []
    correct = status == "ok" and matches_gold(q.query, execute_sqlite(db, q.query), rows)
    counts = (int(data.get("row_count") or 0), int(data.get("revisions") or 0), float(data.get("latency_s") or elapsed))
    return DemoAnswer(
        *(tenant, q.question, status, code, data.get("sql"), *counts, deadline_s, bool(data.get("deadline_met"))),
        correct=correct,
        error=error if isinstance(error, str) else (json.dumps(error) if error else None),
        columns=[str(c) for c in data.get("columns") or []],
        rows=[list(r) for r in rows[:ROWS_KEPT] if isinstance(r, list)],
        refused=refused,
        unchecked_met=unchecked_met,
    )


async def _send_all(
    url: str,
    questions: list[Any],
    db_path: Path,
    on_answer: Callable[[DemoAnswer], None],
    rate: float = DEFAULT_RATE,
    admission: bool = True,
) -> list[DemoAnswer]:
    """Ask the questions in a steady stream at ``rate`` a second, tenants alternating; ``on_answer`` sees each
    answer as it comes. ``admission`` off: every question through its tenant's twin without admission."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256, keepalive_expiry=4.0)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as client:

        async def one(i: int) -> DemoAnswer:
            tenant, key, deadline = TENANTS[i % len(TENANTS)]
            a = await _ask(client, key if admission else unchecked_key(tenant), tenant, questions[i], deadline, db_path)
            on_answer(a)
            return a

        return await scheduled([i / rate for i in range(len(questions))], one)


def summarize_answers(answers: list[DemoAnswer]) -> dict[str, dict[str, float]]:
    """Per tenant: questions, ok, correct, deadline met, latency P50/P95."""
    out: dict[str, dict[str, float]] = {}
    for tenant in sorted({a.tenant for a in answers}):
        mine = [a for a in answers if a.tenant == tenant]
        lat = sorted(a.latency_s for a in mine if not a.refused) or [0.0]
        refused = sum(a.refused for a in mine)
        false = sum(bool(a.unchecked_met) for a in mine if a.refused)
        out[tenant] = {
            "questions": len(mine),
            "ok": sum(a.status == "ok" for a in mine),
            "correct": sum(a.correct for a in mine),
            "deadline_met": sum(a.deadline_met for a in mine) / len(mine),
            "refused": refused,
            "false_refusals": false,
            "false_refusal_rate": false / refused if refused else 0.0,
            "p50_s": percentile(lat, 50),
            "p95_s": percentile(lat, 95),
            "deadline_s": mine[0].deadline_s,
        }
    return out


def format_summary(rep: DemoReport) -> str:
    """The SLO summary table."""
    rows = []
    for tenant, s in rep.summary.items():
        counts = [str(int(s[k])) for k in ("questions", "ok", "correct")]
        refusals = [str(int(s[k])) for k in ("refused", "false_refusals")]
        met, p50, p95 = f"{s['deadline_met']:.1%}", f"{s['p50_s']:.2f}", f"{s['p95_s']:.2f}"
        rows.append([tenant, f"{s['deadline_s']:.1f}s", *counts, met, *refusals, p50, p95])
    heads = ["tenant", "deadline", "questions", "ok", "correct", "met", "refused", "false_ref", "p50_s", "p95_s"]
    return table(heads, rows, left=1, rule=False)


def format_legend() -> str:
    """The legend printed under the summary."""
    return "\n".join(["legend:", *(f"  {k}: {v}" for k, v in LEGEND.items())])


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 3] + "..."


def format_answer(a: DemoAnswer) -> str:
    """One answer: its mark, tenant, latency against the deadline, status, question and SQL, then its first
    ``ROWS_SHOWN`` rows (cells cut to ``CELL_CHARS``)."""
    mark = "ok " if a.correct else ("-- " if a.status != "ok" else "!! ")
    sql = (a.sql or a.error or "").replace("\n", " ")[:90]
    lines = [
        f"{mark}[{a.tenant:<11}] {a.latency_s:5.2f}s/{a.deadline_s:4.0f}s rev={a.revisions} "
        f"{a.status:<12} {a.question[:60]!r} -> {sql}"
    ]
    if a.refused:
        verdict = "met its deadline: a false refusal" if a.unchecked_met else "missed it too"
        lines.append(f"      refused; sent again without admission it {verdict}")
    if a.status == "ok":
        head = " | ".join(_cell(c) for c in a.columns)
        more = f" (first {ROWS_SHOWN} of {a.row_count})" if a.row_count > ROWS_SHOWN else ""
        lines.append(f"      {head}{more}" if head else f"      {a.row_count} rows")
        lines += [f"      {' | '.join(_cell(v) for v in row)}" for row in a.rows[:ROWS_SHOWN]]
    return "\n".join(lines)


def run_demo(
    questions: int = 24,
    live: LiveSettings = DEMO_RIG,
    *,
    quiet: bool = False,
    rate: float = DEFAULT_RATE,
    admission: bool = True,
    share: float | None = None,
) -> DemoReport:
    """Start the emulated cluster and the gateway of ``live``, ask the questions (``rate`` a second, alternating
    tenants), stop everything; return the report. ``admission`` off: every question goes through its tenant's twin
    without predictive admission (``hexflow bench refusals`` finds the cluster's capacity so). ``share``: the
    gateway's ``admission.sustainable_share`` (None: the default)."""
    all_q = demo_questions()
    if not questions >= 1:
        raise ValueError("--questions must be at least 1")
    if not rate > 0:
        raise ValueError("--rate must be positive")
    chosen = [all_q[i % len(all_q)] for i in range(questions)]
    say = (lambda _m: None) if quiet else print
    t0 = time.monotonic()
    with live.folder("hexflow-demo-") as folder:
        emulator_args = ["--answers", str(write_demo_files(folder, live.seed))]
        write_demo_tenants(folder / "tenants.yaml")
        say(
            f"demo: database {DB_ID}.sqlite, {len(chosen)} questions, "
            f"cluster {live.cluster} (emulated, time scale {live.time_scale:g})"
        )
        config = {"databases_file": "databases.yaml", "admission_share": share}
        with live.rig(folder, "demo", emulator_args=emulator_args, **config) as rig:
            say(f"demo: gateway {rig.url} in front of {len(rig.worker_urls)} workers; asking...")
            db = folder / f"{DB_ID}.sqlite"
            answers = asyncio.run(_send_all(rig.url, chosen, db, lambda a: say(format_answer(a)), rate, admission))
    summary = summarize_answers(answers)
    return DemoReport(len(chosen), live.time_scale, live.cluster, answers, summary, time.monotonic() - t0)


@dataclass
class RefusalPoint:
    """One load point of ``hexflow bench refusals``: per tenant, with and without admission, over the seeds."""

    rate: float
    seeds: list[int]
    with_admission: dict[str, dict[str, float]]
    without_admission: dict[str, dict[str, float]]


def _pooled(reports: list[DemoReport]) -> dict[str, dict[str, float]]:
    """Per tenant over the runs: questions, refused, false refusals and met (in time with an ok answer), and the
    shares over the tenant's questions."""
    out: dict[str, dict[str, float]] = {}
    for rep in reports:
        for a in rep.answers:
            t = out.setdefault(a.tenant, {"questions": 0, "refused": 0, "false_refusals": 0, "met": 0})
            t["questions"] += 1
            t["refused"] += a.refused
            t["false_refusals"] += bool(a.refused and a.unchecked_met)
            t["met"] += a.deadline_met
    for t in out.values():
        n = t["questions"] or 1
        t["refused_share"] = t["refused"] / n
        t["false_refusal_share"] = t["false_refusals"] / n
        t["false_of_refused"] = t["false_refusals"] / t["refused"] if t["refused"] else 0.0
        t["met_share"] = t["met"] / n
    return out


def run_refusal_bench(
    rates: list[float],
    live: LiveSettings = DEMO_RIG,
    *,
    questions: int = 300,
    seeds: list[int] | None = None,
    share: float | None = None,
    progress: Any = None,
) -> list[RefusalPoint]:
    """``hexflow bench refusals``: the demo at each rate (questions a second, tenants alternating), once with
    admission (each refused question sent again without it: a false refusal when that met its deadline) and once
    without (every question through the tenants' twins: what the cluster does unprotected), per seed (``live``'s
    seed replaced). ``share``: the gateway's ``admission.sustainable_share`` (None: the default)."""
    seeds = list(seeds or [0])
    demo = functools.partial(run_demo, questions, quiet=True, share=share)
    out: list[RefusalPoint] = []
    for rate in rates:
        runs: dict[bool, list[DemoReport]] = {True: [], False: []}
        for seed in seeds:
            for admission in (True, False):
                runs[admission].append(demo(replace(live, seed=seed), rate=rate, admission=admission))
                if progress is not None:
                    progress(rate, seed, admission)
        out.append(RefusalPoint(rate, seeds, _pooled(runs[True]), _pooled(runs[False])))
    return out


def format_refusal_bench(points: list[RefusalPoint]) -> str:
    """One row per rate and tenant: met without admission (is the rate below capacity?), then with admission:
    refused, false refusals (of the questions, and of the refused), met."""
    rows = []
    for p in points:
        for tenant, w in sorted(p.with_admission.items()):
            wo = p.without_admission.get(tenant, {})
            shares = [f"{w[k]:.1%}" for k in ("refused_share", "false_refusal_share")]
            false_of = f"{w['false_of_refused']:.0%}" if w["refused"] else "-"
            row = [f"{p.rate:g}", tenant, str(int(w["questions"])), f"{wo.get('met_share', 0.0):.1%}", *shares]
            rows.append([*row, false_of, f"{w['met_share']:.1%}"])
    head = ["rate/s", "tenant", "questions", "met w/o adm", "refused", "false", "false/refused", "met"]
    return table(head, rows, left=2, rule=False)

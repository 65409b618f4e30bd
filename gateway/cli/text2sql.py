"""The Text-to-SQL commands: ``demo``, ``eval``, ``databases``, ``answers`` and ``bench quality``. Numbers are
parsed by the commands, not argparse, so bad values stop with one line (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gateway.argtypes import positive_float, positive_floats, positive_int
from gateway.cli.common import (
    API_KEY,
    CLUSTER,
    GATEWAY,
    JSON,
    QUIET,
    SEED,
    TIME_SCALE,
    Command,
    UsageError,
    flag,
    gateway_key,
    int_arg,
    live_settings,
    number_arg,
    opt,
    pick,
    positive_float_arg,
    show,
    write_json,
    write_text,
)

__all__ = ["ANSWERS", "DATABASES", "DEMO", "EVAL", "QUALITY", "REFUSALS"]

QUALITY_OUT = "gateway/config/quality.yaml"
"""Where ``bench quality --out`` writes the packaged quality model (from the repository root)."""


def _wrong_fraction(text: str) -> float:
    return number_arg("--wrong-fraction", text, float, "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0)


def _seeds(text: str) -> list[int]:
    """``--seeds``: distinct seeds >= 0, comma-separated (``UsageError`` otherwise)."""
    seeds = [int_arg("--seeds", t.strip(), minimum=0) for t in str(text).split(",") if t.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds: expected distinct seeds, comma-separated, got {text!r}")
    return seeds


REFUSAL_RATES = "10,20,30,45,60"
"""``hexflow bench refusals``'s default load points (questions a second, both tenants together)."""


def cmd_bench_refusals(args: argparse.Namespace) -> int:
    """Measure false refusals per load on the demo cluster; print the table, write JSON with ``--json``."""
    import dataclasses
    import sys

    from gateway.bench.demo import format_refusal_bench, run_refusal_bench

    seeds = _seeds(args.seeds)
    rates = args.rates if args.rates is not None else positive_floats(REFUSAL_RATES)
    if args.share is not None and args.share > 1.0:
        raise UsageError(f"--share must be at most 1, got {args.share:g}")
    total = 2 * len(rates) * len(seeds)
    done = [0]

    def progress(rate: float, seed: int, admission: bool) -> None:
        done[0] += 1
        which = "with" if admission else "without"
        print(f"[{done[0]}/{total}] rate {rate:g}/s seed {seed} {which} admission", file=sys.stderr, flush=True)

    points = run_refusal_bench(
        rates, live_settings(args), seeds=seeds, **pick(args, "questions", "share"), progress=progress
    )
    return show(args, format_refusal_bench(points), lambda: {"points": [dataclasses.asdict(p) for p in points]})


def _dataset_dir(name: str, text: str | None, *, needs_dev_json: bool) -> Path:
    if not text:
        raise UsageError(f"{name}: give the dataset folder")
    path = Path(text)
    if not path.is_dir():
        raise UsageError(f"{name}: {text} is not a folder")
    if needs_dev_json and not (path / "dev.json").is_file():
        raise UsageError(f"{name}: {text} has no dev.json (expected a Spider-format dataset)")
    return path


def _spider_or_demo(args: argparse.Namespace, what: str, *, needs_dev_json: bool) -> Path | None:
    """The ``--spider`` dataset, or None for ``--demo``; a usage error unless exactly one of them is given."""
    if args.demo and args.spider is not None:
        raise UsageError("--demo and --spider exclude each other: give one of them")
    if not args.demo and args.spider is None:
        raise UsageError(f"give --spider DIR (a Spider-format dataset) or --demo ({what})")
    return None if args.demo else _dataset_dir("--spider", args.spider, needs_dev_json=needs_dev_json)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the Text-to-SQL demo end to end on emulated workers."""
    from gateway.bench.demo import DEFAULT_RATE, format_legend, format_summary, run_demo

    rate = args.rate if args.rate is not None else DEFAULT_RATE
    rep = run_demo(args.questions, live_settings(args), quiet=args.quiet, rate=rate)
    print()
    print(format_summary(rep))
    if not args.quiet:
        print(format_legend())
    total = len(rep.answers)
    correct = sum(a.correct for a in rep.answers)
    refused = sum(a.refused for a in rep.answers)
    false = sum(bool(a.unchecked_met) for a in rep.answers if a.refused)
    print(
        f"{correct}/{total} answers match the gold result; {refused} refused, {false} of them falsely "
        f"(met their deadline sent again without admission); {rep.wall_s:.0f} s wall"
    )
    if args.json:
        write_json(args.json, rep.as_dict(), say=False, end="", allow_nan=True, default=str)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Send a dataset's questions to a running gateway and report execution accuracy and latency."""
    import asyncio

    from gateway.bench.text2sql_eval import evaluate, format_report, spider_items

    dataset = _dataset_dir("--dataset", args.dataset, needs_dev_json=True)
    key = gateway_key(args)
    limit = None if args.limit is None else int_arg("--limit", args.limit, minimum=1)
    settings: dict[str, Any] = {  # evaluate's keywords
        "concurrency": int_arg("--concurrency", args.concurrency, minimum=1),
        "deadline_s": None if args.deadline_s is None else positive_float_arg("--deadline-s", args.deadline_s),
        "timeout_s": positive_float_arg("--timeout-s", args.timeout_s),
    }
    if not args.json:
        raise UsageError("--json: give the file to write the report to")
    items = spider_items(dataset, limit)
    if not items:
        raise UsageError(f"--dataset: no runnable question in {dataset} (no database file for any of them)")
    report = asyncio.run(evaluate(items, gateway=args.gateway, api_key=key, progress=not args.quiet, **settings))
    print(format_report(report))
    print(f"wrote {report.write_json(args.json)}")
    return 0


def cmd_databases(args: argparse.Namespace) -> int:
    """Write the databases file of a Spider-format dataset, or the demo database and its databases file;
    or, with ``--check``, check every database of a databases file."""
    import yaml

    if args.check is not None:
        if args.demo or args.spider is not None or args.out is not None:
            raise UsageError("--check FILE: checks an existing databases file; drop --demo, --spider and --out")
        return check_databases(args.check)

    from gateway.bench.text2sql_eval import write_databases_file
    from gateway.text2sql.demo import write_demo_databases

    dataset = _spider_or_demo(args, "the project's demo database", needs_dev_json=False)
    timeout = positive_float_arg("--statement-timeout-s", args.statement_timeout_s)
    if not args.out:
        raise UsageError("--out: give the databases file to write")
    max_rows = None if args.max_rows is None else int_arg("--max-rows", args.max_rows, minimum=1)
    if args.seed is not None and dataset is not None:
        raise UsageError("--seed: only with --demo (a Spider dataset's databases are files, not generated)")
    seed = 0 if args.seed is None else int_arg("--seed", args.seed, minimum=0)
    if dataset is None:
        try:
            out = write_demo_databases(args.out, seed, statement_timeout_s=timeout, max_rows=max_rows)
        except ValueError as exc:
            raise UsageError(f"--out: {exc}") from None
        print(f"wrote {out}: 1 database (demo_retail, {out.parent / 'demo_retail.sqlite'})")
        return 0
    out = write_databases_file(dataset, args.out, statement_timeout_s=timeout, max_rows=max_rows)
    n = len(yaml.safe_load(out.read_text(encoding="utf-8"))["databases"])
    print(f"wrote {out}: {n} databases")
    return 0


def check_databases(path: str) -> int:
    """``hexflow databases --check FILE``: one line per database, ok or unavailable and why; 1 if any is not."""
    import asyncio

    from gateway.text2sql.db import DatabaseRegistry

    registry = DatabaseRegistry.from_file(path)

    async def run() -> dict[str, str | None]:
        try:
            return await registry.check()
        finally:
            await registry.close()

    results = asyncio.run(run())
    width = max(len(db_id) for db_id in results)
    for db_id, problem in results.items():
        url = registry.config(db_id).safe_url
        print(
            f"{db_id:<{width}}  ok           {url}" if problem is None else f"{db_id:<{width}}  unavailable  {problem}"
        )
    bad = sum(problem is not None for problem in results.values())
    print(f"{len(results) - bad}/{len(results)} databases ok")
    return 1 if bad else 0


def cmd_answers(args: argparse.Namespace) -> int:
    """Write scripted answers (gold SQL, some wrong first candidates) of a Spider-format dataset or of the demo."""
    from gateway.text2sql.answers import answers_from_spider, build_demo_answers, write_answers

    dataset = _spider_or_demo(args, "the demo questions", needs_dev_json=True)
    fraction = _wrong_fraction(args.wrong_fraction)
    seed = int_arg("--seed", args.seed, minimum=0)
    if dataset is None and args.limit is not None:
        raise UsageError("--limit: only with --spider (--demo writes every demo question)")
    limit = None if args.limit is None else int_arg("--limit", args.limit, minimum=1)
    if not args.out:
        raise UsageError("--out: give the answers file to write")
    if dataset is None:
        answers = build_demo_answers(seed=seed, wrong_fraction=fraction)
    else:
        answers = answers_from_spider(dataset, wrong_fraction=fraction, seed=seed, limit=limit)
    out = write_answers(Path(args.out), answers)
    wrong = sum(1 for e in answers.values() if e.get("wrong"))
    print(f"wrote {out}: {len(answers)} questions, {wrong} with a wrong first candidate")
    return 0


def cmd_bench_quality(args: argparse.Namespace) -> int:
    """Measure accuracy per knob setting; print the table, write the quality file with ``--out``."""
    from gateway.bench.quality import format_report, run_quality

    seeds = _seeds(args.seeds)
    fraction = _wrong_fraction(args.wrong_fraction)
    max_k = int_arg("--max-candidates", args.max_candidates, minimum=1)
    if max_k > 8:
        raise UsageError(f"--max-candidates: at most 8 (the pipeline's limit), got {max_k}")
    spider = None if args.spider is None else _dataset_dir("--spider", args.spider, needs_dev_json=True)
    if args.spider_limit is not None and spider is None:
        raise UsageError("--spider-limit: only with --spider")
    limit = None if args.spider_limit is None else int_arg("--spider-limit", args.spider_limit, minimum=1)
    command = "hexflow bench quality" + (f" --spider {args.spider}" if spider is not None else "")
    command += f" --spider-limit {limit}" if limit is not None else ""
    command += f" --seeds {','.join(map(str, seeds))} --wrong-fraction {fraction:g} --max-candidates {max_k}"
    command += f" --out {args.out}" if args.out else ""
    report = run_quality(
        seeds=seeds,
        wrong_fraction=fraction,
        spider=spider,
        spider_limit=limit,
        max_candidates=max_k,
        command=command,
        progress=not args.quiet,
    )
    print(format_report(report))
    if args.out:
        write_text(args.out, report.to_yaml())
    return 0


EMULATION = (
    CLUSTER("cluster file or name to emulate"),
    TIME_SCALE("emulated GPUs run this much of real time", default=0.25),
)
WRONG_FRACTION = opt("--wrong-fraction", str, "0.25", "share of questions with a wrong first candidate")
DEMO = Command(
    "demo",
    cmd_demo,
    "the main job: emulated cluster + gateway, demo questions from two tenants through /v1/text2sql",
    "Write the demo database, start an emulated cluster and a gateway in front of it, send demo questions from two "
    "tenants with different deadlines through POST /v1/text2sql, print every answer and an SLO summary per tenant, "
    "check each answer against the gold result, and stop what it started.",
    (
        opt("--questions", positive_int, 24, "questions to ask (cycled over the demo set)"),
        opt("--rate", positive_float, None, "questions sent per second, tenants alternating (default 20)"),
        *EMULATION,
        SEED("seed of the demo data, scripted answers and emulation"),
        JSON("write every answer and the summary as JSON here"),
        QUIET("print only the summary"),
    ),
)
REFUSALS = Command(
    "refusals",
    cmd_bench_refusals,
    "how often admission refuses a demo question that would have met its deadline, per load",
    "Run the demo (emulated cluster, gateway, both tenants) at each rate, once with admission (each question "
    "refused for its deadline sent again at once without admission: a false refusal when it met the deadline) and "
    "once without (every question unprotected: is the rate below the cluster's capacity?), per seed; print per "
    "rate and tenant the share met without admission, the shares refused and falsely refused, and the share met "
    "with admission.",
    (
        opt("--rates", positive_floats, None, f"questions a second (default {REFUSAL_RATES})"),
        opt("--questions", positive_int, 300, "questions per run"),
        opt("--seeds", str, "0", "seeds of the demo data and emulation, comma-separated"),
        *EMULATION,
        opt(
            "--share",
            positive_float,
            None,
            "the gateway's admission.sustainable_share, at most 1 (default: the gateway's default)",
        ),
        JSON("write the figures per rate and tenant as JSON here"),
    ),
)
EVAL = Command(
    "eval",
    cmd_eval,
    "execution accuracy of a running gateway on a Spider-format dataset",
    "Send the questions of a Spider-format dataset (dev.json) to a running gateway's POST /v1/text2sql and report "
    "execution accuracy (the answer's result against the gold SQL's, on the dataset's SQLite databases) and "
    "latency.",
    (
        opt("--dataset", str, None, "folder with dev.json and database/<db_id>/<db_id>.sqlite", required=True),
        GATEWAY,
        API_KEY,
        opt("--limit", str, None, "only the first N questions of dev.json"),
        opt("--concurrency", str, "8", "questions in flight at once"),
        opt("--deadline-s", str, None, "deadline of every question (default: the tenant's)"),
        opt("--timeout-s", str, "600", "per-request timeout, wall seconds"),
        JSON("write the report (with every question) as JSON here", required=True),
        QUIET,
    ),
)
DATABASES = Command(
    "databases",
    cmd_databases,
    "write the databases file (for hexflow serve) of a Spider-format dataset or of the demo database; or --check one",
    "Write the databases file that a gateway's databases_file names (the databases /v1/text2sql may query) for a "
    "Spider-format dataset, or write the demo database and its file; with --check, check every database a "
    "databases file lists: one line each, ok or unavailable and why (exit 1 if any is not).",
    (
        opt(
            "--check",
            str,
            None,
            "instead of writing: connect to every database of this databases file as the gateway would "
            "(PostgreSQL: and check the role is a least-privilege reader) and print ok or unavailable and why for "
            "each; exit status 1 when one is unavailable",
            metavar="FILE",
        ),
        opt("--spider", str, None, "dataset folder with database/<db_id>/<db_id>.sqlite"),
        flag(
            "--demo",
            "instead of --spider: the demo database (demo_retail.sqlite, as hexflow demo writes it) next to --out",
        ),
        opt("--out", str, None, "the databases YAML to write"),
        opt("--statement-timeout-s", str, "5", "per-query time limit of each database"),
        opt("--max-rows", str, None, "row cap of each result (default 1000; raise it for evaluation)"),
        opt("--seed", str, None, "--demo only: seed of the demo data (default 0, as hexflow demo)"),
    ),
)
ANSWERS = Command(
    "answers",
    cmd_answers,
    "write scripted answers (hexflow emulate --answers) of a Spider-format dataset or of the demo questions",
    "Write the scripted answers that emulated workers give the Text-to-SQL pipeline's prompts (hexflow emulate "
    "--answers): the gold SQL of each question of a Spider-format dataset or of the demo, with some wrong first "
    "candidates so that revision runs.",
    (
        opt("--spider", str, None, "dataset folder with dev.json"),
        flag("--demo", "instead of --spider: the demo questions (those hexflow demo asks)"),
        opt("--out", str, None, "the answers JSON to write"),
        WRONG_FRACTION,
        opt("--seed", str, "0", "which questions get a wrong candidate (--demo: also the data's seed)"),
        opt("--limit", str, None, "--spider only: the first N questions of dev.json"),
    ),
)
QUALITY = Command(
    "quality",
    cmd_bench_quality,
    "accuracy of the Text-to-SQL pipeline at every knob setting (scripted answers, in-process)",
    "Run the real Text-to-SQL pipeline in-process with scripted answers (as the emulator gives them) over the demo "
    "questions and, with --spider, Spider dev on its SQLite databases, once per knob setting (candidates, revision "
    "cap, unit tests and evaluation) and seed; print the accuracy per setting and, with --out, write it as the "
    f"quality model the degradation policy reads ({QUALITY_OUT}).",
    (
        opt("--spider", str, None, "Spider-layout folder (dev.json, database/); default: demo only"),
        opt("--spider-limit", str, None, "the first N questions of dev.json (default: all)"),
        opt("--seeds", str, "0,1,2", "seeds of the wrong-candidate assignment, comma-separated"),
        WRONG_FRACTION,
        opt("--max-candidates", str, "3", "measure up to this many candidates"),
        opt("--out", str, None, f"write the quality file here (the packaged one: {QUALITY_OUT})"),
        QUIET,
    ),
)

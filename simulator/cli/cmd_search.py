"""`stepsim search`: find the fastest layout of a scenario's model by simulation; with
--out, keep finished results in a journal that an interrupted search resumes from."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ..plan.planning import model_params
from ..scenario import ScenarioError, read_search_journal
from .common import (
    EXIT_FAILED,
    Workers,
    calibration_columns,
    calibration_record,
    check_out,
    interrupted_status,
    interrupted_word,
    json_argument,
    load,
    out_errors,
    print_json,
    progress_for,
    scenario_arguments,
    space_arguments,
    space_of,
    worker_arguments,
    write_rows,
)
from .outfolder import out_folder


def add_command(sub) -> None:
    search = sub.add_parser(
        "search",
        help="find the fastest layout (TP/PP/DP, micro-batch, schedule, ...) by simulation",
        description="Enumerate layouts of SCENARIO's model on its cluster (its global batch "
        "and network kept), drop those that do not fit in memory, and rank the rest by "
        "simulated throughput. Layouts whose compute and pipeline bubble (a lower bound) "
        "are slower than the k-th best "
        "simulated are pruned unsimulated (--no-prune simulates all). With --out, results "
        "are kept as they finish and an interrupted search resumes where it stopped.",
    )
    scenario_arguments(search, "SECTION.KEY=VALUE", "override a key of the base scenario")
    space_arguments(search)
    search.add_argument("--top", type=int, default=10, metavar="K", help="show K (default 10)")
    search.add_argument("--no-prune", action="store_true", help="simulate every layout that fits")
    search.add_argument(
        "--out",
        metavar="DIR",
        help="write search.csv (and search.parquet with pyarrow) of every layout to DIR, and "
        "keep finished results in DIR/search.jsonl to resume from",
    )
    json_argument(search)
    worker_arguments(search)
    search.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..plan.answers import search_text
    from ..plan.search import (
        journal_entry,
        journal_header,
        journal_known,
        result_rows,
        rule_of_thumb_entry,
        search,
    )

    base = load(args)
    space = space_of(args)
    if args.top < 1:
        raise ScenarioError(f"--top={args.top} must be >= 1")
    known = {}
    journal = None
    header = journal_header(base)
    if args.out:
        check_out("--out", args.out)
        out = Path(args.out)
        path = out / "search.jsonl"
        found, entries = read_search_journal(path)
        if found is not None and found != header:
            raise ScenarioError(
                f"{path} holds another search's results (different scenario, calibration or "
                "stepsim version); use another --out or delete the file"
            )
        known = journal_known(entries)
        with out_errors("--out", args.out):
            out.mkdir(parents=True, exist_ok=True)
            journal = path.open("a", encoding="utf-8")
            if found is None:
                journal.write(json.dumps({"search": header}) + "\n")
                journal.flush()
    progress = progress_for(args)
    progress.begin("searching")
    todo = [0]

    def on_start(enumerated: int, fitting: int, resumed: int) -> None:
        todo[0] = fitting - resumed
        if args.quiet:
            return
        progress.clear()
        journal_path = f"{args.out}/search.jsonl"
        again = (
            f"; resuming: {resumed:,} done by the earlier run ({journal_path})" if resumed else ""
        )
        print(
            f"stepsim search: {enumerated:,} layouts, {fitting:,} fit in memory; simulating at "
            f"most {fitting - resumed:,}, fewest bound first, the rest pruned when they cannot "
            f"win{again}",
            file=sys.stderr,
        )
        progress.begin("searching")

    def on_result(candidate, i: int, n: int) -> None:
        if journal is not None:
            journal.write(json.dumps(journal_entry(candidate)) + "\n")
            journal.flush()
        progress.task = f"simulated {i} (of at most {todo[0]}){eta(progress, i, todo[0])}"
        progress.update(i / max(todo[0], 1))

    try:
        with Workers(args) as workers:
            result = search(
                base,
                space,
                top=args.top,
                executor=workers.executor,
                prune=not args.no_prune,
                known=known,
                on_result=on_result,
                on_start=on_start,
            )
            rule_entry = rule_of_thumb_entry(base, result, known)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (common.Terminated)
        progress.clear()
        kept = f"; finished results are in {args.out}/search.jsonl: run the same command to "
        print(
            f"stepsim: {interrupted_word(exc)}"
            + (kept + "resume" if journal is not None else " (use --out DIR to keep results)"),
            file=sys.stderr,
        )
        return interrupted_status(exc)
    finally:
        progress.clear()
        if journal is not None:
            journal.close()
    if args.json:
        from ..plan.records import search_record

        record = search_record(base, result, rule_entry, run_command(args))
        record["calibration"] = calibration_record(base)
        print_json(record)
    else:
        print(
            search_text(
                base,
                model_params(base),
                result,
                args.top,
                rule_entry,
                workers.where,
                run_command(args),
            )
        )
    if args.out:
        extra = calibration_columns(base)
        rows = [{**row, **extra} for row in result_rows(result)]
        folder_path = Path(args.out)
        with (
            out_errors("--out", args.out),
            out_folder(folder_path, f"search {base.name}") as folder,
        ):
            written = write_rows(folder, "search", rows)
        if not args.json:
            print(f"\n  wrote {args.out}/: {' '.join(written)} search.jsonl")
    return 0 if result.ranked else EXIT_FAILED


def eta(progress, done: int, total: int) -> str:
    """`, ~N s left at most` at the pace so far (pruning usually stops it sooner)."""
    if done < 1 or total <= done:
        return ""
    left_s = (time.monotonic() - progress.started) / done * (total - done)
    return f", ~{left_s:.0f} s left at most"


def run_command(args: argparse.Namespace) -> str:
    """`stepsim run` of the same base scenario, as the user gave it."""
    parts = ["stepsim", "run", args.scenario]
    if args.calibration:
        parts += ["--calibration", args.calibration]
    if args.hf_config:
        parts += ["--hf-config", args.hf_config]
    for item in args.overrides:
        parts += ["--set", item]
    return shlex.join(parts)

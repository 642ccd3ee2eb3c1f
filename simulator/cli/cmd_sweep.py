"""`stepsim sweep`: run a scenario over a grid of settings and tabulate the results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ir.results import SCHEMA_VERSION
from .common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    calibration_columns,
    calibration_note,
    calibration_record,
    check_out,
    json_argument,
    load,
    out_errors,
    print_json,
    progress_for,
    quiet_argument,
    scenario_arguments,
    write_csv,
)


def add_command(sub) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="run a scenario over a grid of settings and tabulate the results",
        description="Run SCENARIO at every combination of the swept values. A --set with a "
        "comma-separated list (cluster.nic_gbps=135,400) is swept; several swept keys make a "
        "grid, the first varying slowest. A --set with one value applies to every point.",
    )
    scenario_arguments(sweep, "SECTION.KEY=V1[,V2,...]", "a fixed or swept key")
    sweep.add_argument("--out", metavar="DIR", help="write sweep.csv and sweep.png to DIR")
    json_argument(sweep)
    quiet_argument(sweep, "no progress line on the terminal while it runs")
    sweep.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..plan.sweep import run_sweep
    from ..report.figures import sweep_figure
    from ..report.tables import sweep_table_text
    from ..run.iteration import run

    check_out("--out", args.out)
    progress = progress_for(args)

    def on_point(i: int, n: int, where: str) -> None:
        progress.begin(f"point {i + 1}/{n} ({where})")

    try:
        sweep = run_sweep(
            lambda overrides: load(args, overrides),
            lambda scenario: run(scenario, progress.update).metrics,
            args.overrides,
            on_point,
        )
    finally:
        progress.clear()
    keys, points = sweep.keys, sweep.points
    base = load(args, []) if args.calibration is not None else None  # what the file says
    extra = calibration_columns(base) if base is not None else {}
    if args.json:
        print_json(
            {
                "schema_version": SCHEMA_VERSION,
                "command": "sweep",
                "scenario": load(args, []).name,
                "swept": keys,
                "points": [point.row() for point in points],
                "rejected": [{**settings, "error": reason} for settings, reason in sweep.rejected],
                **({"calibration": calibration_record(base)} if base is not None else {}),
            }
        )
    else:
        if points:
            print(sweep_table_text(keys, points))
        note = calibration_note(base) if base is not None else None
        if note:
            print(note)
        for settings, reason in sweep.rejected:
            where = ", ".join(f"{k}={v}" for k, v in settings.items())
            print(f"  rejected {where}: {reason}")
    if args.out:
        out = Path(args.out)
        rows = [{**point.row(), **extra, "error": ""} for point in points]
        rows += [{**settings, "error": reason} for settings, reason in sweep.rejected]
        name = load(args, []).name if points else ""
        with out_errors("--out", args.out):
            out.mkdir(parents=True, exist_ok=True)
            write_csv(out / "sweep.csv", rows)
            written = "sweep.csv"
            if points:
                sweep_figure(keys, points, f"{name}: sweep").savefig(out / "sweep.png", dpi=110)
                written += " sweep.png"
        if not args.json:
            print(f"\n  wrote {args.out}/: {written}")
    if sweep.interrupted:
        print(
            f"stepsim: interrupted after {len(points)} simulated point(s); "
            "they are in the table" + (f" and {args.out}/sweep.csv" if args.out else ""),
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if sweep.rejected:
        total = len(points) + len(sweep.rejected)
        print(
            f"stepsim: error: {len(sweep.rejected)} of {total} sweep points are not valid "
            "(each is marked 'rejected' above with its reason); the others were simulated",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0

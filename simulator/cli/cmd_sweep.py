"""`stepsim sweep`: run a scenario over a grid of settings and tabulate the results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ir.results import SCHEMA_VERSION
from .common import (
    EXIT_USAGE,
    calibration_columns,
    calibration_record,
    check_out,
    csv_text,
    interrupted_status,
    interrupted_word,
    json_argument,
    label_lines,
    load,
    out_errors,
    print_json,
    progress_for,
    quiet_argument,
    scenario_arguments,
)
from .outfolder import out_folder


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
    from ..plan.sweep import run_sweep, split_axes
    from ..report.figures import sweep_figure
    from ..report.tables import sweep_table_text
    from ..run.iteration import run

    check_out("--out", args.out)
    progress = progress_for(args)

    def on_point(i: int, n: int, where: str) -> None:
        progress.part = (i, n)
        progress.begin(f"point {i + 1}/{n} ({where})")

    try:
        sweep = run_sweep(
            lambda overrides: load(args, overrides),
            # only the metrics are read: the engine adds spans up rather than keep them
            lambda scenario: run(scenario, progress.update, spans=False).metrics,
            args.overrides,
            on_point,
        )
    finally:
        progress.clear()
    keys, points = sweep.keys, sweep.points
    # the scenario with the fixed --set values: its calibration and assumptions
    base = load(args, split_axes(args.overrides)[0])
    extra = calibration_columns(base)
    if args.json:
        print_json(
            {
                "schema_version": SCHEMA_VERSION,
                "command": "sweep",
                "scenario": load(args, []).name,
                "swept": keys,
                "points": [point.row() for point in points],
                "rejected": [{**settings, "error": reason} for settings, reason in sweep.rejected],
                "calibration": calibration_record(base),
            }
        )
    else:
        print("\n".join(sweep_header(base, points)))
        if points:
            print(sweep_table_text(keys, points))
        for settings, reason in sweep.rejected:
            where = ", ".join(f"{k}={v}" for k, v in settings.items())
            print(f"  rejected {where}: {reason}")
    if args.out:
        progress.stage(f"writing {args.out}/")
        out = Path(args.out)
        rows = []
        for point in points:
            row = point.row()
            rows.append({**row, **{k: v for k, v in extra.items() if k not in row}, "error": ""})
        rows += [{**settings, "error": reason} for settings, reason in sweep.rejected]
        name = load(args, []).name if points else ""
        try:
            with out_errors("--out", args.out), out_folder(out, f"sweep {base.name}") as folder:
                folder.text("sweep.csv", csv_text(rows))
                written = "sweep.csv"
                if points:
                    figure = sweep_figure(keys, points, f"{name}: sweep")
                    folder.figure("sweep.png", figure, dpi=110)
                    written += " sweep.png"
        finally:
            progress.clear()
        if not args.json:
            print(f"\n  wrote {args.out}/: {written}")
    if sweep.interrupted:
        print(
            f"stepsim: {interrupted_word(sweep.stopped_by)} after {len(points)} simulated "
            "point(s); "
            "they are in the table" + (f" and {args.out}/sweep.csv" if args.out else ""),
            file=sys.stderr,
        )
        return interrupted_status(sweep.stopped_by)
    if sweep.rejected:
        total = len(points) + len(sweep.rejected)
        print(
            f"stepsim: error: {len(sweep.rejected)} of {total} sweep points are not valid "
            "(each is marked 'rejected' above with its reason); the others were simulated",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0


def sweep_header(base, points) -> list[str]:
    """The sweep's title and what its points rest on: each calibration label and each
    assumption once, in the points' order (a swept key may change them: more nodes on
    one switch, another GPU)."""
    calibrations = list(dict.fromkeys(p.calibration for p in points)) or [
        base.kernel_constants.source
    ]
    said = list(dict.fromkeys(a for p in points for a in p.assumptions))
    if not points:
        return [f"stepsim sweep · {base.name}", *label_lines(base)]
    return [
        f"stepsim sweep · {base.name}",
        *(f"  calibration: {c}" for c in calibrations),
        *(f"  assumes: {a}" for a in said),
    ]

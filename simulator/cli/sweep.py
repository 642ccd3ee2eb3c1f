"""`stepsim sweep`: run a scenario over a grid of settings and tabulate the results."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..results import SCHEMA_VERSION
from ..scenario import load_scenario
from .common import (
    json_argument,
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
    from ..report.text import sweep_table_text
    from ..run import run

    progress = progress_for(args)

    def on_point(i: int, n: int, where: str) -> None:
        progress.begin(f"point {i + 1}/{n} ({where})")

    try:
        keys, points = run_sweep(
            lambda overrides: load_scenario(args.scenario, overrides, calibration=args.calibration),
            lambda scenario: run(scenario, progress.update).metrics,
            args.overrides,
            on_point,
        )
    finally:
        progress.clear()
    if args.json:
        print_json(
            {
                "schema_version": SCHEMA_VERSION,
                "command": "sweep",
                "scenario": load_scenario(args.scenario).name,
                "swept": keys,
                "points": [point.row() for point in points],
            }
        )
    else:
        print(sweep_table_text(keys, points))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "sweep.csv", [point.row() for point in points])
        name = load_scenario(args.scenario).name
        sweep_figure(keys, points, f"{name}: sweep").savefig(out / "sweep.png", dpi=110)
        if not args.json:
            print(f"\n  wrote {args.out}/: sweep.csv sweep.png")
    return 0

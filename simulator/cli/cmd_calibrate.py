"""`stepsim calibrate --measured runs.csv --out cal.toml`: fit a few interpretable
parameters (scenario/fitted.py) on measured iteration times, print what moved them and
how well each run is predicted from the others, and write a calibration file that
`run`, `sweep`, `plan`, `search` and `jobs` take with --calibration."""

from __future__ import annotations

import argparse
import gc
import hashlib
import time
from pathlib import Path

from .. import __version__
from ..ir.results import SCHEMA_VERSION
from ..scenario import ScenarioError, load_scenario
from ..scenario.fitted import PARAMETERS
from .common import (
    Workers,
    check_out,
    json_argument,
    out_errors,
    print_json,
    progress_for,
    quiet_argument,
)


def add_command(sub) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="fit GEMM, attention, memory, network and host-overhead parameters to measured "
        "iteration times; write a calibration file",
        description="Fit a few interpretable parameters (multipliers of the built-in GEMM, "
        "attention, memory-bound, NVLink and NIC efficiencies, and a host overhead per "
        "pipeline instruction) to the iteration times measured on your cluster, fewer "
        "parameters than runs, each bounded and pulled toward its built-in value; print "
        "each run predicted from a fit on the others (leave-one-out) and write a "
        "calibration file for --calibration (docs/calibration.md, 'Calibrating to your "
        "own cluster').",
    )
    cal.add_argument(
        "--measured",
        required=True,
        metavar="CSV",
        help="measured runs: columns scenario (a file or a shipped name), overrides "
        "(optional, section.key=value separated by ';'), measured_iteration_s; optional id, "
        "note; one GPU and node kind",
    )
    cal.add_argument("--out", metavar="FILE", help="write the calibration file (TOML) here")
    cal.add_argument(
        "--free",
        metavar="LIST",
        help=f"free these parameters instead of choosing ({', '.join(PARAMETERS)})",
    )
    cal.add_argument(
        "--calibration",
        metavar="FILE",
        help="kernel constants ([constants], benchmarks/measure_kernels.py) to fit on top "
        "of; copied into --out",
    )
    cal.add_argument("--no-loo", action="store_true", help="skip the leave-one-out fits (faster)")
    json_argument(cal)
    cal.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="simulate on N local worker processes (default: in this process, as run --json)",
    )
    cal.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="simulate on a Ray cluster at ADDRESS, or on Ray started here",
    )
    quiet_argument(cal)
    cal.set_defaults(handler=command)


def free_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in PARAMETERS:
            raise ScenarioError(f"--free {name!r}: not a parameter; known: {', '.join(PARAMETERS)}")
    if not names or len(set(names)) != len(names):
        raise ScenarioError(f"--free {text!r} must name each parameter once")
    return [n for n in PARAMETERS if n in names]


def simulated_s(run, scenario) -> float:
    """One run's iteration time. A large run leaves its ops and spans in cycles the
    collector was paused for (run/iteration.py, gc_paused); collected here, or a fit's
    hundred runs of a large scenario would hold them all (a few GB)."""
    started = time.monotonic()
    seconds = run(scenario, spans=False).metrics.iteration_time_s
    if time.monotonic() - started > 0.2:
        gc.collect()
    return seconds


def load_runs(args: argparse.Namespace):
    """The CSV's rows as MeasuredRuns: each row's scenario (relative to the CSV's folder,
    else as given: a path or a shipped name) with its overrides and the base kernel
    constants; an error names the line and the column."""
    from ..calibration.measured import MeasuredRun
    from ..scenario.files import read_calibration_file, read_measured_runs
    from ..scenario.loader import node_kind

    rows = read_measured_runs(args.measured)
    if args.calibration is not None:
        _, fit = read_calibration_file(args.calibration)
        if fit is not None:
            raise ScenarioError(
                f"--calibration {args.calibration!r} holds a [fit] already; give a file of "
                "kernel constants alone ([constants]) to fit on top of"
            )
    folder = Path(args.measured).parent
    runs, first = [], None
    for row in rows:
        beside = folder / row.scenario
        path = beside if not Path(row.scenario).is_absolute() and beside.exists() else row.scenario
        where = f"{args.measured} line {row.line}"
        try:
            load_scenario(path)
        except ScenarioError as exc:
            raise ScenarioError(f"{where}, column 'scenario': {exc}") from None
        try:
            scenario = load_scenario(path, row.overrides, calibration=args.calibration)
        except ScenarioError as exc:
            column = "overrides" if row.overrides else "scenario"
            raise ScenarioError(f"{where}, column {column!r}: {exc}") from None
        kind = (scenario.cluster.gpu.name, node_kind(scenario.cluster))
        if first is None:
            first = (kind, row.line)
        elif kind != first[0]:
            raise ScenarioError(
                f"{where}: runs on gpu={kind[0]!r}, node={kind[1]!r} but line {first[1]} on "
                f"gpu={first[0][0]!r}, node={first[0][1]!r}; one calibration is for one GPU "
                "and node kind (split the CSV)"
            )
        runs.append(MeasuredRun(row.id, scenario, row.measured_iteration_s))
    return rows, runs


def command(args: argparse.Namespace) -> int:
    from ..calibration.measured import calibrate, measured_fit, report_text
    from ..scenario.files import dumps_calibration, read_calibration_file

    free = free_list(args.free)
    check_out("--out", args.out, folder=False)
    rows, runs = load_runs(args)
    progress = progress_for(args)
    progress.begin("simulating")

    def on_progress(count: int) -> None:
        progress.task = f"simulated {count} points"
        progress.update(0.0)

    try:
        if args.jobs is None and args.ray is None:  # here, through run --json's totals path
            from ..run.iteration import run

            def here(scenarios):
                return [simulated_s(run, s) for s in scenarios]

            report = calibrate(
                runs, here, free, leave_one_out=not args.no_loo, progress=on_progress
            )
        else:
            with Workers(args) as workers:

                def pooled(scenarios):
                    times = [0.0] * len(scenarios)

                    def done(i: int, metrics) -> None:
                        times[i] = metrics.iteration_time_s

                    workers.executor(scenarios, done)
                    return times

                report = calibrate(
                    runs, pooled, free, leave_one_out=not args.no_loo, progress=on_progress
                )
    finally:
        progress.clear()
    digest = hashlib.sha256(Path(args.measured).read_bytes()).hexdigest()[:16]
    source = (
        f"stepsim {__version__} calibrate --measured {Path(args.measured).name} "
        f"({len(runs)} runs, sha256 {digest})"
    )
    fit = measured_fit(report, source)
    if args.out:
        constants = None
        if args.calibration is not None:
            constants = read_calibration_file(args.calibration).constants
        loo = report.loo_predicted_s
        written = [
            {
                "id": row.id,
                "scenario": row.scenario,
                "overrides": "; ".join(row.overrides),
                "measured_iteration_s": row.measured_iteration_s,
                "builtin_s": builtin,
                "fitted_s": fitted,
                "loo_predicted_s": None if loo is None else loo[i],
            }
            for i, (row, builtin, fitted) in enumerate(
                zip(rows, report.builtin_s, report.full.simulated_s, strict=True)
            )
        ]
        notes = [
            "stepsim calibration file: a fit on measured iterations (stepsim calibrate).",
            "Use it with --calibration on run, sweep, plan, search, jobs; it holds for the",
            f"GPU and node below only. Made by: {source}.",
            *(f"note: {n}" for n in report.full.notes),
        ]
        with out_errors("--out", args.out):
            Path(args.out).write_text(
                dumps_calibration(fit, written, constants, notes), encoding="utf-8"
            )
    if args.json:
        print_json(json_record(report, fit, args.out))
    else:
        print(report_text(report, args.out))
    return 0


def json_record(report, fit, out: str | None) -> dict:
    """`stepsim calibrate --json`: the runs, each parameter and the errors."""
    loo = report.loo_predicted_s
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "calibrate",
        "gpu": fit.gpu,
        "node": fit.node,
        "runs": [
            {
                "id": run.id,
                "scenario": run.scenario.name,
                "measured_iteration_s": run.measured_s,
                "builtin_s": builtin,
                "fitted_s": fitted,
                "loo_predicted_s": None if loo is None else loo[i],
            }
            for i, (run, builtin, fitted) in enumerate(
                zip(report.runs, report.builtin_s, report.full.simulated_s, strict=True)
            )
        ],
        "parameters": {
            name: {
                "key": p.key,
                "value": fit.value(name),
                "builtin": 0.0 if p.seconds else 1.0,
                "bounds": list(report.bounds[name]),
                "freed": name in fit.freed,
                "at_bound": name in fit.at_bound,
                "spread": report.full.spread.get(name),
                "sensitivity": report.sensitivity[name],
                "mechanism": p.mechanism,
            }
            for name, p in PARAMETERS.items()
        },
        "notes": report.full.notes,
        "builtin_error": report.builtin_error,
        "fit_error": report.fit_error,
        "loo_error": report.loo_error,
        "loo_freed": None if report.loo_freed is None else [list(f) for f in report.loo_freed],
        "calibration_file": out,
    }

"""`stepsim calibrate`: fit a few interpretable parameters (scenario/fitted.py) on what
was measured on the user's cluster, print what moved them and how well each measurement
is predicted from the others, and write a calibration file that `run`, `sweep`, `plan`,
`search` and `jobs` take with --calibration. Two kinds of evidence, alone or together:
nccl-tests logs (--nccl-tests: the network's efficiencies and latencies,
calibration/nccl.py) and measured iteration times (--measured: kernel, network and host
parameters, calibration/measured.py), the second fitted on top of the first."""

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
from .outfolder import atomic_write_bytes


def add_command(sub) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="fit network, GEMM, attention, memory and host-overhead parameters to nccl-tests "
        "logs and measured iteration times; write a calibration file",
        description="Fit a few interpretable parameters to what was measured on your "
        "cluster. --nccl-tests: the NVLink and NIC efficiencies on the logs' "
        "bandwidth-bound sizes and a latency on the others, each size's residual printed. "
        "--measured: multipliers of the built-in GEMM, attention, memory-bound, NVLink and "
        "NIC efficiencies and a host overhead per pipeline instruction, fewer than runs, "
        "each bounded and pulled toward its built-in value, each run predicted from a fit "
        "on the others (leave-one-out). Both: the second on top of the first. Writes a "
        "calibration file for --calibration (docs/calibration.md, 'Calibrating to your "
        "own cluster').",
    )
    cal.add_argument(
        "--measured",
        metavar="CSV",
        help="measured runs: columns scenario (a file or a shipped name), overrides "
        "(optional, section.key=value separated by ';'), measured_iteration_s; optional id, "
        "note; one GPU and node kind",
    )
    cal.add_argument(
        "--nccl-tests",
        nargs="+",
        metavar="LOG",
        help="nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
        "alltoall_perf, sendrecv_perf) as it printed itself; fits the network's NVLink and "
        "NIC efficiencies and its latencies on the scenario's cluster",
    )
    cal.add_argument(
        "--scenario",
        metavar="SCENARIO",
        help="the cluster the nccl-tests logs ran on: a scenario file or a shipped name "
        "(default: the first --measured run's)",
    )
    cal.add_argument(
        "--collective",
        choices=("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"),
        help="what the nccl-tests logs timed, where a log does not say (its command line "
        "or file name)",
    )
    cal.add_argument(
        "--trace",
        metavar="TRACE",
        help="a PyTorch profiler trace (.json or .json.gz) of one rank of the real job: its "
        "GEMM, attention and memory-bound kernel time per iteration set those multipliers "
        "(stepsim compare shows the same classes)",
    )
    cal.add_argument(
        "--trace-stage",
        type=int,
        metavar="N",
        help="the pipeline stage the traced rank ran (default: from its rank, as compare)",
    )
    cal.add_argument(
        "--ranks",
        type=int,
        metavar="N",
        help="the ranks of a log that prints no '# Rank ... on HOST device D' lines: N "
        "GPUs of consecutive nodes, each node full",
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


def evidence_scenario(args: argparse.Namespace, runs, need: str):
    """The scenario nccl-tests logs or a trace are read against: --scenario, else the
    first --measured run's; without either, a one-line error starting with ``need``."""
    if args.scenario is not None:
        return load_scenario(args.scenario)
    if runs:
        return runs[0].scenario
    raise ScenarioError(f"{need}: give --scenario (a scenario file or a shipped name)")


def network_report(args: argparse.Namespace, runs):
    """The fit on the --nccl-tests logs, on the cluster of --scenario (or of the first
    measured run)."""
    from ..calibration.nccl import (
        KINDS,
        Network,
        calibrate_network,
        check_device,
        collective_log,
        log_kind,
    )
    from ..run.iteration import build_cluster
    from ..scenario.files import read_nccl_tests_log
    from ..scenario.loader import node_kind

    scenario = evidence_scenario(args, runs, "--nccl-tests needs the cluster the logs ran on")
    cluster = scenario.cluster
    given = None if args.collective is None else KINDS[f"{args.collective}_perf"]
    if args.ranks is not None and args.ranks < 2:
        raise ScenarioError(f"--ranks {args.ranks} must be 2 or more")
    logs = []
    for path in args.nccl_tests:
        log = read_nccl_tests_log(path)
        name = str(path)
        if not log.hosts:
            if args.ranks is None:
                raise ScenarioError(
                    f"nccl-tests log {name!r} prints no '# Rank N ... on HOST device D' lines; "
                    "give --ranks N (N GPUs on consecutive full nodes)"
                )
            per = cluster.gpus_per_node
            hosts = tuple(f"node{r // per}" for r in range(args.ranks))
            log = log._replace(hosts=hosts, devices=tuple(r % per for r in range(args.ranks)))
        elif args.ranks is not None and args.ranks != len(log.hosts):
            raise ScenarioError(
                f"--ranks {args.ranks}: nccl-tests log {name!r} prints {len(log.hosts)} ranks"
            )
        kind = log_kind(log, f"nccl-tests log {name!r}", given)
        check_device(log, f"nccl-tests log {name!r}", cluster.gpu.name)
        logs.append(collective_log(log, name, kind, cluster.gpus_per_node))
    return calibrate_network(
        Network(cluster, build_cluster), logs, cluster.gpu.name, node_kind(cluster)
    )


def trace_report(args: argparse.Namespace, runs):
    """The kernel classes of --trace fitted on the scenario's GPU of the traced stage:
    (the fit, the stage, the fit as a calibration file's [fit] holds it)."""
    from ..calibration.measured import MeasuredRun, bounds_of
    from ..calibration.trace import fit_trace, measure, stage_of
    from ..report.compare import stage_class_s
    from ..run.iteration import run
    from ..scenario.files import read_profiler_trace
    from ..scenario.fitted import MeasuredFit
    from ..scenario.loader import apply_fit, node_kind

    scenario = evidence_scenario(args, runs, "--trace needs the scenario the traced job ran")
    measured = measure(read_profiler_trace(args.trace), f"profiler trace {args.trace!r}")
    stage, _ = stage_of(args.trace_stage, scenario, measured.rank, "--trace-stage")

    def simulate(values):
        fitted = apply_fit(
            scenario,
            MeasuredFit(
                gemm=values.get("gemm", 1.0),
                attention=values.get("attention", 1.0),
                memory=values.get("memory", 1.0),
            ),
        )
        return stage_class_s(fitted, run(fitted, spans=False, idle_split=False).metrics, stage)

    bounds = bounds_of([MeasuredRun("trace", scenario, 1.0)])
    traced = fit_trace(measured, simulate, bounds)
    fit = MeasuredFit(
        gemm=traced.values.get("gemm", 1.0),
        attention=traced.values.get("attention", 1.0),
        memory=traced.values.get("memory", 1.0),
        gpu=scenario.cluster.gpu.name,
        node=node_kind(scenario.cluster),
        trace_iterations=traced.iterations,
        trace_freed=traced.freed,
        trace_at_bound=traced.at_bound,
        source=_source("--trace", [args.trace], f"{traced.iterations} iterations"),
    )
    return traced, stage, fit


def trace_json(traced, stage: int) -> dict:
    return {
        "stage": stage,
        "iterations": traced.iterations,
        "measured_s": traced.measured_s,
        "builtin_s": traced.builtin_s,
        "fitted_s": traced.fitted_s,
        "parameters": traced.values,
        "freed": list(traced.freed),
        "at_bound": list(traced.at_bound),
        "notes": list(traced.notes),
    }


def _source(option: str, paths, count: str) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    names = " ".join(Path(p).name for p in paths)
    sha = digest.hexdigest()[:16]
    return f"stepsim {__version__} calibrate {option} {names} ({count}, sha256 {sha})"


def command(args: argparse.Namespace) -> int:
    from ..calibration.measured import measured_fit, report_text
    from ..calibration.nccl import collective_rows, report_json
    from ..calibration.nccl import report_text as network_text
    from ..calibration.trace import trace_fit_text
    from ..scenario.files import dumps_calibration, read_calibration_file
    from ..scenario.loader import apply_fit, node_kind

    if args.measured is None and not args.nccl_tests and args.trace is None:
        raise ScenarioError(
            "stepsim calibrate needs evidence: --measured CSV (iteration times), "
            "--nccl-tests LOG ... (collective timings), --trace TRACE (a profiler trace), "
            "or several"
        )
    free = free_list(args.free)
    if free is not None and args.measured is None:
        raise ScenarioError("--free chooses among the --measured fit's parameters; give --measured")
    check_out("--out", args.out, folder=False)
    rows, runs = load_runs(args) if args.measured is not None else ([], [])
    progress = progress_for(args)
    network = traced = None
    prior = None  # what the logs and the trace fitted: the runs are fitted on top of it
    fixed: list[str] = []
    if args.nccl_tests:
        progress.begin("fitting the network on the nccl-tests logs")
        try:
            network = network_report(args, runs)
        finally:
            progress.clear()
        prior = network.measured_fit(
            _source("--nccl-tests", args.nccl_tests, f"{network.sizes} sizes")
        )
        fixed += [n for n in ("nvlink", "nic") if n in prior.collective_freed]
    if args.trace is not None:
        progress.begin("fitting the kernel classes on the profiler trace")
        try:
            traced, stage, trace_fit = trace_report(args, runs)
        finally:
            progress.clear()
        prior = trace_fit if prior is None else prior.then(trace_fit)
        fixed += list(trace_fit.trace_freed)
    if runs and prior is not None:
        scenario = runs[0].scenario
        mine = (scenario.cluster.gpu.name, node_kind(scenario.cluster))
        if mine != (prior.gpu, prior.node):
            raise ScenarioError(
                f"--measured runs on gpu={mine[0]!r}, node={mine[1]!r} but --scenario on "
                f"gpu={prior.gpu!r}, node={prior.node!r}; one calibration is for one "
                "GPU and node kind"
            )
        clash = [n for n in free or () if n in fixed]
        if clash:
            raise ScenarioError(
                f"--free {clash[0]}: the nccl-tests logs or the trace fitted it already; "
                "free the --measured fit's other parameters"
            )
        runs = [r._replace(scenario=apply_fit(r.scenario, prior)) for r in runs]
    report = None
    if runs:
        progress.begin("simulating")

        def on_progress(count: int) -> None:
            progress.task = f"simulated {count} points"
            progress.update(0.0)

        try:
            report = _fit_runs(args, runs, free, fixed, on_progress)
        finally:
            progress.clear()
        fit = measured_fit(report, _source("--measured", [args.measured], f"{len(runs)} runs"))
        if prior is not None:
            fit = prior.then(fit)
    else:
        assert prior is not None
        fit = prior
    if args.out:
        constants = None
        if args.calibration is not None:
            constants = read_calibration_file(args.calibration).constants
        written = []
        if report is not None:
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
            "stepsim calibration file: a fit on what was measured (stepsim calibrate).",
            "Use it with --calibration on run, sweep, plan, search, jobs; it holds for the",
            f"GPU and node below only. Made by: {fit.source}.",
            *(f"note: {n}" for n in (network.full.notes if network else [])),
            *(f"note: {n}" for n in (traced.notes if traced else [])),
            *(f"note: {n}" for n in (report.full.notes if report else [])),
        ]
        text = dumps_calibration(
            fit, written, constants, notes, collective_rows(network) if network else ()
        )
        with out_errors("--out", args.out):  # atomically: a link there is replaced, not followed
            atomic_write_bytes(Path(args.out), text.encode("utf-8"))
    if args.json:
        document = (
            json_record(report, fit, args.out)
            if report is not None
            else {
                "schema_version": SCHEMA_VERSION,
                "command": "calibrate",
                "gpu": fit.gpu,
                "node": fit.node,
                "calibration_file": args.out,
            }
        )
        if network is not None:
            document["network"] = report_json(network)
        if traced is not None:
            document["trace"] = trace_json(traced, stage)
        print_json(document)
    else:
        parts = []
        if network is not None:
            parts.append(network_text(network))
        if traced is not None:
            parts.append(trace_fit_text(traced, Path(args.trace).name, stage))
        if report is not None:
            parts.append(report_text(report, args.out))
        elif args.out:
            parts.append(f"calibration file written: {args.out}")
        print("\n\n".join(parts))
    return 0


def _fit_runs(args, runs, free, fixed, on_progress):
    from ..calibration.measured import calibrate

    loo = not args.no_loo
    if args.jobs is None and args.ray is None:  # here, through run --json's totals path
        from ..run.iteration import run

        def here(scenarios):
            return [simulated_s(run, s) for s in scenarios]

        return calibrate(runs, here, free, leave_one_out=loo, progress=on_progress, fixed=fixed)
    with Workers(args) as workers:

        def pooled(scenarios):
            times = [0.0] * len(scenarios)

            def done(i: int, metrics) -> None:
                times[i] = metrics.iteration_time_s

            workers.executor(scenarios, done)
            return times

        return calibrate(runs, pooled, free, leave_one_out=loo, progress=on_progress, fixed=fixed)


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

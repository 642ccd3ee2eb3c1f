"""The ``stepsim`` command. With the loader, the only code that touches files.

Errors a user can cause print one line and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from . import __version__
from .engine import DeadlockError
from .loader import (
    ScenarioError,
    dumps_toml,
    load_scenario,
    read_schedule_file,
    scenario_to_dict,
)

EXIT_USAGE = 2
# the calibration set, shipped with the project (an editable install finds it here)
DEFAULT_VALIDATION_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "validation"
MAX_SCHEDULE_OPS = 1_000_000  # `stepsim schedule`: under a minute of simulation


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for scenario errors
        self.exit(EXIT_USAGE, f"stepsim: error: {message} (see stepsim {self._sub()}--help)\n")

    def _sub(self) -> str:
        parts = self.prog.split()[1:]
        return " ".join(parts) + " " if parts else ""


class Progress:
    """One self-overwriting line on stderr while a long simulation or sweep runs.
    Silent unless ``enabled`` (stderr is a terminal and no --quiet); redrawn at most
    ten times a second, so it costs nothing measurable."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.task = ""
        self.started = time.monotonic()
        self.drawn_at = -1.0
        self.shown = False

    def begin(self, task: str) -> None:
        self.task = task
        self.update(0.0, force=True)

    def update(self, fraction: float, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.drawn_at < 0.1:
            return
        self.drawn_at = now
        line = f"  {self.task} {fraction:4.0%}  {now - self.started:5.1f} s"
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _progress(args: argparse.Namespace) -> Progress:
    return Progress(sys.stderr.isatty() and not args.quiet)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stepsim",
        description="Simulate one training iteration of a Megatron-style transformer on a "
        "GPU cluster.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="simulate a scenario file and print a summary",
        description="Simulate one iteration of SCENARIO (a TOML file; see scenarios/README.md).",
    )
    _scenario_arguments(
        run, "SECTION.KEY=VALUE", "override a scenario key, e.g. --set cluster.nic_gbps=400"
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        help="write metrics.json, timeline.png, breakdown.png, trace.json and "
        "scenario.resolved.toml to DIR",
    )
    run.add_argument("--json", action="store_true", help="print only the metrics JSON")
    run.add_argument(
        "--allow-oom",
        action="store_true",
        help="simulate a layout that does not fit in GPU memory (a warning, not an error)",
    )

    sweep = sub.add_parser(
        "sweep",
        help="run a scenario over a grid of settings and tabulate the results",
        description="Run SCENARIO at every combination of the swept values. A --set with a "
        "comma-separated list (cluster.nic_gbps=135,400) is swept; several swept keys make a "
        "grid, the first varying slowest. A --set with one value applies to every point.",
    )
    _scenario_arguments(sweep, "SECTION.KEY=V1[,V2,...]", "a fixed or swept key")
    sweep.add_argument("--out", metavar="DIR", help="write sweep.csv and sweep.png to DIR")

    validate = sub.add_parser(
        "validate",
        help="simulate the calibration set and compare with the published measurements",
        description="Simulate every row of the calibration set (Narayanan et al. 2021 Table 1: "
        "iteration times; Korthikanti et al. 2022 Table 4: one layer's forward and backward) "
        "and print measured, simulated and error; write validation.md and a plot.",
    )
    validate.add_argument(
        "--data",
        metavar="DIR",
        default=str(DEFAULT_VALIDATION_DIR),
        help="folder with the two CSV tables (default: the project's scenarios/validation)",
    )
    validate.add_argument(
        "--calibration", metavar="FILE", help="kernel constants for the A100 from FILE"
    )
    validate.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/validation.md and DIR/images/validation.png (the project's is docs)",
    )
    validate.add_argument("--quick", action="store_true", help="skip the rows over 1,000 GPUs")
    for command in (run, sweep, validate):
        command.add_argument(
            "--quiet", action="store_true", help="no progress line on the terminal while it runs"
        )

    topo = sub.add_parser(
        "topology",
        help="describe a scenario's cluster: GPUs, links, switches, bisection bandwidth",
        description="Print what the cluster graph of SCENARIO holds; optionally draw it.",
    )
    _scenario_arguments(topo, "SECTION.KEY=VALUE", "override a scenario key")
    topo.add_argument("--png", metavar="FILE", help="draw the graph (clusters of up to 128 GPUs)")

    sched = sub.add_parser(
        "schedule",
        help="a pipeline schedule on abstract op times: makespan, bubble, memory, picture",
        description="Run a pipeline schedule on abstract op times, no cluster: F, B, W per "
        "micro-batch and stage (any unit; the outputs use the same), c per hop between stages. "
        "Schedules that do not split the backward run one fused backward of B + W.",
    )
    which = sched.add_mutually_exclusive_group(required=True)
    which.add_argument("--schedule", metavar="NAME", help=f"one of: {', '.join(_schedule_names())}")
    which.add_argument(
        "--compare", metavar="A,B,...", help="several schedules, stacked in one picture"
    )
    which.add_argument(
        "--schedule-file",
        metavar="FILE",
        help="per-rank op orders: one line per rank of labels F3 B3 W3 (F3.1 = chunk 1)",
    )
    sched.add_argument("--stages", type=int, metavar="P", help="pipeline stages (ranks)")
    sched.add_argument("--microbatches", type=int, metavar="M", help="micro-batches")
    sched.add_argument(
        "--chunks", type=int, metavar="V", help="chunks per rank (default 2 where chunked)"
    )
    sched.add_argument(
        "--group-size", type=int, metavar="G", help="micro-batch group of interleaved schedules"
    )
    sched.add_argument(
        "--placement",
        choices=["looped", "v"],
        default="looped",
        help="--schedule-file only: chunk k of rank r is stage k*p+r (looped) or a V",
    )
    sched.add_argument("--forward", type=float, required=True, metavar="F")
    sched.add_argument("--backward", type=float, required=True, metavar="B")
    sched.add_argument("--weight", type=float, default=None, metavar="W")
    sched.add_argument("--p2p-latency", type=float, default=0.0, metavar="C")
    sched.add_argument("--json", action="store_true", help="print the results as JSON")
    sched.add_argument("--out", metavar="DIR", help="write schedule.png and trace.json to DIR")
    return parser


def _schedule_names() -> list[str]:
    from schedules import SCHEDULES

    return list(SCHEDULES)


def _scenario_arguments(parser: argparse.ArgumentParser, metavar: str, help_text: str) -> None:
    parser.add_argument("scenario", help="scenario file (TOML)")
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="kernel constants for the scenario's GPU (benchmarks/measure_kernels.py writes it)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar=metavar,
        help=f"{help_text} (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "topology":
            return _topology(args)
        if args.command == "schedule":
            return _schedule(args)
        if args.command == "validate":
            return _validate(args)
    except ScenarioError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DeadlockError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return 1
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from .memory import out_of_memory
    from .run import memory_per_stage, run  # imported here so `stepsim --help` stays instant

    scenario = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    problem = out_of_memory(scenario, memory_per_stage(scenario))
    if problem and not args.allow_oom:
        raise ScenarioError(problem)
    if problem:
        print(f"warning: {problem}", file=sys.stderr)
    progress = _progress(args)
    progress.begin("simulating")
    try:
        result = run(scenario, progress.update)
    finally:
        progress.clear()
    if args.out:
        _write_outputs(result, Path(args.out))
    if args.json:
        print(json.dumps(result.metrics, indent=2))
    else:
        from .output import summary_text

        print(summary_text(result))
        if args.out:
            print(
                f"\n  wrote {args.out}/: metrics.json timeline.png breakdown.png trace.json "
                "scenario.resolved.toml"
            )
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from .figures import sweep_figure
    from .output import sweep_table_text
    from .run import run
    from .sweep import run_sweep

    progress = _progress(args)

    def on_point(i: int, n: int, where: str) -> None:
        progress.begin(f"point {i + 1}/{n} ({where})")

    try:
        keys, rows = run_sweep(
            lambda overrides: load_scenario(args.scenario, overrides, calibration=args.calibration),
            lambda scenario: run(scenario, progress.update).metrics,
            args.overrides,
            on_point,
        )
    finally:
        progress.clear()
    print(sweep_table_text(keys, rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "sweep.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        name = load_scenario(args.scenario).name
        sweep_figure(keys, rows, f"{name}: sweep").savefig(out / "sweep.png", dpi=110)
        print(f"\n  wrote {args.out}/: sweep.csv sweep.png")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .loader import read_calibration, read_validation_set
    from .output import validation_markdown, validation_text
    from .run import run
    from .validation import compare, summary

    rows = read_validation_set(args.data)
    if args.quick:
        rows["megatron"] = [r for r in rows["megatron"] if int(r["num_gpus"]) <= 1000]
    calibration = read_calibration(args.calibration) if args.calibration else None
    if calibration is not None and not calibration.gpu.startswith("a100"):
        raise ScenarioError(
            f"--calibration {args.calibration!r} is for gpu={calibration.gpu!r}; the "
            "calibration set ran on A100s"
        )
    progress = _progress(args)

    def tell(name: str) -> None:
        progress.begin(f"simulating {name}")

    try:
        comparisons = compare(
            rows["megatron"],
            rows["layers"],
            lambda s: run(s, progress.update).trace,
            calibration,
            tell,
        )
    finally:
        progress.clear()
    print(validation_text(comparisons, summary(comparisons)))
    if args.out:
        from .figures import validation_figure

        out = Path(args.out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        validation_figure(comparisons).savefig(out / "images" / "validation.png", dpi=110)
        (out / "validation.md").write_text(
            validation_markdown(comparisons, summary(comparisons), calibration), encoding="utf-8"
        )
        print(f"\n  wrote {args.out}/validation.md and {args.out}/images/validation.png")
    return 0


def _topology(args: argparse.Namespace) -> int:
    from topologies.describe import summarize

    from .figures import topology_figure
    from .output import MAX_DRAWN_GPUS, topology_text
    from .run import build_cluster

    scenario = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    cluster = build_cluster(scenario.cluster)
    if args.png and cluster.num_gpus > MAX_DRAWN_GPUS:
        raise ScenarioError(
            f"--png draws clusters of up to {MAX_DRAWN_GPUS} GPUs; this one has "
            f"{cluster.num_gpus} (try --set cluster.num_nodes=4)"
        )
    print(topology_text(scenario, summarize(cluster.graph, scenario.cluster.gpus_per_node)))
    if args.png:
        topology_figure(cluster.graph, scenario.name).savefig(args.png, dpi=110)
        print(f"\n  wrote {args.png}")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from schedules import SCHEDULES
    from schedules.custom import sizes_of

    from .bubble import run_orders, run_schedule
    from .output import study_text, study_trace

    times = _op_times(args)
    studies = []
    if args.schedule_file:
        path = Path(args.schedule_file)
        orders = read_schedule_file(path, f"--schedule-file {str(path)!r}", args.placement)
        p, m, v, split = sizes_of(orders)
        if p * m * v * 3 > MAX_SCHEDULE_OPS:
            raise ScenarioError(
                f"--schedule-file {str(path)!r}: {p} ranks x {m} micro-batches x {v} chunks is "
                f"over the limit of {MAX_SCHEDULE_OPS:,} ops"
            )
        for flag, given, found in (
            ("--stages", args.stages, p),
            ("--microbatches", args.microbatches, m),
            ("--chunks", args.chunks, v),
        ):
            if given is not None and given != found:
                raise ScenarioError(f"{flag}={given} but the schedule file has {found}")
        if split and args.weight is None:
            raise ScenarioError("--weight is required: the schedule file has W ops")
        studies.append(
            run_orders(
                path.stem,
                orders,
                times,
                num_chunks=v,
                split_backward=split,
                placement=args.placement,
            )
        )
    else:
        names = [args.schedule] if args.schedule else [n.strip() for n in args.compare.split(",")]
        for flag in ("--stages", "--microbatches"):
            if getattr(args, flag[2:]) is None:
                raise ScenarioError(f"{flag} is required with --schedule or --compare")
        ops = args.stages * args.microbatches * 3 * max(args.chunks or 2, 2)
        if ops > MAX_SCHEDULE_OPS:
            raise ScenarioError(
                f"--stages={args.stages} x --microbatches={args.microbatches} means about "
                f"{ops:,} ops, over the limit of {MAX_SCHEDULE_OPS:,}; use fewer"
            )
        for name in names:
            if name not in SCHEDULES:
                raise ScenarioError(f"schedule {name!r} is not one of: {', '.join(SCHEDULES)}")
            info = SCHEDULES[name]
            if info.split_backward and args.weight is None:
                raise ScenarioError(
                    f"--weight is required for {name!r}, which splits the backward: --backward "
                    "is then the input-gradient time and --weight the weight-gradient time"
                )
            v = 1
            if info.chunked:
                v = 2 if info.placement == "v" or args.chunks is None else args.chunks
            single = len(names) == 1  # with --compare, --chunks/--group-size apply where they can
            if single and args.chunks not in (None, v):
                raise ScenarioError(f"--chunks={args.chunks}: schedule {name!r} runs {v} chunks")
            if single and args.group_size is not None and not info.grouped:
                raise ScenarioError(
                    f"--group-size={args.group_size}: schedule {name!r} takes no micro-batch group"
                )
            group = args.group_size if info.grouped else None
            try:
                studies.append(run_schedule(name, args.stages, args.microbatches, times, v, group))
            except ValueError as exc:
                raise ScenarioError(
                    f"--schedule {name} --stages {args.stages} --microbatches "
                    f"{args.microbatches}: {exc}"
                ) from None
    if args.json:
        dicts = [s.as_dict() for s in studies]
        print(json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2))
    else:
        print(study_text(studies))
    if args.out:
        from .figures import pipeline_figure

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        pipeline_figure(studies).savefig(out / "schedule.png", dpi=110)
        (out / "trace.json").write_text(json.dumps(study_trace(studies), separators=(",", ":")))
        if not args.json:
            print(f"\n  wrote {args.out}/: schedule.png trace.json")
    return 0


def _op_times(args: argparse.Namespace):
    from .bubble import OpTimes

    values = {
        "--forward": args.forward,
        "--backward": args.backward,
        "--weight": args.weight or 0.0,
        "--p2p-latency": args.p2p_latency,
    }
    for flag, value in values.items():
        if not 0 <= value < float("inf"):
            raise ScenarioError(f"{flag}={value} must be a finite number >= 0")
    total = args.forward + args.backward + (args.weight or 0.0)
    if total <= 0:
        raise ScenarioError("--forward, --backward and --weight cannot all be 0")
    if total > 1e12 or args.p2p_latency > 1e12:
        raise ScenarioError("--forward, --backward, --weight and --p2p-latency must be <= 1e12")
    for flag in ("--stages", "--microbatches", "--chunks", "--group-size"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not 1 <= value <= 100_000:
            raise ScenarioError(f"{flag}={value} must be between 1 and 100000")
    return OpTimes(
        forward=args.forward,
        backward=args.backward,
        weight=args.weight or 0.0,
        p2p_latency=args.p2p_latency,
    )


def _write_outputs(result, out: Path) -> None:
    from .figures import breakdown_figure, timeline_figure
    from .output import chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    (out / "scenario.resolved.toml").write_text(dumps_toml(scenario_to_dict(result.scenario)))
    # dumps, not dump: dump to a file streams through the slow pure-Python encoder
    (out / "trace.json").write_text(json.dumps(chrome_trace(result), separators=(",", ":")))
    timeline_figure(result).savefig(out / "timeline.png", dpi=110)
    breakdown_figure(result).savefig(out / "breakdown.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())

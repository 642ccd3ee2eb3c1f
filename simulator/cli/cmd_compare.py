"""`stepsim compare SCENARIO TRACE`: a real rank's PyTorch profiler trace beside the
simulated GPU of the same pipeline stage (report/compare.py), as text, JSON and a
picture."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..ir.results import SCHEMA_VERSION
from ..scenario import ScenarioError
from .common import (
    calibration_record,
    check_out,
    json_argument,
    load,
    out_errors,
    print_json,
    progress_for,
    quiet_argument,
    scenario_arguments,
)
from .outfolder import atomic_write_figure


def add_command(sub) -> None:
    cmp = sub.add_parser(
        "compare",
        help="a real rank's PyTorch profiler trace beside the simulated scenario",
        description="Read a PyTorch profiler (Kineto/Chrome) trace of a few iterations on "
        "one rank of the real job, classify its GPU kernels (GEMM, attention, NCCL by "
        "collective, memory-bound, optimizer, copies), and print per iteration its "
        "compute, exposed communication, optimizer and idle time beside stepsim's for the "
        "same scenario's GPU of the same pipeline stage (docs/calibration.md, 'Comparing "
        "with a profiler trace').",
    )
    scenario_arguments(cmp, "SECTION.KEY=VALUE", "override a scenario key")
    cmp.add_argument("trace", metavar="TRACE", help="the trace: .json or .json.gz")
    cmp.add_argument(
        "--stage",
        type=int,
        metavar="N",
        help="the pipeline stage the traced rank ran (default: from the trace's rank in "
        "Megatron-Core's order, tp-cp-ep-dp-pp)",
    )
    cmp.add_argument(
        "--png", metavar="FILE", help="draw the measured timeline over the simulated one"
    )
    cmp.add_argument(
        "--iteration",
        type=int,
        default=0,
        metavar="I",
        help="which of the trace's iterations --png draws (default 0, the first)",
    )
    json_argument(cmp)
    quiet_argument(cmp)
    cmp.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..calibration.trace import measure, other_gpu, stage_of
    from ..report.compare import compare, figure, record, text
    from ..run.iteration import run
    from ..scenario.files import read_profiler_trace

    if args.png is not None and Path(args.png).suffix.lower() not in ("", ".png"):
        raise ScenarioError(f"--png {args.png!r} must name a .png file")
    check_out("--png", args.png, folder=False)
    scenario = load(args)
    progress = progress_for(args)
    progress.begin("reading the trace")
    try:
        trace = read_profiler_trace(args.trace)
        measured = measure(trace, f"profiler trace {args.trace!r}")
        if not 0 <= args.iteration < len(measured.iterations):
            raise ScenarioError(
                f"--iteration {args.iteration}: the trace holds iterations 0 to "
                f"{len(measured.iterations) - 1}"
            )
        stage, notes = stage_of(args.stage, scenario, measured.rank)
        gpu = scenario.cluster.gpu.name
        if other_gpu([measured.device], gpu):
            notes.append(
                f"the trace ran on {measured.device!r}, the scenario on {gpu!r}: the two "
                "sides are different GPUs"
            )
        progress.task = "simulating"
        progress.update(0.0)
        result = run(scenario)
    finally:
        progress.clear()
    comparison = compare(result, measured, stage, Path(args.trace).name, notes)
    if args.png:
        with out_errors("--png", args.png):
            picture = figure(comparison, measured, result, args.iteration)
            atomic_write_figure(Path(args.png), picture, dpi=110)
    if args.json:
        print_json(
            {
                "schema_version": SCHEMA_VERSION,
                "command": "compare",
                **record(comparison),
                "png": args.png,
                "calibration": calibration_record(scenario),
            }
        )
    else:
        print(text(comparison))
    return 0

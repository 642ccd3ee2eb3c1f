"""`stepsim run`: simulate one iteration of a scenario, print its summary, and with
--out write metrics.json, the pictures, the trace and the resolved scenario.

`stepsim jobs`: several jobs on one fabric (a jobs file: a [cluster] and [[job]] tables;
scenarios/README.md). Each job's iteration alone and together, its slowdown, where its
time went and the links it shared; --json, and with --out jobs.json and the together
run's trace (every job's GPUs, processes named by job)."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..scenario import ScenarioError, dumps_toml, scenario_to_dict
from .common import (
    calibration_argument,
    calibration_record,
    check_out,
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

TRACE_FILES = {"json": "trace.json", "gz": "trace.json.gz", None: None}  # --trace, --no-trace


def add_command(sub) -> None:
    run = sub.add_parser(
        "run",
        help="simulate a scenario (a file or a shipped name) and print a summary",
        description="Simulate one iteration of SCENARIO (a TOML file; see scenarios/README.md).",
    )
    scenario_arguments(
        run, "SECTION.KEY=VALUE", "override a scenario key, e.g. --set cluster.nic_gbps=400"
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        help="write metrics.json, timeline.svg, breakdown.svg (see --pictures), trace.json "
        "(see --trace) and scenario.resolved.toml to DIR",
    )
    run.add_argument(
        "--pictures",
        choices=PICTURE_FORMATS,
        default="svg",
        help="with --out, draw the timeline and breakdown as SVG (default: drawn from arrays, "
        "at a fraction of the run's cost), as PNG (matplotlib, about a second more) or not",
    )
    trace = run.add_mutually_exclusive_group()
    trace.add_argument(
        "--trace",
        choices=("json", "gz"),
        default="json",
        help="with --out, write the Perfetto trace as trace.json (default) or gzipped as "
        "trace.json.gz (Perfetto opens both)",
    )
    trace.add_argument(
        "--no-trace",
        dest="trace",
        action="store_const",
        const=None,
        help="with --out, write no trace",
    )
    run.add_argument("--json", action="store_true", help="print only the metrics JSON")
    run.add_argument(
        "--allow-oom",
        action="store_true",
        help="simulate a layout that does not fit in GPU memory (a warning, not an error)",
    )
    quiet_argument(run, "no progress line on the terminal while it runs")
    run.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..cost.memory import out_of_memory
    from ..run.iteration import (  # imported here so `stepsim --help` stays instant
        memory_per_stage,
        run,
    )

    scenario = load(args)
    check_out("--out", args.out)
    problem = out_of_memory(scenario, memory_per_stage(scenario))
    if problem and not args.allow_oom:
        raise ScenarioError(str(problem))
    if problem:
        print(f"warning: {problem}", file=sys.stderr)
    progress = progress_for(args)
    progress.begin("simulating")
    try:
        # only the metrics printed: the engine may add spans up rather than keep them
        result = run(scenario, progress.update, spans=bool(args.out) or not args.json)
        if args.out:  # the trace and pictures of a large run take seconds: say so
            progress.stage(f"writing {args.out}/: metrics, trace, pictures")
            with out_errors("--out", args.out):
                written = write_outputs(
                    result, Path(args.out), TRACE_FILES[args.trace], args.pictures
                )
    finally:
        progress.clear()
    if args.json:
        print(json.dumps(result.metrics.to_json(), indent=2))
    else:
        from ..report.summary import summary_text

        print(summary_text(result))
        if args.out:
            print(f"\n  wrote {args.out}/: {' '.join(written)}")
    return 0


PICTURE_FORMATS = ("svg", "png", "none")


def write_outputs(
    result, out: Path, trace_file: str | None = "trace.json", pictures: str = "svg"
) -> list[str]:
    """Write the run's files to ``out`` (the trace as ``trace_file``: trace.json,
    trace.json.gz or None for none; the timeline and breakdown as ``pictures``: svg,
    png or none); return their names in the order printed."""
    from ..report.trace import chrome_trace_chunks
    from ..run.idlemap import idle_pieces
    from ..run.iteration import gc_paused

    drawn = [] if pictures == "none" else [f"timeline.{pictures}", f"breakdown.{pictures}"]
    # the collector paused as for the run: the writing allocates millions of objects,
    # and each pass it triggered would walk the run's spans and ops again for nothing
    with gc_paused():
        idle = idle_pieces(result)  # the idle by cause, drawn in the trace and the timeline
        with out_folder(out, f"run {result.scenario.name}") as folder:
            folder.text("metrics.json", json.dumps(result.metrics.to_json(), indent=2) + "\n")
            folder.text("scenario.resolved.toml", dumps_toml(scenario_to_dict(result.scenario)))
            if trace_file is not None:
                # chrome_trace's document as compact JSON, streamed to the file as made
                chunks: Iterable[bytes] = (t.encode() for t in chrome_trace_chunks(result, idle))
                if trace_file.endswith(".gz"):
                    chunks = gzipped(chunks)
                folder.stream(trace_file, chunks)
            if pictures == "svg":  # drawn from arrays: matplotlib is not imported
                from ..report.pictures import breakdown_svg, timeline_svg

                folder.bytes(drawn[0], timeline_svg(result, idle))
                folder.bytes(drawn[1], breakdown_svg(result))
            elif pictures == "png":
                from ..report.timeline import breakdown_figure, timeline_figure

                folder.figure(drawn[0], timeline_figure(result, idle), dpi=110)
                folder.figure(drawn[1], breakdown_figure(result), dpi=110)
    names = ["metrics.json", *drawn, trace_file, "scenario.resolved.toml"]
    return [name for name in names if name is not None]


def gzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``gzip.compress(b"".join(chunks), mtime=0)`` made piece by piece: zlib's gzip
    wrapper at level 9, no time stamp (the same bytes every run), fed as they come."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    for chunk in chunks:
        packed = packer.compress(chunk)
        if packed:
            yield packed
    yield packer.flush()


# -- stepsim jobs ---------------------------------------------------------------------


def add_jobs_command(sub) -> None:
    jobs = sub.add_parser(
        "jobs",
        help="several jobs sharing one cluster's network: each one's slowdown",
        description="Simulate the jobs of JOBS (a jobs file, or the name of a shipped one in "
        "scenarios/jobs/) on one cluster, sharing its links: each alone on its nodes, then "
        "all together; print each job's iteration time both ways and its slowdown.",
    )
    jobs.add_argument("jobs", metavar="JOBS", help="a jobs file ([cluster] and [[job]] tables)")
    jobs.add_argument(
        "--out",
        metavar="DIR",
        help="write jobs.json and the together run's trace (trace.json; see --trace) to DIR",
    )
    trace = jobs.add_mutually_exclusive_group()
    trace.add_argument("--trace", choices=("json", "gz"), default="json", help="as `run`'s")
    trace.add_argument("--no-trace", dest="trace", action="store_const", const=None)
    calibration_argument(jobs)
    json_argument(jobs)
    quiet_argument(jobs, "no progress line on the terminal while it runs")
    jobs.set_defaults(handler=jobs_command)


def cluster_header(spec) -> str:
    c = spec.cluster
    fabric = c.fabric
    if fabric == "fat-tree":
        fabric = (
            f"{c.fabric_levels}-level fat tree, {c.nodes_per_leaf} nodes a leaf, "
            f"{c.spine_switches} spines, {c.oversubscription:g}:1 oversubscribed"
        )
    name = c.node or "custom"
    return (
        f"{c.num_nodes} {name} nodes ({c.num_nodes * c.gpus_per_node} GPUs, {c.gpu.name}), "
        f"{fabric} · fair-share network"
    )


def jobs_command(args: argparse.Namespace) -> int:
    from ..report.jobreport import jobs_text
    from ..run.multijob import run_jobs
    from ..scenario.jobfile import load_jobs

    spec = load_jobs(args.jobs)
    if args.calibration is not None:
        spec = calibrated_jobs(spec, args.calibration)
    check_out("--out", args.out)
    progress = progress_for(args)
    progress.begin("simulating the jobs together")
    try:
        result = run_jobs(spec, progress.update, keep_trace=bool(args.out and args.trace))
    finally:
        progress.clear()
    written = []
    if args.out:
        with out_errors("--out", args.out):
            written = write_jobs_outputs(result, spec, Path(args.out), args.trace)
    first = spec.jobs[0].scenario
    if args.json:
        document = result.to_json()
        document["calibration"] = calibration_record(first)
        print_json(document)
    else:
        print(jobs_text(result, spec.cluster, cluster_header(spec)))
        print("\n" + "\n".join(label_lines(first)))
        if written:
            print(f"\n  wrote {args.out}/: {' '.join(written)}")
    return 0


def calibrated_jobs(spec, calibration: str):
    """The jobs with a calibration file applied to each one's scenario and to the shared
    cluster (its NVLink and NIC fractions, when the file's fit moved them)."""
    from dataclasses import replace

    from ..scenario.jobfile import JobsSpec
    from ..scenario.loader import apply_calibration

    jobs = tuple(
        replace(job, scenario=apply_calibration(job.scenario, calibration)) for job in spec.jobs
    )
    return JobsSpec(spec.name, jobs[0].scenario.cluster, jobs)


def write_jobs_outputs(result, spec, out: Path, trace: str | None) -> list[str]:
    from ..report.jobreport import jobs_trace

    names = ["jobs.json"]
    with out_folder(out, f"jobs {spec.name}") as folder:
        folder.text("jobs.json", json.dumps(result.to_json(), indent=2) + "\n")
        if trace is not None:
            text = json.dumps(jobs_trace(result, spec), separators=(",", ":")).encode()
            name = "trace.json"
            if trace == "gz":
                text, name = gzip.compress(text, mtime=0), "trace.json.gz"
            folder.bytes(name, text)
            names.append(name)
    return names

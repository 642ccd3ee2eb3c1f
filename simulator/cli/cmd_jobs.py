"""`stepsim jobs`: several jobs on one fabric (a jobs file: a [cluster] and [[job]]
tables; scenarios/README.md). Each job's iteration alone and together, its slowdown,
where its time went and the links it shared; --json, and with --out jobs.json and the
together run's trace (every job's GPUs, processes named by job)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from .common import json_argument, print_json, progress_for, quiet_argument


def add_command(sub) -> None:
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
    json_argument(jobs)
    quiet_argument(jobs, "no progress line on the terminal while it runs")
    jobs.set_defaults(handler=command)


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


def command(args: argparse.Namespace) -> int:
    from ..report.jobs import jobs_text
    from ..run.multijob import run_jobs
    from ..scenario.jobfile import load_jobs

    spec = load_jobs(args.jobs)
    progress = progress_for(args)
    progress.begin("simulating the jobs together")
    try:
        result = run_jobs(spec, progress.update, keep_trace=bool(args.out and args.trace))
    finally:
        progress.clear()
    written = []
    if args.out:
        written = write_outputs(result, spec, Path(args.out), args.trace)
    if args.json:
        print_json(result.to_json())
    else:
        print(jobs_text(result, spec.cluster, cluster_header(spec)))
        if written:
            print(f"\n  wrote {args.out}/: {' '.join(written)}")
    return 0


def write_outputs(result, spec, out: Path, trace: str | None) -> list[str]:
    from ..report.jobtrace import jobs_trace

    out.mkdir(parents=True, exist_ok=True)
    (out / "jobs.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    names = ["jobs.json"]
    if trace is not None:
        text = json.dumps(jobs_trace(result, spec), separators=(",", ":")).encode()
        name = "trace.json"
        if trace == "gz":
            text, name = gzip.compress(text, mtime=0), "trace.json.gz"
        (out / name).write_bytes(text)
        names.append(name)
    return names

"""`stepsim schedule`: a pipeline schedule on abstract op times, no cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stepsim.schedules import DUAL, PLACEMENTS, SCHEDULES
from stepsim.schedules.custom import sizes_of
from stepsim.schedules.torch_csv import to_torch_csv

from ..plan.space import int_list
from ..scenario import check_limit, read_schedule_file
from .common import check_out, out_errors, progress_for, quiet_argument
from .outfolder import out_folder


def builder_ops(name: str, stages: int, microbatches: int) -> int:
    """What building a schedule's orders costs beyond the ops built, counted in
    simulated ops (the ``schedule_ops`` limit's unit). Measured on the 2-core machine of
    2026-11-28 with F = B = W = 1: `zbv` (its authors' timed greedy, every op placed in
    each of its eight attempts) took 17-39 us per op built, about as long as simulating
    one (32-45 us), so it counts once more; `zbv_unit`'s unit-step list scheduler takes
    2-7 us per rank and step, at most 6m + 4p steps, about a sixth of an op each. The
    other builders cost under 4 us per op: nothing."""
    p, m = stages, microbatches
    if name == "zbv":
        return 6 * p * m
    if name == "zbv_unit":
        return p * (6 * m + 4 * p) // 6
    return 0


# What --out adds, in simulated ops (measured as builder_ops was): drawing schedule.png
# and writing trace.json took 1.5 times as long as simulating per op (interleaved_zb,
# 160 stages x 960 micro-batches: 27 s, 67 s with --out) and about 0.3 s per panel
# (--compare of 60 schedules of 8 x 32: 2 s, 24 s with --out), 10,000 ops' worth.
DRAWN_OP = 1.5
PANEL_OPS = 10_000


def schedule_work(ops: int, built: list[str], stages: int, microbatches: int, drawn: int) -> int:
    """The ``schedule_ops`` a run costs: its ops (as run.bubble counts them), what
    building the named schedules ``built`` costs, and the picture and the trace of
    ``drawn`` panels (--out; 0 without)."""
    work = ops + sum(builder_ops(n, stages, microbatches) for n in built)
    if drawn:
        work += int(DRAWN_OP * ops) + PANEL_OPS * drawn
    return work


def add_command(sub) -> None:
    sched = sub.add_parser(
        "schedule",
        help="a pipeline schedule on abstract op times: makespan, bubble, memory, picture",
        description="Run a pipeline schedule on abstract op times, no cluster: F, B, W per "
        "micro-batch and stage (any unit; the outputs use the same), c per hop between stages. "
        "Schedules that do not split the backward run one fused backward of B + W.",
    )
    which = sched.add_mutually_exclusive_group(required=True)
    which.add_argument("--schedule", metavar="NAME", help=f"one of: {', '.join(SCHEDULES)}")
    which.add_argument(
        "--compare", metavar="A,B,...", help="several schedules, stacked in one picture"
    )
    which.add_argument(
        "--schedule-file",
        metavar="FILE",
        help="per-rank op orders: one line per rank of labels F3 B3 W3 (F3.1 = chunk 1; "
        "F3.0&B1.1 = a forward and a backward run overlapped), or torch.distributed.pipelining's "
        "action CSV (0F3,0I3,0W3; compute_only or compute_comms)",
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
        choices=list(PLACEMENTS),
        default=None,
        help="--schedule-file only: chunk k of rank r is stage k*p+r (looped, the default for "
        "stepsim's labels), a V, or DualPipe's two model copies (dual: micro-batches 0..m/2-1 "
        "from rank 0 on chunk 0, the rest from rank p-1 on chunk 1); a torch CSV's stage "
        "numbers give it",
    )
    sched.add_argument(
        "--forward",
        type=float,
        required=True,
        metavar="F",
        help="time of one micro-batch's forward on one stage (any unit; all times share it)",
    )
    sched.add_argument(
        "--backward",
        type=float,
        required=True,
        metavar="B",
        help="time of one micro-batch's backward on one stage: the input gradient only when "
        "--weight is given, else the whole backward",
    )
    sched.add_argument(
        "--weight",
        type=float,
        default=None,
        metavar="W",
        help="time of the weight-gradient pass, for schedules that run it apart (zbh1, zbh2, "
        "interleaved_zb, zbv, zbv_unit, dualpipe, dualpipev); others run B + W as one "
        "backward; zbv orders its ops by these times",
    )
    sched.add_argument(
        "--overlapped",
        type=float,
        default=None,
        metavar="F&B",
        help="time of an overlapped pair (dualpipe, dualpipev, F3&B1 in a file): one "
        "micro-batch's forward and another's full backward run together on one stage "
        "(default F + B + W, no gain)",
    )
    sched.add_argument(
        "--p2p-latency",
        type=float,
        default=0.0,
        metavar="C",
        help="time of one send between neighbouring stages (default 0)",
    )
    sched.add_argument(
        "--stage-layers",
        metavar="L0,L1,...",
        help="layers per rank (an uneven split, e.g. 5,6,6,5): F, B and W are then per "
        "layer and rank r's ops last L_r times as long",
    )
    sched.add_argument("--json", action="store_true", help="print the results as JSON")
    quiet_argument(sched, "no progress line on the terminal while it runs and writes")
    sched.add_argument(
        "--out",
        metavar="DIR",
        help="write schedule.png, trace.json and each schedule's per-rank actions as "
        "torch.distributed.pipelining's CSV (NAME.torch.csv) to DIR",
    )
    sched.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..report.tables import study_text
    from ..report.trace import study_trace
    from ..run.bubble import check_sizes, op_times, studies_of_schedules, study_of_orders

    times = op_times(args.forward, args.backward, args.weight, args.p2p_latency, args.overlapped)
    stage_layers = int_list("--stage-layers", args.stage_layers)
    sizes = {
        "--stages": args.stages,
        "--microbatches": args.microbatches,
        "--chunks": args.chunks,
    }
    check_sizes({**sizes, "--group-size": args.group_size})
    check_out("--out", args.out)
    weight_given = args.weight is not None
    progress = progress_for(args)
    if args.schedule_file is not None:
        path = Path(args.schedule_file)
        where = f"--schedule-file {str(path)!r}"
        orders, placement = read_schedule_file(path, where, args.placement)
        if args.out:  # its ops as study_of_orders counts them, and the picture
            p, m, v, _ = sizes_of(orders)
            ops = p * m * v * 3
            check_limit(
                "schedule_ops",
                schedule_work(ops, [], p, m, drawn=1),
                f"{where}: {p} ranks x {m} micro-batches x {v} chunks, drawn (--out), is",
            )
        studies = [
            study_of_orders(
                path.stem,
                orders,
                times,
                weight_given=weight_given,
                placement=placement,
                sizes=sizes,
                where=where,
                stage_layers=stage_layers,
            )
        ]
    else:
        names = (
            [args.schedule]
            if args.schedule is not None
            else [n.strip() for n in args.compare.split(",")]
        )
        if args.stages and args.microbatches:  # else studies_of_schedules says so
            # the ops as studies_of_schedules counts them (it checks them alone), with what
            # building zbv's orders and drawing cost
            p, m = args.stages, args.microbatches
            ops = p * m * 3 * max(args.chunks or 2, 2) * len(names)
            work = schedule_work(ops, names, p, m, len(names) if args.out else 0)
            if work > ops:
                check_limit(
                    "schedule_ops",
                    work,
                    f"--stages={p} x --microbatches={m} x {len(names)} schedule(s), with "
                    + ("drawing (--out) and " if args.out else "")
                    + "what building their orders costs, means",
                )
        progress.begin(f"simulating {len(names)} schedule{'s' if len(names) > 1 else ''}")
        studies = studies_of_schedules(
            names,
            args.stages,
            args.microbatches,
            times,
            weight_given=weight_given,
            chunks=args.chunks,
            group_size=args.group_size,
            stage_layers=stage_layers,
        )
    progress.clear()
    if args.json:
        dicts = [s.as_dict() for s in studies]
        print(json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2))
    else:
        print(study_text(studies))
    if args.out:
        from ..report.timeline import pipeline_figure

        out = Path(args.out)
        panels = f"{len(studies)} panel{'s' if len(studies) > 1 else ''}"
        try:
            with out_errors("--out", args.out), out_folder(out, "schedule") as folder:
                progress.begin(f"drawing {args.out}/schedule.png ({panels})")
                folder.figure("schedule.png", pipeline_figure(studies), dpi=110)
                progress.begin(f"writing {args.out}/trace.json")
                folder.text("trace.json", json.dumps(study_trace(studies), separators=(",", ":")))
                written = ["schedule.png", "trace.json"]
                for study in studies:
                    if study.placement == DUAL:  # two model copies: no torch schedule runs them
                        continue
                    name = f"{study.name}.torch.csv"
                    folder.text(name, to_torch_csv(study.orders, study.placement))
                    written.append(name)
        finally:
            progress.clear()
        if not args.json:
            print(f"\n  wrote {args.out}/: {' '.join(written)}")
    return 0

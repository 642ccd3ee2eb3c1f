"""`stepsim schedule`: a pipeline schedule on abstract op times, no cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stepsim.schedules import DUAL, PLACEMENTS, SCHEDULES
from stepsim.schedules.torch_csv import to_torch_csv

from ..plan.space import int_list
from ..scenario import read_schedule_file
from .common import check_out, out_errors, quiet_argument


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
    quiet_argument(sched, "accepted as every command takes it (schedule shows no progress line)")
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
    if args.schedule_file is not None:
        path = Path(args.schedule_file)
        where = f"--schedule-file {str(path)!r}"
        orders, placement = read_schedule_file(path, where, args.placement)
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
    if args.json:
        dicts = [s.as_dict() for s in studies]
        print(json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2))
    else:
        print(study_text(studies))
    if args.out:
        from ..report.timeline import pipeline_figure

        out = Path(args.out)
        with out_errors("--out", args.out):
            out.mkdir(parents=True, exist_ok=True)
            pipeline_figure(studies).savefig(out / "schedule.png", dpi=110)
            trace = json.dumps(study_trace(studies), separators=(",", ":"))
            (out / "trace.json").write_text(trace)
            written = ["schedule.png", "trace.json"]
            for study in studies:
                if study.placement == DUAL:  # two model copies: no torch schedule runs them
                    continue
                name = f"{study.name}.torch.csv"
                (out / name).write_text(to_torch_csv(study.orders, study.placement))
                written.append(name)
        if not args.json:
            print(f"\n  wrote {args.out}/: {' '.join(written)}")
    return 0

"""`stepsim plan`: fit, throughput, time-to-train, scale and goodput, each answered
from a scenario's model, cluster and training settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..plan.goodput import (
    DEFAULT_MTBF_GPU_HOURS,
    DEFAULT_RESTART_MINUTES,
    DEFAULT_STORAGE_GBYTES_PER_S,
    FLEET_FAILURES_PER_1000_NODE_DAYS,
    Reliability,
    costs_of,
    intervals,
)

# from plan.planning, not plan.questions: `stepsim run` loads this module too
from ..plan.planning import SCALE_KEEPS, model_params, with_nodes
from ..plan.space import int_list
from ..scenario import ScenarioError
from .common import (
    Parser,
    Workers,
    calibration_columns,
    calibration_record,
    check_out,
    json_argument,
    load,
    out_errors,
    print_json,
    progress_for,
    quiet_argument,
    scenario_arguments,
    space_arguments,
    space_of,
    tokens_argument,
    worker_arguments,
    write_rows,
)
from .outfolder import out_folder


def add_command(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="planning questions: fit, throughput, time-to-train, scale, goodput",
        description="Questions asked before renting a cluster, each answered from SCENARIO's "
        "model, cluster and training settings.",
    )
    questions = plan.add_subparsers(dest="question", required=True, parser_class=Parser)
    fit = questions.add_parser(
        "fit",
        help="the largest model of a family that fits on N nodes, or the fewest nodes a "
        "model needs",
        description="With --nodes N: which models of --family fit on N of SCENARIO's nodes "
        "(memory only), and the fastest layout of the largest (simulated). With --min-nodes: "
        "the fewest nodes on which SCENARIO's model fits, and its fastest layout there.",
    )
    scenario_arguments(fit, "SECTION.KEY=VALUE", "override a key of the base scenario")
    goal = fit.add_mutually_exclusive_group(required=True)
    goal.add_argument("--nodes", type=int, metavar="N", help="nodes available")
    goal.add_argument(
        "--min-nodes", action="store_true", help="the fewest nodes for the scenario's model"
    )
    fit.add_argument(
        "--family",
        default="gpt3",
        metavar="NAME",
        help="model family for --nodes: gpt3 (Brown et al. 2020) or megatron "
        "(Narayanan et al. 2021, 1.7B to 1T); default gpt3",
    )
    fit.add_argument(
        "--max-nodes", type=int, default=1024, metavar="N", help="--min-nodes: look up to N"
    )
    fit.add_argument(
        "--no-simulate", action="store_true", help="memory only: skip finding the fastest layout"
    )
    space_arguments(fit)
    json_argument(fit)
    worker_arguments(fit)
    fit.set_defaults(handler=fit_command)
    for name, text in (
        ("throughput", "tokens/s, TFLOP/s per GPU and MFU of SCENARIO; with --tokens, days"),
        ("time-to-train", "days and GPU-hours to train SCENARIO on --tokens tokens"),
    ):
        q = questions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        scenario_arguments(q, "SECTION.KEY=VALUE", "override a scenario key")
        tokens_argument(q, "training tokens", required=name == "time-to-train")
        q.add_argument(
            "--goodput",
            action="store_true",
            help="divide the days by the goodput of `plan goodput` (with its defaults for "
            "the reliability flags not given; any of them turns this on)",
        )
        reliability_arguments(q)
        json_argument(q)
        quiet_argument(q)
        q.set_defaults(handler=throughput_command, question=name)
    scale = questions.add_parser(
        "scale",
        help="iteration time and throughput against node count (data parallelism)",
        description="Run SCENARIO's layout on each node count of --nodes, data parallelism "
        "taking up the change, and tabulate throughput, speedup and scaling efficiency.",
    )
    scenario_arguments(scale, "SECTION.KEY=VALUE", "override a scenario key")
    scale.add_argument(
        "--nodes", required=True, metavar="N1,N2,...", help="node counts, e.g. 16,32,64,128"
    )
    scale.add_argument(
        "--keep",
        choices=list(SCALE_KEEPS),
        default=SCALE_KEEPS[0],
        help="strong scaling: the same global batch (default); weak: the same micro-batches "
        "per pipeline, the global batch growing with DP",
    )
    tokens_argument(scale, "add days and GPU-hours for this many training tokens")
    scale.add_argument("--out", metavar="DIR", help="write scale.csv and scale.png to DIR")
    json_argument(scale)
    worker_arguments(scale)
    scale.set_defaults(handler=scale_command)
    goodput = questions.add_parser(
        "goodput",
        help="the share of a run's wall time spent on useful iterations, with failures, "
        "checkpoints and restarts, and the best checkpoint interval",
        description="Expected fractions of wall time spent on useful iterations, checkpoint "
        "writes, lost (recomputed) work and restarts, for SCENARIO's simulated iteration "
        "time, exponential GPU failures and checkpoints of its model and optimizer state "
        "(Daly 2006); the checkpoint interval of the highest goodput, searched in whole "
        "iterations, beside Young's (1974) and Daly's (2006) closed forms.",
    )
    scenario_arguments(goodput, "SECTION.KEY=VALUE", "override a scenario key")
    reliability_arguments(goodput)
    goodput.add_argument(
        "--iteration-s",
        type=float,
        metavar="S",
        help="take this iteration time instead of simulating SCENARIO",
    )
    tokens_argument(goodput, "add the run's days for this many training tokens")
    json_argument(goodput)
    quiet_argument(goodput)
    goodput.set_defaults(handler=goodput_command)


RELIABILITY_FLAGS = (
    "mtbf_gpu_hours",
    "checkpoint_interval",
    "storage_gbytes_per_s",
    "read_gbytes_per_s",
    "restart_minutes",
    "async_checkpoint",
)


def reliability_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reliability (docs/what-if.md, Goodput)")
    group.add_argument(
        "--mtbf-gpu-hours",
        type=float,
        metavar="H",
        help="mean time between job-interrupting failures of one GPU, hours; the job's is "
        f"H / its GPUs (default {DEFAULT_MTBF_GPU_HOURS:,.0f}: Kokolis et al. 2024's "
        f"{FLEET_FAILURES_PER_1000_NODE_DAYS:.2f} per 1,000 node-days of 8 GPUs; inf: none)",
    )
    group.add_argument(
        "--checkpoint-interval",
        type=int,
        metavar="N",
        help="iterations between checkpoints (default: the best, searched)",
    )
    group.add_argument(
        "--storage-gbytes-per-s",
        type=float,
        metavar="X",
        help="aggregate checkpoint write bandwidth, GB/s "
        f"(default {DEFAULT_STORAGE_GBYTES_PER_S:g})",
    )
    group.add_argument(
        "--read-gbytes-per-s",
        type=float,
        metavar="X",
        help="aggregate checkpoint read bandwidth, GB/s (default: the write bandwidth)",
    )
    group.add_argument(
        "--restart-minutes",
        type=float,
        metavar="M",
        help=f"re-queue and start-up after a failure (default {DEFAULT_RESTART_MINUTES:g})",
    )
    group.add_argument(
        "--async-checkpoint",
        action="store_true",
        default=None,
        help="training waits only for the copy to host memory (Megatron's --async-save)",
    )


def reliability_of(args: argparse.Namespace):
    given = {
        "mtbf_gpu_hours": args.mtbf_gpu_hours,
        "storage_write_gbytes_per_s": args.storage_gbytes_per_s,
        "storage_read_gbytes_per_s": args.storage_gbytes_per_s
        if args.read_gbytes_per_s is None
        else args.read_gbytes_per_s,
        "restart_s": None if args.restart_minutes is None else args.restart_minutes * 60,
        "async_save": bool(args.async_checkpoint),
    }
    return Reliability(**{k: v for k, v in given.items() if v is not None})


def _fastest(scenario, space, args: argparse.Namespace):
    """The fastest layout of the space for the scenario (a search for the top one)."""
    from ..plan.search import search

    progress = progress_for(args)
    progress.begin(f"searching {scenario.name}")

    def on_result(candidate, i: int, n: int) -> None:
        progress.task = f"searching {scenario.name}: simulated {i} (of at most {n})"
        progress.update(i / n)

    try:
        with Workers(args) as workers:
            result = search(scenario, space, top=1, executor=workers.executor, on_result=on_result)
    finally:
        progress.clear()
    return result.ranked[0] if result.ranked else None


def fit_command(args: argparse.Namespace) -> int:
    from ..plan.answers import fit_text, min_nodes_text
    from ..plan.questions import check_family, fit_family, largest_fitting, min_nodes

    base = load(args)
    space = space_of(args)
    if args.min_nodes:
        nodes, fitting = min_nodes(base, space, args.max_nodes)
        best = None
        if nodes and not args.no_simulate:
            best = _fastest(with_nodes(base, nodes), space, args)
        if args.json:
            from ..plan.records import min_nodes_record

            record = min_nodes_record(base, nodes, fitting, best, args.max_nodes)
            print_json(labelled({**record, "memory_headroom": space.memory_headroom}, base))
        else:
            print(min_nodes_text(base, model_params(base), nodes, fitting, best, args.max_nodes))
            print(f"  memory headroom: {100 * space.memory_headroom:g} % of each GPU kept free")
        return 0
    check_family(args.family)
    if args.nodes < 1:
        raise ScenarioError(f"--nodes={args.nodes} must be >= 1")
    cluster_base = with_nodes(base, args.nodes)
    rows = fit_family(cluster_base, args.family, space)
    largest = largest_fitting(rows)
    best = None
    if largest is not None and not args.no_simulate:
        best = _fastest(largest.scenario, space, args)
    if args.json:
        from ..plan.records import fit_record

        record = fit_record(cluster_base, rows, args.nodes, best)
        print_json(labelled({**record, "memory_headroom": space.memory_headroom}, base))
    else:
        print(fit_text(cluster_base, rows, args.nodes, best, space.memory_headroom))
    return 0


def throughput_command(args: argparse.Namespace) -> int:
    from ..plan.answers import throughput_text
    from ..plan.questions import (
        check_fits,
        check_tokens,
        flops_factor,
        narayanan_days,
        training_time,
    )
    from ..plan.search import simulate_row

    scenario = load(args)
    check_tokens(args.tokens)
    with_goodput = args.goodput or any(getattr(args, f) is not None for f in RELIABILITY_FLAGS)
    if with_goodput:
        reliability_of(args)  # bad flags fail before a simulation
    check_fits(scenario)
    progress = progress_for(args)
    progress.begin("simulating")
    try:
        metrics = simulate_row(scenario)
    finally:
        progress.clear()
    params = model_params(scenario)
    reliable = None
    if with_goodput:
        _, _, costs, rows = _goodput_of(args, scenario, metrics.iteration_time_s)
        reliable = (costs, rows)
    times = estimate = None
    factor = flops_factor(scenario)
    if args.tokens is not None:
        times = training_time(metrics, args.tokens)
        estimate = narayanan_days(
            params, args.tokens, metrics.num_gpus, metrics.hardware_tflops_per_gpu, factor
        )
    if args.json:
        from ..plan.records import throughput_record

        record = throughput_record(scenario, params, metrics, args.tokens, times, estimate)
        if reliable is not None:
            from ..plan.records import run_goodput_record

            record["goodput"] = run_goodput_record(*reliable, times)
        print_json(labelled(record, scenario))
    else:
        text = throughput_text(
            scenario, params, metrics, args.tokens, times, estimate, factor, args.question
        )
        if reliable is not None:
            from ..plan.answers import run_goodput_text

            text += "\n" + run_goodput_text(*reliable, times)
        print(text)
        noted(scenario)
    return 0


def scale_command(args: argparse.Namespace) -> int:
    from ..plan.answers import scale_text
    from ..plan.questions import check_fits, check_tokens, scale_points, scale_scenarios

    base = load(args)
    nodes = int_list("--nodes", args.nodes)
    check_tokens(args.tokens)
    check_out("--out", args.out)
    entries = scale_scenarios(base, sorted(set(nodes)), args.keep)
    runnable = [(i, sc) for i, (_, sc, _) in enumerate(entries) if sc is not None]
    results = [None] * len(entries)
    progress = progress_for(args)
    progress.begin(f"simulating {len(runnable)} node counts")
    for _, sc in runnable:
        try:
            check_fits(sc)
        except ScenarioError as exc:
            raise ScenarioError(f"{sc.cluster.num_nodes} nodes: {exc}") from None

    def done(j: int, metrics) -> None:
        results[runnable[j][0]] = metrics
        progress.update(sum(r is not None for r in results) / len(runnable))

    try:
        with Workers(args) as workers:
            workers.executor([sc for _, sc in runnable], done)
    finally:
        progress.clear()
    points = scale_points(entries, results, args.tokens)
    if args.json:
        from ..plan.records import scale_record

        print_json(labelled(scale_record(base, points, args.keep), base))
    else:
        print(scale_text(base, points, args.keep, args.tokens))
        noted(base)
    if args.out:
        from ..report.figures import scale_figure

        out = Path(args.out)
        rows = [{**p.row(), **calibration_columns(base)} for p in points if p.metrics is not None]
        with out_errors("--out", args.out), out_folder(out, f"plan scale {base.name}") as folder:
            written = write_rows(folder, "scale", rows)
            figure = scale_figure(points, f"{base.name}: scaling with data parallelism")
            folder.figure("scale.png", figure, dpi=110)
        if not args.json:
            print(f"\n  wrote {args.out}/: {' '.join(written)} scale.png")
    return 0


def _goodput_of(args: argparse.Namespace, scenario, iteration_s: float):
    """The reliability inputs, their costs and the interval rows for a scenario."""
    rel = reliability_of(args)
    params = model_params(scenario)
    costs = costs_of(
        rel, iteration_s, scenario.parallel.num_gpus, params, scenario.cluster.pcie_gbytes_per_s
    )
    return rel, params, costs, intervals(costs, args.checkpoint_interval)


def goodput_command(args: argparse.Namespace) -> int:
    from ..plan.answers import goodput_text
    from ..plan.questions import check_fits, check_tokens
    from ..plan.search import simulate_row

    scenario = load(args)
    check_tokens(args.tokens)
    reliability_of(args)  # bad flags fail before a simulation
    simulated = args.iteration_s is None
    iteration_s = args.iteration_s
    if simulated:
        check_fits(scenario)
        progress = progress_for(args)
        progress.begin("simulating")
        try:
            iteration_s = simulate_row(scenario).iteration_time_s
        finally:
            progress.clear()
    rel, params, costs, rows = _goodput_of(args, scenario, iteration_s)
    if args.json:
        from ..plan.records import goodput_record

        print_json(
            labelled(
                goodput_record(scenario, params, rel, costs, rows, simulated, args.tokens), scenario
            )
        )
    else:
        tokens_per_iteration = scenario.training.global_batch_size * scenario.model.seq_length
        print(
            goodput_text(
                scenario, params, rel, costs, rows, simulated, args.tokens, tokens_per_iteration
            )
        )
        noted(scenario)
    return 0


def labelled(record: dict, scenario) -> dict:
    """A --json answer with what it rests on: the calibration label, the assumptions and
    a calibration file's fit, if any (report/labels.py)."""
    return {**record, "calibration": calibration_record(scenario)}


def noted(scenario) -> None:
    """Nothing: a text answer's header carries the labels (plan.answers.describe_base)."""

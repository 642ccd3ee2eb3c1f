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

from .. import __version__
from ..engine.core import DeadlockError
from ..scenario.loader import (
    ScenarioError,
    dumps_toml,
    load_scenario,
    read_schedule_file,
    scenario_to_dict,
)

EXIT_USAGE = 2
# the calibration set, shipped with the project (an editable install finds it here)
DEFAULT_VALIDATION_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "validation"
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

    search = sub.add_parser(
        "search",
        help="find the fastest layout (TP/PP/DP, micro-batch, schedule, ...) by simulation",
        description="Enumerate layouts of SCENARIO's model on its cluster (its global batch "
        "and network kept), drop those that do not fit in memory, and rank the rest by "
        "simulated throughput. Layouts whose compute alone is slower than the k-th best "
        "simulated are pruned unsimulated (--no-prune simulates all). With --out, results "
        "are kept as they finish and an interrupted search resumes where it stopped.",
    )
    _scenario_arguments(search, "SECTION.KEY=VALUE", "override a key of the base scenario")
    _space_arguments(search)
    search.add_argument("--top", type=int, default=10, metavar="K", help="show K (default 10)")
    search.add_argument("--no-prune", action="store_true", help="simulate every layout that fits")
    search.add_argument(
        "--out",
        metavar="DIR",
        help="write search.csv (and search.parquet with pyarrow) of every layout to DIR, and "
        "keep finished results in DIR/search.jsonl to resume from",
    )
    _worker_arguments(search)

    plan = sub.add_parser(
        "plan",
        help="planning questions: fit, throughput, time-to-train, scale",
        description="Questions asked before renting a cluster, each answered from SCENARIO's "
        "model, cluster and training settings.",
    )
    questions = plan.add_subparsers(dest="question", required=True, parser_class=_Parser)
    fit = questions.add_parser(
        "fit",
        help="the largest model of a family that fits on N nodes, or the fewest nodes a "
        "model needs",
        description="With --nodes N: which models of --family fit on N of SCENARIO's nodes "
        "(memory only), and the fastest layout of the largest (simulated). With --min-nodes: "
        "the fewest nodes on which SCENARIO's model fits, and its fastest layout there.",
    )
    _scenario_arguments(fit, "SECTION.KEY=VALUE", "override a key of the base scenario")
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
    _space_arguments(fit)
    _worker_arguments(fit)
    for name, text in (
        ("throughput", "tokens/s, TFLOP/s per GPU and MFU of SCENARIO; with --tokens, days"),
        ("time-to-train", "days and GPU-hours to train SCENARIO on --tokens tokens"),
    ):
        q = questions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _scenario_arguments(q, "SECTION.KEY=VALUE", "override a scenario key")
        q.add_argument(
            "--tokens",
            type=float,
            required=name == "time-to-train",
            metavar="T",
            help="training tokens, e.g. 300e9",
        )
        q.add_argument("--quiet", action="store_true", help="no progress line")
    scale = questions.add_parser(
        "scale",
        help="iteration time and throughput against node count (data parallelism)",
        description="Run SCENARIO's layout on each node count of --nodes, data parallelism "
        "taking up the change, and tabulate throughput, speedup and scaling efficiency.",
    )
    _scenario_arguments(scale, "SECTION.KEY=VALUE", "override a scenario key")
    scale.add_argument(
        "--nodes", required=True, metavar="N1,N2,...", help="node counts, e.g. 16,32,64,128"
    )
    scale.add_argument(
        "--keep",
        choices=["global-batch", "microbatches"],
        default="global-batch",
        help="strong scaling: the same global batch (default); weak: the same micro-batches "
        "per pipeline, the global batch growing with DP",
    )
    scale.add_argument("--tokens", type=float, metavar="T", help="add days and GPU-hours")
    scale.add_argument("--out", metavar="DIR", help="write scale.csv and scale.png to DIR")
    _worker_arguments(scale)

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


def _space_arguments(parser: argparse.ArgumentParser) -> None:
    space = parser.add_argument_group("search space (comma-separated values)")
    space.add_argument("--tp", metavar="LIST", help="tensor parallel (default: divisors of a node)")
    space.add_argument("--pp", metavar="LIST", help="pipeline parallel (default: layer divisors)")
    space.add_argument("--micro-batch", metavar="LIST", default="1,2,4,8", help="default 1,2,4,8")
    space.add_argument(
        "--schedules", metavar="LIST", default="1f1b,interleaved", help="default 1f1b,interleaved"
    )
    space.add_argument(
        "--chunks", metavar="LIST", default="2", help="chunks per rank of chunked schedules (2)"
    )
    space.add_argument(
        "--recompute", metavar="LIST", default="none,selective,full", help="default all three"
    )
    space.add_argument(
        "--sharding",
        metavar="LIST",
        default="none,optimizer",
        help="data-parallel sharding: none, optimizer (ZeRO-1), full (FSDP); default the first two",
    )
    space.add_argument(
        "--sequence-parallel",
        choices=["both", "on", "off"],
        default="both",
        help="with TP > 1 (default both)",
    )


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="local worker processes (default: the CPUs)"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="simulate on a Ray cluster at ADDRESS, or on Ray started here when no address "
        "is given (pip install 'stepsim[ray]')",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def _int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    values = []
    for item in text.split(","):
        try:
            value = int(item.strip())
        except ValueError:
            raise ScenarioError(f"{flag}={text!r}: {item.strip()!r} is not an integer") from None
        if value < 1:
            raise ScenarioError(f"{flag}={text!r}: every value must be >= 1")
        values.append(value)
    return tuple(values)


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _space(args: argparse.Namespace):
    from ..plan.planning import SearchSpace

    space = SearchSpace(
        tp=_int_list("--tp", args.tp),
        pp=_int_list("--pp", args.pp),
        micro_batch=_int_list("--micro-batch", args.micro_batch),
        schedules=_name_list(args.schedules),
        chunks=_int_list("--chunks", args.chunks),
        recompute=_name_list(args.recompute),
        sharding=_name_list(args.sharding),
        sequence_parallel={"both": (False, True), "on": (True,), "off": (False,)}[
            args.sequence_parallel
        ],
    )
    flags = {
        "schedules": "--schedules",
        "recompute": "--recompute",
        "sharding": "--sharding",
        "micro_batch": "--micro-batch",
        "chunks": "--chunks",
    }
    try:
        space.check()
    except ScenarioError as exc:
        message = str(exc).removeprefix("search ")
        name = message.split("=", 1)[0].split(" ", 1)[0]
        raise ScenarioError(message.replace(name, flags.get(name, "--" + name), 1)) from None
    return space


class _Workers:
    """The executor the command's flags ask for, closed when done."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ..plan.executors import LocalPool, RayPool, default_jobs

        jobs = args.jobs if args.jobs is not None else default_jobs()
        if jobs < 1:
            raise ScenarioError(f"--jobs={jobs} must be >= 1")
        if args.ray is not None:
            self.executor = RayPool(args.ray or None, jobs)
            self.where = f"on Ray at {args.ray}" if args.ray else f"on Ray here, {jobs} CPUs"
        else:
            self.executor = LocalPool(jobs)
            self.where = f"{jobs} local process" + ("es" if jobs > 1 else "")

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.close()


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
        if args.command == "search":
            return _search(args)
        if args.command == "plan":
            return _plan(args)
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
    from ..run import memory_per_stage, run  # imported here so `stepsim --help` stays instant
    from ..workload.memory import out_of_memory

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
        from ..report.text import summary_text

        print(summary_text(result))
        if args.out:
            print(
                f"\n  wrote {args.out}/: metrics.json timeline.png breakdown.png trace.json "
                "scenario.resolved.toml"
            )
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from ..plan.sweep import run_sweep
    from ..report.figures import sweep_figure
    from ..report.text import sweep_table_text
    from ..run import run

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
    from ..calibration.validation import compare, summary
    from ..report.text import validation_markdown, validation_text
    from ..run import run
    from ..scenario.loader import read_calibration, read_validation_set

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
        from ..report.figures import validation_figure

        out = Path(args.out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        validation_figure(comparisons).savefig(out / "images" / "validation.png", dpi=110)
        (out / "validation.md").write_text(
            validation_markdown(comparisons, summary(comparisons), calibration), encoding="utf-8"
        )
        print(f"\n  wrote {args.out}/validation.md and {args.out}/images/validation.png")
    return 0


def _journal_header(base) -> dict:
    """What a search's results depend on besides the layout: the base scenario (layout
    keys aside), its kernel constants and stepsim's version."""
    from dataclasses import asdict

    raw = scenario_to_dict(base)
    raw.pop("parallel")
    from ..plan.planning import SCHEDULE_BOUND_KEYS

    layout_keys = (
        "micro_batch_size",
        "schedule",
        "recompute_granularity",
        "data_parallel_sharding",
    )
    for key in (*layout_keys, *SCHEDULE_BOUND_KEYS):
        raw["training"].pop(key, None)
    raw.pop("name")
    calibration = asdict(base.calibration) if base.calibration is not None else None
    return {"version": __version__, "scenario": raw, "calibration": calibration}


def _search(args: argparse.Namespace) -> int:
    from ..plan.planning import (
        SIMULATED,
        apply_layout,
        model_params,
        result_rows,
        rule_of_thumb,
        search,
    )
    from ..plan.planning import simulate_row as simulate_one
    from ..plan.text import search_text
    from ..scenario.loader import read_search_journal

    base = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    space = _space(args)
    if args.top < 1:
        raise ScenarioError(f"--top={args.top} must be >= 1")
    known: dict[str, dict] = {}
    journal = None
    header = json.loads(json.dumps(_journal_header(base)))  # as it reads back
    if args.out:
        out = Path(args.out)
        path = out / "search.jsonl"
        found, known = read_search_journal(path)
        if found is not None and found != header:
            raise ScenarioError(
                f"{path} holds another search's results (different scenario, calibration or "
                "stepsim version); use another --out or delete the file"
            )
        out.mkdir(parents=True, exist_ok=True)
        journal = path.open("a", encoding="utf-8")
        if found is None:
            journal.write(json.dumps({"search": header}) + "\n")
            journal.flush()
    progress = _progress(args)
    progress.begin("searching")

    def on_result(candidate, i: int, n: int) -> None:
        if journal is not None:
            entry = {"layout": candidate.layout.key, "row": candidate.row}
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
        progress.task = f"simulated {i} (of at most {n})"
        progress.update(i / n)

    try:
        with _Workers(args) as workers:
            result = search(
                base,
                space,
                top=args.top,
                executor=workers.executor,
                prune=not args.no_prune,
                known=known,
                on_result=on_result,
            )
            rule = rule_of_thumb(base)
            rule_entry = None
            if rule is not None:
                by_key = {c.layout.key: c for c in result.candidates}
                ranks = {c.layout.key: i + 1 for i, c in enumerate(result.ranked)}
                done = by_key.get(rule.key)
                if done is not None and done.status == SIMULATED:
                    row = done.row
                else:
                    row = known.get(rule.key) or simulate_one(apply_layout(base, rule))
                rule_entry = (rule, row, ranks.get(rule.key))
    except KeyboardInterrupt:
        progress.clear()
        kept = f"; finished results are in {args.out}/search.jsonl: run the same command to "
        print(
            "stepsim: interrupted"
            + (kept + "resume" if journal is not None else " (use --out DIR to keep results)"),
            file=sys.stderr,
        )
        return 130
    finally:
        progress.clear()
        if journal is not None:
            journal.close()
    text = search_text(
        base, model_params(base), result, args.top, rule_entry, workers.where, _run_command(args)
    )
    print(text)
    if args.out:
        written = _write_rows(Path(args.out), "search", result_rows(result))
        print(f"\n  wrote {args.out}/: {' '.join(written)} search.jsonl")
    return 0


def _write_rows(out: Path, stem: str, rows: list[dict]) -> list[str]:
    """rows as STEM.csv, and STEM.parquet when pyarrow is installed; the names written."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["layout"])
        writer.writeheader()
        writer.writerows(rows)
    written = [f"{stem}.csv"]
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return written
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), out / f"{stem}.parquet")
    return [*written, f"{stem}.parquet"]


def _run_command(args: argparse.Namespace) -> str:
    """`stepsim run` of the same base scenario, as the user gave it."""
    import shlex

    parts = ["stepsim", "run", args.scenario]
    if args.calibration:
        parts += ["--calibration", args.calibration]
    for item in args.overrides:
        parts += ["--set", item]
    return shlex.join(parts)


def _plan(args: argparse.Namespace) -> int:
    if args.question == "fit":
        return _plan_fit(args)
    if args.question in ("throughput", "time-to-train"):
        return _plan_throughput(args)
    return _plan_scale(args)


def _fastest(scenario, space, args: argparse.Namespace):
    """The fastest layout of the space for the scenario (a search for the top one)."""
    from ..plan.planning import search

    progress = _progress(args)
    progress.begin(f"searching {scenario.name}")

    def on_result(candidate, i: int, n: int) -> None:
        progress.task = f"searching {scenario.name}: simulated {i} (of at most {n})"
        progress.update(i / n)

    try:
        with _Workers(args) as workers:
            result = search(scenario, space, top=1, executor=workers.executor, on_result=on_result)
    finally:
        progress.clear()
    return result.ranked[0] if result.ranked else None


def _plan_fit(args: argparse.Namespace) -> int:
    from ..plan.planning import fit_family, min_nodes, model_params, with_nodes
    from ..plan.text import fit_text, min_nodes_text
    from ..scenario.presets import MODEL_FAMILIES

    base = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    space = _space(args)
    if args.min_nodes:
        nodes, fitting = min_nodes(base, space, args.max_nodes)
        best = None
        if nodes and not args.no_simulate:
            best = _fastest(with_nodes(base, nodes), space, args)
        print(min_nodes_text(base, model_params(base), nodes, fitting, best, args.max_nodes))
        return 0
    if args.family not in MODEL_FAMILIES:
        raise ScenarioError(f"--family={args.family!r} is not one of: {', '.join(MODEL_FAMILIES)}")
    if args.nodes < 1:
        raise ScenarioError(f"--nodes={args.nodes} must be >= 1")
    cluster_base = with_nodes(base, args.nodes)
    rows = fit_family(cluster_base, args.family, space)
    largest = next((r for r in reversed(rows) if r.leanest is not None), None)
    best = None
    if largest is not None and not args.no_simulate:
        best = _fastest(largest.scenario, space, args)
    print(fit_text(cluster_base, rows, args.nodes, best))
    return 0


def _plan_throughput(args: argparse.Namespace) -> int:
    from ..plan.planning import model_params, narayanan_days, simulate_row, training_time
    from ..plan.text import throughput_text

    scenario = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    if args.tokens is not None and not 0 < args.tokens < float("inf"):
        raise ScenarioError(f"--tokens={args.tokens} must be a positive number")
    _check_fits(scenario)
    progress = _progress(args)
    progress.begin("simulating")
    try:
        row = simulate_row(scenario)
    finally:
        progress.clear()
    params = model_params(scenario)
    times = estimate = None
    factor = 8 if scenario.training.recompute_granularity == "full" else 6
    if args.tokens is not None:
        times = training_time(row, args.tokens)
        estimate = narayanan_days(
            params, args.tokens, row["num_gpus"], row["hardware_tflops_per_gpu"], factor
        )
    print(throughput_text(scenario, params, row, args.tokens, times, estimate, factor))
    return 0


def _check_fits(scenario) -> None:
    from ..run import memory_per_stage
    from ..workload.memory import out_of_memory

    problem = out_of_memory(scenario, memory_per_stage(scenario))
    if problem:
        raise ScenarioError(problem.split(" --allow-oom")[0].rstrip(";").rstrip())


def _plan_scale(args: argparse.Namespace) -> int:
    from ..plan.planning import scale_points, scale_scenarios
    from ..plan.text import scale_text

    base = load_scenario(args.scenario, args.overrides, calibration=args.calibration)
    nodes = _int_list("--nodes", args.nodes)
    if args.tokens is not None and not 0 < args.tokens < float("inf"):
        raise ScenarioError(f"--tokens={args.tokens} must be a positive number")
    entries = scale_scenarios(base, sorted(set(nodes)), args.keep)
    runnable = [(i, sc) for i, (_, sc, _) in enumerate(entries) if sc is not None]
    rows: list[dict | None] = [None] * len(entries)
    progress = _progress(args)
    progress.begin(f"simulating {len(runnable)} node counts")
    for _, sc in runnable:
        try:
            _check_fits(sc)
        except ScenarioError as exc:
            raise ScenarioError(f"{sc.cluster.num_nodes} nodes: {exc}") from None

    def done(j: int, row: dict) -> None:
        rows[runnable[j][0]] = row
        progress.update(sum(r is not None for r in rows) / len(runnable))

    try:
        with _Workers(args) as workers:
            workers.executor([sc for _, sc in runnable], done)
    finally:
        progress.clear()
    points = scale_points(entries, rows, args.tokens)
    print(scale_text(base, points, args.keep, args.tokens))
    if args.out:
        from ..report.figures import scale_figure

        out = Path(args.out)
        flat = []
        for p in points:
            if p["row"] is None:
                continue
            flat.append(
                {
                    "nodes": p["nodes"],
                    "data_parallel_size": p["dp"],
                    "global_batch_size": p["global_batch"],
                    **p["row"],
                    "speedup": p["speedup"],
                    "scaling_efficiency": p["efficiency"],
                    **({"days": p["days"], "gpu_hours": p["gpu_hours"]} if args.tokens else {}),
                }
            )
        written = _write_rows(out, "scale", flat)
        scale_figure(points, f"{base.name}: scaling with data parallelism").savefig(
            out / "scale.png", dpi=110
        )
        print(f"\n  wrote {args.out}/: {' '.join(written)} scale.png")
    return 0


def _topology(args: argparse.Namespace) -> int:
    from topologies.describe import summarize

    from ..report.figures import topology_figure
    from ..report.text import MAX_DRAWN_GPUS, topology_text
    from ..run import build_cluster

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

    from ..bubble import run_orders, run_schedule
    from ..report.text import study_text, study_trace

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
        from ..report.figures import pipeline_figure

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        pipeline_figure(studies).savefig(out / "schedule.png", dpi=110)
        (out / "trace.json").write_text(json.dumps(study_trace(studies), separators=(",", ":")))
        if not args.json:
            print(f"\n  wrote {args.out}/: schedule.png trace.json")
    return 0


def _op_times(args: argparse.Namespace):
    from ..bubble import OpTimes

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
    from ..report.figures import breakdown_figure, timeline_figure
    from ..report.text import chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    (out / "scenario.resolved.toml").write_text(dumps_toml(scenario_to_dict(result.scenario)))
    # dumps, not dump: dump to a file streams through the slow pure-Python encoder
    (out / "trace.json").write_text(json.dumps(chrome_trace(result), separators=(",", ":")))
    timeline_figure(result).savefig(out / "timeline.png", dpi=110)
    breakdown_figure(result).savefig(out / "breakdown.png", dpi=110)

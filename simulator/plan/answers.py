"""Text for `stepsim search` and `stepsim plan`: tables a person reads in a terminal."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..ir.results import IDLE_CAUSES, MetricsRow
from ..ir.units import count_text
from ..ir.vocabulary import CATEGORIES, SHARDING_NAMES
from ..report.labels import fabric_text, label_lines
from ..scenario import Scenario
from .goodput import (
    CHECKPOINT_BYTES_PER_PARAM,
    DEFAULT_MTBF_GPU_HOURS,
    FLEET_FAILURES_PER_1000_NODE_DAYS,
    FLEET_GPUS_PER_NODE,
    GIVEN,
    Costs,
    Interval,
    Reliability,
    failures_per_day,
    run_goodput,
)
from .planning import KEEP_GLOBAL_BATCH
from .questions import (
    SECONDS_PER_DAY,
    FitRow,
    ScalePoint,
    TrainingTime,
    largest_fitting,
    leanest_of,
)
from .search import OUT_OF_MEMORY, PRUNED, SIMULATED, Candidate, RuleOfThumb, SearchResult
from .space import Layout


def table(head: Sequence[str], body: Sequence[Sequence[str]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join(
        indent + "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *body]
    )


def params_text(params: float) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def describe_base(base: Scenario, params: float) -> list[str]:
    m, c = base.model, base.cluster
    return [
        f"  model: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, "
        + (f"{m.num_query_groups} K/V groups, " if m.num_query_groups is not None else "")
        + f"{params_text(params)} parameters; global batch {base.training.global_batch_size} x "
        f"{m.seq_length} tokens",
        f"  cluster: {c.num_nodes} x {c.node or 'custom node'} = {c.num_gpus} GPUs "
        f"({c.gpu.name}, {c.gpu.memory_gib:g} GiB), {c.nics_per_node} x {c.nic_gbps:g} Gb/s "
        f"per node; {fabric_text(c)}",
        *label_lines(base),
    ]


def layout_cells(layout: Layout) -> list[str]:
    return [
        str(layout.tp),
        f"{layout.pp} ({layout.first_layers}|..|{layout.last_layers})"
        if layout.uneven
        else str(layout.pp),
        str(layout.dp),
        str(layout.micro_batch),
        layout.schedule,
        str(layout.chunks),
        layout.recompute,
        SHARDING_NAMES[layout.sharding],
        "yes" if layout.sequence_parallel else "-",
    ]


LAYOUT_HEAD = ["TP", "PP", "DP", "mb", "schedule", "v", "recompute", "shard", "SP"]


def metric_cells(m: MetricsRow, memory_gib: float, tight_gib: float | None = None) -> list[str]:
    """A layout's metrics; its memory marked '!' above ``tight_gib`` (SearchSpace.tight_gib)."""
    tight = tight_gib is not None and memory_gib > tight_gib
    return [
        f"{m.iteration_time_s:.3f}",
        f"{m.tokens_per_s:,.0f}",
        f"{m.hardware_tflops_per_gpu:.1f}",
        f"{100 * m.mfu:.1f}",
        f"{memory_gib:.1f}" + (" !" if tight else ""),
        *(f"{100 * m.breakdown_s[c.key] / m.iteration_time_s:.1f}" for c in CATEGORIES),
    ]


METRIC_HEAD = [
    "iter s",
    "tokens/s",
    "TFLOP/s",
    "MFU %",
    "mem GiB",
    *(f"{category.short}%" for category in CATEGORIES),
]


# what a layout's name (space.Layout.key) spells, said under every answer that shows one
LAYOUT_NAMES = (
    "  layout names: tp<N>-pp<N>[-first<L>-last<L>]-dp<N> (tensor, pipeline, data parallel; "
    "layers on the first and last stage when uneven) -mb<N> (micro-batch) -<schedule> "
    "-v<N> (chunks per rank) -<recompute> -<data-parallel sharding: none, optimizer = ZeRO-1, "
    "gradients = ZeRO-2, full = FSDP> -sp|nosp (sequence parallelism)"
)

IDLE_HEAD = ["own%", "imbal%", "comm%"]


def idle_cells(m: MetricsRow) -> list[str]:
    """A layout's idle split by cause in % of its iteration (run/bubble.py); '-' without
    a pipeline."""
    causes = m.idle_by_cause_s
    if causes is None:
        return ["-"] * len(IDLE_CAUSES)
    return [f"{100 * causes[k] / m.iteration_time_s:.1f}" for k in IDLE_CAUSES]


def headroom_text(result: SearchResult) -> str:
    """`` (5 % of each GPU kept free)``: the search's memory headroom, when it has one."""
    if result.space is None or not result.space.memory_headroom:
        return ""
    return f" ({100 * result.space.memory_headroom:g} % of each GPU kept free)"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, ..."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def best_of(top: int) -> str:
    """The words for the top-th best: "best" for the first, "3rd best" for the third."""
    return "best" if top == 1 else f"{ordinal(top)} best"


def search_text(
    base: Scenario,
    params: float,
    result: SearchResult,
    show: int,
    rule: RuleOfThumb | None,
    where: str,
    command: str,
) -> str:
    ranked = result.ranked
    fitting = len(result.candidates) - result.count(OUT_OF_MEMORY)
    resumed = sum(1 for c in result.candidates if c.resumed)
    invalid = ", ".join(f"{k} {n}" for k, n in result.invalid.items())
    lines = [f"stepsim search · {base.name}", *describe_base(base, params)]
    lines.append(
        f"  layouts: {result.enumerated:,} enumerated; {result.num_invalid:,} break a rule"
        + (f" ({invalid})" if invalid else "")
        + f"; {result.count(OUT_OF_MEMORY):,} do not fit in memory{headroom_text(result)}; "
        f"{fitting:,} fit"
    )
    lines.append(
        f"  simulated {result.count(SIMULATED):,} ("
        + (f"{resumed:,} of them by the earlier run; the rest " if resumed else "")
        + f"{where}), pruned {result.count(PRUNED):,}: their compute, bubble and blocking "
        f"TP collectives (a lower bound) is slower than the {best_of(result.top)} simulated"
    )
    if not ranked:
        lines.append("  no layout fits in GPU memory: more nodes, or widen the search")
        return "\n".join(lines)
    lines.append("")
    lines.append(
        f"  top {min(show, len(ranked))} by simulated throughput; compute% .. idle%: where a "
        "GPU's iteration goes (mean over GPUs; tp, pp, dp: exposed communication)"
    )
    capacity = base.cluster.gpu.memory_gib
    tight = result.space.tight_gib(capacity) if result.space is not None else None
    split = any(c.simulated_metrics.idle_by_cause_s for c in ranked[:show])
    body = [
        [
            str(i + 1),
            *layout_cells(c.layout),
            *metric_cells(c.simulated_metrics, c.memory_gib, tight),
            *(idle_cells(c.simulated_metrics) if split else []),
        ]
        for i, c in enumerate(ranked[:show])
    ]
    lines.append(table(["#", *LAYOUT_HEAD, *METRIC_HEAD, *(IDLE_HEAD if split else [])], body))
    if split:
        lines.append(
            "  idle% = own% (the schedule's bubble, with equal stages and free communication) "
            "+ imbal% (unequal stages) + comm% (waits on transfers); - : no pipeline"
        )
    if tight is not None and any(c.memory_gib > tight for c in ranked[:show]):
        lines.append(
            f"  !: over {tight:.1f} of the GPU's {capacity:g} GiB, within twice the headroom "
            "kept free (--memory-headroom): one allocation the model does not see from failing"
        )
    best = ranked[0]
    if rule is not None:
        layout, m, rank = rule
        ratio = m.iteration_time_s / best.simulated_metrics.iteration_time_s
        where_rule = (
            f"rank {rank} of {len(ranked)}" if rank else "pruned by the search, simulated here"
        )
        lines += [
            "",
            "  Megatron-LM's rule of thumb (TP across a node, the smallest PP that fits, DP for "
            "the rest; 1F1B, micro-batch 1, full recomputation):",
            f"    {layout.key}: {m.iteration_time_s:.3f} s, "
            f"{m.hardware_tflops_per_gpu:.1f} TFLOP/s, MFU {100 * m.mfu:.1f} % "
            f"({where_rule}); the best found is "
            + (
                f"{(ratio - 1) * 100:.1f} % faster"
                if ratio > 1
                else "the rule's own layout"
                if ratio == 1
                else "slower (the rule lies outside the searched space)"
            ),
            LAYOUT_NAMES,
        ]
    elif result.candidates:
        lines += ["", "  Megatron-LM's rule of thumb: no layout it allows fits in memory"]
    lines += [
        "",
        "  run the best: "
        + command
        + " "
        + " ".join(f"--set {o}" for o in best.layout.overrides()),
    ]
    return "\n".join(lines)


def fit_text(
    base: Scenario,
    rows: Sequence[FitRow],
    nodes: int,
    best: Candidate | None,
    headroom: float = 0.0,
) -> str:
    c = base.cluster
    lines = [
        f"stepsim plan fit · {nodes} x {c.node or 'custom node'} = {c.num_gpus} GPUs "
        f"({c.gpu.name}, {c.gpu.memory_gib:g} GiB each); {fabric_text(c)}",
        *label_lines(base),
        "  a model fits when some layout of the search space fits every GPU's memory "
        "(weights, gradients, optimizer, activations, workspace)"
        + (f" with {100 * headroom:g} % of it kept free" if headroom else ""),
        "",
    ]
    body = []
    for row in rows:
        lean = row.leanest
        body.append(
            [
                row.name,
                params_text(row.params),
                "yes" if lean else "no",
                str(row.num_fitting),
                lean.layout.key if lean else "-",
                f"{lean.memory_gib:.1f}" if lean else "-",
            ]
        )
    lines.append(
        table(["model", "params", "fits", "layouts", "leanest layout", "its mem GiB"], body)
    )
    largest = largest_fitting(rows)
    lines.append("")
    if largest is None:
        lines.append(f"  none of the family fits on {nodes} nodes")
        return "\n".join(lines)
    lines.append(f"  largest that fits: {largest.name} ({params_text(largest.params)} parameters)")
    if best is not None:
        lines.append(f"  its fastest layout (simulated): {_fastest_text(best)}")
    lines.append(LAYOUT_NAMES)
    return "\n".join(lines)


def _fastest_text(best: Candidate) -> str:
    m = best.simulated_metrics
    return (
        f"{best.layout.key}: {m.iteration_time_s:.3f} s per iteration, "
        f"{m.tokens_per_s:,.0f} tokens/s, MFU {100 * m.mfu:.1f} %, {best.memory_gib:.1f} GiB"
    )


def min_nodes_text(
    base: Scenario,
    params: float,
    nodes: int,
    fitting: Sequence[Candidate],
    best: Candidate | None,
    max_nodes: int,
) -> str:
    lines = [f"stepsim plan fit · {base.name}", describe_base(base, params)[0]]
    lines += label_lines(base)
    if nodes == 0:
        lines.append(
            f"  does not fit on up to {max_nodes} nodes of {base.cluster.node or 'this node'} "
            "with any layout of the search space (raise --max-nodes or widen the space)"
        )
        return "\n".join(lines)
    gpus = nodes * base.cluster.gpus_per_node
    lean = leanest_of(fitting)
    assert lean is not None  # nodes > 0: some layout fits there
    lines += [
        f"  fewest nodes: {nodes} x {base.cluster.node or 'node'} = {gpus} GPUs; "
        f"{len(fitting)} layouts fit there",
        f"  leanest layout: {lean.layout.key}, {lean.memory_gib:.1f} of "
        f"{base.cluster.gpu.memory_gib:g} GiB",
    ]
    if best is not None:
        lines.append(f"  fastest layout (simulated): {_fastest_text(best)}")
    lines.append(
        "  fewer nodes fail on memory, or on the global batch: data parallel x micro-batch "
        "must divide it"
    )
    lines.append(LAYOUT_NAMES)
    return "\n".join(lines)


def throughput_text(
    scenario: Scenario,
    params: float,
    m: MetricsRow,
    tokens: float | None,
    times: TrainingTime | None,
    estimate_days: float | None,
    factor: int,
    question: str = "throughput",
) -> str:
    lines = [f"stepsim plan {question} · {scenario.name}", *describe_base(scenario, params)]
    par, tr = scenario.parallel, scenario.training
    lines += [
        f"  layout: TP {par.tensor_model_parallel_size}, PP {par.pipeline_model_parallel_size}, "
        f"DP {par.data_parallel_size}, micro-batch {tr.micro_batch_size}, {tr.schedule}, "
        f"recompute {tr.recompute_granularity}",
        "",
        f"  iteration        {m.iteration_time_s:.3f} s",
        f"  throughput       {m.tokens_per_s:,.0f} tokens/s "
        f"({scenario.training.global_batch_size * scenario.model.seq_length:,} tokens per "
        "iteration)",
        f"  per GPU          {m.hardware_tflops_per_gpu:.1f} TFLOP/s (hardware), "
        f"{m.model_tflops_per_gpu:.1f} TFLOP/s (model)",
        f"  MFU              {100 * m.mfu:.1f} %",
    ]
    if tokens is not None and times is not None:
        lines += [
            "",
            f"  {count_text(tokens)} tokens: {times.days:.1f} days on {m.num_gpus:,} GPUs, "
            f"{times.gpu_hours:,.0f} GPU-hours",
            f"  (tokens / simulated tokens per second; Narayanan et al. 2021's estimate "
            f"{factor} T P / (n X) with the simulated hardware TFLOP/s gives "
            f"{estimate_days:.1f} days)",
        ]
    return "\n".join(lines)


def scale_text(
    base: Scenario, points: Sequence[ScalePoint], keep: str, tokens: float | None
) -> str:
    par = base.parallel
    lines = [
        f"stepsim plan scale · {base.name}",
        f"  TP {par.tensor_model_parallel_size} x PP {par.pipeline_model_parallel_size} fixed; "
        "data parallelism grows with the nodes; "
        + (
            f"global batch {base.training.global_batch_size} kept (strong scaling)"
            if keep == KEEP_GLOBAL_BATCH
            else f"{base.num_microbatches} micro-batches per pipeline kept (weak scaling)"
        ),
        "",
    ]
    head = ["nodes", "GPUs", "DP", "batch", "m", "iter s", "tokens/s", "TFLOP/s", "MFU %"]
    head += ["speedup", "efficiency %"]
    if tokens is not None:
        head += ["days", "GPU-hours"]
    body = []
    notes = []
    for point in points:
        m, scaled = point.metrics, point.scaled
        if m is None or scaled is None:
            notes.append(f"  {point.nodes} nodes: {point.why}")
            continue
        cells = [
            str(point.nodes),
            f"{m.num_gpus:,}",
            str(scaled.dp),
            str(scaled.global_batch),
            str(m.num_microbatches),
            f"{m.iteration_time_s:.3f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.hardware_tflops_per_gpu:.1f}",
            f"{100 * m.mfu:.1f}",
            f"{scaled.speedup:.2f}",
            f"{100 * scaled.efficiency:.1f}",
        ]
        if scaled.time is not None:
            cells += [f"{scaled.time.days:.1f}", f"{scaled.time.gpu_hours:,.0f}"]
        body.append(cells)
    if body:
        lines.append(table(head, body))
    lines += notes
    lines += [
        "",
        "  speedup = throughput / throughput at the fewest nodes; efficiency = speedup / "
        "(nodes / fewest nodes)",
    ]
    return "\n".join(lines)


def goodput_text(
    scenario: Scenario,
    params: float,
    rel: Reliability,
    costs: Costs,
    rows: Sequence[Interval],
    simulated: bool,
    tokens: float | None,
    tokens_per_iteration: int,
) -> str:
    """`plan goodput`: the inputs, what a checkpoint and a failure cost, and where the
    wall time goes at each interval of ``rows``."""
    c = costs
    source = (
        f"Kokolis et al. 2024's fleet rate, {FLEET_FAILURES_PER_1000_NODE_DAYS:.2f} per 1,000 "
        f"node-days of {FLEET_GPUS_PER_NODE} GPUs"
        if rel.mtbf_gpu_hours == DEFAULT_MTBF_GPU_HOURS
        else "given"
    )
    mode = (
        f"async: training waits {c.blocking_s:.3g} s for the copy to host memory, the write "
        f"takes {c.write_s:.3g} s behind it"
        if rel.async_save
        else f"sync: training waits {c.write_s:.3g} s for the write"
    )
    lines = [
        f"stepsim plan goodput · {scenario.name}",
        f"  {c.num_gpus:,} GPUs; iteration {c.iteration_s:.3f} s "
        + ("(simulated)" if simulated else "(given)"),
        f"  failures: per-GPU MTBF {_hours(rel.mtbf_gpu_hours * 3600)} ({source})"
        + (
            " -> no failures"
            if c.job_mtbf_s == math.inf
            else f" -> job MTBF {_hours(c.job_mtbf_s)}, {failures_per_day(c):.3g} interruptions "
            "a day"
        ),
        f"  checkpoint: {_bytes(c.checkpoint_bytes)} ({params_text(params)} parameters x "
        f"{CHECKPOINT_BYTES_PER_PARAM} bytes) at {rel.storage_write_gbytes_per_s:g} GB/s; {mode}",
        f"  restart: {c.restart_s / 60:g} min re-queue and start-up + {c.load_s:.3g} s to load "
        f"the checkpoint at {rel.storage_read_gbytes_per_s:g} GB/s",
        "",
    ]
    head = ["interval", "iterations", "minutes", "goodput %", "checkpoint %", "lost %"]
    head.append("restart %")
    body = []
    for r in rows:
        s = r.shares
        its = f"{s.interval_iterations:,}"
        if r.exact_iterations is not None:
            its += f" ({r.exact_iterations:,.1f})"
        cells = [r.name, its, f"{s.interval_iterations * c.iteration_s / 60:.1f}"]
        cells += [f"{100 * v:.2f}" for v in (s.useful, s.checkpoint, s.lost, s.restart)]
        body.append(cells)
    if body:
        lines += [
            table(head, body),
            "",
            "  shares of wall time (Daly 2006's expected time with exponential failures); "
            "goodput = the useful share",
            "  Young 1974: sqrt(2 C M); Daly 2006: sqrt(2 C M) (1 + sqrt(C/2M)/3 + C/18M) - C",
            "  (C: the checkpoint's blocking time, M: the job's MTBF; in brackets: before "
            "rounding to whole iterations"
            + ("; async: no shorter than the write)" if rel.async_save else ")"),
        ]
    else:
        lines.append("  no failures and no --checkpoint-interval: nothing to checkpoint for")
    if tokens is not None:
        goodput = run_goodput(list(rows))
        ideal_days = tokens / tokens_per_iteration * c.iteration_s / SECONDS_PER_DAY
        wall = ideal_days / goodput if goodput > 0 else math.inf
        at = f"{rows[0].name} interval" if rows else "no checkpoints"
        if goodput == 0:
            lines.append(f"  {count_text(tokens)} tokens: never finished at 0 % goodput ({at})")
            return "\n".join(lines)
        lines.append(
            f"  {count_text(tokens)} tokens: {ideal_days:.1f} days without failures, "
            f"{wall:.1f} days at {100 * goodput:.1f} % goodput ({at})"
            + (
                ""
                if c.job_mtbf_s == math.inf
                else f", about {wall * failures_per_day(c):,.0f} interruptions"
            )
        )
    return "\n".join(lines)


def run_goodput_text(costs: Costs, rows: Sequence[Interval], times: TrainingTime | None) -> str:
    """`plan time-to-train --goodput`'s lines: the days and GPU-hours with failures,
    checkpoints and restarts (ideal / goodput)."""
    goodput = run_goodput(list(rows))
    if rows:
        every = f"a checkpoint every {rows[0].shares.interval_iterations:,} iterations"
        every += " (" + ("given" if rows[0].name == GIVEN else "the searched best") + ")"
    else:
        every = "no checkpoints"
    mtbf = "no failures" if costs.job_mtbf_s == math.inf else f"job MTBF {_hours(costs.job_mtbf_s)}"
    lines = [
        "",
        f"  goodput {100 * goodput:.1f} % ({mtbf}, {every}; the breakdown: stepsim plan goodput)",
    ]
    if times is not None and goodput > 0:
        lines.append(
            f"  with failures, checkpoints and restarts: {times.days / goodput:.1f} days, "
            f"{times.gpu_hours / goodput:,.0f} GPU-hours"
        )
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    if hours == math.inf:
        return "infinite"
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"


def _bytes(n: float) -> str:
    return f"{n / 1e12:.3g} TB" if n >= 1e12 else f"{n / 1e9:.3g} GB"

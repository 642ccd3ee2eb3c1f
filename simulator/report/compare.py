"""`stepsim compare SCENARIO TRACE`: what a real rank's profiler trace measured
(calibration/trace.py) beside what stepsim simulates for the same scenario's GPU of the
same pipeline stage, as text, JSON and a picture (the measured iteration's GPU timeline
over the simulated one's).

The two sides share stepsim's breakdown categories: compute, exposed communication,
optimizer and idle, which add up to the iteration time on both. Below them, the
measured compute kernels by class (GEMM, attention, memory-bound, copies) as shares of
the compute kernel time, beside the same shares of one simulated layer's forward and
backward kernels (cost/compute.py ``ComputeModel.kernels``: a GEMM kernel has FLOPs, the
attention core is marked, the rest are memory-bound); and the measured communication
kernels by collective, beside the simulated GPU's communication ops (their whole time,
hidden or not)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..calibration.trace import (
    ATTENTION,
    CLASS_LABELS,
    COPY,
    GEMM,
    MEMORY,
    TraceMeasurement,
    is_communication,
)
from ..cost.compute import ComputeModel
from ..ir.results import Result
from ..ir.vocabulary import (
    ALL_CATEGORIES,
    CATEGORY_OF_KIND,
    IDLE,
    OFFLOAD,
    OPTIMIZER,
    WAIT_OF_COMM,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COMPUTE_TIME = "compute"
EXPOSED = "exposed communication"
ROWS = (COMPUTE_TIME, EXPOSED, OPTIMIZER, IDLE)
CLASS_COLORS = {
    GEMM: "#4C72B0",
    ATTENTION: "#8172B3",
    MEMORY: "#64B5CD",
    COPY: "#CCB974",
    OPTIMIZER: "#222222",
}
COMM_COLOR = "#C44E52"


class Comparison(NamedTuple):
    """One comparison: the measured means, the simulated GPU's, and the shares."""

    scenario: str
    trace: str
    stage: int
    gpu: int
    measured: dict[str, float]  # ROWS and "iteration", mean over the iterations
    simulated: dict[str, float]
    measured_shares: dict[str, float]  # compute kernel classes, of the compute kernel time
    simulated_shares: dict[str, float]
    measured_collectives_s: dict[str, float]  # kernel time per NCCL collective
    simulated_communication_s: dict[str, float]  # the GPU's comm ops by kind
    iterations: int
    rank: int | None
    world_size: int | None
    device: str
    notes: tuple[str, ...]


def layer_shares(model: ComputeModel) -> dict[str, float]:
    """One layer's forward and backward kernel time by class, as shares."""
    totals = {GEMM: 0.0, ATTENTION: 0.0, MEMORY: 0.0}
    for kernel in model.kernels():
        if kernel.core:
            cls = ATTENTION
        elif kernel.work.flops > 0:
            cls = GEMM
        else:
            cls = MEMORY
        totals[cls] += kernel.work.duration_s
    whole = sum(totals.values()) or 1.0
    return {c: t / whole for c, t in totals.items()}


def stage_class_s(scenario: Any, metrics: Any, stage: int) -> dict[str, float]:
    """A stage's simulated compute seconds per iteration by kernel class: its compute
    time split by one layer's kernel mix (`layer_shares`); what `calibrate --trace`
    matches a trace's classes to."""
    compute = metrics.stages[stage].breakdown_s[COMPUTE_TIME]
    return {c: compute * share for c, share in layer_shares(ComputeModel(scenario)).items()}


def simulated_side(result: Result, stage: int) -> tuple[int, dict[str, float], dict[str, float]]:
    """(the GPU standing for ``stage``, its breakdown in ROWS, its communication ops'
    whole time by kind)."""
    metrics = result.metrics
    st = metrics.stages[stage]
    breakdown = st.breakdown_s
    comm_keys = {CATEGORY_OF_KIND[WAIT_OF_COMM[k]] for k in WAIT_OF_COMM} - {OFFLOAD}
    out = {
        "iteration": metrics.iteration_time_s,
        COMPUTE_TIME: breakdown.get(COMPUTE_TIME, 0.0),
        EXPOSED: sum(v for k, v in breakdown.items() if k in comm_keys),
        OPTIMIZER: breakdown.get(OPTIMIZER, 0.0),
        IDLE: breakdown.get(IDLE, 0.0),
        OFFLOAD: breakdown.get(OFFLOAD, 0.0),
    }
    communication: dict[str, float] = {}
    for span in result.trace.spans:
        if span.gpu == st.gpu and span.kind in WAIT_OF_COMM:
            label = str(span.kind)
            communication[label] = communication.get(label, 0.0) + (span.end_s - span.start_s)
    return st.gpu, out, dict(sorted(communication.items()))


def compare(
    result: Result, measured: TraceMeasurement, stage: int, trace_name: str, notes: Sequence[str]
) -> Comparison:
    gpu, simulated, communication = simulated_side(result, stage)
    mean = {
        "iteration": measured.mean("time_s"),
        COMPUTE_TIME: measured.mean("compute_s"),
        EXPOSED: measured.mean("exposed_communication_s"),
        OPTIMIZER: measured.mean("optimizer_s"),
        IDLE: measured.mean("idle_s"),
        OFFLOAD: 0.0,
    }
    kernels = measured.mean_kernel_s()
    compute_classes = (GEMM, ATTENTION, MEMORY, COPY)
    whole = sum(kernels.get(c, 0.0) for c in compute_classes) or 1.0
    shares = {c: kernels.get(c, 0.0) / whole for c in compute_classes}
    simulated_shares = {**layer_shares(ComputeModel(result.scenario)), COPY: 0.0}
    collectives = {c: s for c, s in kernels.items() if is_communication(c)}
    return Comparison(
        result.scenario.name,
        trace_name,
        stage,
        gpu,
        mean,
        simulated,
        shares,
        simulated_shares,
        collectives,
        communication,
        len(measured.iterations),
        measured.rank,
        measured.world_size,
        measured.device,
        (*measured.notes, *notes),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _ratio(measured: float, simulated: float) -> str:
    if measured <= 0:
        return ""
    return f"{100 * (simulated / measured - 1):+.0f} %"


def text(c: Comparison) -> str:
    who = f"rank {c.rank}" if c.rank is not None else "its rank"
    if c.world_size is not None:
        who += f" of {c.world_size}"
    lines = [
        f"stepsim compare · {c.scenario} (simulated: stage {c.stage}, GPU {c.gpu}) vs "
        f"{c.trace} ({who}, {c.device or 'GPU not named'}; mean of {c.iterations} "
        f"iteration{'s' if c.iterations > 1 else ''})",
        f"  {'':<34}{'measured':>12}{'simulated':>12}{'sim/meas':>10}",
    ]
    labels = {
        "iteration": "iteration",
        COMPUTE_TIME: "compute",
        EXPOSED: "communication (exposed)",
        OPTIMIZER: "optimizer",
        IDLE: "idle",
        OFFLOAD: "activation offload (exposed)",
    }
    for key in ("iteration", *ROWS, OFFLOAD):
        m, s = c.measured[key], c.simulated[key]
        if key == OFFLOAD and not s:
            continue
        lines.append(f"  {labels[key]:<34}{_ms(m):>12}{_ms(s):>12}{_ratio(m, s):>10}")
    lines += [
        "",
        "  compute kernels by class, share of the compute kernel time (measured; simulated: "
        "one layer's forward and backward)",
    ]
    for cls in (GEMM, ATTENTION, MEMORY, COPY):
        lines.append(
            f"  {CLASS_LABELS[cls]:<34}{100 * c.measured_shares[cls]:>11.1f}%"
            f"{100 * c.simulated_shares[cls]:>11.1f}%"
        )
    lines += ["", "  communication kernels (whole time, hidden or not)"]
    for name, seconds in c.measured_collectives_s.items():
        lines.append(f"  measured {name:<25}{_ms(seconds):>12}")
    for name, seconds in c.simulated_communication_s.items():
        lines.append(f"  simulated {name:<24}{'':>12}{_ms(seconds):>12}")
    if not c.measured_collectives_s:
        lines.append("  measured: none")
    if not c.simulated_communication_s:
        lines.append("  simulated: none")
    lines += [f"  note: {n}" for n in c.notes]
    return "\n".join(lines)


def record(c: Comparison) -> dict[str, Any]:
    return {
        "scenario": c.scenario,
        "trace": c.trace,
        "stage": c.stage,
        "gpu": c.gpu,
        "rank": c.rank,
        "world_size": c.world_size,
        "device": c.device,
        "iterations": c.iterations,
        "measured_s": {k.replace(" ", "_"): v for k, v in c.measured.items()},
        "simulated_s": {k.replace(" ", "_"): v for k, v in c.simulated.items()},
        "measured_compute_shares": c.measured_shares,
        "simulated_compute_shares": c.simulated_shares,
        "measured_collectives_s": c.measured_collectives_s,
        "simulated_communication_s": c.simulated_communication_s,
        "notes": list(c.notes),
    }


def figure(c: Comparison, measured: TraceMeasurement, result: Result, iteration: int = 0) -> Figure:
    """The measured iteration's GPU timeline (a row per stream, kernels coloured by
    class) over the simulated GPU's (a row per stream, spans coloured by category), on
    one time scale from each one's start. Each row is one collection of bars in time
    order, a colour per bar (what a call per bar drew, at a fraction of the time)."""
    from matplotlib.figure import Figure  # a picture's import: compare's text needs none
    from matplotlib.patches import Patch

    it = measured.iterations[iteration]
    streams = sorted({e.stream for e in it.events})
    sim_spans = [s for s in result.trace.spans if s.gpu == c.gpu]
    sim_streams = list(dict.fromkeys(str(s.stream) for s in sim_spans))
    end = max(it.end_s - it.start_s, it.time_s, result.metrics.iteration_time_s)
    fig = Figure(figsize=(13, 2.2 + 0.35 * (len(streams) + len(sim_streams))))
    top, bottom = fig.subplots(
        2, 1, sharex=True, height_ratios=[max(1, len(streams)), max(1, len(sim_streams))]
    )
    scale = 1e3
    for row, number in enumerate(streams):
        bars, shades = [], []
        for e in it.events:
            if e.stream != number:
                continue
            bars.append(((e.start_s - it.start_s) * scale, (e.end_s - e.start_s) * scale))
            shades.append(
                COMM_COLOR if is_communication(e.cls) else CLASS_COLORS.get(e.cls, "#999999")
            )
        _bars(top, row, bars, shades)
    top.set_yticks(range(len(streams)), [f"stream {s}" for s in streams])
    top.set_title(
        f"measured: {c.trace}, {it.step} ({who(c)}), GPU time from its first kernel",
        fontsize=10,
        loc="left",
    )
    colors = {cat.key: cat.color for cat in ALL_CATEGORIES}
    for row, stream in enumerate(sim_streams):
        bars, shades = [], []
        for s in sim_spans:
            if str(s.stream) != stream or s.kind == IDLE:
                continue
            category = CATEGORY_OF_KIND.get(s.kind)
            bars.append((s.start_s * scale, (s.end_s - s.start_s) * scale))
            shades.append(colors.get(category, COMM_COLOR) if category else COMM_COLOR)
        _bars(bottom, row, bars, shades)
    bottom.set_yticks(range(len(sim_streams)), sim_streams)
    bottom.set_title(
        f"simulated: {c.scenario}, stage {c.stage} (GPU {c.gpu}), one iteration",
        fontsize=10,
        loc="left",
    )
    bottom.set_xlim(0, end * scale)
    bottom.set_xlabel("ms")
    for ax in (top, bottom):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=CLASS_COLORS[k], label=CLASS_LABELS[k]) for k in CLASS_COLORS]
    legend.append(Patch(color=COMM_COLOR, label="communication (NCCL / simulated comm)"))
    legend += [
        Patch(color=cat.color, label=f"simulated {cat.label}")
        for cat in ALL_CATEGORIES
        if cat.key in {CATEGORY_OF_KIND.get(s.kind) for s in sim_spans} and cat.key != IDLE
    ]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.28, hspace=0.5)
    return fig


def _bars(ax, row: int, bars: list[tuple[float, float]], colors: list[str]) -> None:
    """A row's bars as one collection, drawn in the order given (overlapping bars cover
    each other as one call per bar did); nothing for an empty row."""
    if bars:
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colors, linewidth=0)


def who(c: Comparison) -> str:
    return f"rank {c.rank}" if c.rank is not None else "one rank"

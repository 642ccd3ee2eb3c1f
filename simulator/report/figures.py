"""The figures: per-GPU timeline, time breakdown, sweep curves, cluster graph.
Builds matplotlib Figure objects only; the CLI saves them."""

from __future__ import annotations

from itertools import groupby

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..results import Result, Trace
from ..vocabulary import (
    BACKWARD,
    BREAKDOWN_KEYS,
    CATEGORIES,
    COMPUTE_STREAM,
    DP_WAIT,
    FORWARD,
    KIND_STYLES,
    PP_SEND,
    PP_WAIT,
    RECOMPUTE,
    STREAM_ORDER,
    TP_COMM,
    TP_WAIT,
    WEIGHT,
)
from .metrics import compute_lanes

# One colour per span kind; waits share their communication's colour, hatched.
COLORS = {kind: style.color for kind, style in KIND_STYLES.items()}
LEGEND = [(kind, style.legend) for kind, style in KIND_STYLES.items() if style.legend]
BREAKDOWN_COLORS = {c.key: c.color for c in CATEGORIES}
BREAKDOWN_NAMES = {c.key: c.label for c in CATEGORIES}


def timeline_figure(result: Result) -> Figure:
    """A Gantt chart: one row per simulated GPU (one per pipeline stage), its compute
    stream on top and its background transfers in a thin band below."""
    trace = result.trace
    lanes = compute_lanes(trace.lanes)
    rows_note = "one GPU per pipeline stage"
    if len({lane.stage for lane in lanes}) < len(lanes):
        # exact mode: every GPU was simulated; draw the first GPU of each stage
        first: dict[int, object] = {}
        for lane in lanes:
            first.setdefault(lane.stage, lane)
        lanes = list(first.values())
        rows_note = "the first GPU of each stage, all simulated"
        shown = {lane.gpu for lane in lanes}
        trace = trace._replace(spans=[sp for sp in trace.spans if sp.gpu in shown])
    row_of = {lane.gpu: i for i, lane in enumerate(lanes)}
    scale, unit = _time_unit(trace.end_s)
    height = min(max(2.0 + 0.45 * len(lanes), 3.0), 16.0)
    fig = Figure(figsize=(14, height), layout="constrained")
    ax = fig.add_subplot()
    few = len(lanes) <= 16 and result.scenario.num_microbatches <= 32
    if len(trace.spans) > RASTER_ABOVE_SPANS:
        _draw_raster(ax, trace, row_of, scale)
    else:
        _draw_bars(ax, trace, row_of, scale)
    if few:
        _label_microbatches(ax, trace, row_of, scale)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(
        [
            f"stage {lane.stage} · GPU {lane.gpu}"
            + (f" (x{lane.stands_for})" if lane.stands_for > 1 else "")
            for lane in lanes
        ],
        fontsize=8 if len(lanes) > 20 else 9,
    )
    ax.set_ylim(len(lanes) - 0.45, -0.55)  # first stage on top, after imshow set limits
    ax.set_xlim(0, trace.end_s * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(
        f"{result.scenario.name}: one iteration, {trace.end_s * scale:.4g} {unit}"
        f" (rows: {rows_note}; thin band: background transfers)"
    )
    fig.legend(
        handles=[Patch(facecolor=COLORS[k], label=name) for k, name in LEGEND],
        loc="outside lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    return fig


# Above this many spans the timeline is drawn as an image, one pixel column per time
# slice coloured by what took most of it: faster, and finer than the eye anyway.
RASTER_ABOVE_SPANS = 20_000


RASTER_COLUMNS = 1400


def _sorted_groups(trace: Trace):
    spans = sorted(
        trace.spans, key=lambda sp: (sp.gpu, STREAM_ORDER.get(sp.stream, 9), sp.kind, sp.start_s)
    )
    return groupby(spans, key=lambda sp: (sp.gpu, sp.stream, sp.kind))


def _band(row: int, stream: str) -> tuple[float, float]:
    """(top, height) of a GPU's compute row or its thin band of background transfers."""
    return (row - 0.38, 0.6) if stream == COMPUTE_STREAM else (row + 0.26, 0.14)


def _draw_bars(ax, trace: Trace, row_of: dict[int, int], scale: float) -> None:
    for (gpu, stream, kind), spans in _sorted_groups(trace):
        bars = _merge([(sp.start_s * scale, sp.end_s * scale) for sp in spans])
        ax.broken_barh(
            [(a, b - a) for a, b in bars],
            _band(row_of[gpu], stream),
            facecolors=COLORS.get(kind, "#999999"),
            edgecolor="none",
            hatch="///" if kind in (PP_WAIT, DP_WAIT, TP_WAIT) else None,
        )


def _draw_raster(ax, trace: Trace, row_of: dict[int, int], scale: float) -> None:
    import numpy as np
    from matplotlib.colors import to_rgb

    edges = np.linspace(0.0, trace.end_s, RASTER_COLUMNS + 1)
    # time per (row band, kind, column); bands: 2 per GPU (compute, background)
    kinds = list(COLORS)
    time = np.zeros((2 * len(row_of), len(kinds), RASTER_COLUMNS))
    for (gpu, stream, kind), spans in _sorted_groups(trace):
        spans = list(spans)
        band = 2 * row_of[gpu] + (stream != COMPUTE_STREAM)
        times = np.array([sp.start_s for sp in spans] + [sp.end_s for sp in spans])
        steps = np.repeat([1.0, -1.0], len(spans))
        order = np.argsort(times, kind="stable")
        times, level = times[order], np.cumsum(steps[order])
        # time covered up to each event, then at each column edge (piecewise linear)
        covered = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
        at_edges = np.interp(edges, times, covered)
        time[band, kinds.index(kind)] += np.diff(at_edges)
    busy = time.sum(axis=1)
    dominant = time.argmax(axis=1)
    image = np.ones((2 * len(row_of), RASTER_COLUMNS, 3))
    palette = np.array([to_rgb(COLORS[k]) for k in kinds])
    has = busy > 0.3 * np.diff(edges)[None, :]  # mostly empty columns stay white
    image[has] = palette[dominant[has]]
    for band in range(image.shape[0]):
        row, background = divmod(band, 2)
        top, height = _band(row, "pp" if background else COMPUTE_STREAM)
        ax.imshow(
            image[band : band + 1],
            aspect="auto",
            interpolation="nearest",
            extent=(0, trace.end_s * scale, top + height, top),
        )


def breakdown_figure(result: Result) -> Figure:
    """Stacked bars: where each pipeline stage's iteration goes."""
    stages = result.metrics["stages"]
    scale, unit = _time_unit(result.trace.end_s)
    fig = Figure(figsize=(max(6.0, 0.3 * len(stages) + 3), 4.5), layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for key in BREAKDOWN_KEYS:
        values = [stage["breakdown_s"][key] * scale for stage in stages]
        ax.bar(
            x,
            values,
            bottom=bottom,
            color=BREAKDOWN_COLORS[key],
            label=BREAKDOWN_NAMES[key],
            width=0.8,
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(x)
    ax.set_xticklabels(
        [str(stage["stage"]) for stage in stages], fontsize=7 if len(stages) > 20 else 9
    )
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title(f"{result.scenario.name}: where the time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def _time_unit(end_s: float) -> tuple[float, str]:
    if end_s >= 1.0:
        return 1.0, "s"
    if end_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _merge(bars: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Join touching intervals so that large runs draw fewer rectangles."""
    merged: list[list[float]] = []
    for start, end in bars:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _label_microbatches(ax, trace: Trace, row_of: dict[int, int], scale: float) -> None:
    """Micro-batch numbers on forward and backward passes, as in the papers' figures."""
    compute = [
        sp
        for sp in trace.spans
        if sp.stream == COMPUTE_STREAM
        and sp.microbatch >= 0
        and sp.kind in (FORWARD, BACKWARD, WEIGHT, RECOMPUTE)
    ]
    # one number per pass: the spans of one label (F3, B3.1, W3) on one GPU
    compute.sort(key=lambda sp: (sp.gpu, sp.label, sp.start_s))
    for (gpu, _), group in groupby(compute, key=lambda sp: (sp.gpu, sp.label)):
        spans = list(group)
        start, end = spans[0].start_s, max(sp.end_s for sp in spans)
        if end - start < trace.end_s / 160:
            continue  # too narrow for a number at the figure's width
        ax.text(
            (start + end) / 2 * scale,
            row_of[gpu] - 0.08,
            str(spans[0].microbatch),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if spans[0].kind == FORWARD else "black",
        )


def sweep_figure(keys: list[str], rows: list[dict], title: str) -> Figure:
    """Iteration time, TFLOP/s per GPU and exposed-communication share against the
    first swept key; one line per combination of the other swept keys."""
    x_key, other = keys[0], keys[1:]
    xs = [row[x_key] for row in rows]
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
    categories = list(dict.fromkeys(xs))
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        ("iteration_time_s", "iteration time (s)", 1.0),
        ("hardware_tflops_per_gpu", "hardware TFLOP/s per GPU", 1.0),
        ("exposed_comm_fraction", "exposed communication (% of iteration)", 100.0),
    ]
    series: dict[tuple, list[dict]] = {}
    for row in rows:
        series.setdefault(tuple(row[k] for k in other), []).append(row)
    for ax, (metric, label, scale) in zip(axes, panels, strict=True):
        for name, points in series.items():
            x = [p[x_key] if numeric else categories.index(p[x_key]) for p in points]
            y = [p[metric] * scale for p in points]
            legend = ", ".join(f"{k}={v}" for k, v in zip(other, name, strict=True))
            ax.plot(x, y, marker="o", label=legend or None)
        ax.set_xlabel(x_key)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        if not numeric:
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels([str(c) for c in categories])
        ax.grid(alpha=0.3)
    if other:
        axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def topology_figure(graph, title: str) -> Figure:
    """The cluster graph, by layer: GPUs, NVSwitches, NICs, then switch levels."""
    import networkx as nx

    from topologies import GPU, NIC, NVSWITCH, SWITCH

    layer = {GPU: 0, NVSWITCH: 1, NIC: 2}

    def layer_of(n: tuple) -> int:
        return 2 + n[1] if n[0] == SWITCH else layer[n[0]]

    undirected = nx.Graph()
    rows: dict[int, list[tuple]] = {}
    for n in sorted(graph, key=lambda n: (layer_of(n), n[1:])):
        undirected.add_node(n)
        rows.setdefault(layer_of(n), []).append(n)
    for a, b, data in graph.edges(data=True):
        undirected.add_edge(a, b, kind=data["kind"], bw=data["bandwidth_bytes_per_s"])
    # Left to right in index order within each layer, so nodes line up with their GPUs.
    positions = {
        n: ((i + 0.5) / len(row), -depth) for depth, row in rows.items() for i, n in enumerate(row)
    }
    fig = Figure(figsize=(14, 7), layout="constrained")
    ax = fig.add_subplot()
    colors = {"nvlink": COLORS[TP_COMM], "pcie": "#888888", "ib": COLORS[PP_SEND]}
    top = max(d["bw"] for _, _, d in undirected.edges(data=True))
    for kind, color in colors.items():
        edges = [(a, b) for a, b, d in undirected.edges(data=True) if d["kind"] == kind]
        widths = [0.5 + 3 * undirected[a][b]["bw"] / top for a, b in edges]
        nx.draw_networkx_edges(
            undirected, positions, edgelist=edges, edge_color=color, width=widths, ax=ax, label=kind
        )
    node_colors = {
        GPU: COLORS[FORWARD],
        NVSWITCH: COLORS[TP_COMM],
        NIC: "#BBBBBB",
        SWITCH: COLORS[PP_SEND],
    }
    for kind, color in node_colors.items():
        nodes = [n for n in undirected if n[0] == kind]
        nx.draw_networkx_nodes(
            undirected,
            positions,
            nodelist=nodes,
            node_color=color,
            node_size=60 if kind != SWITCH else 120,
            ax=ax,
        )
    ax.set_title(
        title + "  (top: GPUs, then NVSwitches, NICs, switch levels; edge width ~ bandwidth)"
    )
    ax.legend(loc="upper right", fontsize=8)
    ax.set_axis_off()
    return fig


def pipeline_figure(studies: list) -> Figure:
    """The papers' pipeline picture: one row per rank, one box per op with its
    micro-batch number; later chunks in lighter shades; one panel per schedule."""
    from matplotlib.colors import to_rgb

    from schedules import parse_label

    ranks = max(s.num_ranks for s in studies)
    height = sum(0.32 * s.num_ranks + 0.9 for s in studies) + 0.6
    fig = Figure(figsize=(12, min(max(height, 2.5), 40)), layout="constrained")
    axes = fig.subplots(len(studies), 1, sharex=True, squeeze=False)[:, 0]
    end = max(s.makespan for s in studies)
    for ax, study in zip(axes, studies, strict=True):
        boxes = [sp for sp in study.trace.spans if sp.kind in (FORWARD, BACKWARD, WEIGHT)]
        width_px = 12 * 100 * 0.85
        groups: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
        for sp in boxes:
            chunk = parse_label(sp.label).chunk
            groups.setdefault((sp.gpu, sp.kind, chunk), []).append(
                (sp.start_s, sp.end_s - sp.start_s)
            )
            if (sp.end_s - sp.start_s) / end * width_px >= 9:
                ax.text(
                    (sp.start_s + sp.end_s) / 2,
                    sp.gpu,
                    str(sp.microbatch),
                    ha="center",
                    va="center",
                    fontsize=6 if study.num_microbatches >= 10 else 7,
                    color="white" if sp.kind == FORWARD and chunk == 0 else "black",
                )
        # one collection per (rank, kind, chunk): fast for hundreds of thousands of ops
        for (rank, kind, chunk), bars in groups.items():
            base = to_rgb(COLORS[kind])
            fade = 0.5 * chunk / max(study.num_chunks - 1, 1)
            ax.broken_barh(
                bars,
                (rank - 0.4, 0.8),
                facecolors=tuple(c + (1 - c) * fade for c in base),
                edgecolors="white",
                linewidth=0.5 if len(boxes) < 5000 else 0.0,
            )
        d = study.as_dict()
        chunks = f", {study.num_chunks} chunks" if study.num_chunks > 1 else ""
        ax.set_title(
            f"{study.name}{chunks}: makespan {d['makespan']:.4g}, bubble {d['bubble_ratio']:.1%} "
            f"of ideal, peak {max(d['per_rank_peak_inflight_w'])} chunk activations",
            fontsize=9,
            loc="left",
        )
        ax.set_ylim(study.num_ranks - 0.5, -0.5)
        ax.set_yticks(range(study.num_ranks))
        ax.set_yticklabels(
            [f"rank {r}" for r in range(study.num_ranks)], fontsize=7 if ranks > 16 else 8
        )
        ax.set_xlim(0, end)
    axes[-1].set_xlabel("time (units of F, B, W)")
    fig.legend(
        handles=[
            Patch(facecolor=COLORS[FORWARD], label="F forward"),
            Patch(facecolor=COLORS[BACKWARD], label="B backward (input grad when split)"),
            Patch(facecolor=COLORS[WEIGHT], label="W weight grad"),
        ],
        loc="outside lower center",
        ncols=3,
        fontsize=8,
        frameon=False,
    )
    return fig


def validation_figure(comparisons):
    """Simulated against measured, one panel per table, on log axes, with the ±8 % band."""
    scored = [c for c in comparisons if c.what in ("iteration", "layer forward", "layer backward")]
    groups = (
        ("Narayanan et al. 2021 Table 1: iteration", ("iteration",), 1.0, "s"),
        (
            "Korthikanti et al. 2022 Table 4: one layer",
            ("layer forward", "layer backward"),
            1e3,
            "ms",
        ),
    )
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (title, kinds, scale, unit) in zip(axes, groups, strict=True):
        rows = [c for c in scored if c.what in kinds]
        if not rows:
            ax.set_axis_off()
            continue
        values = [scale * v for c in rows for v in (c.measured_s, c.simulated_s)]
        low, high = min(values) / 1.3, max(values) * 1.3
        ax.plot([low, high], [low, high], color="black", linewidth=0.8)
        for factor in (0.92, 1.08):
            ax.plot(
                [low, high],
                [low * factor, high * factor],
                color="grey",
                linewidth=0.6,
                linestyle="--",
            )
        for kind, marker in zip(kinds, ("o", "s"), strict=False):
            pts = [c for c in rows if c.what == kind]
            ax.scatter(
                [scale * c.measured_s for c in pts],
                [scale * c.simulated_s for c in pts],
                marker=marker,
                label=kind,
                color=COLORS[FORWARD] if marker == "o" else COLORS[BACKWARD],
                zorder=3,
            )
            for c in pts:
                ax.annotate(
                    c.id,
                    (scale * c.measured_s, scale * c.simulated_s),
                    fontsize=7,
                    xytext=(4, -8),
                    textcoords="offset points",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"simulated ({unit})")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("stepsim vs published measurements (dashed: ±8 %)")
    return fig


def scale_figure(points: list[dict], title: str) -> Figure:
    """Throughput against nodes with the ideal line through the first point, and the
    scaling efficiency."""
    done = [p for p in points if p["row"] is not None]
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    nodes = [p["nodes"] for p in done]
    tokens = [p["row"]["tokens_per_s"] for p in done]
    if done:
        ideal = [tokens[0] * n / nodes[0] for n in nodes]
        left.plot(nodes, ideal, color="0.6", linestyle="--", label="linear")
        left.plot(nodes, tokens, marker="o", label="simulated")
        right.plot(nodes, [100 * p["efficiency"] for p in done], marker="o")
    left.set_xlabel("nodes")
    left.set_ylabel("tokens/s")
    left.legend()
    right.set_xlabel("nodes")
    right.set_ylabel("scaling efficiency (%)")
    right.set_ylim(0, 105)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.suptitle(title)
    return fig

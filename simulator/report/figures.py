"""The charts: sweep curves, scaling against nodes, the validation plot and the
cluster graph. Builds matplotlib Figure objects only; the CLI saves them. The
timelines are in timeline.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import networkx as nx

from stepsim.topologies import GPU, NIC, NVSWITCH, SWITCH

from ..ir.results import MetricsRow, SweepPoint
from ..ir.vocabulary import BACKWARD, FORWARD, PP_SEND, TP_COMM
from .timeline import COLORS

if TYPE_CHECKING:  # matplotlib is imported where a picture is drawn (start-up time)
    from matplotlib.figure import Figure

    from ..plan.questions import ScalePoint

MAX_DRAWN_GPUS = 288  # topology_figure draws clusters up to this size (four NVL72 racks)


def sweep_figure(keys: list[str], points: Sequence[SweepPoint], title: str) -> Figure:
    """Iteration time, TFLOP/s per GPU and exposed-communication share against the
    first swept key; one line per combination of the other swept keys."""
    from matplotlib.figure import Figure

    x_key, other = keys[0], keys[1:]
    xs = [point.settings[x_key] for point in points]
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
    categories = list(dict.fromkeys(xs))
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels: list[tuple[Callable[[MetricsRow], float], str]] = [
        (lambda m: m.iteration_time_s, "iteration time (s)"),
        (lambda m: m.hardware_tflops_per_gpu, "hardware TFLOP/s per GPU"),
        (lambda m: 100.0 * m.exposed_comm_fraction, "exposed communication (% of iteration)"),
    ]
    series: dict[tuple, list[SweepPoint]] = {}
    for point in points:
        series.setdefault(tuple(point.settings[k] for k in other), []).append(point)
    for ax, (metric, label) in zip(axes, panels, strict=True):
        highest = 0.0
        for j, (name, members) in enumerate(series.items()):
            # side by side at a category, so that equal values do not hide each other
            dodge = (j - (len(series) - 1) / 2) * min(0.08, 0.6 / len(series))
            x = [
                p.settings[x_key] if numeric else categories.index(p.settings[x_key]) + dodge
                for p in members
            ]
            y = [metric(p.metrics) for p in members]
            highest = max(highest, *y)
            legend = ", ".join(f"{k}={v}" for k, v in zip(other, name, strict=True))
            # categories are not a scale: markers only, no line between them
            ax.plot(
                x,
                y,
                marker="o",
                linestyle="-" if numeric else "none",
                label=legend or None,
                clip_on=False,
            )
        ax.set_xlabel(x_key)
        ax.set_ylabel(label)
        ax.margins(x=0.08)  # markers stay whole
        # from zero: a 2 % difference looks like one, not like the whole panel
        ax.set_ylim(0.0, 1.1 * highest if highest > 0 else 1.0)
        if not numeric:
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels([str(c) for c in categories])
        ax.grid(alpha=0.3)
    if other:
        axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def topology_figure(graph, title: str, planes: int = 1) -> Figure:
    """The cluster graph, by layer: GPUs, NVSwitches, NICs, then switch levels. With
    ``planes`` > 1 (rail-only, multi-plane) the leaves are drawn plane by plane (leaf i
    is on plane i mod planes), each plane's above its own spines."""
    from matplotlib.figure import Figure

    layer = {GPU: 0, NVSWITCH: 1, NIC: 2}

    def layer_of(n: tuple) -> int:
        return 2 + n[1] if n[0] == SWITCH else layer[n[0]]

    undirected = nx.Graph()
    rows: dict[int, list[tuple]] = {}

    def order(n: tuple) -> tuple:
        if planes > 1 and n[0] == SWITCH and n[1] == 1:
            return (layer_of(n), n[2] % planes, n[2])
        return (layer_of(n), *n[1:])

    for n in sorted(graph, key=order):
        undirected.add_node(n)
        rows.setdefault(layer_of(n), []).append(n)
    for a, b, data in graph.edges(data=True):
        undirected.add_edge(a, b, kind=data["kind"], bw=data["bandwidth_bytes_per_s"])
    # Left to right in index order within each layer, so nodes line up with their GPUs.
    positions = {
        n: ((i + 0.5) / len(row), -depth) for depth, row in rows.items() for i, n in enumerate(row)
    }
    # rows wider than 128 (several 72-GPU racks) get smaller dots and thinner lines
    crowd = min(1.0, 128 / max(len(row) for row in rows.values()))
    fig = Figure(figsize=(14, 7), layout="constrained")
    ax = fig.add_subplot()
    colors = {"nvlink": COLORS[TP_COMM], "pcie": "#888888", "ib": COLORS[PP_SEND]}
    top = max(d["bw"] for _, _, d in undirected.edges(data=True))
    for kind, color in colors.items():
        edges = [(a, b) for a, b, d in undirected.edges(data=True) if d["kind"] == kind]
        widths = [(0.5 + 3 * undirected[a][b]["bw"] / top) * crowd for a, b in edges]
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
            node_size=(60 if kind != SWITCH else 120) * crowd,
            ax=ax,
        )
    names = {GPU: "GPUs", NVSWITCH: "NVSwitches", NIC: "NICs"}
    for depth, row in rows.items():
        kind = row[0][0]
        name = names.get(kind) or f"level-{row[0][1]} switches"
        ax.text(-0.02, -depth, f"{name} ({len(row)})", ha="right", va="center", fontsize=9)
        if len(row) <= 64:  # each node's index where there is room for it
            for n in row:
                x, y = positions[n]
                label = str(n[1]) if kind in (GPU, NVSWITCH) else ".".join(map(str, n[1:]))
                ax.text(x, y - 0.12, label, ha="center", va="top", fontsize=6)
    ax.set_xlim(-0.2, 1.0)
    ax.set_title(title + "  (edge width ~ bandwidth; NIC k.j: node k's NIC j)")
    # below the drawing, clear of the GPU row and of the last switch
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    ax.set_axis_off()
    return fig


def validation_figure(by_set, band: float):
    """Simulated against measured, one panel per table, on log axes, with the band of
    ± ``band`` (the target's row limit, 0.08 for ±8 %)."""
    from matplotlib.figure import Figure

    groups = (
        ("A100 · Narayanan et al. 2021 Table 1: iteration", "a100", ("iteration",), 1.0, "s"),
        (
            "A100 · Korthikanti et al. 2022 Table 4: one layer",
            "a100",
            ("layer forward", "layer backward"),
            1e3,
            "ms",
        ),
        ("V100 · Megatron-LM 2020, DGX-2: iteration", "v100", ("iteration",), 1.0, "s"),
        (
            "H100 · Megatron-Core 2024: FLOPs / model TFLOP/s",
            "h100",
            ("model TFLOP/s",),
            1.0,
            "s",
        ),
    )
    fig = Figure(figsize=(11, 9.6), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, (title, name, kinds, scale, unit) in zip(axes, groups, strict=True):
        rows = [c for c in by_set.get(name, ()) if c.what in kinds]
        if not rows:
            ax.set_axis_off()
            continue
        values = [scale * v for c in rows for v in (c.measured_s, c.simulated_s)]
        low, high = min(values) / 1.3, max(values) * 1.3
        ax.plot([low, high], [low, high], color="black", linewidth=0.8)
        for factor in (1 - band, 1 + band):
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
            # labels alternate below-right and above-left along the diagonal, so that
            # neighbours (rows of similar size) do not print over each other
            for i, c in enumerate(sorted(pts, key=lambda c: c.measured_s)):
                ax.annotate(
                    c.id,
                    (scale * c.measured_s, scale * c.simulated_s),
                    fontsize=7,
                    xytext=(5, -9) if i % 2 == 0 else (-16, 5),
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
    fig.suptitle(f"stepsim vs published measurements (dashed: ±{100 * band:g} %)")
    return fig


def scale_figure(points: Sequence[ScalePoint], title: str) -> Figure:
    """Throughput against nodes with the ideal line through the first point, and the
    scaling efficiency."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    done = [
        (p.nodes, p.metrics, p.scaled)
        for p in points
        if p.metrics is not None and p.scaled is not None
    ]
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    nodes = [n for n, _, _ in done]
    tokens = [m.tokens_per_s for _, m, _ in done]
    if done:
        ideal = [tokens[0] * n / nodes[0] for n in nodes]
        left.plot(nodes, ideal, color="0.6", linestyle="--", label="linear")
        left.plot(nodes, tokens, marker="o", label="simulated")
        right.plot(nodes, [100 * scaled.efficiency for _, _, scaled in done], marker="o")
    left.set_xlabel("nodes")
    left.set_ylabel("tokens/s (log scale)")
    left.legend()
    right.set_xlabel("nodes")
    right.set_ylabel("scaling efficiency (%)")
    right.set_ylim(0, 105)
    # log-log on the left: linear scaling is a straight line of slope 1
    left.set_yscale("log")
    # ticks at the simulated throughputs (log axes leave too few of their own)
    left.set_yticks(tokens, [f"{v / 1e3:,.0f}k" if v >= 1e4 else f"{v:,.0f}" for v in tokens])
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig

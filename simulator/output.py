"""What a person reads: the text summary, the timeline and breakdown figures,
and the Chrome trace. Builds objects only; the CLI writes them to files."""

from __future__ import annotations

from itertools import groupby

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .engine import DP_WAIT, IDLE, PP_WAIT, TP_WAIT, Trace
from .metrics import BREAKDOWN_KEYS, compute_lanes
from .run import Result
from .workload import BACKWARD, DP_SYNC, FORWARD, OPTIMIZER, PP_SEND, RECOMPUTE, TP_COMM

# One colour per span kind; waits share their communication's colour, hatched.
COLORS = {
    FORWARD: "#4C72B0",
    BACKWARD: "#DD8452",
    RECOMPUTE: "#8172B3",
    TP_COMM: "#55A868",
    TP_WAIT: "#55A868",
    PP_SEND: "#C44E52",
    PP_WAIT: "#C44E52",
    DP_SYNC: "#937860",
    DP_WAIT: "#937860",
    OPTIMIZER: "#222222",
    IDLE: "#EEEEEE",
}
LEGEND = [
    (FORWARD, "forward"),
    (BACKWARD, "backward"),
    (RECOMPUTE, "recompute"),
    (TP_COMM, "tensor-parallel comm"),
    (PP_SEND, "pipeline p2p (send / exposed wait)"),
    (DP_SYNC, "data-parallel grad sync"),
    (OPTIMIZER, "optimizer"),
    (IDLE, "idle (bubble)"),
]
BREAKDOWN_COLORS = {
    "compute": COLORS[FORWARD],
    "tp_comm": COLORS[TP_COMM],
    "pp_p2p": COLORS[PP_SEND],
    "dp_sync": COLORS[DP_SYNC],
    "optimizer": COLORS[OPTIMIZER],
    "idle": "#BBBBBB",
}
_STREAM_ORDER = {"compute": 0, "pp": 1, "dp": 2, "tp": 3}


# -- text ------------------------------------------------------------------------------


def summary_text(result: Result) -> str:
    s, m = result.scenario, result.metrics
    par, tr, cl = s.parallel, s.training, s.cluster
    node = f"{cl.node} nodes" if cl.node else f"nodes of {cl.gpus_per_node}"
    used = f"{m['num_gpus']} GPUs"
    if m["num_gpus"] < cl.num_gpus:
        used += f" of {cl.num_gpus}"
    lines = [
        f"stepsim · {s.name}",
        f"  {used} ({cl.num_nodes} {node}, {cl.gpu.name}, {cl.nics_per_node} x "
        f"{cl.nic_gbps:g} Gb/s NICs per node)",
        f"  TP {par.tensor_model_parallel_size} x PP {par.pipeline_model_parallel_size} x "
        f"DP {par.data_parallel_size}"
        + (" + sequence parallel" if par.sequence_parallel else "")
        + f" · {m['num_microbatches']} micro-batches of {tr.micro_batch_size} per pipeline"
        f" · {tr.schedule} · recompute {tr.recompute_granularity}"
        + (" · overlapped grad reduce" if tr.overlap_grad_reduce else "")
        + f" · {s.network.model} network",
        "",
        f"  iteration time            {m['iteration_time_s']:.4g} s",
        f"  throughput                {m['tokens_per_s']:,.0f} tokens/s",
        f"  hardware TFLOP/s per GPU  {m['hardware_tflops_per_gpu']:.1f}  (recomputation included)",
        f"  model TFLOP/s per GPU     {m['model_tflops_per_gpu']:.1f}",
        f"  MFU                       {100 * m['mfu']:.1f} %",
        f"  pipeline bubble           {100 * m['bubble_fraction']:.1f} % of the iteration",
        f"  memory per GPU            {m['memory_per_gpu_gib']:.1f} GiB of "
        f"{m['gpu_memory_gib']:g} GiB (peak on stage {m['memory_peak_stage']})",
    ]
    if m["memory_per_gpu_gib"] > m["gpu_memory_gib"]:
        lines.append("  WARNING: this layout does not fit in GPU memory")
    iteration = m["iteration_time_s"]
    lines += ["", "  where the time goes, mean per GPU      seconds       %"]
    for key in BREAKDOWN_KEYS:
        value = m["breakdown_s"][key]
        share = 100 * value / iteration if iteration else 0.0
        lines.append(f"    {_BREAKDOWN_NAMES[key]:<34}{value:>10.4g}{share:>8.1f}")
    lines += ["", _stage_table(m["stages"])]
    if m.get("busiest_links"):
        lines += ["", "  busiest links (mean utilization over the iteration)"]
        for entry in m["busiest_links"]:
            lines.append(
                f"    {100 * entry['utilization']:5.1f} %  {entry['gbytes']:>10.3g} GB  "
                f"{entry['kind']:<7}{entry['link']}"
            )
    return "\n".join(lines)


_BREAKDOWN_NAMES = {
    "compute": "compute",
    "tp_comm": "tensor-parallel comm (exposed)",
    "pp_p2p": "pipeline p2p (exposed)",
    "dp_sync": "data-parallel sync (exposed)",
    "optimizer": "optimizer step",
    "idle": "idle (pipeline bubble)",
}


def _stage_table(stages: list[dict]) -> str:
    head = "  per stage (seconds)  " + "".join(f"{k:>10}" for k in BREAKDOWN_KEYS) + "   mem GiB"
    rows = [head]
    shown = stages if len(stages) <= 12 else stages[:5] + [None] + stages[-5:]
    for stage in shown:
        if stage is None:
            rows.append("    ...")
            continue
        values = "".join(f"{stage['breakdown_s'][k]:>10.3g}" for k in BREAKDOWN_KEYS)
        rows.append(
            f"    stage {stage['stage']:<3} x{stage['stands_for_gpus']:<5}  {values}"
            f"{stage['memory_gib']['total']:>10.1f}"
        )
    return "\n".join(rows)


# -- figures ---------------------------------------------------------------------------


def timeline_figure(result: Result) -> Figure:
    """A Gantt chart: one row per simulated GPU (one per pipeline stage), its compute
    stream on top and its background transfers in a thin band below."""
    trace = result.trace
    lanes = compute_lanes(trace.lanes)
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
        " (rows: one GPU per pipeline stage; thin band: background transfers)"
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
        trace.spans, key=lambda sp: (sp.gpu, _STREAM_ORDER.get(sp.stream, 9), sp.kind, sp.start_s)
    )
    return groupby(spans, key=lambda sp: (sp.gpu, sp.stream, sp.kind))


def _band(row: int, stream: str) -> tuple[float, float]:
    """(top, height) of a GPU's compute row or its thin band of background transfers."""
    return (row - 0.38, 0.6) if stream == "compute" else (row + 0.26, 0.14)


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
        band = 2 * row_of[gpu] + (stream != "compute")
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
        top, height = _band(row, "pp" if background else "compute")
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
            label=_BREAKDOWN_NAMES[key],
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
        if sp.stream == "compute"
        and sp.microbatch >= 0
        and sp.kind in (FORWARD, BACKWARD, RECOMPUTE)
    ]
    compute.sort(key=lambda sp: (sp.gpu, sp.microbatch, sp.kind == FORWARD, sp.start_s))
    for (gpu, mb, forward), group in groupby(
        compute, key=lambda sp: (sp.gpu, sp.microbatch, sp.kind == FORWARD)
    ):
        spans = list(group)
        start, end = spans[0].start_s, max(sp.end_s for sp in spans)
        ax.text(
            (start + end) / 2 * scale,
            row_of[gpu] - 0.08,
            str(mb),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if forward else "black",
        )


# -- Chrome trace ----------------------------------------------------------------------


def chrome_trace(result: Result) -> dict:
    """Chrome trace event format: a process per simulated GPU, a thread per stream.
    Opens in Perfetto (ui.perfetto.dev) and chrome://tracing."""
    events: list[dict] = []
    streams = sorted(
        {sp.stream for sp in result.trace.spans}, key=lambda s: _STREAM_ORDER.get(s, 9)
    )
    tids = {stream: i for i, stream in enumerate(streams)}
    for lane in compute_lanes(result.trace.lanes):
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(
            {"ph": "M", "name": "process_name", "pid": lane.gpu, "tid": 0, "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": lane.gpu,
                "tid": 0,
                "args": {"sort_index": lane.stage},
            }
        )
        for stream, tid in tids.items():
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": lane.gpu,
                    "tid": tid,
                    "args": {"name": stream},
                }
            )
    for sp in result.trace.spans:
        events.append(
            {
                "ph": "X",
                "name": f"{sp.label} {sp.kind}",
                "cat": sp.kind,
                "pid": sp.gpu,
                "tid": tids[sp.stream],
                "ts": sp.start_s * 1e6,
                "dur": (sp.end_s - sp.start_s) * 1e6,
                "args": {"microbatch": sp.microbatch},
            }
        )
    events += _link_counters(result)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": result.scenario.name},
    }


NETWORK_PID = 1_000_000_000  # a process of its own for the link counters


def _link_counters(result: Result, top: int = 8, bins: int = 400) -> list[dict]:
    """Utilization of the busiest links over time, as Chrome trace counter tracks."""
    from .linkstats import utilization_over_time

    busiest = result.metrics.get("busiest_links", [])[:top]
    if not busiest:
        return []
    chosen = [entry["index"] for entry in busiest]
    capacities = [link.bandwidth_bytes_per_s for link in result.cluster.links]
    edges, series = utilization_over_time(
        result.trace.link_intervals, capacities, chosen, result.trace.end_s, bins
    )
    events: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": NETWORK_PID,
            "tid": 0,
            "args": {"name": "network: busiest links (utilization %)"},
        }
    ]
    for entry in busiest:
        for start, value in zip(edges[:-1], series[entry["index"]], strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": entry["link"],
                    "pid": NETWORK_PID,
                    "ts": start * 1e6,
                    "args": {"utilization %": round(100 * float(value), 3)},
                }
            )
    return events


# -- sweeps ----------------------------------------------------------------------------


def sweep_table_text(keys: list[str], rows: list[dict]) -> str:
    head = [*keys, "iteration s", "HW TFLOP/s", "MFU %", "bubble %", "exposed comm %", "mem GiB"]
    body = [
        [
            *(str(row[k]) for k in keys),
            f"{row['iteration_time_s']:.4g}",
            f"{row['hardware_tflops_per_gpu']:.1f}",
            f"{100 * row['mfu']:.1f}",
            f"{100 * row['bubble_fraction']:.1f}",
            f"{100 * row['exposed_comm_fraction']:.1f}",
            f"{row['memory_per_gpu_gib']:.1f}",
        ]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [head, *body]
    ]
    return "\n".join(lines)


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


# -- topology --------------------------------------------------------------------------

_LEVEL_NAMES = {1: "leaf", 2: "spine/aggregation", 3: "core"}
MAX_DRAWN_GPUS = 128


def topology_text(scenario, summary: dict) -> str:
    cl = scenario.cluster
    three_levels = cl.fabric == "fat-tree" and cl.fabric_levels == 3
    lines = [
        f"stepsim topology · {scenario.name}",
        f"  {summary['num_nodes']} nodes x {cl.gpus_per_node} GPUs"
        + (f" ({cl.node})" if cl.node else "")
        + f" = {summary['num_gpus']} GPUs, {summary['num_nics']} NICs of {cl.nic_gbps:g} Gb/s",
        f"  inside a node: {cl.nvlink_topology}, {cl.nvlink_gbytes_per_s:g} GB/s NVLink per GPU "
        f"per direction; GPU-NIC over PCIe at {cl.pcie_gbytes_per_s:g} GB/s",
        f"  fabric: {cl.fabric}"
        + (
            ""
            if cl.fabric == "switch"
            else f", {cl.nodes_per_leaf} nodes per leaf, {cl.spine_switches} switches above each "
            f"leaf{' and pod' if three_levels else ''}, oversubscription "
            f"{cl.oversubscription:g}:1"
            + (
                f", 3 levels ({cl.leaves_per_pod} leaves per pod)"
                if cl.fabric == "fat-tree" and cl.fabric_levels == 3
                else ""
            )
        ),
        "  switches: "
        + ", ".join(
            f"{n} {_LEVEL_NAMES.get(level, f'level {level}')}"
            for level, n in summary["switches_by_level"].items()
        ),
        "",
        "  directed links   count   GB/s each (min-max)   total GB/s",
    ]
    for kind, entry in summary["links"].items():
        lo, hi = entry["min_bytes_per_s"] / 1e9, entry["max_bytes_per_s"] / 1e9
        each = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        lines.append(
            f"    {kind:<12}{entry['count']:>8}   {each:>19}   "
            f"{entry['total_bytes_per_s'] / 1e9:>10,.0f}"
        )
    bisection = summary["bisection_bytes_per_s"]
    half = summary["num_nodes"] // 2
    if bisection:
        lines += [
            "",
            f"  bisection bandwidth: {bisection / 1e9:,.0f} GB/s one way "
            f"({bisection * 8 / 1e12:,.1f} Tb/s) from nodes 0-{half - 1} to "
            f"{half}-{summary['num_nodes'] - 1}",
        ]
    return "\n".join(lines)


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

"""The timelines: a simulated iteration per GPU (Gantt chart), where each stage's time
goes, and the bubble study's pipeline picture. Builds matplotlib Figure objects only;
the CLI saves them. Charts of sweeps, scaling, validation and the cluster graph are in
figures.py."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from stepsim.schedules import parse_label

from ..ir.ops import Lane
from ..ir.results import FastForward, Result, Span, Trace
from ..ir.vocabulary import (
    BACKWARD,
    COMM_WAITS,
    COMPUTE_STREAM,
    CP_COMM,
    CP_WAIT,
    DP_SYNC,
    DP_WAIT,
    EP_COMM,
    EP_WAIT,
    FORWARD,
    IDLE,
    KIND_STYLES,
    OPTIMIZER,
    PASS_KINDS,
    PP_SEND,
    PP_STREAM,
    PP_WAIT,
    RECOMPUTE,
    STREAM_ORDER,
    TP_COMM,
    TP_WAIT,
    WEIGHT,
    categories_of,
)
from .idle import IDLE_CAUSE_STYLES, IdleMap
from .metrics import compute_lanes
from .summary import decimal_places

if TYPE_CHECKING:  # matplotlib is imported where a picture is drawn (start-up time)
    from matplotlib.figure import Figure

# One colour per span kind; waits share their communication's colour, hatched.
COLORS = {kind: style.color for kind, style in KIND_STYLES.items()}
LEGEND = [(kind, style.legend) for kind, style in KIND_STYLES.items() if style.legend]
# a wait kind's legend entry is its communication's: the last kind before it with one
LEGEND_OF = {
    kind: [k for k, style in list(KIND_STYLES.items())[: i + 1] if style.legend][-1]
    for i, kind in enumerate(KIND_STYLES)
}


class TimelineView(NamedTuple):
    """What a timeline shows, whoever paints it (`timeline_figure` with matplotlib,
    pictures.timeline_svg as SVG): its rows (one GPU per pipeline stage), their spans and
    idle, the time axis (the whole iteration, in ``unit``: seconds times ``scale``), and
    how it is drawn (``binned``: as time slices; ``numbered``: micro-batch numbers)."""

    result: Result
    trace: Trace  # the rows' spans; ``end_s`` the whole iteration's end
    lanes: list[Lane]
    row_of: dict[int, int]  # each row's GPU -> row
    idle: IdleMap | None
    ff: FastForward | None
    short_end_s: float  # the simulated run's end (the iteration's without a fast-forward)
    scale: float
    unit: str
    binned: bool
    numbered: bool
    rows_note: str


def timeline_view(result: Result, idle: IdleMap | None = None) -> TimelineView:
    """The timeline of ``result`` (with ``idle``, run/idlemap.py, the idle by cause)."""
    trace = result.trace
    lanes = compute_lanes(trace.lanes)
    rows_note = "one GPU per pipeline stage"
    if len({lane.stage for lane in lanes}) < len(lanes):
        # several lanes a stage: exact mode (every GPU simulated), or the replicas a
        # perturbation touches beside the representatives; the first GPU of each stage,
        # and after it each GPU a perturbation names (a straggler is what one asks to see)
        named = perturbed_gpus(result.scenario)
        first: dict[int, Lane] = {}
        extra: list[Lane] = []
        for lane in lanes:
            if first.setdefault(lane.stage, lane) is not lane and lane.gpu in named:
                extra.append(lane)
        extra = extra[:PERTURBED_ROWS]
        lanes = sorted([*first.values(), *extra], key=lambda lane: lane.stage)
        touched = result.scenario.perturbations and result.scenario.network.symmetry
        rows_note = (
            "each stage's first class of GPUs that ran alike, by its first GPU"
            if result.classes is not None
            else "the first GPU of each stage, for its untouched replicas"
            if touched
            else "the first GPU of each stage, all simulated"
        ) + ("; and each perturbed GPU" if extra else "")
        shown = {lane.gpu for lane in lanes}
        trace = trace._replace(spans=[sp for sp in trace.spans if sp.gpu in shown])
    if idle is not None:
        idle = {gpu: idle[gpu] for gpu in (lane.gpu for lane in lanes) if gpu in idle}
    ff = result.metrics.fast_forward
    short_end_s = trace.end_s
    trace = trace._replace(end_s=full_end_s(trace.end_s, ff))  # drawn: the whole iteration
    scale, unit = _time_unit(trace.end_s)
    return TimelineView(
        result,
        trace,
        lanes,
        {lane.gpu: i for i, lane in enumerate(lanes)},
        idle,
        ff,
        short_end_s,
        scale,
        unit,
        binned=drawn_spans(trace.spans, ff) > RASTER_ABOVE_SPANS,
        numbered=len(lanes) <= 16 and result.scenario.num_microbatches <= 32,
        rows_note=rows_note,
    )


# the most rows a timeline adds for perturbed GPUs (a slow node names 8)
PERTURBED_ROWS = 8


def perturbed_gpus(scenario) -> set[int]:
    """The GPUs a scenario's perturbations name: a ``gpu``, or a ``node``'s GPUs (a
    perturbation of every GPU, or of a link, names none here)."""
    gpn = scenario.cluster.gpus_per_node
    named: set[int] = set()
    for p in scenario.perturbations:
        if p.gpu is not None:
            named.add(p.gpu)
        elif p.node is not None:
            named.update(range(p.node * gpn, (p.node + 1) * gpn))
    return named


def row_labels(view: TimelineView) -> list[str]:
    named = perturbed_gpus(view.result.scenario) if view.result.scenario.perturbations else set()
    return [
        f"stage {lane.stage} · GPU {lane.gpu}"
        + (f" (x{lane.stands_for})" if lane.stands_for > 1 else "")
        + (" (perturbed)" if lane.gpu in named else "")
        for lane in view.lanes
    ]


def title_lines(view: TimelineView) -> list[str]:
    """The title, line by line (the first may hold a newline where it would not fit)."""
    result, trace, ff, scale, unit = view.result, view.trace, view.ff, view.scale, view.unit
    head = f"{result.scenario.name}: one iteration, {_digits4(trace.end_s * scale)} {unit}"
    rows = f"(rows: {view.rows_note}; thin band: background transfers)"
    lines = [head + (" " if len(head) + len(rows) < TITLE_CHARS else "\n") + rows]
    if ff is not None:
        # what was simulated, and where the repeats of its proved period are drawn
        cut_s = ff.proved_at_s + ff.period_s
        lines.append(
            f"fast-forward: {ff.simulated_microbatches} of {result.metrics.num_microbatches:,} "
            f"micro-batches simulated (to {_digits4(view.short_end_s * scale)} {unit}); from "
            f"{_digits4(cut_s * scale)} to "
            f"{_digits4((cut_s + ff.periods_skipped * ff.period_s) * scale)} {unit}, their "
            f"proved period of {_digits4(ff.period_s * scale)} {unit} repeated "
            f"{ff.periods_skipped:,} times"
        )
    if view.binned:
        lines.append(
            f"binned: {len(trace.spans):,} {'' if ff is None else 'simulated '}spans drawn as "
            f"{RASTER_COLUMNS:,} time slices, each stacked by the share of its time each kind took"
            + (" (idle: each cause's share)" if view.idle is not None else "")
        )
    return lines


def legend_entries(view: TimelineView, drawn: set[str]) -> tuple[list[tuple[str, str]], str | None]:
    """The legend's (colour, label) entries and its title (None: none). It names what is
    drawn (a wait shares its communication's entry), and idle: as one entry, or by cause
    (all three, so that a cause absent is seen to be)."""
    idle = view.idle
    named = drawn | {LEGEND_OF[k] for k in drawn} | ({IDLE} if idle is None else set())
    entries = [(COLORS[k], name) for k, name in LEGEND if k in named]
    if idle is not None:
        entries += [(style.color, style.legend) for style in IDLE_CAUSE_STYLES.values()]
    title = None
    if view.binned:
        title = "binned: share of each time slice" + ("" if idle is None else ", idle by cause")
    if view.ff is not None and idle is not None:
        # the causes are split over the micro-batches simulated (run/idlemap.py)
        repeated = "idle causes as split in the micro-batches simulated, its period repeated"
        title = repeated if title is None else f"{title}; {repeated}"
    return entries, title


def timeline_figure(result: Result, idle: IdleMap | None = None) -> Figure:
    """A Gantt chart: one row per simulated GPU (one per pipeline stage), its compute
    stream on top and its background transfers in a thin band below. With ``idle``
    (run/idlemap.py) the idle is drawn by cause, each in a light colour of its own."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    view = timeline_view(result, idle)
    lanes, trace, scale = view.lanes, view.trace, view.scale
    height = min(max(2.0 + 0.45 * len(lanes), 3.0), 16.0)
    fig = Figure(figsize=(14, height), layout="constrained")
    ax = fig.add_subplot()
    drawn = _draw_raster(ax, view) if view.binned else _draw_bars(ax, view)
    if view.numbered:
        for x, y, text, color in microbatch_labels(view):
            ax.text(
                x,
                y,
                text,
                ha="center",
                va="center",
                fontsize=LABEL_FONT_PT,
                color=color,
                # inside the axes: the layout need not measure each of hundreds of labels
                in_layout=False,
            )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(row_labels(view), fontsize=8 if len(lanes) > 20 else 9)
    ax.set_ylim(len(lanes) - 0.45, -0.55)  # first stage on top
    ax.set_xlim(0, trace.end_s * scale)
    ax.set_xlabel(f"time ({view.unit})")
    ax.set_title("\n".join(title_lines(view)))
    entries, title = legend_entries(view, drawn)
    fig.legend(
        handles=[Patch(facecolor=color, label=label) for color, label in entries],
        loc="outside lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
        title=title,
        title_fontsize=8,
    )
    return fig


TITLE_CHARS = 130  # a title line longer than this is cut off at the 14-inch figure's edge

# Above this many spans the timeline is drawn as an image, one pixel column per time
# slice coloured by what took most of it: faster, and finer than the eye anyway.
RASTER_ABOVE_SPANS = 20_000


RASTER_COLUMNS = 1400
RASTER_PIXELS = (20, 5)  # pixel rows of a compute band and of a background band
# top to bottom in a raster column: compute kinds, then what waits or talks
STACK_ORDER = (
    FORWARD,
    RECOMPUTE,
    BACKWARD,
    WEIGHT,
    TP_COMM,
    TP_WAIT,
    CP_COMM,
    CP_WAIT,
    EP_COMM,
    EP_WAIT,
    PP_SEND,
    PP_WAIT,
    DP_SYNC,
    DP_WAIT,
    OPTIMIZER,
)


def _span_groups(
    spans: Sequence[Span], kinds: Collection[str] | None = None
) -> list[tuple[tuple[int, str, str], np.ndarray, np.ndarray]]:
    """The spans (of ``kinds``; None: all) by (GPU, stream, kind), in order of GPU,
    stream (`STREAM_ORDER`) and kind, each group's starts and ends in order of start
    (spans starting together in trace order): found from arrays, not a sort of spans."""
    n = len(spans)
    if not n:
        return []
    gpu = np.fromiter(map(itemgetter(0), spans), np.int64, n)
    stream_of, kind_of = list(map(itemgetter(1), spans)), list(map(itemgetter(2), spans))
    streams = list(dict.fromkeys(stream_of))
    names = list(dict.fromkeys(kind_of))
    stream_code = {stream: k for k, stream in enumerate(streams)}
    kind_code = {kind: k for k, kind in enumerate(names)}
    kind = np.fromiter(map(kind_code.__getitem__, kind_of), np.int64, n)
    stream = np.fromiter(map(stream_code.__getitem__, stream_of), np.int64, n)
    key = (gpu * len(streams) + stream) * len(names) + kind
    start = np.fromiter(map(itemgetter(5), spans), np.float64, n)
    end = np.fromiter(map(itemgetter(6), spans), np.float64, n)
    if kinds is not None:
        kept = np.nonzero(np.isin(kind, [kind_code[k] for k in kinds if k in kind_code]))[0]
        key, start, end = key[kept], start[kept], end[kept]
    order = np.lexsort((start, key))  # stable: spans starting together keep trace order
    key = key[order]
    cut = (np.nonzero(key[1:] != key[:-1])[0] + 1).tolist()
    groups = []
    for low, high in zip([0, *cut], [*cut, len(key)], strict=True):
        if high > low:
            track, k = divmod(int(key[low]), len(names))
            at = order[low:high]
            found = (track // len(streams), streams[track % len(streams)], names[k])
            groups.append((found, start[at], end[at]))
    groups.sort(key=lambda group: (group[0][0], STREAM_ORDER.get(group[0][1], 9), group[0][2]))
    return groups


def _band(row: int, stream: str) -> tuple[float, float]:
    """(top, height) of a GPU's compute row or its thin band of background transfers."""
    return (row - 0.38, 0.6) if stream == COMPUTE_STREAM else (row + 0.26, 0.14)


class Bars(NamedTuple):
    """Bars of one colour in one band of a row, (start, width) in the view's unit; an
    ``outlined`` background (the idle under a row) or ``hatched`` (a wait)."""

    row: int
    stream: str
    color: str
    bars: list[tuple[float, float]]
    hatched: bool = False
    outlined: bool = False


def bar_groups(view: TimelineView) -> tuple[list[Bars], set[str]]:
    """Each span group as bars, over an idle background from 0 to the end, and the idle
    pieces by cause over it (with idle; then the idle spans are not drawn), in drawing
    order, and the kinds drawn. A fast-forwarded run's spans and idle as the whole
    iteration's (`full_iteration`)."""
    trace, row_of, scale, ff = view.trace, view.row_of, view.scale, view.ff
    out = [
        Bars(row, COMPUTE_STREAM, COLORS[IDLE], [(0, trace.end_s * scale)], outlined=True)
        for row in row_of.values()
    ]
    for gpu, pieces in (view.idle or {}).items():
        for cause, style in IDLE_CAUSE_STYLES.items():
            found = [(p.start_s, p.end_s) for p in pieces if p.cause == cause]
            if found:
                pairs = np.array(found).reshape(-1, 2)
                starts, ends = full_iteration(pairs[:, 0], pairs[:, 1], ff)
                lengths = (ends - starts) * scale
                bars = list(zip((starts * scale).tolist(), lengths.tolist(), strict=True))
                out.append(Bars(row_of[gpu], COMPUTE_STREAM, style.color, bars))
    drawn = set()
    for (gpu, stream, kind), starts, ends in _span_groups(trace.spans):
        if view.idle is not None and kind == IDLE:
            continue  # drawn by cause
        drawn.add(kind)
        starts, ends = full_iteration(starts, ends, ff)
        merged = _merge(list(zip((starts * scale).tolist(), (ends * scale).tolist(), strict=True)))
        out.append(
            Bars(
                row_of[gpu],
                stream,
                COLORS.get(kind, "#999999"),
                [(a, b - a) for a, b in merged],
                hatched=kind in COMM_WAITS,
            )
        )
    return out, drawn


def _draw_bars(ax, view: TimelineView) -> set[str]:
    """`bar_groups` on the axes: the kinds drawn."""
    groups, drawn = bar_groups(view)
    for group in groups:
        band = _band(group.row, group.stream)
        if group.outlined:
            ax.broken_barh(group.bars, band, facecolors=group.color)
        else:
            ax.broken_barh(
                group.bars,
                band,
                facecolors=group.color,
                edgecolor="none",
                hatch="///" if group.hatched else None,
            )
    return drawn


class Raster(NamedTuple):
    """The binned timeline's pixels: each row's compute band (row, RASTER_PIXELS[0]
    pixel rows, column) and background band (RASTER_PIXELS[1] rows), each pixel the
    index of its colour in ``colors`` (the kinds, then idle causes, then the idle of a
    compute band and the white of a background band), and the kinds drawn."""

    compute: np.ndarray
    background: np.ndarray
    colors: list[str]
    drawn: set[str]


def raster(view: TimelineView) -> Raster:
    """Each band as pixel rows whose columns are time slices, each stacked from the
    kinds that ran in it in proportion to their time (a kind with at least 2 % of the
    slice gets a pixel row), the rest idle: at the scale of a large run a 1-in-20 share
    such as tensor-parallel comm stays visible. With idle the idle causes stack below
    the kinds, each by its share."""
    kinds, colors, share = raster_shares(view.trace, view.row_of, view.idle, view.ff)
    blank, white = len(kinds), len(kinds) + 1
    compute = _pixel_kinds(share[0::2], RASTER_PIXELS[0], blank)
    background = _pixel_kinds(share[1::2], RASTER_PIXELS[1], white)
    on = share.reshape(-1, len(kinds), RASTER_COLUMNS).max(axis=(0, 2)) >= 0.02
    drawn = {kind for kind, yes in zip(kinds, on.tolist(), strict=True) if yes and kind in COLORS}
    return Raster(compute, background, [*colors, COLORS[IDLE], "#ffffff"], drawn)


def _draw_raster(ax, view: TimelineView) -> set[str]:
    """`raster` on the axes, as one picture: the kinds drawn."""
    from matplotlib.colors import to_rgba
    from matplotlib.image import PcolorImage

    found = raster(view)
    # every band's pixels in one picture, one row of cells per pixel row: each lane's
    # compute band, a clear gap, its background band, a clear gap to the next lane
    # (an image per band was resampled band by band, in the layout pass and again
    # when drawn; this one is looked up once per screen pixel, at exact band edges)
    rows = len(view.row_of)
    clear = len(found.colors)
    gap = np.full((rows, 1, RASTER_COLUMNS), clear)
    cells = np.concatenate([found.compute, gap, found.background, gap], axis=1)
    cells = cells.reshape(-1, RASTER_COLUMNS)[:-1]  # the last lane's gap below: none
    y_edges = []
    for row in range(rows):
        for stream, pixels in ((COMPUTE_STREAM, RASTER_PIXELS[0]), (PP_STREAM, RASTER_PIXELS[1])):
            top, height = _band(row, stream)
            y_edges.append(np.linspace(top, top + height, pixels + 1))
    # the kinds' colours, idle, white; between bands the axes' own (clear) white
    table = [to_rgba(color) for color in found.colors] + [(1.0, 1.0, 1.0, 0.0)]
    # a pixel's four bytes looked up as one 32-bit word
    words = np.round(np.array(table) * 255).astype(np.uint8).view(np.uint32)
    rgba = words[cells].view(np.uint8)
    picture = PcolorImage(
        ax,
        np.linspace(0.0, view.trace.end_s * view.scale, RASTER_COLUMNS + 1),
        np.concatenate(y_edges),
        rgba,
    )
    picture.set_in_layout(False)  # inside the axes: nothing for the layout to measure
    ax.add_image(picture)
    return found.drawn


def raster_shares(
    trace: Trace,
    row_of: dict[int, int],
    idle: IdleMap | None = None,
    ff: FastForward | None = None,
) -> tuple[list[str], list[str], np.ndarray]:
    """The binned timeline's kinds (then idle causes, with ``idle``), their colours and
    each one's share of each time slice per band: (band, kind, column), two bands per
    row (compute, background), ``RASTER_COLUMNS`` slices from 0 to ``trace.end_s``; a
    fast-forwarded run's spans and idle as the whole iteration's (`_covered_at`)."""
    edges = np.linspace(0.0, trace.end_s, RASTER_COLUMNS + 1)
    kinds: list[str] = [kind for kind in STACK_ORDER if kind in COLORS]
    colors = [COLORS[kind] for kind in kinds]
    groups = [
        (2 * row_of[gpu] + (stream != COMPUTE_STREAM), kind, starts, ends)
        for (gpu, stream, kind), starts, ends in _span_groups(trace.spans, kinds)
    ]
    if idle is not None:
        for cause, style in IDLE_CAUSE_STYLES.items():
            kinds.append(cause)
            colors.append(style.color)
            for gpu, pieces in idle.items():
                bars = [(p.start_s, p.end_s) for p in pieces if p.cause == cause]
                if bars:
                    starts, ends = np.array(bars).reshape(-1, 2).T
                    groups.append((2 * row_of[gpu], cause, starts, ends))
    time = np.zeros((2 * len(row_of), len(kinds), RASTER_COLUMNS))
    for band, kind, starts, ends in groups:
        times = np.concatenate([starts, ends])
        steps = np.repeat([1.0, -1.0], len(starts))
        order = np.argsort(times, kind="stable")
        times, level = times[order], np.cumsum(steps[order])
        # time covered up to each event, then at each column edge (piecewise linear)
        covered = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
        time[band, kinds.index(kind)] += np.diff(_covered_at(edges, times, covered, ff))
    return kinds, colors, np.clip(time / np.diff(edges)[None, None, :], 0.0, 1.0)


def _covered_at(
    edges: np.ndarray, times: np.ndarray, covered: np.ndarray, ff: FastForward | None
) -> np.ndarray:
    """The time covered up to each of ``edges``, from the simulated run's (``covered``
    at ``times``, piecewise linear): a fast-forwarded run's as the whole iteration's,
    what `full_iteration`'s intervals would cover, without making them. Up to T + Δ the
    simulated run's; in the j-th copy of [T, T + Δ), that at T + Δ, j times the window's,
    and the window's part up to the same point; after the copies the simulated run's
    k Δ earlier, plus k times the window's."""
    if ff is None or ff.periods_skipped == 0:
        return np.interp(edges, times, covered)
    first, period, k = ff.proved_at_s, ff.period_s, ff.periods_skipped
    cut = first + period
    at_first, at_cut = np.interp([first, cut], times, covered).tolist()
    window = at_cut - at_first
    out = np.empty_like(edges)
    low, high = edges <= cut, edges > cut + k * period
    out[low] = np.interp(edges[low], times, covered)
    out[high] = np.interp(edges[high] - k * period, times, covered) + k * window
    inside = ~(low | high)
    since = edges[inside] - cut
    copies = np.minimum(np.floor(since / period), k)
    into = np.interp(first + since - copies * period, times, covered) - at_first
    out[inside] = at_cut + copies * window + into
    return out


def drawn_spans(spans: Sequence[Span], ff: FastForward | None) -> int:
    """How many spans the whole iteration has: a fast-forwarded run's simulated ones and
    k copies of those that start in its proved period's window (counted by start, as
    the metrics count them)."""
    if ff is None or not ff.periods_skipped or not spans:
        return len(spans)
    start = np.fromiter(map(itemgetter(5), spans), np.float64, len(spans))
    cut = ff.proved_at_s + ff.period_s
    return len(spans) + ff.periods_skipped * int(
        np.count_nonzero((start >= ff.proved_at_s) & (start < cut))
    )


def full_end_s(end_s: float, ff: FastForward | None) -> float:
    """The end of the whole iteration of a run whose simulated run ended at ``end_s``."""
    return end_s if ff is None else end_s + ff.periods_skipped * ff.period_s


def full_iteration(
    starts: np.ndarray, ends: np.ndarray, ff: FastForward | None
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of a fast-forwarded run's simulation (in order of start) as the whole
    iteration's, in order of start: the run is its simulation up to T + Δ, then k copies
    of [T, T + Δ), each Δ later than the one before, then the rest k Δ later
    (run/fastforward.py: the proof). An interval across T or T + Δ is cut there; pieces
    of no length are left out. Unchanged without a fast-forward."""
    found = _copied(starts, ends, ff)
    return found[0], found[1]


def _copied(
    starts: np.ndarray, ends: np.ndarray, ff: FastForward | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`full_iteration`'s pieces and the copy each belongs to: 0 up to T + Δ, j for the
    j-th copy of [T, T + Δ), k for the rest (all 0 without a fast-forward)."""
    if ff is None or ff.periods_skipped == 0 or not len(starts):
        return starts, ends, np.zeros(len(starts), np.int64)
    first, period, k = ff.proved_at_s, ff.period_s, ff.periods_skipped
    cut = first + period
    head = starts < cut
    head_starts, head_ends = starts[head], np.minimum(ends[head], cut)
    inside = head & (ends > first)
    window_starts = np.maximum(starts[inside], first)
    window_ends = np.minimum(ends[inside], cut)
    kept = window_ends > window_starts
    window_starts, window_ends = window_starts[kept], window_ends[kept]
    copy = np.arange(1, k + 1, dtype=np.int64)[:, None]
    shifts = period * copy.astype(np.float64)
    tail = ends > cut
    tail_starts = np.maximum(starts[tail], cut) + k * period
    tail_ends = ends[tail] + k * period
    out_starts = np.concatenate([head_starts, (window_starts + shifts).ravel(), tail_starts])
    out_ends = np.concatenate([head_ends, (window_ends + shifts).ravel(), tail_ends])
    out_copy = np.concatenate(
        [
            np.zeros(len(head_starts), np.int64),
            np.broadcast_to(copy, (k, len(window_starts))).ravel(),
            np.full(len(tail_starts), k, np.int64),
        ]
    )
    kept = out_ends > out_starts
    return out_starts[kept], out_ends[kept], out_copy[kept]


def _pixel_kinds(share: np.ndarray, pixels: int, empty: int) -> np.ndarray:
    """Bands of ``pixels`` pixel rows from ``share`` (band, kind, column): each
    column stacked from the kinds in their order, each with pixel rows in proportion
    to its share (at least one from 2 %), the rest ``empty``: (band, pixel row,
    column), each pixel's kind."""
    counts = np.round(share * pixels).astype(int)
    counts[(counts == 0) & (share >= 0.02)] = 1
    overflow = counts.sum(axis=1) - pixels  # rounding up past the band: trim the largest
    band, column = np.nonzero(overflow > 0)
    largest = np.argmax(counts[band, :, column], axis=1)
    counts[band, largest, column] -= overflow[band, column]
    if counts.min() >= 0:
        # each column's kinds one after another, each its count of pixel rows, then
        # ``empty`` to the band's foot: one repeat for all columns
        rest = pixels - counts.sum(axis=1, keepdims=True)
        runs = np.concatenate([counts, rest], axis=1).transpose(0, 2, 1)  # band, column, run
        values = np.append(np.arange(counts.shape[1]), empty)
        flat = np.repeat(np.broadcast_to(values, runs.shape).ravel(), runs.ravel())
        return flat.reshape(share.shape[0], share.shape[2], pixels).transpose(0, 2, 1)
    # a trim past a count's own rows (overlapping kinds' shares summing far above one):
    # kind by kind, a later kind's rows over an earlier's
    top_of = np.concatenate([np.zeros_like(counts[:, :1]), np.cumsum(counts, axis=1)], axis=1)
    rows = np.arange(pixels)[None, :, None]
    kind_of = np.full((share.shape[0], pixels, share.shape[2]), empty)
    for k in np.nonzero(counts.any(axis=(0, 2)))[0].tolist():  # the kinds with pixels
        kind_of[(rows >= top_of[:, k : k + 1]) & (rows < top_of[:, k + 1 : k + 2])] = k
    return kind_of


def breakdown_figure(result: Result) -> Figure:
    """Stacked bars: where each pipeline stage's iteration goes."""
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    stages = result.metrics.stages
    scale, unit = _time_unit(full_end_s(result.trace.end_s, result.metrics.fast_forward))
    fig = Figure(figsize=(max(6.0, 0.3 * len(stages) + 3), 4.5), layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    handles = []
    for category in categories_of(result.metrics.breakdown_s):
        values = [stage.breakdown_s[category.key] * scale for stage in stages]
        # a category's bars as one collection (as `ax.bar` draws them, a patch per bar
        # was drawn and measured one by one), resting on the axis as bars do
        bars = PolyCollection(
            [
                [(i - 0.4, b), (i + 0.4, b), (i + 0.4, b + v), (i - 0.4, b + v)]
                for i, b, v in zip(x, bottom, values, strict=True)
            ],
            facecolors=category.color,
            edgecolors="none",
            linewidths=0.0,
        )
        bars.sticky_edges.y[:] = bottom
        ax.add_collection(bars)
        handles.append(Patch(facecolor=category.color, label=category.label))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(x)
    ax.set_xticklabels(
        [str(stage.stage) for stage in stages], fontsize=7 if len(stages) > 20 else 9
    )
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title(f"{result.scenario.name}: where the time goes")
    ax.legend(
        handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
    )
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


# The time axis spans about this many points of the 14-inch figure (its margins and
# the stage labels take the rest), and a digit of the 7-point labels about 0.6 of its
# size in width: a number is drawn only on a pass at least that wide plus a point on
# each side, so that neighbours never overlap.
AXIS_WIDTH_PT = 14 * 72 * 0.82
LABEL_FONT_PT = 7
DIGIT_WIDTH_EM = 0.6


def _label_width_s(text: str, end_s: float) -> float:
    """The time a label of ``text`` covers on the axis, with a point of margin each side."""
    width_pt = len(text) * LABEL_FONT_PT * DIGIT_WIDTH_EM + 2.0
    return width_pt * end_s / AXIS_WIDTH_PT


def microbatch_labels(view: TimelineView) -> list[tuple[float, float, str, str]]:
    """Micro-batch numbers on forward and backward passes, as in the papers' figures:
    (x in the view's unit, row position, text, colour) where a number fits (a
    fast-forwarded run's passes as the whole iteration's, `_pieces`)."""
    trace, ff, scale = view.trace, view.ff, view.scale
    compute = [
        piece
        for sp in trace.spans
        if sp.stream == COMPUTE_STREAM
        and sp.microbatch >= 0
        and sp.kind in (FORWARD, BACKWARD, WEIGHT, RECOMPUTE)
        for piece in _pieces(sp, ff)
    ]
    # one number per pass: the pieces of one label (F3, B3.1, W3) on one GPU
    compute.sort()
    out = []
    for (gpu, _), group in groupby(compute, key=itemgetter(0, 1)):
        pieces = list(group)
        start, end = pieces[0][2], max(piece[3] for piece in pieces)
        microbatch, kind = pieces[0][4], pieces[0][5]
        if end - start < _label_width_s(str(microbatch), trace.end_s):
            continue  # too narrow for its number at the figure's width: it would collide
        color = "white" if kind == FORWARD else "black"
        out.append(((start + end) / 2 * scale, view.row_of[gpu] - 0.08, str(microbatch), color))
    return out


def _pieces(sp: Span, ff: FastForward | None) -> list[tuple[int, str, float, float, int, str]]:
    """A compute span as (GPU, label, start, end, micro-batch, kind) pieces of the whole
    iteration, as `full_iteration` cuts and copies it (itself without a fast-forward),
    each copy's micro-batch ``q`` later than the one before (its label renumbered)."""
    starts, ends, copies = _copied(np.array([sp.start_s]), np.array([sp.end_s]), ff)
    q = 0 if ff is None else ff.period_microbatches
    number = str(sp.microbatch)
    out = []
    for start, end, j in zip(starts.tolist(), ends.tolist(), copies.tolist(), strict=True):
        microbatch, label = sp.microbatch + j * q, sp.label
        if j and label[1:].startswith(number):
            label = label[:1] + str(microbatch) + label[1 + len(number) :]
        out.append((sp.gpu, label, start, end, microbatch, sp.kind))
    return out


def pipeline_figure(studies: list) -> Figure:
    """The papers' pipeline picture: one row per rank, one box per op with its
    micro-batch number; later chunks in lighter shades; one panel per schedule."""
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ranks = max(s.num_ranks for s in studies)
    height = sum(0.32 * s.num_ranks + 0.9 for s in studies) + 0.6
    fig = Figure(figsize=(12, min(max(height, 2.5), 40)), layout="constrained")
    axes = fig.subplots(len(studies), 1, sharex=True, squeeze=False)[:, 0]
    end = max(s.makespan for s in studies)
    for ax, study in zip(axes, studies, strict=True):
        boxes = [sp for sp in study.trace.spans if sp.kind in PASS_KINDS]
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
            f"{study.name}{chunks}: makespan {d['makespan']:.4g}, "
            f"bubble {d['bubble_fraction']:.1%} of the makespan, "
            f"peak {max(d['per_rank_peak_inflight_w'])} chunk activations",
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


def _digits4(value: float) -> str:
    """Four significant digits, a trailing zero kept (35.20), as the run summary shows."""
    return f"{value:.{decimal_places(value)}f}"

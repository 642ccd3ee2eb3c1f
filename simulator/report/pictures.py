"""The run's two pictures as SVG, drawn from arrays: the timeline (`timeline_svg`) and
where each stage's time goes (`breakdown_svg`). They show what timeline.py's matplotlib
figures show (the same `TimelineView`: rows, title, legend, bars or time slices,
micro-batch numbers; the same breakdown categories), without importing matplotlib,
whose import alone costs a third of a large run (docs/design.md, "Pictures"): text and
rectangles are SVG elements, bars snapped to whole pixels (`snapped`), and a binned
timeline's time slices an 8-bit palette PNG per band (`png_palette`), embedded.
Positions are computed here with fixed margins (text widths estimated from character
counts), so a viewer's font may make a label a little wider or narrower than its room;
nothing depends on it. Deterministic: the same result gives the same bytes."""

from __future__ import annotations

import base64
import math
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from ..ir.results import Result
from ..ir.vocabulary import COMPUTE_STREAM, PP_STREAM, categories_of
from .idle import IdleMap
from .timeline import (
    LABEL_FONT_PT,
    Bars,
    Raster,
    TimelineView,
    _band,
    _time_unit,
    bar_groups,
    full_end_s,
    legend_entries,
    microbatch_labels,
    raster,
    row_labels,
    timeline_view,
    title_lines,
)

PX_PER_PT = 110 / 72  # the PNG figures' 110 dpi: the SVG is as large as they are
FONT = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"
CHAR_EM = 0.6  # a character's width in ems, on average (for margins only)
Scale = Callable[[float], float]  # a value on an axis -> pixels


def timeline_svg(result: Result, idle: IdleMap | None = None) -> bytes:
    """timeline.py's Gantt chart (`timeline_figure`) as an SVG document."""
    view = timeline_view(result, idle)
    rows = len(view.lanes)
    width = 14 * 110
    labels = row_labels(view)
    label_px = (8 if rows > 20 else 9) * PX_PER_PT
    title = [part for line in title_lines(view) for part in line.split("\n")]
    title_px, tick_px, legend_px = 12 * PX_PER_PT, 10 * PX_PER_PT, 8 * PX_PER_PT
    top = 10 + len(title) * title_px * 1.25 + 8
    left = 12 + max(map(len, labels), default=0) * CHAR_EM * label_px + 10
    right = 16
    plot_w = width - left - right
    found = raster(view) if view.binned else None
    groups, drawn = ([], found.drawn) if found is not None else bar_groups(view)
    entries, legend_title = legend_entries(view, drawn)
    columns = 4
    legend_rows = math.ceil(len(entries) / columns) + (legend_title is not None)
    bottom = tick_px * 1.3 + 8 + tick_px * 1.4 + 12 + legend_rows * legend_px * 1.6 + 10
    # as tall as timeline_figure: 2 inches and 0.45 a row, from 3 up to 16
    height = max(min(max(2.0 + 0.45 * rows, 3.0), 16.0) * 110, top + bottom + 20 * rows)
    plot_h = height - top - bottom
    pitch = plot_h / (rows + 0.1)
    # the axis runs from 0 to end, in the view's unit (a run of no time: an axis of 1)
    end = view.trace.end_s * view.scale or 1.0

    def x_of(t: float) -> float:
        return left + t / end * plot_w

    def y_of(v: float) -> float:  # rows are 1 apart, the first on top (ylim n - 0.45 .. -0.55)
        return top + (v + 0.55) * pitch

    svg = _Svg(width, height)
    svg.add(
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" '
        f'stroke-width="1"/></pattern><clipPath id="plot">{_rect(left, top, plot_w, plot_h)}'
        "</clipPath></defs>"
    )
    for i, line in enumerate(title):
        svg.text(width / 2, 10 + (i + 0.8) * title_px * 1.25, line, title_px, anchor="middle")
    svg.add('<g clip-path="url(#plot)">')
    if found is not None:
        _draw_raster(svg, view, found, x_of, y_of)
    else:
        _draw_bars(svg, groups, x_of, y_of)
    if view.numbered:
        for x, y, text, color in microbatch_labels(view):
            svg.text(x_of(x), y_of(y), text, LABEL_FONT_PT * PX_PER_PT, anchor="middle", fill=color)
    svg.add("</g>")
    svg.add(_rect(left, top, plot_w, plot_h, fill="none", stroke="#000"))
    for row, label in enumerate(labels):
        svg.text(left - 6, y_of(row), label, label_px, anchor="end")
        svg.add(_line(left - 4, y_of(row), left, y_of(row)))
    axis_y = top + plot_h
    ticks = nice_ticks(0.0, end)
    for tick, text in zip(ticks, tick_texts(ticks), strict=True):
        x = x_of(tick)
        svg.add(_line(x, axis_y, x, axis_y + 4))
        svg.text(x, axis_y + 4 + tick_px, text, tick_px, anchor="middle")
    label_y = axis_y + 8 + tick_px * 2.4
    svg.text(left + plot_w / 2, label_y, f"time ({view.unit})", tick_px, anchor="middle")
    y = label_y + 12 + legend_px
    if legend_title is not None:
        svg.text(width / 2, y, legend_title, legend_px, anchor="middle")
        y += legend_px * 1.6
    _legend_grid(svg, entries, width / 2, y, columns, legend_px)
    return svg.bytes()


def _draw_bars(svg: _Svg, groups: Sequence[Bars], x_of: Scale, y_of: Scale) -> None:
    for group in groups:
        top, height = _band(group.row, group.stream)
        y0, y1 = y_of(top), y_of(top + height)
        for x0, x1 in snapped(group.bars, x_of):
            svg.add(_rect(x0, y0, x1 - x0, y1 - y0, fill=group.color))
            if group.hatched:
                svg.add(_rect(x0, y0, x1 - x0, y1 - y0, fill="url(#hatch)"))


def snapped(bars: Sequence[tuple[float, float]], x_of: Scale) -> list[tuple[int, int]]:
    """Bars (start, width; in order of start) as pixel spans, snapped as Agg snaps the
    PNG's rectangles: each edge at the nearest pixel edge, so that a bar is drawn as wide
    as it lasts on average (a sliver within one edge is left out, one across an edge is
    a pixel), and bars that then touch as one (thousands of slivers blended one by one
    would haze a band, and a whole pixel for each would paint it)."""
    out: list[list[int]] = []
    for start, width in bars:
        x0, x1 = round(x_of(start)), round(x_of(start + width))
        if x1 <= x0:
            continue
        if out and x0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], x1)
        else:
            out.append([x0, x1])
    return [(a, b) for a, b in out]


def _draw_raster(svg: _Svg, view: TimelineView, found: Raster, x_of: Scale, y_of: Scale) -> None:
    """Each band's pixels as an image stretched over the band (its pixels' columns are
    the time slices): crisp edges, no smoothing between slices."""
    palette = np.array([rgb(color) for color in found.colors], np.uint8)
    x0, x1 = x_of(0.0), x_of(view.trace.end_s * view.scale)
    for row in range(len(view.row_of)):
        for stream, cells in ((COMPUTE_STREAM, found.compute), (PP_STREAM, found.background)):
            top, height = _band(row, stream)
            data = base64.b64encode(png_palette(cells[row].astype(np.uint8), palette)).decode()
            svg.add(
                f'<image x="{_n(x0)}" y="{_n(y_of(top))}" width="{_n(x1 - x0)}" '
                f'height="{_n(y_of(top + height) - y_of(top))}" preserveAspectRatio="none" '
                'image-rendering="optimizeSpeed" style="image-rendering:pixelated" '
                # xlink:href: SVG 1.1's, which SVG 2 viewers read too (plain href is 2's only)
                f'xlink:href="data:image/png;base64,{data}"/>'
            )


def breakdown_svg(result: Result) -> bytes:
    """timeline.py's stacked bars (`breakdown_figure`) as an SVG document: where each
    pipeline stage's iteration goes, by category."""
    stages = result.metrics.stages
    scale, unit = _time_unit(full_end_s(result.trace.end_s, result.metrics.fast_forward))
    categories = categories_of(result.metrics.breakdown_s)
    label_px, tick_px, title_px = 8 * PX_PER_PT, 10 * PX_PER_PT, 12 * PX_PER_PT
    legend_w = 30 + max((len(c.label) for c in categories), default=0) * CHAR_EM * label_px
    width = max(6.0, 0.3 * len(stages) + 3) * 110
    height = 4.5 * 110
    left, top, bottom = 16 + tick_px * 1.4 + 6 * CHAR_EM * tick_px, 20 + title_px * 1.6, 60
    plot_w, plot_h = width - left - legend_w - 16, height - top - bottom
    totals = [0.0] * len(stages)
    for category in categories:
        for i, stage in enumerate(stages):
            totals[i] += stage.breakdown_s[category.key] * scale
    y_max = 1.05 * (max(totals, default=0.0) or 1.0)  # the tallest bar and a margin
    ticks = nice_ticks(0.0, y_max)  # none above y_max

    def x_of(v: float) -> float:  # stage i's bar over [i - 0.4, i + 0.4]
        return left + (v + 0.8) / (len(stages) + 0.6) * plot_w

    def y_of(v: float) -> float:
        return top + plot_h - v / y_max * plot_h

    svg = _Svg(width, height)
    title = f"{result.scenario.name}: where the time goes"
    # over the plot while it fits there, else from the left margin
    title_x = max(left + plot_w / 2, 8 + len(title) * CHAR_EM * title_px / 2)
    svg.text(title_x, 10 + title_px, title, title_px, anchor="middle")
    bottoms = [0.0] * len(stages)
    for category in categories:
        for i, stage in enumerate(stages):
            value = stage.breakdown_s[category.key] * scale
            y0, y1 = y_of(bottoms[i] + value), y_of(bottoms[i])
            x0, x1 = x_of(i - 0.4), x_of(i + 0.4)
            svg.add(_rect(x0, y0, x1 - x0, y1 - y0, fill=category.color))
            bottoms[i] += value
    svg.add(_rect(left, top, plot_w, plot_h, fill="none", stroke="#000"))
    for tick, text in zip(ticks, tick_texts(ticks), strict=True):
        y = y_of(tick)
        svg.add(_line(left - 4, y, left, y))
        svg.text(left - 6, y, text, tick_px, anchor="end")
    stage_px = (7 if len(stages) > 20 else 9) * PX_PER_PT
    for i, stage in enumerate(stages):
        x = x_of(i)
        svg.add(_line(x, top + plot_h, x, top + plot_h + 4))
        svg.text(x, top + plot_h + 4 + stage_px, str(stage.stage), stage_px, anchor="middle")
    svg.text(left + plot_w / 2, height - 12, "pipeline stage", tick_px, anchor="middle")
    y_label = f"time per iteration ({unit})"
    svg.add(
        f'<text transform="translate({_n(16 + tick_px * 0.4)},{_n(top + plot_h / 2)}) '
        f'rotate(-90)" font-size="{_n(tick_px)}" text-anchor="middle" '
        f'dominant-baseline="central">{_xml_text(y_label)}</text>'
    )
    entries = [(c.color, c.label) for c in categories]
    for i, (color, label) in enumerate(entries):
        y = top + 4 + i * label_px * 1.6
        svg.add(_rect(left + plot_w + 14, y, 18, label_px * 0.8, fill=color))
        svg.text(left + plot_w + 38, y + label_px * 0.4, label, label_px)
    return svg.bytes()


# -- the pieces ------------------------------------------------------------------------


class _Svg:
    """An SVG document's elements, written out by `bytes`."""

    def __init__(self, width: float, height: float) -> None:
        self.parts = [
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<svg xmlns="http://www.w3.org/2000/svg" '
            'xmlns:xlink="http://www.w3.org/1999/xlink" '
            f'width="{_n(width)}" '
            f'height="{_n(height)}" viewBox="0 0 {_n(width)} {_n(height)}" '
            f"font-family={quoteattr(FONT)}>",
            _rect(0, 0, width, height, fill="#fff"),
        ]

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float,
        anchor: str = "start",
        fill: str = "#000",
    ) -> None:
        """``text`` centred vertically on y."""
        self.parts.append(
            f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" text-anchor="{anchor}" '
            f'dominant-baseline="central" fill="{fill}">{_xml_text(text)}</text>'
        )

    def bytes(self) -> bytes:
        return ("\n".join(self.parts) + "\n</svg>\n").encode()


# characters XML 1.0 does not allow in a document (a scenario's name may hold them)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """``text`` as an element's content: escaped, each character XML forbids as U+FFFD."""
    return escape(_NOT_XML.sub("\ufffd", text))


def _legend_grid(
    svg: _Svg,
    entries: Sequence[tuple[str, str]],
    centre: float,
    y: float,
    columns: int,
    size: float,
) -> None:
    """Entries column by column (as a matplotlib legend of ``columns`` columns), each a
    swatch and its label, the grid centred on ``centre``."""
    widest = max((len(label) for _, label in entries), default=0) * CHAR_EM * size + 34
    rows = max(math.ceil(len(entries) / columns), 1)
    x0 = centre - widest * min(columns, math.ceil(len(entries) / rows)) / 2
    for i, (color, label) in enumerate(entries):
        column, row = divmod(i, rows)
        x, top = x0 + column * widest, y + row * size * 1.6
        svg.add(_rect(x, top - size * 0.4, 20, size * 0.8, fill=color))
        svg.text(x + 26, top, label, size)


def _rect(x: float, y: float, w: float, h: float, fill: str = "#000", stroke: str = "") -> str:
    outline = f' stroke="{stroke}" stroke-width="1"' if stroke else ""
    return (
        f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(max(w, 0.0))}" height="{_n(max(h, 0.0))}" '
        f'fill="{fill}"{outline}/>'
    )


def _line(x0: float, y0: float, x1: float, y1: float) -> str:
    return f'<line x1="{_n(x0)}" y1="{_n(y0)}" x2="{_n(x1)}" y2="{_n(y1)}" stroke="#000"/>'


def _n(value: float) -> str:
    """A coordinate, to a hundredth of a pixel, without trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def nice_ticks(low: float, high: float, most: int = 10) -> list[float]:
    """Ticks from ``low`` up to ``high`` at a step of 1, 2, 2.5 or 5 times a power of ten,
    the smallest step that gives at most ``most`` of them."""
    span = high - low
    if not span > 0 or not math.isfinite(span):
        return [low]
    power = 10.0 ** math.floor(math.log10(span / most))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = factor * power
        if span / step <= most:
            break
    first = math.ceil(low / step - 1e-9)
    count = math.floor(high / step + 1e-9) - first + 1
    return [round((first + i) * step, 12) for i in range(count)]


def tick_texts(ticks: Sequence[float]) -> list[str]:
    """The ticks' numbers, each with as many decimals as their step needs."""
    decimals = 0
    if len(ticks) > 1:
        gap = ticks[1] - ticks[0]
        while decimals < 6 and abs(round(gap, decimals) - gap) > 1e-9 * max(gap, 1.0):
            decimals += 1
    return [f"{tick:.{decimals}f}" for tick in ticks]


def rgb(color: str) -> tuple[int, int, int]:
    """A ``#rrggbb`` or ``#rgb`` colour as its three bytes."""
    digits = color.lstrip("#")
    if len(digits) == 3:
        digits = "".join(d * 2 for d in digits)
    if len(digits) != 6:
        raise ValueError(f"colour {color!r} is not #rrggbb")
    return int(digits[0:2], 16), int(digits[2:4], 16), int(digits[4:6], 16)


def png_palette(cells: np.ndarray, palette: np.ndarray) -> bytes:
    """An 8-bit palette PNG of ``cells`` (rows, columns: each pixel's index into
    ``palette``, an (n, 3) array of bytes; n <= 256): every row unfiltered, deflated
    (PNG specification, ISO/IEC 15948: IHDR colour type 3, PLTE, IDAT, IEND)."""
    rows, columns = cells.shape
    raw = np.zeros((rows, columns + 1), np.uint8)  # each row's filter byte: 0, none
    raw[:, 1:] = cells

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", columns, rows, 8, 3, 0, 0, 0)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", header),
            chunk(b"PLTE", palette.astype(np.uint8).tobytes()),
            chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)),
            chunk(b"IEND", b""),
        )
    )

"""The run's pictures as SVG (simulator/report/pictures.py): well-formed documents that
show what timeline.py's view holds (title, rows, legend, bars or time slices, numbers),
their embedded PNGs exactly the binned pixels, drawn without matplotlib."""

from __future__ import annotations

import base64
import struct
import subprocess
import sys
import zlib
from xml.etree import ElementTree

import numpy as np
import pytest

from stepsim.report import pictures, timeline
from stepsim.run.idlemap import idle_pieces
from stepsim.run.iteration import run
from stepsim.scenario import load_scenario

TINY = "scenarios/tiny-2gpu.toml"
SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


@pytest.fixture(scope="module")
def tiny():
    result = run(load_scenario(TINY))
    return result, idle_pieces(result)


def _decode_png(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """An 8-bit palette PNG, read by the specification: (pixel indices, palette)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    width, height, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color) == (8, 3) and b"IEND" in chunks
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, width + 1)
    assert not raw[:, 0].any()  # every row unfiltered
    return raw[:, 1:], np.frombuffer(chunks[b"PLTE"], np.uint8).reshape(-1, 3)


def _texts(root) -> list[str]:
    return [element.text or "" for element in root.iter(f"{SVG}text")]


def test_a_palette_png_holds_its_pixels():
    rng = np.random.default_rng(4)
    cells = rng.integers(0, 5, (7, 33)).astype(np.uint8)
    palette = rng.integers(0, 256, (5, 3)).astype(np.uint8)
    found, colours = _decode_png(pictures.png_palette(cells, palette))
    assert np.array_equal(found, cells) and np.array_equal(colours, palette)


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.0, 35.2, [0, 5, 10, 15, 20, 25, 30, 35]),
        (0.0, 60.51, [0, 10, 20, 30, 40, 50, 60]),
        (0.0, 1.0, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
        (0.0, 0.024, [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225]),
        (2.0, 2.0, [2.0]),
    ],
)
def test_ticks_step_by_one_two_two_and_a_half_or_five(low, high, ticks):
    assert pictures.nice_ticks(low, high) == pytest.approx(ticks)


def test_a_tick_shows_the_decimals_its_step_needs():
    assert pictures.tick_texts(pictures.nice_ticks(0.0, 35.2))[:3] == ["0", "5", "10"]
    assert pictures.tick_texts(pictures.nice_ticks(0.0, 1.0))[5] == "0.5"
    assert pictures.tick_texts(pictures.nice_ticks(0.0, 0.024))[3] == "0.0075"


def test_the_timeline_of_bars_shows_the_view(tiny):
    result, idle = tiny
    document = pictures.timeline_svg(result, idle)
    assert document == pictures.timeline_svg(result, idle)  # deterministic
    root = ElementTree.fromstring(document)
    view = timeline.timeline_view(result, idle)
    assert not view.binned and view.numbered
    texts = _texts(root)
    for line in timeline.title_lines(view):
        assert set(line.split("\n")) <= set(texts)
    assert set(timeline.row_labels(view)) <= set(texts)
    groups, drawn = timeline.bar_groups(view)
    entries, _ = timeline.legend_entries(view, drawn)
    assert {label for _, label in entries} <= set(texts)
    numbers = [text for _, _, text, _ in timeline.microbatch_labels(view)]
    assert numbers and all(texts.count(n) >= numbers.count(n) for n in numbers)
    rects = list(root.iter(f"{SVG}rect"))
    x_of = _x_scale(root, view)
    bars = sum(
        len(pictures.snapped(group.bars, x_of)) * (2 if group.hatched else 1) for group in groups
    )
    # the page, the plot's clip, the bars, the frame, the legend's swatches
    assert len(rects) == 1 + 1 + bars + 1 + len(entries)
    assert {group.color for group in groups} <= {r.get("fill") for r in rects}


def _x_scale(root, view):
    """The plot's time axis, read off its frame (the clip rectangle)."""
    clip = root.find(f"{SVG}defs/{SVG}clipPath/{SVG}rect")
    left, width = float(clip.get("x")), float(clip.get("width"))
    end = view.trace.end_s * view.scale
    return lambda t: left + t / end * width


def test_bars_snap_to_pixels_and_merge():
    """Edges at the nearest pixel edge: a sliver within one edge is left out, one across
    an edge is a pixel, and bars that touch once snapped are one."""

    def x_of(t):
        return t  # one unit a pixel

    assert pictures.snapped([(0.0, 10.0)], x_of) == [(0, 10)]
    assert pictures.snapped([(3.1, 0.3)], x_of) == []  # 3.1 - 3.4: within pixel 3
    assert pictures.snapped([(3.3, 0.4)], x_of) == [(3, 4)]  # 3.3 - 3.7: across 3.5
    assert pictures.snapped([(1.0, 2.0), (3.4, 1.0), (7.0, 1.0)], x_of) == [(1, 4), (7, 8)]
    assert pictures.snapped([(0.0, 5.0), (1.0, 1.0)], x_of) == [(0, 5)]  # inside: one


def test_the_binned_timeline_embeds_its_pixels(tiny, monkeypatch):
    result, idle = tiny
    monkeypatch.setattr(timeline, "RASTER_ABOVE_SPANS", 10)
    view = timeline.timeline_view(result, idle)
    assert view.binned
    found = timeline.raster(view)
    root = ElementTree.fromstring(pictures.timeline_svg(result, idle))
    images = list(root.iter(f"{SVG}image"))
    assert len(images) == 2 * len(view.lanes)  # a compute and a background band per row
    palette = np.array([pictures.rgb(c) for c in found.colors], np.uint8)
    for row in range(len(view.lanes)):
        for image, cells in zip(
            images[2 * row : 2 * row + 2], (found.compute[row], found.background[row]), strict=True
        ):
            data = base64.b64decode(image.get(f"{XLINK}href").split(",", 1)[1])
            pixels, colours = _decode_png(data)
            assert np.array_equal(pixels, cells) and np.array_equal(colours, palette)
    assert any(t.startswith("binned:") for t in _texts(root))


def test_the_breakdown_has_a_bar_per_stage_and_category(tiny):
    result, _ = tiny
    root = ElementTree.fromstring(pictures.breakdown_svg(result))
    from stepsim.ir.vocabulary import categories_of

    categories = categories_of(result.metrics.breakdown_s)
    rects = list(root.iter(f"{SVG}rect"))
    stages = len(result.metrics.stages)
    # the page, a bar per stage and category, the frame, the legend's swatches
    assert len(rects) == 1 + stages * len(categories) + 1 + len(categories)
    texts = _texts(root)
    assert {c.label for c in categories} <= set(texts)
    assert "pipeline stage" in texts and f"{result.scenario.name}: where the time goes" in texts


def test_writing_svg_pictures_imports_no_matplotlib(tmp_path):
    code = (
        "import sys; from stepsim.cli import main; "
        f"main(['run', {TINY!r}, '--out', {str(tmp_path)!r}, '--quiet', '--json']); "
        "sys.stderr.write(str('matplotlib' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().endswith("False")
    assert (tmp_path / "timeline.svg").exists() and (tmp_path / "breakdown.svg").exists()


def test_a_name_of_any_characters_gives_well_formed_documents(tiny):
    """Escaped, and what XML forbids (a control character) replaced: both parse."""
    from dataclasses import replace

    result, idle = tiny
    named = result._replace(scenario=replace(result.scenario, name='a\x0cb & <c> "d"'))
    for document in (pictures.timeline_svg(named, idle), pictures.breakdown_svg(named)):
        texts = _texts(ElementTree.fromstring(document))
        assert any(t.startswith('a\ufffdb & <c> "d"') for t in texts)


def test_a_perturbed_gpu_gets_its_own_row():
    """Symmetric mode's fast path: the representative of each stage, and the straggler
    (a replica it touched) after its stage's, labelled, in both painters."""
    from stepsim.scenario import scenario_from_dict
    from tests.helpers import scenario

    doc = scenario(
        cluster={"node": "dgx-a100", "num_nodes": 2},
        parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 8},
        training={"global_batch_size": 64},
        perturbation=[{"kind": "slow_gpu", "gpu": 13, "factor": 1.5}],
    )
    result = run(scenario_from_dict(doc))
    view = timeline.timeline_view(result)
    assert [(lane.stage, lane.gpu) for lane in view.lanes] == [(0, 0), (1, 8), (1, 13)]
    labels = timeline.row_labels(view)
    assert labels[2] == "stage 1 · GPU 13 (perturbed)" and "perturbed" not in labels[1]
    assert "each perturbed GPU" in timeline.title_lines(view)[0]
    texts = _texts(ElementTree.fromstring(pictures.timeline_svg(result)))
    assert "stage 1 · GPU 13 (perturbed)" in texts
    # the straggler's compute ends later than its stage's representative's
    last = {
        gpu: max(sp.end_s for sp in view.trace.spans if sp.gpu == gpu and sp.kind == "backward")
        for gpu in (8, 13)
    }
    assert last[13] > last[8]

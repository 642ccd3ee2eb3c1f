"""The pictures of `stepsim run --out` made at less cost, the same bytes: a figure drawn
once (laid out, then saved without its layout engine) is savefig's PNG, and the binned
timeline's pixel rows are the ones stacked kind by kind."""

import numpy as np
import pytest

from stepsim.scenario import load_scenario

TINY = "scenarios/tiny-2gpu.toml"


@pytest.fixture(scope="module")
def tiny():
    from stepsim.run.idlemap import idle_pieces
    from stepsim.run.iteration import run

    result = run(load_scenario(TINY))
    return result, idle_pieces(result)


def test_a_figure_drawn_once_is_savefigs_png(tiny, monkeypatch):
    """The binned timeline (an image, a title, a legend outside the axes: constrained
    layout's work) at a small dpi, to keep the test short."""
    import io

    from stepsim.cli.outfolder import figure_png
    from stepsim.report import timeline

    result, idle = tiny
    monkeypatch.setattr(timeline, "RASTER_ABOVE_SPANS", 10)
    buffer = io.BytesIO()
    timeline.timeline_figure(result, idle).savefig(buffer, format="png", dpi=30)
    figure, draws = timeline.timeline_figure(result, idle), []
    figure.canvas.mpl_connect("draw_event", draws.append)
    assert figure_png(figure, dpi=30) == buffer.getvalue()
    assert len(draws) == 1  # savefig draws twice: once to lay out, once for real


def _pixel_kinds_kind_by_kind(share: np.ndarray, pixels: int, empty: int) -> np.ndarray:
    """`timeline._pixel_kinds` as it was written first: each kind's rows set in turn."""
    counts = np.round(share * pixels).astype(int)
    counts[(counts == 0) & (share >= 0.02)] = 1
    overflow = counts.sum(axis=1) - pixels
    band, column = np.nonzero(overflow > 0)
    largest = np.argmax(counts[band, :, column], axis=1)
    counts[band, largest, column] -= overflow[band, column]
    top_of = np.concatenate([np.zeros_like(counts[:, :1]), np.cumsum(counts, axis=1)], axis=1)
    rows = np.arange(pixels)[None, :, None]
    kind_of = np.full((share.shape[0], pixels, share.shape[2]), empty)
    for k in range(share.shape[1]):
        kind_of[(rows >= top_of[:, k : k + 1]) & (rows < top_of[:, k + 1 : k + 2])] = k
    return kind_of


def test_pixel_rows_are_stacked_kind_by_kind():
    """Shares that add up to at most one (one stream's kinds), and overlapping ones far
    above (a trim past a kind's own rows): the same pixel rows either way."""
    from stepsim.report.timeline import _pixel_kinds

    rng = np.random.default_rng(34)
    for trial in range(60):
        bands, kinds, columns = rng.integers(1, 5), rng.integers(1, 17), rng.integers(1, 40)
        share = rng.random((bands, kinds, columns)) * rng.choice([0.05, 0.3, 1.0])
        share[rng.random(share.shape) < 0.5] = 0.0
        if trial % 2:
            share /= np.maximum(share.sum(axis=1, keepdims=True), 1.0)
        pixels = int(rng.choice([5, 20]))
        expected = _pixel_kinds_kind_by_kind(share, pixels, kinds)
        got = _pixel_kinds(share, pixels, kinds)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert (got == expected).all()

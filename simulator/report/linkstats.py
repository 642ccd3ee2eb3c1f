"""How busy each link was: mean utilization over the iteration and over time.

Works from the network's record of constant-rate stretches (`ir.flows.Interval`),
after the simulation, with numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.flows import Interval


def _rows(
    intervals: Sequence[Interval], chosen: set[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One row per (interval, chosen link): link index, bytes/s on it, start, end. Only
    the chosen links' rows are made (a large run's collectives cross thousands of
    links, of which a handful are drawn)."""
    # where the chosen links sit in each shape, found once per shape (by identity): a
    # coupled flow of many rings crosses thousands of links in every interval
    places: dict[int, list[tuple[int, int]]] = {}
    rows: list[tuple[int, float, float, float]] = []
    for iv in intervals:
        found = places.get(id(iv.links))
        if found is None:
            found = places[id(iv.links)] = [
                (i, link) for i, link in enumerate(iv.links) if link in chosen
            ]
        rate, mults = iv.rate_bytes_per_s, iv.mults
        rows.extend((link, mults[i] * rate, iv.start_s, iv.end_s) for i, link in found)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0)
    links, loads, starts, ends = zip(*rows, strict=True)
    return (
        np.array(links, dtype=np.int64),
        np.array(loads, dtype=np.float64),
        np.array(starts, dtype=np.float64),
        np.array(ends, dtype=np.float64),
    )


class Utilization:
    """Each link's mean utilization, kept for the links that carried something:
    ``links`` in increasing order and ``values`` theirs; ``self[i]`` is link ``i``'s,
    0.0 for a link not kept. A 131,072-GPU cluster has 786,432 links, of which a run
    crosses a few per cent: dense arrays would cost 6 MB each."""

    def __init__(self, links: np.ndarray, values: np.ndarray) -> None:
        self.links, self.values = links, values

    def __getitem__(self, link: int) -> float:
        at = int(np.searchsorted(self.links, link))
        return float(self.values[at]) if at < len(self.links) and self.links[at] == link else 0.0


def _moved_by_shape(intervals: Sequence[Interval]) -> tuple[list[tuple], list[float]]:
    """Each coupled-flow shape (links, mults) and the bytes per real flow it moved."""
    # A large run has few shapes (one per collective and send of a stage) and many
    # intervals of each. Intervals of one shape mostly share its tuples: the shape is
    # looked up by their identities (hashing a pair of ints, not two tuples of links),
    # then summed in interval order under its value (its number among the values, in
    # order of first appearance), as if keyed by value throughout.
    number_of: dict[tuple, int] = {}  # a shape's value: its number
    shape_of: dict[tuple[int, int], int] = {}  # a pair of tuples, by identity: its number
    shapes: list[tuple] = []
    moved: list[float] = []
    for iv in intervals:
        links, mults = iv.links, iv.mults
        ids = (id(links), id(mults))
        number = shape_of.get(ids)
        if number is None:
            number = number_of.get((links, mults))
            if number is None:
                number = number_of[(links, mults)] = len(shapes)
                shapes.append((links, mults))
                moved.append(0.0)
            shape_of[ids] = number
        moved[number] = moved[number] + iv.rate_bytes_per_s * (iv.end_s - iv.start_s)
    return shapes, moved


def link_utilization(
    intervals: Sequence[Interval],
    capacities: Sequence[float],
    end_s: float,
    links: np.ndarray | None = None,
) -> Utilization:
    """Bytes each link carried divided by what it could have carried in ``end_s``, for
    ``links`` (increasing; every link the intervals cross among them), or for the links
    the intervals cross."""
    shapes, moved = _moved_by_shape(intervals) if end_s > 0 else ([], [])
    if links is None:
        crossed = [np.asarray(shape[0], dtype=np.int64) for shape in shapes]
        links = np.sort(np.concatenate(crossed)) if crossed else np.zeros(0, np.int64)
        # distinct (np.unique would import numpy.ma: 14 ms of a run's start-up)
        links = links[np.concatenate(([True], links[1:] != links[:-1]))] if len(links) else links
    carried = np.zeros(len(links))
    for (crossed_links, mults), moved_bytes in zip(shapes, moved, strict=True):
        # a shape lists each link once, so fancy-index addition is exact
        where = np.searchsorted(links, crossed_links)
        carried[where] += np.asarray(mults, dtype=np.float64) * moved_bytes
    if not shapes:
        return Utilization(links, carried)
    capacity = np.fromiter(map(capacities.__getitem__, links.tolist()), np.float64, len(links))
    return Utilization(links, carried / (capacity * end_s))


def cumulative_load(
    intervals: Sequence[Interval], links: Sequence[int]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per chosen link, the bytes it carried from time 0 as a piecewise-linear function:
    its breakpoints and the bytes by each (np.interp between them is exact)."""
    # only the intervals that cross a chosen link (decided once per shape, by
    # identity), and only the chosen links' rows of them
    chosen = set(links)
    crosses: dict[int, bool] = {}
    mine_only = []
    for iv in intervals:
        hit = crosses.get(id(iv.links))
        if hit is None:
            hit = crosses[id(iv.links)] = not chosen.isdisjoint(iv.links)
        if hit:
            mine_only.append(iv)
    all_links, loads, starts, ends = _rows(mine_only, chosen)
    out = {}
    for link in links:
        mine = all_links == link
        times = np.concatenate([starts[mine], ends[mine]])
        deltas = np.concatenate([loads[mine], -loads[mine]])
        order = np.argsort(times, kind="stable")
        times, deltas = times[order], deltas[order]
        level = np.cumsum(deltas)  # load from each event time to the next
        integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
        out[link] = (times, integral)
    return out


def bytes_by(times: np.ndarray, integral: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`cumulative_load`'s function evaluated at ``at``."""
    return np.interp(at, times, integral, left=0.0, right=integral[-1] if len(integral) else 0.0)


def utilization_over_time(
    intervals: Sequence[Interval],
    capacities: Sequence[float],
    links: Sequence[int],
    end_s: float,
    bins: int,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Bin edges and, per chosen link, its mean utilization in each time bin."""
    edges = np.linspace(0.0, end_s, bins + 1)
    if not intervals:
        return edges, {link: np.zeros(bins) for link in links}
    out: dict[int, np.ndarray] = {}
    for link, (times, integral) in cumulative_load(intervals, links).items():
        at_edges = bytes_by(times, integral, edges)
        out[link] = np.diff(at_edges) / (np.diff(edges) * capacities[link])
    return edges, out

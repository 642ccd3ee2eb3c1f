"""Max-min fair rates of coupled flows (progressive filling with multiplicities).

The plain algorithm (tests/test_maxmin.py keeps it as the reference): raise the rates
of all unfrozen flows together until a link fills (its remaining capacity over the
multiplicities of the unfrozen flows crossing it is the smallest, within a relative
``SHARE_RTOL``), give that share to every unfrozen flow crossing a filled link,
subtract ``mult x share`` from the remaining capacity of each of their links, flow
by flow in start order, and repeat.

`max_min` gives the same rates to the bit with less work, which matters when a
component holds many flows of few shapes (ZeRO-2's per-layer gradient buckets: one
transfer per stage, tens of flows of it in flight, each over a ring of hundreds of
links):

- Flows of one shape (the same ``links`` and ``mults`` tuples) are always frozen in
  the same round at the same share, so they are handled as one group: a link's load
  counts the group's flows at once (integers: exact).
- Links of one capacity crossed by the same groups with the same multiplicities (a
  ring's hundreds of links) have the same remaining capacity and load throughout: the
  rounds run on these link classes (`link_classes`, kept per set of shapes by the
  caller), and the groups to freeze are found through the filled classes.
- A class's remaining capacity is only read again while it still carries an unfrozen
  flow, so only those links are updated, each by the same subtractions in the same
  order as the plain algorithm: when every flow frozen on it in the round has the same
  multiplicity there, that many subtractions of the same amount; otherwise the frozen
  flows' subtractions in start order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Relative tolerance when deciding that two fair shares are the same bottleneck.
SHARE_RTOL = 1e-12
# A link's load left after its frozen flows are taken off, relative to its load before,
# below which no flow is left on it (the residue of fractional multiplicities).
LOAD_RTOL = 1e-9


class CoupledFlow(Protocol):
    seq: int  # start order
    links: tuple[int, ...]
    mults: tuple[float, ...]  # fractional for an all-to-all-v (flows.Transfer)


# the most link-class structures a network keeps (see max_min); past it they are dropped
STRUCTURES_KEPT = 4096

Shape = tuple[tuple[int, ...], tuple[float, ...]]  # a flow's links and their multiplicities
# links alike: a capacity and the groups crossing them, each with its multiplicity
LinkClass = tuple[float, tuple[tuple[int, float], ...]]


def link_classes(shapes: Sequence[Shape], capacities: Sequence[float]) -> list[LinkClass]:
    """The links these shapes cross, as classes of links of one capacity crossed by the
    same shapes (by index) with the same multiplicities; in order of first link."""
    crossing: dict[int, list[tuple[int, float]]] = {}
    for group, (links, mults) in enumerate(shapes):
        for link, mult in zip(links, mults, strict=True):
            if link in crossing:
                crossing[link].append((group, mult))
            else:
                crossing[link] = [(group, mult)]
    classes = dict.fromkeys((capacities[link], tuple(on)) for link, on in crossing.items())
    return list(classes)


def max_min(
    flows: Sequence[CoupledFlow],
    capacities: Sequence[float],
    structures: dict[tuple, tuple[list[LinkClass], list[Shape]]] | None = None,
) -> list[float]:
    """Each flow's max-min fair rate (``flows`` in start order, as the plain algorithm
    takes them; the rates are in the same order). ``structures`` keeps the link classes
    of each set of shapes met, for the next call with the same set."""
    # groups of flows of one shape (tuples compared by identity: a workload reuses one
    # Transfer for all its flows of a kind; equal shapes in two groups are fine too)
    group_of: dict[tuple[int, int], int] = {}
    keys: list[tuple[int, int]] = []
    shapes: list[Shape] = []
    members: list[list[int]] = []  # the flows' start numbers, per group
    index = []  # each flow's group
    for flow in flows:
        links, mults = flow.links, flow.mults
        key = (id(links), id(mults))
        group = group_of.get(key)
        if group is None:
            group = group_of[key] = len(keys)
            keys.append(key)
            shapes.append((links, mults))
            members.append([])
        members[group].append(flow.seq)
        index.append(group)
    # groups numbered by their key, so that a set of shapes has one structure
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if order != list(range(len(keys))):
        renumber = [0] * len(order)
        for new, old in enumerate(order):
            renumber[old] = new
        shapes = [shapes[old] for old in order]
        members = [members[old] for old in order]
        index = [renumber[group] for group in index]
    known = tuple(keys[old] for old in order)
    found = structures.get(known) if structures is not None else None
    if found is None:
        classes = link_classes(shapes, capacities)
        if structures is not None:
            if len(structures) >= STRUCTURES_KEPT:
                structures.clear()
            structures[known] = (classes, shapes)  # the shapes keep their ids unique
    else:
        classes = found[0]
    rates = _progressive_filling(classes, [len(seqs) for seqs in members], members)
    return [rates[group] for group in index]


def _progressive_filling(
    classes: list[LinkClass], count: list[int], members: list[list[int]]
) -> list[float]:
    """The plain algorithm on link classes: every link of a class has the same remaining
    capacity and load throughout, so a class stands for its links."""
    remaining = [capacity for capacity, _on in classes]
    load = [sum(count[group] * mult for group, mult in on) for _capacity, on in classes]
    active = list(range(len(classes)))  # classes still carrying an unfrozen flow
    rate: list[float] = [0.0] * len(count)
    frozen_ever = [False] * len(count)
    left = len(count)
    while left:
        share = min(remaining[c] / load[c] for c in active)
        limit = share * (1 + SHARE_RTOL)
        full = {c for c in active if remaining[c] / load[c] <= limit}
        frozen = {group for c in full for group, _mult in classes[c][1] if not frozen_ever[group]}
        for group in frozen:
            rate[group] = share
            frozen_ever[group] = True
        still = []
        for c in active:
            if c in full:
                continue  # every flow on it is frozen now
            here = [(group, mult) for group, mult in classes[c][1] if group in frozen]
            if not here:
                still.append(c)
                continue
            n = load[c] - sum(count[group] * mult for group, mult in here)
            if n <= LOAD_RTOL * load[c]:
                # no unfrozen flow left on it (fractional multiplicities, an all-to-all-v's
                # or the flex dispatcher's, may leave a rounding residue, even a negative
                # one, which would be taken for the next bottleneck); its remaining
                # capacity is not read again
                continue
            load[c] = n
            left_here = remaining[c]
            first_mult = here[0][1]
            if all(mult == first_mult for _group, mult in here):
                step = first_mult * share
                for _ in range(sum(count[group] for group, _mult in here)):
                    left_here = max(left_here - step, 0.0)
            else:  # the frozen flows' subtractions in start order
                for _seq, mult in sorted(
                    (seq, mult) for group, mult in here for seq in members[group]
                ):
                    left_here = max(left_here - mult * share, 0.0)
            remaining[c] = left_here
            still.append(c)
        active = still
        left -= len(frozen)
    return rate

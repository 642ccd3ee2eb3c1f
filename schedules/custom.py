"""A schedule written by hand: per-rank op orders as text, checked before use.

The text has one line per pipeline rank, rank 0 first, each a list of op labels
in the reference format (``F3``, ``B3``, ``W3``, ``F3.1`` for chunk 1),
separated by spaces or commas; blank lines and ``#`` comments are skipped, and
a leading ``rank N:`` is allowed when N is the line's rank. A CSV with one row per
rank is the same text.

`check_orders` refuses orders that cannot run: an op missing or repeated, a
backward before its forward, a weight gradient before its backward, or a
deadlock (every rank waiting for another), each named in one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .pipeline import LOOPED, V_SHAPE, Step, parse_label, step_label, upstream

_RANK_PREFIX = re.compile(r"^\s*rank\s*(\d+)\s*:", re.IGNORECASE)
NO_ORDERS = "no op orders found: write one line per rank, e.g. 'F0 F1 B0 B1'"


def parse_orders(text: str) -> list[list[Step]]:
    """Per-rank orders from text; ValueError naming the line and label if one is not an op."""
    orders = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0]
        prefix = _RANK_PREFIX.match(line)
        if prefix:
            if int(prefix.group(1)) != len(orders):
                raise ValueError(
                    f"line {number}: 'rank {prefix.group(1)}:' where rank {len(orders)} is next "
                    "(write the ranks in order, one line each)"
                )
            line = line[prefix.end() :]
        labels = [label for label in re.split(r"[\s,;]+", line) if label]
        if not labels:
            continue
        order = []
        for label in labels:
            try:
                order.append(parse_label(label))
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
        orders.append(order)
    if not orders:
        raise ValueError(NO_ORDERS)
    return orders


def sizes_of(orders: Sequence[Sequence[Step]]) -> tuple[int, int, int, bool]:
    """(ranks, micro-batches, chunks per rank, split backward) that the orders imply."""
    steps = [s for order in orders for s in order]
    return (
        len(orders),
        max(s.microbatch for s in steps) + 1,
        max(s.chunk for s in steps) + 1,
        any(s.kind == "W" for s in steps),
    )


def check_orders(orders: Sequence[Sequence[Step]], placement: str = LOOPED) -> None:
    """Raise ValueError (one line) unless every rank runs every op once, each after the
    ops it needs on its own rank, and the ranks together cannot deadlock."""
    if not any(orders):
        raise ValueError(NO_ORDERS)
    p, m, v, split = sizes_of(orders)
    if placement == V_SHAPE and v != 2:
        raise ValueError(f"a V placement holds exactly 2 chunks per rank; the orders have {v}")
    kinds = ("F", "B", "W") if split else ("F", "B")
    for rank, order in enumerate(orders):
        seen: dict[Step, int] = {}
        for position, step in enumerate(order):
            if step in seen:
                raise ValueError(f"rank {rank}: {step_label(step, v)} appears twice")
            seen[step] = position
        for kind in kinds:
            for mb in range(m):
                for chunk in range(v):
                    if Step(kind, mb, chunk) not in seen:
                        label = step_label(Step(kind, mb, chunk), v)
                        raise ValueError(
                            f"rank {rank}: {label} is missing ({m} micro-batches x {v} chunks "
                            f"of {'/'.join(kinds)} expected on every rank)"
                        )
        for step, position in seen.items():
            before = {"B": "F", "W": "B"}.get(step.kind)
            if before and seen[Step(before, step.microbatch, step.chunk)] > position:
                first = step_label(Step(before, step.microbatch, step.chunk), v)
                raise ValueError(f"rank {rank}: {step_label(step, v)} comes before {first}")
    _check_no_deadlock(orders, p, v, placement)


def _check_no_deadlock(orders: Sequence[Sequence[Step]], p: int, v: int, placement: str) -> None:
    """Run the orders with no times at all: each rank takes its next op once the op it
    waits for on another stage is done. Stuck with ops left means deadlock, whatever
    the op times."""
    done: set[tuple[int, Step]] = set()
    position = [0] * p

    progressed = True
    while progressed:
        progressed = False
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                step = order[position[rank]]
                need = upstream(rank, step, p, v, placement)
                if need is not None and need not in done:
                    break
                done.add((rank, step))
                position[rank] += 1
                progressed = True
    stuck = [
        (rank, order[position[rank]])
        for rank, order in enumerate(orders)
        if position[rank] < len(order)
    ]
    if stuck:
        shown = "; ".join(
            f"rank {rank} at {step_label(step, v)} waits for "
            f"{step_label(need[1], v)} on rank {need[0]}"
            for rank, step in stuck[:4]
            for need in [upstream(rank, step, p, v, placement)]
        )
        more = f" (and {len(stuck) - 4} more ranks)" if len(stuck) > 4 else ""
        raise ValueError(f"the orders deadlock: {shown}{more}")

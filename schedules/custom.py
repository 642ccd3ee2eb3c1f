"""A schedule written by hand: per-rank op orders as text, checked before use.

The text has one line per pipeline rank, rank 0 first, each a list of op labels
in the reference format (``F3``, ``B3``, ``W3``, ``F3.1`` for chunk 1, ``F3.0&B1.1``
for a forward and a backward run overlapped as one F&B), separated by spaces or
commas; blank lines and ``#`` comments are skipped, and a leading ``rank N:`` is
allowed when N is the line's rank. A CSV with one row per rank is the same text.

`check_orders` refuses orders that cannot run: an op missing or repeated, a
backward before its forward, a weight gradient before its backward, an F&B that
is not a forward and another micro-batch's or chunk's backward, or a deadlock
(every rank waiting for another), each named in one line. A B whose W never comes,
in orders that have W's, is a full backward (as DualPipe runs some).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .pipeline import DUAL, LOOPED, V_SHAPE, Step, parse_labels, step_label, upstream

_RANK_PREFIX = re.compile(r"^\s*rank\s*(\d+)\s*:", re.IGNORECASE)
NO_ORDERS = "no op orders found: write one line per rank, e.g. 'F0 F1 B0 B1'"


def parse_orders(text: str) -> list[list[Step]]:
    """Per-rank orders from text; ValueError naming the line and the op's position (not
    its text) if one is not an op."""
    orders: list[list[Step]] = []
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
        for position, label in enumerate(labels, start=1):
            try:
                order.extend(parse_labels(label))
            except ValueError:  # its text is not echoed: a file's contents stay out of errors
                raise ValueError(
                    f"line {number}, op {position}: not an op label like F3, B3, W3, F3.1 "
                    "or F3&B1 (F, B or W, a micro-batch, optionally .chunk)"
                ) from None
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
    p, m, v, _ = sizes_of(orders)
    if placement in (V_SHAPE, DUAL) and v != 2:
        shape = "V" if placement == V_SHAPE else "dual"
        raise ValueError(
            f"a {shape} placement holds exactly 2 chunks per rank; the orders have {v}"
        )
    if placement == DUAL and m % 2:
        raise ValueError(f"a 'dual' placement takes an even number of micro-batches, not {m}")
    expected = [
        (mb, chunk)
        for mb in range(m)
        for chunk in range(v)
        if placement != DUAL or chunk == (mb >= m // 2)
    ]
    allowed = set(expected)
    shape = "micro-batches 0..m/2-1 on chunk 0, the rest on chunk 1" if placement == DUAL else ""
    for rank, order in enumerate(orders):
        seen: dict[Step, int] = {}
        for position, step in enumerate(order):
            if step in seen:
                raise ValueError(f"rank {rank}: {step_label(step, v)} appears twice")
            seen[step] = position
        for kind in ("F", "B"):
            for mb, chunk in expected:
                if Step(kind, mb, chunk) not in seen:
                    label = step_label(Step(kind, mb, chunk), v)
                    raise ValueError(
                        f"rank {rank}: {label} is missing ({m} micro-batches x {v} chunks "
                        f"of F/B expected on every rank{': ' + shape if shape else ''})"
                    )
        for step in seen:
            if (step.microbatch, step.chunk) not in allowed:
                label = step_label(step, v)
                raise ValueError(f"rank {rank}: {label} is not on its chunk ({shape})")
        for step, position in seen.items():
            before = {"B": "F", "W": "B"}.get(step.kind)
            if before and seen[Step(before, step.microbatch, step.chunk)] > position:
                first = step_label(Step(before, step.microbatch, step.chunk), v)
                raise ValueError(f"rank {rank}: {step_label(step, v)} comes before {first}")
        for position, step in enumerate(order):
            if not step.overlapped:
                continue
            pair = order[position - 1] if position else Step("-", 0)
            if step.kind != "B" or pair.kind != "F" or pair[1:] == step[1:]:
                raise ValueError(
                    f"rank {rank}: {step_label(pair, v)}&{step_label(step, v)} is not an F&B "
                    "pair (a forward, then the backward of another micro-batch or chunk)"
                )
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
                need = _needs(order, position[rank], rank, p, v, placement)
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
        waits = []
        for rank, step in stuck[:4]:
            need = _needs(orders[rank], position[rank], rank, p, v, placement)
            assert need is not None  # the loop above left this rank only for a need
            waits.append(
                f"rank {rank} at {step_label(step, v)} waits for "
                f"{step_label(need[1], v)} on rank {need[0]}"
            )
        shown = "; ".join(waits)
        more = f" (and {len(stuck) - 4} more ranks)" if len(stuck) > 4 else ""
        raise ValueError(f"the orders deadlock: {shown}{more}")


def _needs(
    order: Sequence[Step], position: int, rank: int, p: int, v: int, placement: str
) -> tuple[int, Step] | None:
    """What the step at ``position`` waits for on another rank; an F&B's forward waits
    for its backward's input too (the pair starts with both), reported first."""
    step = order[position]
    after = order[position + 1] if position + 1 < len(order) else None
    if step.kind == "F" and after is not None and after.overlapped:
        both = upstream(rank, after, p, v, placement)
        if both is not None:
            return both
    return upstream(rank, step, p, v, placement)

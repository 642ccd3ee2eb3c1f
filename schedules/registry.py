"""The schedules by name: what each one is (`ScheduleInfo`), whether sizes suit it
(`check`) and each rank's order (`build`). The schedules themselves are pipeline.py's,
dualpipe.py's and zbv_timed.py's plain functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .dualpipe import dualpipe, dualpipev
from .pipeline import (
    DUAL,
    INTERLEAVED,
    LOOPED,
    ONE_F_ONE_B,
    V_SHAPE,
    Step,
    gpipe,
    interleaved,
    interleaved_zb,
    looped_bfs,
    one_f_one_b,
    zbh1,
    zbh2,
    zbv_unit,
)
from .zbv_timed import zbv_timed


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    build: Callable[..., list[list[Step]]]
    split_backward: bool  # B and W are separate ops
    chunked: bool  # runs v >= 2 chunks per rank
    placement: str = LOOPED
    grouped: bool = False  # takes a micro-batch group size (Megatron's interleaving)
    timed: bool = False  # its order depends on the op times (build takes ``times``)


def _zbv_timed(p: int, m: int, v: int, group_size: int | None, times) -> list[list[Step]]:
    return zbv_timed(p, m, times)


SCHEDULES: dict[str, ScheduleInfo] = {
    "gpipe": ScheduleInfo(gpipe, split_backward=False, chunked=False),
    ONE_F_ONE_B: ScheduleInfo(one_f_one_b, split_backward=False, chunked=False),
    INTERLEAVED: ScheduleInfo(interleaved, split_backward=False, chunked=True, grouped=True),
    "looped_bfs": ScheduleInfo(looped_bfs, split_backward=False, chunked=True),
    "zbh1": ScheduleInfo(zbh1, split_backward=True, chunked=False),
    "zbh2": ScheduleInfo(zbh2, split_backward=True, chunked=False),
    "interleaved_zb": ScheduleInfo(interleaved_zb, split_backward=True, chunked=True, grouped=True),
    "zbv": ScheduleInfo(
        _zbv_timed, split_backward=True, chunked=True, placement=V_SHAPE, timed=True
    ),
    "zbv_unit": ScheduleInfo(zbv_unit, split_backward=True, chunked=True, placement=V_SHAPE),
    "dualpipe": ScheduleInfo(dualpipe, split_backward=True, chunked=True, placement=DUAL),
    "dualpipev": ScheduleInfo(dualpipev, split_backward=True, chunked=True, placement=V_SHAPE),
}


def check(name: str, p: int, m: int, v: int = 1, group_size: int | None = None) -> str | None:
    """Why these sizes do not suit the schedule (one line), or None if they do."""
    if name not in SCHEDULES:
        return f"schedule {name!r} is not one of: {', '.join(SCHEDULES)}"
    info = SCHEDULES[name]
    if p < 1 or m < 1 or v < 1:
        return f"stages, micro-batches and chunks must be at least 1 (got {p}, {m}, {v})"
    if info.chunked and v < 2:
        return f"schedule {name!r} runs 2 or more chunks per rank, got {v}"
    if info.placement == V_SHAPE and v != 2:
        return f"schedule {name!r} runs exactly 2 chunks per rank (a V), got {v}"
    if info.placement == DUAL and v != 2:
        return f"schedule {name!r} runs exactly 2 chunks per rank (two model copies), got {v}"
    if name == "dualpipe" and (p % 2 or m % 2):
        return (
            f"schedule 'dualpipe' needs an even number of stages and of micro-batches "
            f"(half enter at each end; got {p} stages, {m} micro-batches), as DualPipe does"
        )
    if name in ("dualpipe", "dualpipev") and m < 2 * p:
        return (
            f"schedule {name!r} needs at least 2 micro-batches per stage ({m} < 2 x {p}), "
            "as DualPipe's step() asserts"
        )
    if not info.chunked and v != 1:
        return f"schedule {name!r} runs one chunk per rank, got {v}"
    if group_size is not None and not info.grouped:
        return f"schedule {name!r} takes no micro-batch group size"
    if info.grouped and m % (group_size or p):
        return (
            f"schedule {name!r} needs micro-batches ({m}) to be a multiple of the "
            f"micro-batch group size ({group_size or p}), as Megatron-LM does"
        )
    if info.grouped and group_size is not None and group_size < min(p, m):
        return (
            f"schedule {name!r} needs a micro-batch group size ({group_size}) of at least the "
            f"number of ranks ({p}) or all micro-batches ({m}); smaller groups deadlock"
        )
    return None


def build(
    name: str, p: int, m: int, v: int = 1, group_size: int | None = None, times=None
) -> list[list[Step]]:
    """Each rank's op order for a named schedule; ValueError with the reason if the sizes
    do not suit it. ``times`` (a `zbv_timed.ZbvTimes`: per-chunk F, B, W, the hop and
    memory per op) steers a timed schedule (`ScheduleInfo.timed`); None means unit
    times. Other schedules ignore it."""
    problem = check(name, p, m, v, group_size)
    if problem:
        raise ValueError(problem)
    info = SCHEDULES[name]
    if info.timed:
        return info.build(p, m, v, group_size, times)
    return info.build(p, m, v, group_size)

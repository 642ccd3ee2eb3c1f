"""Pipeline schedules as plain functions: (ranks, micro-batches, chunks) -> per-rank op order."""

from .pipeline import (
    SCHEDULES,
    ScheduleInfo,
    Step,
    build,
    check,
    gpipe,
    interleaved,
    interleaved_zb,
    looped_bfs,
    one_f_one_b,
    parse_label,
    peak_inflight,
    stage_of,
    step_label,
    zbh1,
    zbh2,
)

__all__ = [
    "SCHEDULES",
    "ScheduleInfo",
    "Step",
    "build",
    "check",
    "gpipe",
    "interleaved",
    "interleaved_zb",
    "looped_bfs",
    "one_f_one_b",
    "parse_label",
    "peak_inflight",
    "stage_of",
    "step_label",
    "zbh1",
    "zbh2",
]

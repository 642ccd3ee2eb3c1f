"""The idle of a simulated iteration's timeline by cause, as the timeline picture and the
trace show it: each stretch of a GPU's idle as pieces, each of one cause of
``ir.results.IDLE_CAUSES`` (run/idlemap.py finds them; per cause, their mean over GPUs
is the run's ``idle_by_cause_s``, docs/design.md "Time accounting")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ..ir.vocabulary import IDLE, KIND_STYLES


class IdlePiece(NamedTuple):
    start_s: float
    end_s: float
    cause: str  # one of ir.results.IDLE_CAUSES


IdleMap = Mapping[int, Sequence[IdlePiece]]  # GPU -> its idle pieces in time order


class CauseStyle(NamedTuple):
    color: str  # light, as idle is: work stays the eye's first stop
    legend: str  # the timeline's legend entry and the trace's slice name


IDLE_CAUSE_STYLES: dict[str, CauseStyle] = {  # in IDLE_CAUSES' order
    # the schedule's own bubble keeps the plain idle grey (KIND_STYLES' idle)
    "schedule": CauseStyle(KIND_STYLES[IDLE].color, "idle: schedule's own bubble"),
    "imbalance": CauseStyle("#F6E0A0", "idle: stage imbalance"),
    # light blue: pink would read as recompute's, and every hue is some kind's already
    "communication": CauseStyle("#C9DCF2", "idle: waiting on communication"),
}

"""What a simulation produces: spans on a trace, and a run's whole result.

Kept apart from the engine and from the run orchestration so that presentation
(report/) reads results without importing either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from topologies import Cluster

    from .scenario.spec import Scenario
    from .workload.memory import StageMemory
    from .workload.ops import Lane, Workload


class Span(NamedTuple):
    """Something a lane did or waited for, from start to end (vocabulary names kinds)."""

    gpu: int
    stream: str
    kind: str
    label: str
    microbatch: int
    start_s: float
    end_s: float


class Trace(NamedTuple):
    spans: list[Span]
    lanes: tuple[Lane, ...]
    end_s: float  # when the last op finished
    num_transfers: int
    link_intervals: list  # engine.network.Interval: which links carried what, when


class Result(NamedTuple):
    scenario: Scenario
    cluster: Cluster
    workload: Workload
    trace: Trace
    memory: list[StageMemory]
    metrics: dict

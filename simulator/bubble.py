"""The bubble study: a schedule on abstract op times, no cluster (``stepsim schedule``).

Times follow the reference vectors' conventions: F, B and W are per micro-batch
and rank; with v chunks each op lasts F/v, B/v or W/v; a schedule that does not
split the backward runs one fused backward of (B + W)/v; c is added to every
hop between ranks. The engine runs the orders exactly as the full simulator
runs a pipeline's compute lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedules import SCHEDULES, Step, peak_inflight, step_label
from schedules import build as build_schedule

from .engine.core import simulate
from .results import Trace
from .vocabulary import COMPUTE_STREAM, MODEL_KINDS
from .workload.ops import abstract_pipeline


@dataclass(frozen=True, slots=True, kw_only=True)
class OpTimes:
    forward: float
    backward: float
    weight: float = 0.0
    p2p_latency: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Study:
    name: str
    num_ranks: int
    num_microbatches: int
    num_chunks: int
    split_backward: bool
    placement: str
    times: OpTimes
    orders: tuple[tuple[Step, ...], ...]
    trace: Trace

    @property
    def makespan(self) -> float:
        return self.trace.end_s

    @property
    def ideal(self) -> float:
        t = self.times
        return self.num_microbatches * (t.forward + t.backward + t.weight)

    @property
    def per_rank_busy(self) -> list[float]:
        busy = [0.0] * self.num_ranks
        for span in self.trace.spans:
            if span.stream == COMPUTE_STREAM and span.kind in MODEL_KINDS:
                busy[span.gpu] += span.end_s - span.start_s
        return busy

    @property
    def per_rank_bubble(self) -> list[float]:
        return [self.makespan - busy for busy in self.per_rank_busy]

    def peak_inflight(self, release_at: str = "W") -> list[int]:
        """Chunk activations alive per rank: +1 at F, -1 at W (or the fused B)."""
        return [peak_inflight(order, release_at) for order in self.orders]

    def rank_order(self) -> list[str]:
        return [" ".join(step_label(s, self.num_chunks) for s in o) for o in self.orders]

    def as_dict(self) -> dict:
        ideal, makespan = self.ideal, self.makespan
        t = self.times
        return {
            "schedule": self.name,
            "p": self.num_ranks,
            "m": self.num_microbatches,
            "v": self.num_chunks,
            "F": t.forward,
            "B": t.backward,
            "W": t.weight,
            "c": t.p2p_latency,
            "split_backward": self.split_backward,
            "placement": self.placement,
            "makespan": makespan,
            "ideal": ideal,
            "bubble_ratio": (makespan - ideal) / ideal,
            "bubble_rate": (makespan - ideal) / makespan,
            "per_rank_busy": self.per_rank_busy,
            "per_rank_bubble": self.per_rank_bubble,
            "per_rank_peak_inflight_b": self.peak_inflight("B"),
            "per_rank_peak_inflight_w": self.peak_inflight("W"),
            "rank_order": self.rank_order(),
        }


def run_orders(
    name: str,
    orders: Sequence[Sequence[Step]],
    times: OpTimes,
    *,
    num_chunks: int,
    split_backward: bool,
    placement: str = "looped",
) -> Study:
    """Simulate given per-rank orders (already checked) on abstract op times."""
    v = num_chunks
    backward = times.backward if split_backward else times.backward + times.weight
    workload = abstract_pipeline(
        orders,
        forward_s=times.forward / v,
        backward_s=backward / v,
        weight_s=times.weight / v if split_backward else 0.0,
        p2p_latency_s=times.p2p_latency,
        num_chunks=v,
        placement=placement,
    )
    m = 1 + max(s.microbatch for order in orders for s in order)
    return Study(
        name=name,
        num_ranks=len(orders),
        num_microbatches=m,
        num_chunks=v,
        split_backward=split_backward,
        placement=placement,
        times=times,
        orders=tuple(tuple(o) for o in orders),
        trace=simulate(workload),
    )


def run_schedule(
    name: str, p: int, m: int, times: OpTimes, v: int = 1, group_size: int | None = None
) -> Study:
    """Build a named schedule and simulate it; ValueError if the sizes do not suit it."""
    orders = build_schedule(name, p, m, v, group_size)
    info = SCHEDULES[name]
    return run_orders(
        name,
        orders,
        times,
        num_chunks=v,
        split_backward=info.split_backward,
        placement=info.placement,
    )

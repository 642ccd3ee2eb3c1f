"""Each pipeline rank's passes under a scenario's schedule: the named schedule's orders
(timed by schedule_costs.py for the schedules that place passes by their times; with
Megatron-Core's combined 1F1B pairs under the expert all-to-all overlap) or the custom
file's, and the activations they hold at most (the memory model and the lowering read
them; p2pcalls.py places the framework's blocking p2p calls between them)."""

from __future__ import annotations

from collections.abc import Sequence

from stepsim.schedules import INTERLEAVED, ONE_F_ONE_B, Step, peak_inflight
from stepsim.schedules import build as build_schedule
from stepsim.schedules.dualpipe import combined_1f1b

from ..scenario import Scenario
from .schedule_costs import schedule_times


def stage_orders(scenario: Scenario) -> list[list[Step]]:
    """Each pipeline rank's op order under the scenario's schedule."""
    par, tr = scenario.parallel, scenario.training
    if tr.custom_orders is not None:
        return [list(order) for order in tr.custom_orders]
    orders = build_schedule(
        tr.schedule,
        par.pipeline_model_parallel_size,
        scenario.num_microbatches,
        par.virtual_pipeline_model_parallel_size,
        tr.microbatch_group_size_per_vp_stage,
        schedule_times(scenario),
    )
    if tr.moe_overlap and tr.schedule in (ONE_F_ONE_B, INTERLEAVED):
        return combined_1f1b(orders)  # Megatron-Core's F&B pairs
    return orders


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak forwards whose activations each stage holds under the schedule: released
    by the backward, or by the weight gradient when the schedule splits it."""
    return inflight_of(stage_orders(scenario))


def inflight_of(orders: Sequence[Sequence[Step]]) -> list[int]:
    """`inflight_per_stage` of orders already built."""
    return [peak_inflight(order, "W") for order in orders]

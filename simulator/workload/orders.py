"""Each pipeline rank's passes under a scenario's schedule: the named schedule's orders
(with Megatron-Core's combined 1F1B pairs under the expert all-to-all overlap) or the
custom file's, the framework's blocking p2p calls between them, and the activations
they hold at most (the lowering and the memory model read them)."""

from __future__ import annotations

from stepsim.schedules import INTERLEAVED, ONE_F_ONE_B, Step, peak_inflight
from stepsim.schedules import build as build_schedule
from stepsim.schedules.dualpipe import combined_1f1b
from stepsim.schedules.p2p import (
    Call,
    deepspeed_calls,
    megatron_calls,
    megatron_interleaved_calls,
)

from ..scenario import Scenario, frameworks
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


def p2p_items(scenario: Scenario, orders: list[list[Step]]) -> list[list[Step | Call]]:
    """Each rank's passes with its framework's blocking p2p calls between them
    (schedules.p2p), or the passes alone under `overlapped`."""
    mode, p = scenario.training.mechanism("pipeline_p2p"), len(orders)
    if mode == frameworks.BATCHED_BLOCKING and scenario.training.schedule == INTERLEAVED:
        v = scenario.parallel.virtual_pipeline_model_parallel_size
        group = scenario.training.microbatch_group_size_per_vp_stage
        return megatron_interleaved_calls(orders, v, group)
    if mode == frameworks.BATCHED_BLOCKING:
        return [megatron_calls(order, stage, p) for stage, order in enumerate(orders)]
    if mode == frameworks.SEQUENTIAL_BLOCKING:
        return [deepspeed_calls(stage, p, scenario.num_microbatches) for stage in range(p)]
    return [list(order) for order in orders]


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak forwards whose activations each stage holds under the schedule: released
    by the backward, or by the weight gradient when the schedule splits it."""
    return [peak_inflight(order, "W") for order in stage_orders(scenario)]

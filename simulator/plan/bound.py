"""Memory and a lower bound on the iteration time of a layout, both closed forms: what
a search filters and orders candidates by before it simulates any."""

from __future__ import annotations

from collections.abc import Callable

from stepsim import schedules

from ..cost.compute import ComputeModel
from ..cost.memory import optimizer_sharded, stage_memory
from ..cost.moe import moe_block_work
from ..cost.orders import inflight_per_stage
from ..cost.params import output_rank, stage_params_per_rank
from ..cost.schedule_costs import schedule_times
from ..ir.results import StageMemory
from ..scenario import Scenario


class Inflight:
    """In-flight activations per rank, cached by what they depend on (the schedule's
    shape), since building the orders is the slow part of the memory model."""

    def __init__(self) -> None:
        self.cache: dict[tuple, list[int]] = {}

    def __call__(self, scenario: Scenario) -> list[int]:
        par, tr = scenario.parallel, scenario.training
        key: tuple[object, ...] = (
            tr.schedule,
            par.pipeline_model_parallel_size,
            scenario.num_microbatches,
            par.virtual_pipeline_model_parallel_size,
            tr.microbatch_group_size_per_vp_stage,
        )
        if tr.custom_orders is not None:
            key = (key, tr.custom_orders)
        if schedules.SCHEDULES[tr.schedule].timed:  # the order follows the op times
            key = (key, schedule_times(scenario))
        if key not in self.cache:
            self.cache[key] = inflight_per_stage(scenario)
        return self.cache[key]


def memory_of(scenario: Scenario, inflight: Callable[[Scenario], list[int]]) -> list[StageMemory]:
    return [stage_memory(scenario, s, n) for s, n in enumerate(inflight(scenario))]


def iteration_lower_bound_s(scenario: Scenario) -> float:
    """A time no simulation of the scenario can beat (closed form, no simulation).

    A rank's compute stream runs one op at a time, so the iteration lasts at least
    the sum of its compute ops (forwards, backwards, recomputation, weight gradients,
    its embedding or output layer, its optimizer step). Rank s starts nothing before
    the first micro-batch's forward has passed virtual stages 0 .. s-1, held by ranks
    0 .. s-1 under both placements. Each rank counts its own layers (an uneven split,
    stages.stage_layers, gives ranks different counts). The bound is the largest of those
    sums over ranks; communication, bubbles and waiting only add to the simulated time.
    """
    model = ComputeModel(scenario)
    layer, extras = model.layer(), model.extras()
    par, tr = scenario.parallel, scenario.training
    p = par.pipeline_model_parallel_size
    m = scenario.num_microbatches
    forward = (layer.attention_forward + layer.mlp_forward).duration_s
    backward = (layer.attention_backward + layer.mlp_backward).duration_s
    if scenario.model.moe:  # dense and MoE layers: the cheaper of the two, per layer
        moe = moe_block_work(model)
        forward = min(forward, (layer.attention_forward + moe.forward).duration_s)
        backward = min(backward, (layer.attention_backward + moe.backward).duration_s)
    recompute = layer.recompute_s(tr.recompute_granularity, forward, tr.recomputed)
    split = tr.split_backward
    embedding = (
        extras.embedding_forward.duration_s
        + (extras.embedding_weight if split else extras.embedding_backward).duration_s
    )
    output = (extras.output_forward + extras.output_backward).duration_s
    d = par.gradient_group_size  # ZeRO shards over data x context parallel
    sharded = optimizer_sharded(scenario)
    last = output_rank(scenario)
    best = 0.0
    fill = 0.0  # the first micro-batch's forwards on ranks before this one
    for s in range(p):
        busy = m * scenario.rank_layers(s) * (forward + backward + recompute)
        if s == 0:
            busy += m * embedding
        if s == last:
            busy += m * output
        params = stage_params_per_rank(scenario, s)
        busy += model.optimizer(params / d if sharded else params).duration_s
        best = max(best, fill + busy)
        first_chunk = scenario.chunk_layers[s][0]  # virtual stage s, both placements
        fill += first_chunk * forward + (extras.embedding_forward.duration_s if s == 0 else 0.0)
    return best

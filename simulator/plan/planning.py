"""Scenarios a plan edits: a layout applied to a base scenario, another model, another
number of nodes. Each is an edit with ``dataclasses.replace``, so the calibration and a
custom schedule's orders carry over untouched, and building the edited Scenario runs
the scenario's rules (simulator.scenario.rules): what planning keeps is what
``stepsim run`` accepts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stepsim.schedules import ONE_F_ONE_B

from ..cost.params import stage_params_per_rank
from ..ir.vocabulary import NO_SHARDING, RECOMPUTE_NONE
from ..scenario import ModelSpec, ParallelConfig, Scenario, TrainingConfig
from ..scenario.presets import FAMILY_SEQ_LENGTH, FAMILY_VOCAB_SIZE
from .space import SCHEDULE_BOUND_KEYS, Layout

# what `plan scale` keeps as the nodes change: the global batch (strong scaling) or the
# micro-batches per pipeline (weak scaling)
KEEP_GLOBAL_BATCH, KEEP_MICROBATCHES = "global-batch", "microbatches"
SCALE_KEEPS = (KEEP_GLOBAL_BATCH, KEEP_MICROBATCHES)


def apply_layout(base: Scenario, layout: Layout) -> Scenario:
    """The base scenario with this layout, checked by the scenario's rules (building a
    Scenario runs them). A custom schedule's file and orders, and an interleaved
    group, belong to the schedule the layout replaces and go with it."""
    parallel = ParallelConfig(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        data_parallel_size=layout.dp,
        virtual_pipeline_model_parallel_size=layout.chunks,
        sequence_parallel=layout.sequence_parallel,
        context_parallel_size=base.parallel.context_parallel_size,  # kept, not searched
        cp_comm_type=base.parallel.cp_comm_type,
        expert_model_parallel_size=base.parallel.expert_model_parallel_size,  # kept too
        expert_tensor_parallel_size=base.parallel.expert_tensor_parallel_size,
        decoder_first_pipeline_num_layers=layout.first_layers,
        decoder_last_pipeline_num_layers=layout.last_layers,
    )
    training = _with_schedule(
        base.training,
        micro_batch_size=layout.micro_batch,
        schedule=layout.schedule,
        recompute_granularity=layout.recompute,
        data_parallel_sharding=layout.sharding,
        use_distributed_optimizer=None,  # the layout's sharding says it
    )
    return replace(base, parallel=parallel, training=training)


def _with_schedule(training: TrainingConfig, **changes: Any) -> TrainingConfig:
    """The training spec with another named schedule: the keys bound to the old one
    (SCHEDULE_BOUND_KEYS and a custom schedule's orders) are cleared."""
    cleared: dict[str, Any] = dict.fromkeys(SCHEDULE_BOUND_KEYS)  # each key's "not set"
    return replace(training, **cleared, custom_orders=None, **changes)


def _one_gpu_layout(base: Scenario, **changes: Any) -> Scenario:
    """The base scenario (with ``changes`` to its other fields) on one GPU, plain
    1F1B, no recomputation or sharding: a layout every model takes, replaced by
    whatever fit or search picks. The other training and network settings stay, but
    for the two overlaps that need what this layout drops (the distributed optimizer's
    parameter gather, TP overlap's sequence parallelism)."""
    training = _with_schedule(
        base.training,
        micro_batch_size=1,
        schedule=ONE_F_ONE_B,
        recompute_granularity=RECOMPUTE_NONE,
        data_parallel_sharding=NO_SHARDING,
        use_distributed_optimizer=None,
        overlap_param_gather=False,
        tp_comm_overlap=False,
    )
    parallel = ParallelConfig(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=1
    )
    return replace(base, parallel=parallel, training=training, **changes)


def with_model(base: Scenario, name: str, layers: int, hidden: int, heads: int) -> Scenario:
    """The base scenario with another model of the GPT shape (ffn 4 x hidden)."""
    model = ModelSpec(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=4 * hidden,
        seq_length=FAMILY_SEQ_LENGTH,
        vocab_size=FAMILY_VOCAB_SIZE,
    )
    return _one_gpu_layout(base, name=name, model=model)


def with_nodes(base: Scenario, num_nodes: int) -> Scenario:
    """The base scenario on another number of nodes, its layout reset to one GPU."""
    return _one_gpu_layout(base, cluster=replace(base.cluster, num_nodes=num_nodes))


def model_params(scenario: Scenario) -> float:
    """Parameters of the whole model as one GPU holds it (the output layer shared
    unless untied): 12 L h^2 + 13 L h + (V + s) h + 2 h for the GPT shape with ffn 4h;
    `cost.memory.model_params` for any shape."""
    return stage_params_per_rank(_one_gpu_layout(scenario), 0)

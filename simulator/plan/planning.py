"""Scenarios a plan edits: a layout applied to a base scenario, another model, another
number of nodes, each built through the loader's rules (``scenario_from_dict``) so
that what planning keeps is what ``stepsim run`` accepts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..scenario.loader import scenario_from_dict, scenario_to_dict
from ..scenario.spec import Scenario
from ..workload.memory import stage_params_per_rank
from .space import SCHEDULE_BOUND_KEYS, Layout


def apply_layout(base: Scenario, layout: Layout) -> Scenario:
    """The base scenario with this layout, validated by the loader's rules."""
    raw = scenario_to_dict(base)
    for key in SCHEDULE_BOUND_KEYS:
        raw["training"].pop(key, None)
    raw["parallel"].update(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        data_parallel_size=layout.dp,
        virtual_pipeline_model_parallel_size=layout.chunks,
        sequence_parallel=layout.sequence_parallel,
    )
    raw["training"].update(
        micro_batch_size=layout.micro_batch,
        schedule=layout.schedule,
        recompute_granularity=layout.recompute,
        data_parallel_sharding=layout.sharding,
    )
    return replace(scenario_from_dict(raw), calibration=base.calibration)


def _one_gpu_layout(raw: dict[str, Any]) -> None:
    """Reset a scenario dict's layout to one GPU, plain 1F1B, no recomputation or
    sharding: a layout every model takes, replaced by whatever fit or search picks.
    The other training and network settings stay."""
    raw["parallel"] = {
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "data_parallel_size": 1,
    }
    for key in SCHEDULE_BOUND_KEYS:
        raw["training"].pop(key, None)
    raw["training"].update(
        micro_batch_size=1,
        schedule="1f1b",
        recompute_granularity="none",
        data_parallel_sharding="none",
    )


def with_model(base: Scenario, name: str, layers: int, hidden: int, heads: int) -> Scenario:
    """The base scenario with another model of the GPT shape (ffn 4 x hidden)."""
    from ..scenario.presets import FAMILY_SEQ_LENGTH, FAMILY_VOCAB_SIZE

    raw = scenario_to_dict(base)
    raw["model"] = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": 4 * hidden,
        "seq_length": FAMILY_SEQ_LENGTH,
        "vocab_size": FAMILY_VOCAB_SIZE,
    }
    raw["name"] = name
    _one_gpu_layout(raw)
    return replace(scenario_from_dict(raw), calibration=base.calibration)


def with_nodes(base: Scenario, num_nodes: int) -> Scenario:
    """The base scenario on another number of nodes, its layout reset to one GPU."""
    raw = scenario_to_dict(base)
    raw["cluster"]["num_nodes"] = num_nodes
    _one_gpu_layout(raw)
    return replace(scenario_from_dict(raw), calibration=base.calibration)


def model_params(scenario: Scenario) -> float:
    """Parameters of the whole model (embedding and output layer shared, as on one GPU):
    12 L h^2 + 13 L h + (V + s) h + 2 h for the GPT shape with ffn 4h."""
    raw = scenario_to_dict(scenario)
    _one_gpu_layout(raw)
    return stage_params_per_rank(scenario_from_dict(raw), 0)

"""Rules of activation offloading (`training.cpu_offloading`, docs/memory.md
"Activation offloading"): Megatron-Core's and Transformer Engine's own checks, cited,
and what stepsim does not model, said as such.

Megatron-Core's TransformerConfig.__post_init__ (megatron/core/transformer/
transformer_config.py; the same three checks at core_r0.8.0, core_v0.12.1 and main at
d98e8a6, lines 1884-1898 there):

- "CPU offloading can be done only for layers less than {num_layers}"
  (`cpu_offloading_num_layers` < 0 or >= `num_layers`);
- "Currently there is no support for Pipeline parallelism with CPU offloading";
- "CPU offloading does not work when activation recomputation is enabled".

Transformer Engine's get_cpu_offload_context (transformer_engine/pytorch/cpu_offload.py,
d0067d0 and every version since v2.3): "CPU Offloading is enabled while it is not
mentioned what to offload (weights/activations)" when both switches are off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepsim.schedules import ONE_F_ONE_B

from ..ir.vocabulary import RECOMPUTE_NONE
from .errors import ScenarioError
from .frameworks import MEGATRON

if TYPE_CHECKING:
    from .spec import Scenario

# the Megatron versions stepsim models that hold the cpu_offloading keys (Megatron-Core)
OFFLOADING_VERSIONS = ("2024", "2025")


def check_offloading(scenario: Scenario) -> None:
    training, par = scenario.training, scenario.parallel
    if not training.offloading:
        return
    # the key the user turned it on with names the error
    key, value = (
        ("training.cpu_offloading", True)
        if training.cpu_offloading
        else ("training.cpu_offloading_num_layers", training.cpu_offloading_num_layers)
    )
    n, layers = training.cpu_offloading_num_layers, scenario.model.num_layers
    if n >= layers:
        raise ScenarioError(
            key="training.cpu_offloading_num_layers",
            value=n,
            rule=f"must be less than model.num_layers={layers} (Megatron-Core: CPU "
            f"offloading can be done only for layers less than {layers})",
        )
    if not training.cpu_offloading_activations and not training.cpu_offloading_weights:
        raise ScenarioError(
            key="training.cpu_offloading_activations",
            value=False,
            rule="and training.cpu_offloading_weights = false leave nothing to offload "
            "(Transformer Engine: CPU Offloading is enabled while it is not mentioned what "
            "to offload)",
        )
    problem = None
    version = training.mechanism("framework_version")
    if training.framework != MEGATRON or version not in OFFLOADING_VERSIONS:
        problem = f"is Megatron-Core's (megatron 2024 or 2025), not {training.engine_label}"
    elif par.pipeline_model_parallel_size > 1:
        problem = (
            "cannot go with pipeline parallelism (Megatron-Core: no support for pipeline "
            f"parallelism with CPU offloading); parallel.pipeline_model_parallel_size="
            f"{par.pipeline_model_parallel_size}"
        )
    elif training.recompute_granularity != RECOMPUTE_NONE:
        problem = (
            "cannot go with activation recomputation (Megatron-Core: CPU offloading does "
            f"not work when recomputation is enabled); training.recompute_granularity="
            f"{training.recompute_granularity!r}"
        )
    elif training.schedule != ONE_F_ONE_B:
        problem = (
            f'needs training.schedule = "{ONE_F_ONE_B}" (stepsim models Megatron-Core '
            "without pipeline parallelism, each micro-batch's backward right after its "
            f"forward), not {training.schedule!r}"
        )
    elif training.moe_overlap:
        problem = (
            "is not modelled with training.overlap_moe_expert_parallel_comm (a stepsim "
            "limitation: F&B pairs interleave two passes' layers)"
        )
    if problem:
        raise ScenarioError(key=key, value=value, rule=problem)

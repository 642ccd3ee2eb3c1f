"""Mixture-of-experts rules (docs/moe.md): what the MoE model keys need of
each other, and what expert parallelism needs of the layout, as Megatron-Core checks
them (megatron/core/transformer/transformer_config.py `__post_init__`,
megatron/core/parallel_state.py `initialize_model_parallel`) or as stepsim models
them. `rules` runs them in its order."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ir.vocabulary import MOE_FLEX, SHARD_FULL
from .errors import ScenarioError

if TYPE_CHECKING:
    from .spec import ModelSpec, Scenario

# `model.moe_routing`: how tokens spread over the routed experts (cost/routing.py)
IMBALANCED, BALANCED, ZIPF, SHARES = "imbalanced", "balanced", "zipf", "shares"
MOE_ROUTINGS = (IMBALANCED, BALANCED, ZIPF, SHARES)

# The imbalance a balancing router leaves (`model.moe_expert_load_max_violation` when not
# given): Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
# Mixture-of-Experts" (arXiv 2408.15664), Table 2: MaxVio_global (the busiest expert's
# load over the mean, minus 1, over their validation set) of DeepSeekMoE models trained
# with an auxiliary loss: 0.72 (1B) and 0.52 (3B); with Loss-Free Balancing (the expert
# bias): 0.04 for both. The 3B model's, the larger of the two, is taken. A global figure
# averages over batches: a micro-batch's own imbalance is at least as large, so these
# are a floor for what a step sees (docs/moe.md).
AUX_LOSS_MAX_VIOLATION = 0.52
LOSS_FREE_MAX_VIOLATION = 0.04

# the MoE model keys that mean nothing without num_experts
_MOE_MODEL_KEYS = (
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "first_k_dense_replace",
    "moe_expert_capacity_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_routing",
    "moe_routing_zipf_exponent",
    "moe_routing_shares_file",
    "moe_routing_shares",
    "moe_expert_load_max_violation",
    "moe_router_enable_expert_bias",
)


def check_moe_model(model: ModelSpec) -> None:
    """The MoE keys go with `num_experts`, and a token picks at most every expert."""
    if model.num_experts is None:
        for name in _MOE_MODEL_KEYS:
            if getattr(model, name) is not None:
                raise ScenarioError(
                    key=f"model.{name}",
                    value=getattr(model, name),
                    rule="needs model.num_experts (an MoE model); without it the model is dense",
                )
        return
    if model.router_topk > model.num_experts:
        raise ScenarioError(
            key="model.moe_router_topk",
            value=model.router_topk,
            rule=f"must be <= model.num_experts={model.num_experts} (a token's distinct experts)",
        )
    if (model.first_k_dense_replace or 0) >= model.num_layers:
        raise ScenarioError(
            key="model.first_k_dense_replace",
            value=model.first_k_dense_replace,
            rule=f"must be < model.num_layers={model.num_layers} (leave an MoE layer)",
        )
    check_routing(model)
    check_groups(model)


def check_groups(model: ModelSpec) -> None:
    """Group-limited routing (Megatron-Core's TransformerConfig checks): both keys or
    neither, the groups divide the experts, and the chosen groups hold top-k experts."""
    groups, chosen = model.moe_router_num_groups, model.moe_router_group_topk
    if (groups is None) != (chosen is None):
        name = "moe_router_num_groups" if groups is not None else "moe_router_group_topk"
        other = "moe_router_group_topk" if groups is not None else "moe_router_num_groups"
        raise ScenarioError(
            key=f"model.{name}",
            value=getattr(model, name),
            rule=f"needs model.{other} too (group-limited routing takes both)",
        )
    if groups is None:
        return
    # both keys are set (checked above), and check_moe_model calls this for MoE models only
    assert chosen is not None and model.num_experts is not None
    if model.num_experts % groups:
        raise ScenarioError(
            key="model.moe_router_num_groups",
            value=groups,
            rule=f"must divide model.num_experts={model.num_experts} (equal groups)",
        )
    if chosen > groups:
        raise ScenarioError(
            key="model.moe_router_group_topk",
            value=chosen,
            rule=f"must be <= model.moe_router_num_groups={groups}",
        )
    if chosen * (model.num_experts // groups) < model.router_topk:
        raise ScenarioError(
            key="model.moe_router_group_topk",
            value=chosen,
            rule=f"x the {model.num_experts // groups} experts of a group must be >= "
            f"model.moe_router_topk={model.router_topk} (a token's experts lie in the chosen "
            "groups)",
        )


def check_routing(model: ModelSpec) -> None:
    """The routing keys go with their `moe_routing`; a shares file gives one share >= 0
    per expert, and none above 1/top-k of the total (a token meets an expert once)."""
    routing = model.moe_routing
    if model.moe_expert_load_max_violation is not None and routing not in (None, IMBALANCED):
        raise ScenarioError(
            key="model.moe_expert_load_max_violation",
            value=model.moe_expert_load_max_violation,
            rule="applies to model.moe_routing='imbalanced' (the default) only",
        )
    if model.moe_routing_zipf_exponent is not None and routing != ZIPF:
        raise ScenarioError(
            key="model.moe_routing_zipf_exponent",
            value=model.moe_routing_zipf_exponent,
            rule="applies to model.moe_routing='zipf' only",
        )
    given = model.moe_routing_shares
    if routing != SHARES:
        for name in ("moe_routing_shares_file", "moe_routing_shares"):
            if getattr(model, name) is not None:
                raise ScenarioError(
                    key=f"model.{name}",
                    value=getattr(model, name),
                    rule="applies to model.moe_routing='shares' only",
                )
        return
    file_key = "model.moe_routing_shares_file"
    if given is None:
        raise ScenarioError(
            f"missing key {file_key} (the experts' token shares) for model.moe_routing='shares'",
            key=file_key,
            rule="required by model.moe_routing='shares'",
        )
    where = model.moe_routing_shares_file
    value = where if where is not None else f"{len(given)} shares"
    if len(given) != model.num_experts:
        raise ScenarioError(
            key=file_key,
            value=value,
            rule=f"must give one share per expert: {len(given)} given, "
            f"model.num_experts={model.num_experts}",
        )
    if not all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in given):
        raise ScenarioError(key=file_key, value=value, rule="shares must be finite numbers >= 0")
    total = math.fsum(given)
    if total <= 0:
        raise ScenarioError(key=file_key, value=value, rule="shares must not all be 0")
    top = max(given) / total
    if top > 1.0 / model.router_topk * (1 + 1e-9):
        raise ScenarioError(
            key=file_key,
            value=value,
            rule=f"no expert may take more than 1/moe_router_topk={1 / model.router_topk:.4g} "
            f"of the shares (a token meets an expert once); the largest takes {top:.4g}",
        )


def check_expert_parallel(scenario: Scenario) -> None:
    """Expert parallelism as Megatron-Core lays it out and as stepsim models it."""
    model, par, training = scenario.model, scenario.parallel, scenario.training
    ep, etp, tp = par.ep_size, par.etp_size, par.tensor_model_parallel_size
    if not model.moe:
        for name, value in (
            ("parallel.expert_model_parallel_size", par.expert_model_parallel_size),
            ("parallel.expert_tensor_parallel_size", par.expert_tensor_parallel_size),
            ("training.moe_token_dispatcher_type", training.moe_token_dispatcher_type),
            ("training.moe_permute_fusion", training.moe_permute_fusion),
            ("training.moe_grouped_gemm", training.moe_grouped_gemm),
        ):
            if value is not None:
                raise ScenarioError(
                    key=name, value=value, rule="needs model.num_experts (an MoE model)"
                )
        return
    assert model.num_experts is not None  # model.moe says so
    if model.num_experts % ep:
        raise ScenarioError(
            key="parallel.expert_model_parallel_size",
            value=ep,
            rule=f"must divide model.num_experts={model.num_experts} (each EP rank holds "
            "the same number of experts)",
        )
    stage_gpus = tp * par.gradient_group_size
    if stage_gpus % (ep * etp):
        raise ScenarioError(
            key="parallel.expert_model_parallel_size",
            value=ep,
            rule=f"x expert_tensor_parallel_size={etp} must divide TP x CP x DP={stage_gpus} "
            "(Megatron-Core folds the experts' EP x ETP over a stage's GPUs)",
        )
    if etp not in (1, tp):
        raise ScenarioError(
            key="parallel.expert_tensor_parallel_size",
            value=etp,
            rule=f"must be 1 or the tensor-parallel size {tp} (other sizes are not modelled yet)",
        )
    if model.expert_ffn % etp:
        raise ScenarioError(
            key="parallel.expert_tensor_parallel_size",
            value=etp,
            rule=f"must divide model.moe_ffn_hidden_size={model.expert_ffn}",
        )
    if tp > 1 and not par.sequence_parallel:
        raise ScenarioError(
            key="parallel.sequence_parallel",
            value=False,
            rule="must be true for an MoE model with tensor parallelism (Megatron-LM asks "
            "for it with EP and TP; stepsim models MoE layers under SP only)",
        )
    span = ep * etp
    gpn = scenario.cluster.gpus_per_node
    if gpn % span and span % gpn:
        raise ScenarioError(
            key="parallel.expert_model_parallel_size",
            value=ep,
            rule=f"x expert_tensor_parallel_size={etp} must divide or be a multiple of "
            f"cluster.gpus_per_node={gpn} (alike EP groups on every node)",
        )
    if training.moe_dispatcher == MOE_FLEX:
        check_flex(scenario)
    if training.data_parallel_sharding == SHARD_FULL:
        raise ScenarioError(
            key="training.data_parallel_sharding",
            value=SHARD_FULL,
            rule="cannot be `full` for an MoE model yet (FSDP of expert weights is not "
            "modelled); use `optimizer` or `gradients`",
        )


def check_flex(scenario: Scenario) -> None:
    """The flex (DeepEP) dispatcher: Megatron-Core's asserts (TP x EP > 1; no padding to
    capacity, which stepsim does not model anyway) and what stepsim models of it
    (cost/deepep.py): ETP 1, balanced dropless routing, groups that nest with the
    experts of a GPU and of a node."""
    model, par = scenario.model, scenario.parallel
    key = "training.moe_token_dispatcher_type"
    problem = None
    if par.ep_size < 2:
        problem = "needs parallel.expert_model_parallel_size > 1 (DeepEP moves tokens over EP)"
    elif par.etp_size != 1:
        problem = "is modelled with parallel.expert_tensor_parallel_size = 1 only"
    elif model.moe_routing not in (None, BALANCED, IMBALANCED):
        problem = (
            "is modelled under balanced or imbalanced routing only, not "
            f"model.moe_routing={model.moe_routing!r}"
        )
    elif model.moe_expert_capacity_factor is not None:
        problem = "is modelled dropless only (model.moe_expert_capacity_factor unset)"
    if problem:
        raise ScenarioError(key=key, value=MOE_FLEX, rule=problem)
    groups = model.moe_router_num_groups
    if groups is None:
        return
    gpn = scenario.cluster.gpus_per_node
    experts = model.num_experts
    assert experts is not None  # check_expert_parallel calls this for MoE models only
    size = experts // groups
    for what, block in (
        ("a GPU's", experts // par.ep_size),
        ("a node's", experts * min(par.ep_size, gpn) // par.ep_size),
    ):
        if block % size and size % block:
            raise ScenarioError(
                key="model.moe_router_num_groups",
                value=groups,
                rule=f"groups of {size} experts must nest with {what} {block} experts under "
                "the flex dispatcher (one divides the other)",
            )

"""Mixture-of-experts parameters and which layers are MoE layers (docs/moe.md).

An MoE layer is attention as in a dense layer, then in place of the MLP: a router (an
h x E weight, replicated on every tensor rank as Megatron-Core's TopKRouter keeps it),
E routed experts (each an MLP of `moe_ffn_hidden_size`, gated as `swiglu` says, its
fc1 column- and fc2 row-parallel over the expert tensor-parallel group ETP) split over
the EP ranks (E / EP each), and optional shared experts (one MLP of
`moe_shared_expert_intermediate_size`, sharded over TP like a dense MLP). Its two norms
stay. Dense parameters (attention, norms, router, shared experts) are reduced over
data x context parallel as a dense layer's; the routed experts' over the
expert-data-parallel group, TP x CP x DP / (EP x ETP) GPUs (Megatron-Core's
`expert_data_parallel_group`).
"""

from __future__ import annotations

from stepsim.schedules import DUAL, holder_of

from ..scenario import ModelSpec, Scenario
from .mla import attention_params as mla_attention_params


def norm_params(model: ModelSpec) -> int:
    return model.hidden_size if model.rms_norm else 2 * model.hidden_size


def expert_params(model: ModelSpec) -> tuple[int, int]:
    """One routed expert: (sharded over ETP: fc1, fc2 and fc1's bias; replicated over
    ETP: fc2's bias)."""
    h, f, f1 = model.hidden_size, model.expert_ffn, model.expert_fc1_width
    bias = model.linear_bias
    return h * f1 + f * h + (f1 if bias else 0), (h if bias else 0)


def moe_layer_params(model: ModelSpec) -> tuple[int, int, int]:
    """One MoE layer: (sharded over TP: attention and shared experts; replicated on every
    TP rank: norms, the row-parallel biases, the router; the E routed experts in all)."""
    h = model.hidden_size
    qkv, bias = model.qkv_width, model.linear_bias
    shared_f = model.shared_expert_ffn
    shared_f1 = (2 if model.gated else 1) * shared_f
    sharded = h * qkv + (qkv if model.qkv_bias else 0) + model.attention_width * h
    replicated = 2 * norm_params(model) + (h if bias else 0) + h * model.num_experts
    if model.mla:  # multi-head latent attention (mla.py): its down-projections replicated
        sharded, down = mla_attention_params(model)
        replicated += down
    if shared_f:
        sharded += h * shared_f1 + shared_f * h + (shared_f1 if bias else 0)
        replicated += h if bias else 0
    one_sharded, one_replicated = expert_params(model)
    return sharded, replicated, model.num_experts * (one_sharded + one_replicated)


def all_layers_params(model: ModelSpec, active: bool = False) -> int:
    """The transformer layers' parameters, dense and MoE; ``active``: counting each MoE
    layer's top-k routed experts only (the parameters a token meets)."""
    from .memory import layer_params  # memory imports this module

    dense_sharded, dense_replicated = layer_params(model)
    sharded, replicated, experts = moe_layer_params(model)
    if active:
        experts = experts // model.num_experts * model.router_topk
    moe = model.num_moe_layers
    return (model.num_layers - moe) * (dense_sharded + dense_replicated) + moe * (
        sharded + replicated + experts
    )


def rank_global_layers(scenario: Scenario, rank: int) -> list[int]:
    """The global (0-based) indices of pipeline rank ``rank``'s layers, in its rank-local
    order (chunk by chunk, as lowering.layers numbers them)."""
    par = scenario.parallel
    p, v = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    counts, placement = scenario.chunk_layers, scenario.training.placement
    starts, start = {}, 0
    for virtual in range(p * v):
        if placement == DUAL and virtual == p:
            start = 0  # DualPipe's second copy: the same layers again
        holder = holder_of(virtual, p, placement)
        starts[holder] = start
        start += counts[holder[0]][holder[1]]
    return [starts[(rank, k)] + i for k in range(v) for i in range(counts[rank][k])]


def rank_moe_flags(scenario: Scenario, rank: int) -> list[bool]:
    """Whether each of the rank's layers (rank-local order) is an MoE layer."""
    model = scenario.model
    return [model.is_moe_layer(i) for i in rank_global_layers(scenario, rank)]


def moe_layer_params_per_rank(scenario: Scenario) -> tuple[float, float]:
    """One MoE layer on one GPU: (parameters reduced over data x context parallel,
    routed-expert parameters reduced over the expert-data-parallel group): E / EP
    experts, each 1/ETP of its sharded part."""
    model, par = scenario.model, scenario.parallel
    sharded, replicated, _ = moe_layer_params(model)
    one_sharded, one_replicated = expert_params(model)
    local = model.num_experts // par.ep_size
    dense = sharded / par.tensor_model_parallel_size + replicated
    return dense, local * (one_sharded / par.etp_size + one_replicated)


def layer_params_of(scenario: Scenario, rank: int) -> list[tuple[float, float]]:
    """Each of the rank's layers (rank-local order) on one GPU: (dense-group parameters,
    routed-expert parameters)."""
    from .memory import layer_params_per_rank  # memory imports this module

    dense = (layer_params_per_rank(scenario), 0.0)
    moe = moe_layer_params_per_rank(scenario)
    return [moe if flag else dense for flag in rank_moe_flags(scenario, rank)]

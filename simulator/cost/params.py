"""Parameters: the model's, a layer's, a pipeline stage's on one GPU, dense and MoE.

Parameters follow the model's shape (GQA, SwiGLU, norms, biases, learned or rotary
positions, tied or untied output layer, multi-head latent attention: `layer_params`,
`model_params`). Mixture-of-experts layers (docs/moe.md), and which layers are MoE:

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


def expert_params(model: ModelSpec) -> tuple[int, int]:
    """One routed expert: (sharded over ETP: fc1, fc2 and fc1's bias; replicated over
    ETP: fc2's bias)."""
    h, f, f1 = model.hidden_size, model.expert_ffn, model.expert_fc1_width
    bias = model.linear_bias
    return h * f1 + f * h + (f1 if bias else 0), (h if bias else 0)


def moe_layer_params(model: ModelSpec) -> tuple[int, int, int]:
    """One MoE layer: (sharded over TP: attention and shared experts; replicated on every
    TP rank: norms, the row-parallel biases, the router; the E routed experts in all)."""
    assert model.num_experts is not None  # MoE models only (num_experts set)
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
    dense_sharded, dense_replicated = layer_params(model)
    sharded, replicated, experts = moe_layer_params(model)
    if active:
        assert model.num_experts is not None  # moe_layer_params checked it
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
    assert model.num_experts is not None  # MoE models only (num_experts set)
    local = model.num_experts // par.ep_size
    dense = sharded / par.tensor_model_parallel_size + replicated
    return dense, local * (one_sharded / par.etp_size + one_replicated)


def layer_params_of(scenario: Scenario, rank: int) -> list[tuple[float, float]]:
    """Each of the rank's layers (rank-local order) on one GPU: (dense-group parameters,
    routed-expert parameters)."""
    dense = (layer_params_per_rank(scenario), 0.0)
    moe = moe_layer_params_per_rank(scenario)
    return [moe if flag else dense for flag in rank_moe_flags(scenario, rank)]


def norm_params(model: ModelSpec) -> int:
    """One norm's parameters: LayerNorm's weight and bias, RMSNorm's weight."""
    return model.hidden_size if model.rms_norm else 2 * model.hidden_size


def layer_params(model: ModelSpec) -> tuple[int, int]:
    """One transformer layer's parameters: (sharded over TP, replicated on every TP rank).

    Sharded: QKV h x (heads + 2 groups) d, projection heads d x h, fc1 h x ffn (2 ffn
    with SwiGLU), fc2 ffn x h, and the column-parallel layers' biases (QKV's with
    ``add_qkv_bias`` alone). Replicated: two norms, the row-parallel layers' biases."""
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv, fc1 = model.qkv_width, model.fc1_width
    bias = model.linear_bias
    if model.mla:  # multi-head latent attention (mla.py): no biases
        attention, down = mla_attention_params(model)
        return attention + h * fc1 + f * h, 2 * norm_params(model) + down
    sharded = (
        h * qkv
        + (qkv if model.qkv_bias else 0)
        + model.attention_width * h
        + h * fc1
        + (fc1 if bias else 0)
        + f * h
    )
    replicated = 2 * norm_params(model) + (2 * h if bias else 0)
    return sharded, replicated


def model_params(model: ModelSpec, tied: bool = True) -> int:
    """The whole model's parameters: layers, word embedding, learned positions, final
    norm and, untied, the output layer (the published counts count each once)."""
    sharded, replicated = layer_params(model)
    if model.moe:  # dense and MoE layers (experts.py)
        params = all_layers_params(model) + model.vocab_size * model.hidden_size
    else:
        params = model.num_layers * (sharded + replicated) + model.vocab_size * model.hidden_size
    if not model.rope:
        params += model.seq_length * model.hidden_size
    if not tied:
        params += model.vocab_size * model.hidden_size
    return params + norm_params(model)


def active_params(model: ModelSpec, tied: bool = True) -> int:
    """The parameters one token meets: `model_params` with each MoE layer's top-k routed
    experts in place of all E (a dense model's are all of them). MFU's model FLOPs are
    the FLOPs of these (docs/moe.md)."""
    total = model_params(model, tied)
    if not model.moe:
        return total
    return total - all_layers_params(model) + all_layers_params(model, active=True)


def layer_params_per_rank(scenario: Scenario) -> float:
    """Parameters of one transformer layer held by one tensor-parallel rank."""
    sharded, replicated = layer_params(scenario.model)
    return sharded / scenario.parallel.tensor_model_parallel_size + replicated


def output_rank(scenario: Scenario) -> int:
    """The pipeline rank that holds the last virtual stage (the output layer): the last
    rank, or rank 0 under ZB-V's V-shaped placement."""
    p = scenario.parallel.pipeline_model_parallel_size
    v = scenario.parallel.virtual_pipeline_model_parallel_size
    placement = scenario.training.placement
    return holder_of(p * v - 1, p, placement)[0]


def end_ranks(scenario: Scenario) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ranks holding an embedding, ranks holding an output layer and loss): rank 0 and
    `output_rank`, or under DualPipe's two copies both end ranks each (rank 0 holds copy
    0's first stage and copy 1's last, rank p - 1 the others)."""
    if scenario.training.placement == DUAL:
        ends = (0, scenario.parallel.pipeline_model_parallel_size - 1)
        return ends, ends
    return (0,), (output_rank(scenario),)


def stage_params_per_rank(scenario: Scenario, stage: int) -> float:
    """Parameters on one GPU of a pipeline stage (embedding on the first, output on the
    one holding the last virtual stage).

    The output layer shares the word embedding; when it sits on another stage that
    stage keeps its own copy, as Megatron-LM does. Untied, it is its own weight wherever
    it sits. Learned absolute positions add their table to the first stage; rope none.
    """
    m = scenario.model
    t = scenario.parallel.tensor_model_parallel_size
    tied = scenario.training.share_embeddings_and_output_weights
    if scenario.model.moe:  # dense and MoE layers, the experts' E / EP (experts.py)
        params = sum(dense + experts for dense, experts in layer_params_of(scenario, stage))
    else:
        params = layer_params_per_rank(scenario) * scenario.rank_layers(stage)
    embedding, output = end_ranks(scenario)
    if stage in embedding:
        params += m.vocab_size * m.hidden_size / t + (0 if m.rope else m.seq_length * m.hidden_size)
    if stage in output:
        params += norm_params(m)  # final norm
        if stage not in embedding or not tied:
            params += m.vocab_size * m.hidden_size / t
    return params


def stage_expert_params_per_rank(scenario: Scenario, stage: int) -> float:
    """The routed experts' parameters on one GPU of a pipeline stage (0 for a dense
    model): reduced, and sharded by ZeRO, over the expert-data-parallel group."""
    if not scenario.model.moe:
        return 0.0
    return sum(experts for _, experts in layer_params_of(scenario, stage))

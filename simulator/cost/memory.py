"""Parameters and memory per GPU, stage by stage.

Weights, gradients and optimizer states follow mixed-precision Adam as counted
by Rajbhandari et al. 2020 (ZeRO, Sec 3.1): 2 bytes of 16-bit weights, g of
gradients and 12 of fp32 master weights, momentum and variance per parameter.
g is the gradient buffer's dtype (`TrainingConfig.gradient_bytes`): 2 for fp16,
4 when gradients accumulate in fp32 (Megatron-LM's bf16, 18 bytes per parameter in
all; docs/frameworks.md §4).
The distributed optimizer (ZeRO-1) divides the 12 by the data-parallel size;
full sharding (ZeRO-3 / FSDP) divides all 16, plus a working set of gathered
layers.
Parameters are counted in params.py.
Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Sec 4), generalised to
those shapes, bytes per layer and micro-batch (the attention core's s x s terms as its kernel keeps
them: fp32 softmax output on Megatron's unfused fallback, none under flash
attention), times the activations the schedule keeps in flight:
a chunk's worth of layers (all the rank's layers when it runs one chunk) for
each forward whose backward (or, when split, weight gradient) has not yet run; with
chunks of unequal size (an uneven split), each forward counts its own chunk's layers.

FP8 (`training.fp8_format`, docs/design.md "FP8 training"): the linear layers' saved
inputs take 1 byte, their weights gain TE's FP8 copies (`fp8_weight_bytes`), and with
``fp8_param_gather`` the FP8 weights replace the 16-bit ones and are gathered in FP8
(`gathered_param_bytes`).

Megatron-Core (megatron 2024, `megatron_core`) keeps a few things the older engines'
count leaves out or counts twice, each checked against its source (docs/memory.md):
the 16-bit logits beside their fp32 copy in the loss (`logits_bytes_per_element`), the
recomputed layer's input shared with its checkpoint, and the optimizer step's fp32
copy of 16-bit gradients. Megatron 2021/2022 and DeepSpeed keep their count as before.
Measured against Megatron-LM's own memory tests (docs/memory.md) the tensors are within
a few per cent.

"Stage" below is a pipeline rank: with v chunks per rank it holds v of the
p x v virtual stages (schedules.stage_of).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.results import StageMemory
from ..ir.units import BYTES_PER_GIB
from ..ir.vocabulary import (
    ATTENTION_FLASH,
    MOE_ALLTOALL,
    MOE_FLEX,
    NO_SHARDING,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    SHARD_FULL,
    SHARD_GRADIENTS,
    SHARD_OPTIMIZER,
)
from ..scenario import Scenario
from ..scenario.frameworks import MEGATRON
from ..scenario.precision import fp8_enabled, fp8_param_gather, recipe_of, second_copy
from ..scenario.softmax import scenario_softmax_path
from .mla import activation_bytes_per_token as mla_activation_bytes_per_token
from .mla import linear_weights_per_rank as mla_linear_weights_per_rank
from .optimizer import state_bytes_per_param
from .orders import stage_orders
from .params import (
    end_ranks,
    layer_params_per_rank,
    rank_moe_flags,
    stage_expert_params_per_rank,
    stage_params_per_rank,
)
from .routing import rank_loads, skewed

# What a training process holds besides the model state and activations: the CUDA
# context and kernels (~0.5 GiB on A100/H100), NCCL's channel buffers (a few MiB per
# peer and channel, per communicator; allocated outside PyTorch) and the caching
# allocator's fragmentation (reserved less allocated). cuBLAS's and Transformer Engine's
# workspaces come from PyTorch's allocator and are small. One round figure for every
# GPU; it is a budget, not a measurement: Megatron-LM's memory tests record only
# PyTorch's allocated peak (docs/memory.md), which the rest of this model is checked on.
WORKSPACE_BYTES = 2.0 * BYTES_PER_GIB
WEIGHT_BYTES_PER_PARAM = 2.0
# The optimizer's fp32 copy of a 16-bit gradient, per parameter it steps on
MAIN_GRAD_BYTES_PER_PARAM = 4.0
# The loss's logits per element: Korthikanti et al. 2022, Sec 4.3, count them in fp32
# (4 bytes). Megatron-Core r0.8.0 computes them in 16 bits (GPTModel.forward,
# `self.output_layer`) and the loss casts them to fp32 (tensor_parallel/cross_entropy.py
# `VocabParallelCrossEntropy.calculate_logits_max`: `vocab_parallel_logits.float()`),
# keeping the fp32 softmax for the backward (`ctx.save_for_backward(exp_logits, ...)`)
# while the 16-bit logits are still referenced by the forward that made them: 2 + 4
# bytes at once (and again in the backward, whose 16-bit gradient is made from the fp32
# one in place).
LOGITS_BYTES_FP32 = 4.0
LOGITS_BYTES_MEGATRON_CORE = 6.0


def megatron_core(scenario: Scenario) -> bool:
    """Whether the run is Megatron-Core's (megatron 2024, r0.8.0, and 2025, which keeps
    its memory terms but for `moe_combine_bytes`): the versions whose memory terms
    docs/memory.md checks against their source and measurements. Megatron-LM 2021/2022
    and DeepSpeed keep the count they had."""
    training = scenario.training
    version = training.mechanism("framework_version")
    return training.framework == MEGATRON and version in ("2024", "2025")


def logits_bytes_per_element(scenario: Scenario) -> float:
    """Bytes per logit (token x vocabulary entry on a rank) the loss holds at its peak."""
    return LOGITS_BYTES_MEGATRON_CORE if megatron_core(scenario) else LOGITS_BYTES_FP32


def fp8_linear_params_per_rank(scenario: Scenario) -> float:
    """One layer's linear weights on one tensor-parallel rank (QKV, projection, fc1, fc2;
    no biases): what FP8 casts, caches and, with ``fp8_param_gather``, keeps and gathers
    in FP8 (TE quantizes the GEMMs' weights; biases and norms stay 16-bit)."""
    m = scenario.model
    h = m.hidden_size
    t = scenario.parallel.tensor_model_parallel_size
    if not m.mla and not m.moe:
        weights = h * m.qkv_width + m.attention_width * h + h * m.fc1_width + m.ffn_hidden_size * h
        return weights / t
    dense, moe = _fp8_layer_weights(scenario)
    if not m.moe:
        return dense
    # an MoE model: the mean layer's (fp8_weight_bytes counts a stage's own mix)
    return (m.num_moe_layers * moe + (m.num_layers - m.num_moe_layers) * dense) / m.num_layers


def _fp8_layer_weights(scenario: Scenario) -> tuple[float, float]:
    """(a dense layer's, an MoE layer's) linear weights on one GPU: an MoE layer's
    shared experts over TP and its E / EP local routed experts over ETP."""
    m = scenario.model
    h = m.hidden_size
    t = scenario.parallel.tensor_model_parallel_size
    mlp = (h * m.fc1_width + m.ffn_hidden_size * h) / t
    if m.mla:  # its down-projections are on every tensor rank whole
        attention = mla_linear_weights_per_rank(m, t)
    else:
        attention = (h * m.qkv_width + m.attention_width * h) / t
    if not m.moe:
        return attention + mlp, 0.0
    assert m.num_experts is not None  # m.moe says so
    par = scenario.parallel
    shared = 3 * h * m.shared_expert_ffn if m.gated else 2 * h * m.shared_expert_ffn
    routed = m.num_experts // par.ep_size * (h * m.expert_fc1_width + m.expert_ffn * h)
    return attention + mlp, attention + shared / t + routed / par.etp_size


def gathered_param_bytes(scenario: Scenario, params: float, layers: float) -> float:
    """Bytes of a parameter all-gather of ``params`` parameters holding ``layers``
    transformer layers: 2 per parameter, 1 per FP8 linear weight with
    ``fp8_param_gather`` (Megatron-LM's --fp8-param-gather gathers the FP8 parameters)."""
    gathered = params * WEIGHT_BYTES_PER_PARAM
    if fp8_param_gather(scenario.training):
        gathered -= layers * fp8_linear_params_per_rank(scenario) * (WEIGHT_BYTES_PER_PARAM - 1)
    return gathered


def fp8_weight_bytes(scenario: Scenario, layers: float, stage: int | None = None) -> float:
    """What FP8 adds to the weights of ``layers`` layers on one rank (0 without FP8): TE's
    cached FP8 copy of each linear weight and its second copy (transpose or column-wise,
    scenario.precision.second_copy), 1 byte each, kept from the first micro-batch on;
    with ``fp8_param_gather`` the FP8 weight replaces the 16-bit one (1 byte less).
    ``stage``: that pipeline rank's own layers, dense and MoE (DeepSeek's dense first
    layers are wider than its MoE layers' share on a GPU), else the mean layer's."""
    training = scenario.training
    if not fp8_enabled(training):
        return 0.0
    copies: float = 1 + second_copy(scenario.cluster.gpu, recipe_of(training))
    if fp8_param_gather(training):
        copies -= WEIGHT_BYTES_PER_PARAM
    m = scenario.model
    if stage is not None and m.moe and m.num_moe_layers < m.num_layers:
        dense, moe = _fp8_layer_weights(scenario)
        flags = rank_moe_flags(scenario, stage)
        return math.fsum(moe if flag else dense for flag in flags) * copies
    return layers * fp8_linear_params_per_rank(scenario) * copies


def activation_input_bytes(scenario: Scenario) -> int:
    """Bytes per element of the activation function's saved input (fc1's output): 2,
    or 1 with `activation_func_fp8_input_store` (Megatron-Core transformer_config.py:
    "Store the input of MLP activation function in FP8 for backprop"; the fused
    `weighted_bias_swiglu_impl` of mlp.py and moe/experts.py keeps an FP8 copy)."""
    return 1 if scenario.training.activation_func_fp8_input_store else 2


def activation_bytes_per_layer(
    scenario: Scenario, recompute: str | None = None, dense_mlp: bool = True
) -> float:
    """Korthikanti et al. 2022, Sec 4.2 and Table 2: one layer, one micro-batch, one rank.

    ``recompute`` defaults to the scenario's granularity. With context parallelism s is
    a rank's share of the sequence, s / CP (cost.context). Under selective recomputation
    the modules of `training.recompute_modules` keep less (Megatron-Core's
    transformer_config.py: `layernorm` and `mla_up_proj` discard their outputs, `mlp` is
    checkpointed on its input): the norms' outputs (QKV's and fc1's inputs), MLA's
    up-projected Q, K and V, and a dense MLP's fc1 output and fc2 input
    (``dense_mlp``: the layer's MLP is dense; an MoE layer's are `moe_activation_bytes`')."""
    m = scenario.model
    s, b, h, a = (
        m.seq_length // scenario.parallel.cp_size,
        scenario.training.micro_batch_size,
        m.hidden_size,
        (m.num_attention_heads),
    )
    t = scenario.parallel.tensor_model_parallel_size
    sp = scenario.parallel.sequence_parallel
    if recompute is None:
        recompute = scenario.training.recompute_granularity
    sbh = s * b * h
    # Korthikanti's 24 sbh / t of TP-sharded activations, per element of each tensor:
    # Q and the projection's input (2 bytes each, heads x d wide), K and V (groups x d),
    # the activation's input (fc1's output: 2 ffn with SwiGLU) and fc2's input (ffn);
    # 24 h for GPT's shape. The 10 sbh not sharded without SP: the two norms' inputs,
    # QKV's and fc1's inputs, the two dropout masks (RMSNorm keeps the same input).
    act_input = activation_input_bytes(scenario)
    sharded = (
        4 * m.attention_width
        + 4 * m.query_groups * m.head_size
        + act_input * m.fc1_width
        + 2 * m.ffn_hidden_size
    ) / h
    latents = 0.0  # MLA's latents, on every tensor rank for all its tokens (mla.py)
    if m.mla:
        mla_sharded, latents = mla_activation_bytes_per_token(m, 1)
        sharded += (mla_sharded - 4 * m.attention_width - 4 * m.query_groups * m.head_size) / h
        latents /= h
    if recompute == RECOMPUTE_FULL:
        return 2 * sbh / (t if sp else 1)  # only the layer's input is kept
    replicated = 10
    flash = scenario.training.mechanism("attention_kernel") == ATTENTION_FLASH
    if fp8_enabled(scenario.training):
        # TE saves each linear layer's input for wgrad as FP8 (1 byte, its one copy the
        # backward reads): the projection's and fc2's inputs in the sharded part, QKV's
        # and fc1's of the 10 (Q, K, V, the activation's input and the norms' stay 16-bit)
        sharded -= (m.attention_width + m.ffn_hidden_size) / h
        replicated = 8
        if flash:
            # ... but the projection's 16-bit input is the attention output O, which the
            # fused kernel keeps for its own backward (TE v1.9 attention.py FusedAttnFunc:
            # `ctx.save_for_backward(q, k, v, out_save, ...)`; flash-attn saves `out`
            # alike): O in 2 bytes beside the projection's FP8 copy (TE v1.9
            # module/linear.py `_Linear.forward` saves `inputmat_t`), 3 bytes, not 1
            sharded += 2 * m.attention_width / h
    # softmax output, dropout mask and dropout output: 2 + 1 + 2 bytes per score element
    attention_core = 5 * a * s / (h * t)
    if flash:
        # one fp32 log-sum-exp per query row and head; nothing s x s (cost.attention)
        attention_core = 4 * a / (h * t)
    elif not scenario_softmax_path(scenario).fused:
        # PyTorch's softmax in fp32 keeps its fp32 output: 4 bytes per score, not 2
        attention_core = 7 * a * s / (h * t)
    if recompute == RECOMPUTE_SELECTIVE:
        modules = scenario.training.recomputed
        if "core_attn" in modules:
            attention_core = 0.0
        fp8 = fp8_enabled(scenario.training)
        if "layernorm" in modules:  # QKV's and fc1's inputs, 2 bytes (FP8: 1) each
            replicated -= 2 if fp8 else 4
        if "mla_up_proj" in modules and m.mla:  # Q, K (qk_dim) and V per head, 2 bytes
            sharded -= 2 * a * (2 * m.qk_dim + m.v_dim) / h
        if "mlp" in modules and dense_mlp:  # fc1's output and fc2's input (FP8: 1 byte)
            sharded -= (act_input * m.fc1_width + (1 if fp8 else 2) * m.ffn_hidden_size) / h
    if sp:
        return sbh * ((replicated + sharded) / t + attention_core + latents)
    return sbh * (replicated + sharded / t + attention_core + latents)


def moe_activation_bytes(
    scenario: Scenario, dense_bytes: float, recompute: str | None = None
) -> float:
    """An MoE layer's activations from a dense layer's (``dense_bytes``, same
    recomputation): the MLP's fc1 and fc2 inputs (2 ffn_1 + 2 ffn bytes per token on the
    GPU) give way to the routed rows the GPU's experts keep: k (capped by the capacity
    factor) x ETP rows per local token, each keeping fc1's input (h), the activation's
    (ffn_1 / ETP) and fc2's (ffn / ETP) in 2 bytes (the linears' inputs in 1 under FP8);
    plus the rows the combine keeps (`moe_combine_bytes`)."""
    m, par = scenario.model, scenario.parallel
    if (recompute or scenario.training.recompute_granularity) == RECOMPUTE_FULL:
        return dense_bytes
    local: float = m.seq_length // par.cp_size * scenario.training.micro_batch_size
    local /= par.tensor_model_parallel_size
    factor = m.moe_expert_capacity_factor
    rows = local * m.router_topk * (1.0 if factor is None else min(1.0, factor)) * par.etp_size
    if skewed(m):  # the busiest EP rank's experts keep the most (routing.py)
        rows = local * m.router_topk * max(rank_loads(m, par.ep_size)) * par.etp_size
    # under FP8 the experts' linears keep their inputs as TE's FP8 copies, 1 byte (TE's
    # grouped_linear.py `_GroupedLinear.forward` saves the FP8 `inputmats` for wgrad, as
    # `_Linear` does), the activation's input stays 16-bit
    linear_input = 1 if fp8_enabled(scenario.training) else 2
    act_input = activation_input_bytes(scenario)
    fc1_out, fc2_in = m.expert_fc1_width / par.etp_size, m.expert_ffn / par.etp_size
    experts = rows * (linear_input * m.hidden_size + act_input * fc1_out + linear_input * fc2_in)
    shared = local * (act_input * (2 if m.gated else 1) + 2) * m.shared_expert_ffn
    combine = moe_combine_bytes(scenario, local, rows)
    modules = scenario.training.recomputed  # selective's MoE modules keep less
    if "moe" in modules:  # checkpointed on its input (the norm's output, counted already)
        experts = shared = combine = 0.0
    if "moe_act" in modules:  # the activation's output (fc2's input) discarded
        experts -= rows * linear_input * fc2_in
    if "shared_experts" in modules:  # checkpointed on the same input
        shared = 0.0
    # the dense MLP's fc1 and fc2 inputs as `activation_bytes_per_layer` counted them
    dense_mlp = local * (act_input * m.fc1_width + linear_input * m.ffn_hidden_size)
    return dense_bytes - dense_mlp + experts + shared + combine


def moe_combine_bytes(scenario: Scenario, local: float, rows: float) -> float:
    """What an MoE layer's combine keeps for its backward on one GPU, per micro-batch:
    Megatron-Core r0.8.0 weights the experts' output rows by their router probabilities
    after the experts, and the product keeps its 16-bit rows for the probabilities'
    gradient. The `alltoall` dispatcher does it on the token's own GPU, over its k copies
    (moe/moe_utils.py `unpermute`: `unpermuted_tokens * probs.unsqueeze(-1)`, on
    [tokens x k, h / TP] after `all_to_all_sp2hp`: k x ``local`` x h x 2 bytes; TE's
    fused `moe_unpermute` with probabilities saves its input rows alike); `allgather`
    on the GPU's expert rows when k > 1 (moe/token_dispatcher.py
    `MoEAllGatherTokenDispatcher.token_unpermutation`: `unpermuted_local_hidden *
    scores`), and `flex` (DeepEP) on its expert rows in its `unpermute(..., probs=...)`
    (core_v0.12.0 token_dispatcher.py `_DeepepManager`): ``rows`` x h x 2 bytes.
    Megatron-Core from v0.12.1 moves the weighting into the experts' activation
    (`permuted_probs`), where nothing of h is kept: none under
    `training.moe_probs_in_experts` (megatron 2025)."""
    m = scenario.model
    if scenario.training.mechanism("moe_probs_in_experts"):
        return 0.0  # weighted inside the experts: the unpermute merges unweighted rows
    if scenario.training.moe_dispatcher == MOE_ALLTOALL:
        return local * m.router_topk * m.hidden_size * 2
    if m.router_topk == 1 and scenario.training.moe_dispatcher != MOE_FLEX:
        return 0.0  # allgather scales the rows only with k > 1
    return rows * m.hidden_size * 2


def stage_activation_bytes_per_layer(scenario: Scenario, stage: int) -> float:
    """`activation_bytes_per_layer`, for an MoE model the mean over the rank's dense and
    MoE layers (exact when they are all of one kind)."""
    dense = activation_bytes_per_layer(scenario)
    if not scenario.model.moe:
        return dense
    flags = rank_moe_flags(scenario, stage)
    moe = moe_activation_bytes(scenario, activation_bytes_per_layer(scenario, dense_mlp=False))
    return sum(moe if flag else dense for flag in flags) / max(1, len(flags))


def sharding_of(scenario: Scenario) -> str:
    """The data-parallel sharding in effect: the scenario's, or none with one replica
    (there is nothing to shard over). Replicas are data x context parallel: Megatron-Core
    reduces gradients and shards the distributed optimizer over the data-parallel group
    with context parallelism."""
    if scenario.parallel.gradient_group_size > 1:
        return scenario.training.data_parallel_sharding
    return NO_SHARDING


def optimizer_sharded(scenario: Scenario) -> bool:
    """Whether each replica holds 1/D of the optimizer state and steps on 1/D of the
    parameters (ZeRO-1 and FSDP): the memory here and the bound (plan.bound) read it."""
    return sharding_of(scenario) in (SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_FULL)


def stage_memory(scenario: Scenario, stage: int, inflight_activations: int) -> StageMemory:
    m = scenario.model
    t = scenario.parallel.tensor_model_parallel_size
    params = stage_params_per_rank(scenario, stage)
    d = scenario.parallel.gradient_group_size  # data x context parallel
    weights = params * WEIGHT_BYTES_PER_PARAM
    gradient_bytes = scenario.training.gradient_bytes
    gradients = params * gradient_bytes
    state_bytes = state_bytes_per_param(scenario.training)  # 12, or the dtypes' sum
    optimizer = params * state_bytes
    experts = stage_expert_params_per_rank(scenario, stage)
    if optimizer_sharded(scenario) and experts:
        # the routed experts' states over the expert-data-parallel group, the rest over D x C
        edp = scenario.parallel.expert_data_parallel_size
        optimizer = ((params - experts) / d + experts / edp) * state_bytes
    elif optimizer_sharded(scenario):
        optimizer /= d
    if sharding_of(scenario) == SHARD_FULL:
        # sharded weights and gradients, plus FSDP's working set: the layer in use and
        # the one being gathered ahead, and one layer's full gradients
        # (the embedding/output weights are gathered with the first layer of each pass)
        layer = layer_params_per_rank(scenario)
        rest = params - layer * scenario.rank_layers(stage)
        weights = weights / d + (2 * layer + rest) * WEIGHT_BYTES_PER_PARAM
        gradients = gradients / d + (layer + rest) * gradient_bytes
        if fp8_enabled(scenario.training):
            weights += fp8_weight_bytes(scenario, 2)  # the FP8 copies of the working set
    else:
        if sharding_of(scenario) == SHARD_GRADIENTS:
            # ZeRO-2 / Megatron-FSDP optim_grads: 1/D of every gradient (the embedding's and
            # output layer's too: reduce-scattered every micro-batch, emit/dataparallel.py),
            # plus one layer's and the embedding/output weights' full gradients before
            # their reduce-scatter (megatron_fsdp.py's per-bucket buffers)
            layer = layer_params_per_rank(scenario)
            rest = params - layer * scenario.rank_layers(stage)
            gradients = params * gradient_bytes / d + (layer + rest) * gradient_bytes
        if fp8_enabled(scenario.training):
            weights += fp8_weight_bytes(scenario, scenario.rank_layers(stage), stage)
    chunks = scenario.chunk_layers[stage]
    if len(set(chunks)) == 1:  # every chunk alike: the peak in flight times a chunk's layers
        activations = stage_activation_bytes_per_layer(scenario, stage) * chunks[0]
        activations *= inflight_activations
    else:  # chunks of unequal size (an uneven split with chunks): walk the rank's order
        activations = stage_activation_bytes_per_layer(scenario, stage)
        activations *= inflight_layers(scenario, stage)
    activations -= offload_saving_bytes(scenario, stage)  # training.cpu_offloading
    if scenario.training.recompute_granularity == RECOMPUTE_FULL:
        # the layer being recomputed holds all its activations during its backward
        whole = activation_bytes_per_layer(scenario, RECOMPUTE_NONE)
        if scenario.model.moe:  # its largest layer, an MoE one
            whole = max(whole, moe_activation_bytes(scenario, whole, RECOMPUTE_NONE))
        if megatron_core(scenario):
            # its input is the checkpoint already counted: the recomputation runs on a
            # detached view of the saved tensor, no copy (Megatron-Core r0.8.0
            # tensor_parallel/random.py `CheckpointFunction.backward`: `detach_variable`)
            whole -= activation_bytes_per_layer(scenario, RECOMPUTE_FULL)
        activations += whole
    if stage in end_ranks(scenario)[1]:
        # the logits of the micro-batch whose loss is being computed (Korthikanti Sec 4.3:
        # fp32; Megatron-Core: 16-bit beside fp32, `logits_bytes_per_element`). One
        # micro-batch's: under 1F1B, and Megatron's interleaving in steady state, the
        # output chunk's backward follows its forward; schedules that run several of its
        # forwards first (GPipe, the interleaved schedule's all-forwards-first warm-up when
        # m = p in Megatron-Core r0.8.0) hold more, not counted (docs/memory.md)
        tokens = m.seq_length // scenario.parallel.cp_size * scenario.training.micro_batch_size
        activations += logits_bytes_per_element(scenario) * tokens * m.vocab_size / t
    if (
        megatron_core(scenario)
        and gradient_bytes < MAIN_GRAD_BYTES_PER_PARAM
        and sharding_of(scenario) in (NO_SHARDING, SHARD_OPTIMIZER)
        and not scenario.training.use_precision_aware_optimizer  # it reads them as they are
    ):
        # 16-bit gradients: the optimizer step casts the gradients it steps on to fp32
        # (Megatron-Core r0.8.0 optimizer/optimizer.py `_copy_model_grads_to_main_grads`:
        # `main_param.grad = model_param.main_grad.float()`; distrib_optimizer.py the
        # same on its shard), freed after the step; no activations are held then, so the
        # peak is the larger of the two (the docs' table: 20 and 4 + 16/d bytes per
        # parameter for fp16, docs/source/distrib_optimizer.md). Counted with the
        # optimizer, where it exceeds the activations.
        stepped = optimizer / state_bytes  # the parameters the replica steps
        optimizer += max(0.0, MAIN_GRAD_BYTES_PER_PARAM * stepped - activations)
    return StageMemory(
        stage=stage,
        params=params,
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        inflight_activations=inflight_activations,
        workspace_bytes=WORKSPACE_BYTES,
    )


def inflight_layers(scenario: Scenario, stage: int) -> int:
    """Most transformer layers whose activations a rank holds at once under its schedule:
    each forward adds its chunk's layers, the backward (or, when split, the weight
    gradient; a full backward's where the order holds no W) of the same chunk and
    micro-batch takes them off (schedules.peak_inflight,
    weighted by `Scenario.chunk_layers`)."""
    order = stage_orders(scenario)[stage]
    counts = scenario.chunk_layers[stage]
    # released at the W, or at a full B (one whose W the order does not hold), as
    # schedules.peak_inflight counts them
    weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
    alive = peak = 0
    for step in order:
        if step.kind == "F":
            alive += counts[step.chunk]
            peak = max(peak, alive)
        elif step.kind == "W" or (
            step.kind == "B" and (step.microbatch, step.chunk) not in weights
        ):
            alive -= counts[step.chunk]
    return peak


def _decoder_layer_bytes(scenario: Scenario) -> list[float]:
    """Each decoder layer's activations on pipeline rank 0, one micro-batch, in layer
    order (`activation_bytes_per_layer`, an MoE layer's `moe_activation_bytes`)."""
    m = scenario.model
    dense = activation_bytes_per_layer(scenario)
    if not m.moe:
        return [dense] * m.num_layers
    moe = moe_activation_bytes(scenario, activation_bytes_per_layer(scenario, dense_mlp=False))
    return [moe if flag else dense for flag in rank_moe_flags(scenario, 0)[: m.num_layers]]


def offload_layer_bytes(scenario: Scenario) -> list[float]:
    """Activation offloading (`training.cpu_offloading`, docs/memory.md "Activation
    offloading"): the activations each offloaded layer copies to host memory and back,
    one micro-batch on one GPU, in layer order: the first `training.offloaded_layers`
    decoder layers (Transformer Engine's default scheduling offloads layers 0 to N - 1,
    transformer_engine/pytorch/cpu_offload.py `DefaultOffloadSynchronizer`, d0067d0), each
    what this model keeps for it. Offloading needs PP 1 (scenario/offload_rules.py): the
    rank is pipeline rank 0 and holds every layer."""
    n = scenario.training.offloaded_layers
    return _decoder_layer_bytes(scenario)[:n] if n else []


def offload_saving_bytes(scenario: Scenario, stage: int) -> float:
    """What activation offloading takes off a GPU's peak activations. Transformer Engine's
    default scheduling (cpu_offload.py `_init_offload_synchronization_dicts`, d0067d0)
    frees offloaded layer i's GPU copy when layer L - N + i's forward starts (its copy
    to the host done) and reloads it when layer L - N + i's backward is done, so at most
    L - N consecutive layers' activations are on the GPU at any time (its docstring:
    "peak memory usage of saving activations is (num_layers - num_offloaded_layers) *
    T"): the saving is all L decoder layers' activations less the largest L - N
    consecutive ones' (N layers' when all are alike). One micro-batch's: without
    pipeline parallelism each forward's backward follows it."""
    n = scenario.training.offloaded_layers
    if not n or stage != 0:
        return 0.0
    layers = _decoder_layer_bytes(scenario)
    kept = len(layers) - n
    peak = max(math.fsum(layers[s : s + kept]) for s in range(n + 1))
    return math.fsum(layers) - peak


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """Why a layout does not fit: ``problem`` says which stage, by how much, what fills
    it and what to change; ``override`` how `stepsim run --allow-oom` simulates it
    anyway, a hint `plan` (which simulates nothing that does not fit) leaves out.
    ``str()`` is the whole line, as run's error, warning and metrics.json carry it."""

    problem: str
    override: str = "--allow-oom simulates it anyway"

    def __str__(self) -> str:
        return f"{self.problem}; {self.override}"


def out_of_memory(scenario: Scenario, memory: list[StageMemory]) -> OutOfMemory | None:
    """None when every stage fits its GPU, else what is wrong (`OutOfMemory`)."""
    capacity_gib = scenario.cluster.gpu.memory_gib
    worst = max(memory, key=lambda m: (m.total_bytes, -m.stage))
    parts = worst.as_gib()
    if parts["total"] <= capacity_gib:
        return None
    over = [stage.stage for stage in memory if stage.as_gib()["total"] > capacity_gib]
    return OutOfMemory(
        f"out of memory: pipeline stage {worst.stage} needs {parts['total']:.1f} GiB of the "
        f"{scenario.cluster.gpu.name}'s {capacity_gib:g} GiB ({parts['total'] - capacity_gib:.1f} "
        f"GiB over; "
        + ", ".join(f"{k} {parts[k]:.1f}" for k in parts if k != "total")
        + f"); {len(over)} of {len(memory)} stages do not fit. More pipeline or tensor "
        "parallelism, recomputation, a smaller micro-batch or a sharded optimizer would "
        "help"
    )

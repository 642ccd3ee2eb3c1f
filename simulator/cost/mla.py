"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434 Sec 2.1; DeepSeek-V3,
arXiv 2412.19437 Sec 2.1.1), as Megatron-Core's MLASelfAttention runs it
(megatron/core/transformer/multi_latent_attention.py, its keys MLATransformerConfig's).

With h the hidden size, a heads, q_lora and kv_lora the latents' widths, d_n =
`qk_head_dim`, d_r = `qk_pos_emb_head_dim` (the rotary part) and d_v = `v_head_dim`,
per token:

- Q: down-projection h -> q_lora, RMSNorm, up-projection q_lora -> a (d_n + d_r);
- K/V: down-projection h -> kv_lora + d_r (the latent and one rotary key part shared
  by every head), RMSNorm over the latent, up-projection kv_lora -> a (d_n + d_v);
- rotary embedding on the d_r parts of Q (per head) and K (once per token);
- the attention core with Q/K heads of d_n + d_r and V heads of d_v: scores 2 s^2 (d_n +
  d_r) and context 2 s^2 d_v FLOPs per head and sequence (attention.py);
- the output projection a d_v -> h.

**Tensor parallelism** as Megatron-Core shards it: the up-projections are
column-parallel (a / TP heads each), the projection row-parallel; the down-projections
are replicated on every tensor rank ("duplicated" linears) and, under sequence
parallelism, run on the rank's n / TP tokens, their latents then gathered; without SP
every rank runs them on all n tokens. Approximations under TP > 1 with SP: the SP
all-gather here stays the hidden state's, before the block (h per token where
Megatron-Core gathers the latents, q_lora + kv_lora + d_r: 7168 against 2112 for
DeepSeek-V3, 3.4 x the bytes), the latents' norms run on all n tokens (Megatron-Core:
n / TP) and every rank keeps all n tokens' latents; the TP all-reduce of the
duplicated down-projections' weight gradients (Megatron-Core's
`allreduce_gradients_across_tp_domain`) is not modelled. None of it applies at TP 1.

**Activations kept** (2 bytes each, per token): the hidden input (shared by the two
down-projections, Korthikanti's QKV input), the two latents before and after their
norms (2 q_lora + 2 kv_lora + d_r, not sharded over TP: every rank holds all n tokens'),
Q and K (a (d_n + d_r) each, the rotary K copied per head as the core reads it), V and
the core's output (a d_v each) sharded over TP.

No biases (DeepSeek has none; the rules refuse them); MLA under context parallelism is
refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kernels import BYTES_PER_ELEMENT, Kernel, LinearKernels

if TYPE_CHECKING:
    from ..scenario import ModelSpec
    from .compute import ComputeModel

LAST_WEIGHT, GATHER_FED = "q down dW", "q up"


def attention_params(model: ModelSpec) -> tuple[int, int]:
    """One MLA block's parameters: (sharded over TP: the up-projections and the output
    projection; replicated on every TP rank: the down-projections and the latents'
    norms)."""
    h, a = model.hidden_size, model.num_attention_heads
    q_up = model.q_lora * a * model.qk_dim
    kv_up = model.kv_lora * a * (model.qk_dim - model.rope_dim + model.v_dim)
    sharded = q_up + kv_up + model.attention_width * h
    down = h * model.q_lora + h * (model.kv_lora + model.rope_dim)
    return sharded, down + model.q_lora + model.kv_lora


def linear_weights_per_rank(model: ModelSpec, tp: int) -> float:
    """The block's linear weights on one tensor rank (what FP8 casts)."""
    sharded, replicated = attention_params(model)
    return sharded / tp + replicated - model.q_lora - model.kv_lora


def _linear(cm: ComputeModel, name: str, k_in: float, n_out: float, tokens: float) -> LinearKernels:
    """(forward, input-gradient, weight-gradient) kernels of one linear layer on
    ``tokens`` rows, 16-bit or FP8 as the linear layers of compute.kernels."""
    if cm.fp8 is not None:
        return cm.fp8.linear("attention", name, k_in, n_out, tokens)
    weight, accumulate = cm.weight_gradient(k_in, n_out, tokens)
    return (
        [Kernel("attention", "forward", name, cm.gemm(tokens, n_out, k_in))],
        [Kernel("attention", "input", name + " dX", cm.gemm(tokens, k_in, n_out))],
        [Kernel("attention", "weight", name + " dW", weight + accumulate)],
    )


def qkv_kernels(cm: ComputeModel) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """MLA's Q, K and V: the kernels between the block's norm and its rotary kernel
    (forward), and the input- and weight-gradient kernels of the same, in backward order
    (the up-projections' before the down-projections'; the last, ``LAST_WEIGHT``, ends
    the block's backward)."""
    m, par = cm.model, cm.parallel
    t, h, a = par.tensor_model_parallel_size, m.hidden_size, m.num_attention_heads
    tokens = cm.tokens
    local = tokens / t if par.sequence_parallel else tokens  # the down-projections' rows
    e, mem = BYTES_PER_ELEMENT, cm.memory_bound
    q_down = _linear(cm, "q down", h, m.q_lora, local)
    kv_down = _linear(cm, "kv down", h, m.kv_lora + m.rope_dim, local)
    q_up = _linear(cm, GATHER_FED, m.q_lora, a * m.qk_dim / t, tokens)
    kv_width = a * (m.qk_dim - m.rope_dim + m.v_dim) / t
    kv_up = _linear(cm, "kv up", m.kv_lora, kv_width, tokens)
    latents = tokens * (m.q_lora + m.kv_lora)  # the two norms' elements (after the gather)
    forward = [
        *q_down[0],
        *kv_down[0],
        Kernel("attention", "forward", "latent rmsnorms", mem(2 * e * latents)),
        *q_up[0],
        *kv_up[0],
    ]
    input_gradients = [
        *kv_up[1],
        *q_up[1],
        Kernel("attention", "input", "latent rmsnorms", mem(4 * e * latents)),
        *kv_down[1],
        *q_down[1],
    ]
    weight_gradients = [*kv_up[2], *q_up[2], *kv_down[2], *q_down[2]]
    return forward, input_gradients, weight_gradients


def rope_elements(cm: ComputeModel) -> float:
    """Elements the rotary kernel reads and writes per rank: Q's rotary parts (a / TP
    heads) and K's one per token."""
    m, t = cm.model, cm.parallel.tensor_model_parallel_size
    return cm.tokens * (m.num_attention_heads / t + 1) * m.rope_dim


def activation_bytes_per_token(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(bytes per token sharded over TP, bytes per token every TP rank keeps for all n
    tokens) of the block's attention-specific activations (the module's notes; the
    hidden input and the norm's are in Korthikanti's 10 of the caller)."""
    a = model.num_attention_heads
    sharded = 2 * a * (2 * model.qk_dim + 2 * model.v_dim)
    latents = 2 * (2 * model.q_lora + 2 * model.kv_lora + model.rope_dim)
    return sharded / tp, latents

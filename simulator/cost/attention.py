"""The attention core's kernels: Megatron-LM's unfused path or one flash kernel.

``unfused`` (Megatron-LM 2020-2022): the scores Q K^T as a batched GEMM, scale + mask
+ softmax, dropout, probabilities x V; the b x (a/T) x s x s scores go through HBM
in every one of them. The softmax is Megatron's fused kernel when its shape rule
allows (``simulator.scenario.softmax``, docs/frameworks.md §9): it reads the fp16
scores and writes the fp16 probabilities (2 + 2 bytes per score element), and its
backward reads the probabilities and their gradient and writes the scores' gradient
(2 + 2 + 2). Otherwise PyTorch's ``forward_torch_softmax`` runs with the scores in
fp32 (``attention_softmax_in_fp32``, set by ``apply_query_key_layer_scaling``):
``.float()`` 2 + 4, ``* scale`` 4 + 4, ``masked_fill_`` 4 + 4, softmax 4 + 4 and the
cast back 4 + 2 bytes, 36 in all; its backward through autograd 6 + 12 + 8 + 8 + 6 =
40 (Megatron-LM megatron/model/fused_softmax.py, transformer.py; §9(b)). 36 is a
lower bound: PyTorch's softmax may read a long row more than once.

``flash`` (Megatron-Core r0.8.0 with ``--transformer-impl transformer_engine``, its
default: TransformerEngine's ``DotProductAttention`` through
megatron/core/transformer/custom_layers/transformer_engine.py ``TEDotProductAttention``,
which runs cuDNN's fused attention or FlashAttention-2): one kernel that keeps each
block of scores on chip (Dao 2023, FlashAttention-2, arXiv 2307.08691). Nothing s x s
reaches HBM; the forward keeps only Q, K, V, the output and one fp32 log-sum-exp per
row; the backward recomputes the scores from them (Dao 2023 Algorithm 2: five
matmuls, S = Q K^T, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, against the
forward's two: 2.5 times its matmul work). With GPT's causal mask the kernels skip the
blocks above the diagonal (Dao 2023 Sec 3.1.1, "causal masking"): with blocks of
``FLASH_BLOCK`` query rows the fraction of blocks computed is (n + 1) / 2n, n =
s / ``FLASH_BLOCK``.

Its time (``flash_seconds``): the matmuls, plus the exponentials, each at the SM time of
``tensor_flops_per_exp`` tensor FLOPs (one per score element forward, one backward to
recompute P), at the rate the GPU's flash kernels were measured to reach
(``GpuSpec.attention_kernels``, fitted on attention kernel timings alone:
docs/calibration.md, "Flash attention, fitted apart"): ``forward_efficiency`` or
``backward_efficiency`` of the 16-bit tensor peak, times L / (L + ``kv_half``) where L
is the loop a thread block runs (keys per query row forward, queries per key
backward, the causal mask's share of them): each block of rows pays a fixed cost
(loading its Q, writing its O, the final rescale) worth ``kv_half`` keys. Of the
exponentials only the share ``exp_exposed`` counts: FlashAttention-2 does not overlap
the softmax with the matmuls (1), FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608,
Sec 3.1) and cuDNN's newer kernels hide part or all of it (the fits give 1 for cuDNN
9.1 on the H100, 0.35 for 9.19 on the H200, 0 on Blackwell). The rest of the softmax
(max, scale, sum: FP32 FMA-pipe work) is not counted apart. A GPU with no attention
timings (``attention_kernels`` None: the V100s and A100s) runs the matmuls and every
exponential at the efficiency the score GEMM's shape gets instead
(``kernels.gemm_efficiency``: m = n = s, k = the head dimension, one per head), a
mechanism estimate.

Grouped-query attention (``model.num_query_groups``) changes the K and V tensors only:
scores and context stay per query head, so the matmuls and the unfused s x s kernels
are the same; the flash kernels read and write K, V (and their gradients) per group
(``flash_hbm_bytes``). ``training.attention_backend = "fused"`` (cuDNN) runs as flash.

The FLOPs a flash kernel reports are the model's (4 b s^2 h / T forward, twice that
backward, what Megatron's formula counts), so MFU compares across the two kernels;
the causal skip and the backward's recomputed scores show in the time alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..ir.units import gbytes_per_s_to_bytes_per_s, tflops_to_flops_per_s
from ..ir.vocabulary import ATTENTION_FLASH
from ..scenario import GpuSpec, KernelConstants
from ..scenario.softmax import scenario_softmax_path
from .kernels import BYTES_PER_ELEMENT, MASK_BYTES, Kernel, Work, gemm_efficiency

if TYPE_CHECKING:
    from .compute import ComputeModel

# Bytes per score element of the softmax kernels (module docstring, §9(b)).
FUSED_SOFTMAX_BYTES = 4.0
FUSED_SOFTMAX_BACKWARD_BYTES = 6.0
UNFUSED_SOFTMAX_BYTES = 36.0
UNFUSED_SOFTMAX_BACKWARD_BYTES = 40.0
# Query rows per block of FlashAttention-2's kernels for head dimensions 64-128
# (csrc/flash_attn/src/flash_fwd_launch_template.h, kBlockM = 128; key blocks of 32,
# 64 or 128 divide it, and then skip the same fraction of a causal matrix).
FLASH_BLOCK = 128
FLASH_BACKWARD_MATMULS = 2.5  # five matmuls against the forward's two


def causal_fraction(s: int, block: int = FLASH_BLOCK) -> float:
    """Fraction of the s x s score blocks a causal flash kernel computes: row block i
    needs the key blocks up to its diagonal."""
    rows = math.ceil(s / block)
    computed = sum(math.ceil(min(s, (i + 1) * block) / block) for i in range(rows))
    return computed / (rows * rows)


def core_kernels(cm: ComputeModel) -> tuple[list[Kernel], list[Kernel]]:
    """The attention core's forward kernels and its backward kernels (in execution
    order) on one tensor-parallel rank, for the scenario's attention kernel."""
    if cm.training.mechanism("attention_kernel") == ATTENTION_FLASH:
        return _flash(cm)
    return _unfused(cm)


def _shape(cm: ComputeModel) -> tuple[int, int, int]:
    """(micro-batch x query heads per rank, sequence, head size): every query head has
    its own s x s scores, whatever K/V head it shares (GQA)."""
    m, t, b = cm.model, cm.parallel.tensor_model_parallel_size, cm.training.micro_batch_size
    return b * m.num_attention_heads // t, m.seq_length, m.head_size


def kv_heads_per_rank(cm: ComputeModel) -> float:
    """Micro-batch x K/V heads per rank (num_query_groups / TP of them; Megatron-Core
    shards the groups over TP)."""
    m, t, b = cm.model, cm.parallel.tensor_model_parallel_size, cm.training.micro_batch_size
    return b * m.query_groups // t


def _attention_gemm(cm: ComputeModel) -> Callable[..., Work]:
    """The unfused core's score and context GEMMs: the layer's GEMMs, their time divided
    by a measured fit's attention multiplier (scenario/fitted.py; 1 without one)."""
    scale = cm.scenario.attention_scale
    if scale == 1.0:
        return cm.gemm

    def gemm(m: float, n: float, k: float, batch: int = 1) -> Work:
        work = cm.gemm(m, n, k, batch)
        return Work(duration_s=work.duration_s / scale, flops=work.flops)

    return gemm


def _unfused(cm: ComputeModel) -> tuple[list[Kernel], list[Kernel]]:
    heads, s, _ = _shape(cm)
    qk, v = cm.model.qk_dim, cm.model.v_dim  # the head size both, but under MLA (mla.py)
    scores = heads * s * s  # score elements per rank
    e, g, mem = BYTES_PER_ELEMENT, _attention_gemm(cm), cm.memory_bound
    fused = scenario_softmax_path(cm.scenario).fused
    forward_bytes = FUSED_SOFTMAX_BYTES if fused else UNFUSED_SOFTMAX_BYTES
    backward_bytes = FUSED_SOFTMAX_BACKWARD_BYTES if fused else UNFUSED_SOFTMAX_BACKWARD_BYTES
    forward = [
        Kernel("attention", "forward", "scores", g(s, s, qk, heads), core=True),
        Kernel("attention", "forward", "softmax", mem(forward_bytes * scores), core=True),
        Kernel("attention", "forward", "dropout", mem((2 * e + MASK_BYTES) * scores), core=True),
        Kernel("attention", "forward", "context", g(s, v, s, heads), core=True),
    ]
    backward = [
        Kernel("attention", "input", "context dP", g(s, s, v, heads)),
        Kernel("attention", "input", "context dV", g(s, v, s, heads)),
        Kernel("attention", "input", "dropout", mem((2 * e + MASK_BYTES) * scores)),
        Kernel("attention", "input", "softmax", mem(backward_bytes * scores)),
        Kernel("attention", "input", "scores dQ", g(s, qk, s, heads)),
        Kernel("attention", "input", "scores dK", g(s, qk, s, heads)),
    ]
    return forward, backward


def flash_bytes(
    heads: float, kv_heads: float, q: int, k: int, d_qk: int, d_v: int, backward: bool
) -> float:
    """What a flash kernel moves through HBM: Q (d_qk wide) and O (d_v) per query row
    and query head, K (d_qk) and V (d_v) per key row and K/V head, in; O out
    (forward); the backward also reads dO and writes dQ, dK, dV: twice the forward's."""
    per_pass = BYTES_PER_ELEMENT * (d_qk + d_v) * (q * heads + k * kv_heads)
    return per_pass * (2 if backward else 1)


def flash_hbm_bytes(cm: ComputeModel, backward: bool) -> float:
    """What a flash kernel moves through HBM on one rank: Q, K, V in and O out
    (forward); Q, K, V, O, dO in and dQ, dK, dV out (backward). Q, O, dO, dQ have a
    head per query head, K, V, dK, dV one per group (GQA), so the forward moves
    e b s d (2 a + 2 g) / T bytes and the backward e b s d (4 a + 4 g) / T."""
    heads, s, head = _shape(cm)
    m = cm.model
    d_qk, d_v = (m.qk_dim, m.v_dim) if m.mla else (head, head)
    return flash_bytes(heads, kv_heads_per_rank(cm), s, s, d_qk, d_v, backward)


def flash_matmul_flops(pairs: float, d_qk: int, d_v: int, backward: bool) -> float:
    """The matmul FLOPs a flash kernel executes over ``pairs`` (query, key) pairs: Q K^T
    over d_qk and P V over d_v forward; backward S again, dQ, dK over d_qk and dP, dV
    over d_v (Dao 2023 Algorithm 2), 2.5 times the forward's when d_qk = d_v."""
    return 2.0 * pairs * ((3 * d_qk + 2 * d_v) if backward else (d_qk + d_v))


def flash_seconds(
    gpu: GpuSpec,
    c: KernelConstants,
    *,
    heads: float,
    kv_heads: float,
    q: int,
    k: int,
    d_qk: int,
    d_v: int,
    done: float,
    backward: bool,
    scale: float = 1.0,
) -> float:
    """One flash kernel (forward, or its backward) over ``heads`` (batch x query heads)
    q x k score matrices of which the fraction ``done`` is computed (the causal mask's
    blocks): its matmuls and exponentials at the GPU's flash rate (module docstring),
    or its HBM traffic at the streaming rate if longer. ``c``: the run's GEMM and
    memory constants (the record's, or a calibration file's); ``scale``: a fit on measured
    iterations' attention multiplier (scenario/fitted.py), dividing the compute time."""
    pairs = heads * q * k * done
    executed = flash_matmul_flops(pairs, d_qk, d_v, backward)
    peak = tflops_to_flops_per_s(gpu.peak_tflops)
    a = gpu.attention_kernels
    exponentials = gpu.tensor_flops_per_exp * pairs  # in tensor FLOPs' time
    if a is None:  # the score GEMM's shape efficiency (no attention timings)
        compute_s = (executed + exponentials) / (peak * gemm_efficiency(c, q, k, d_qk, heads))
    else:
        loop = (q if backward else k) * done  # keys per query row; queries per key backward
        efficiency = a.backward_efficiency if backward else a.forward_efficiency
        rate = peak * efficiency * loop / (loop + a.kv_half)
        compute_s = (executed + a.exp_exposed * exponentials) / rate
    compute_s /= scale
    stream = gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * c.memory_efficiency
    memory_s = flash_bytes(heads, kv_heads, q, k, d_qk, d_v, backward) / stream
    return max(compute_s, memory_s)


def flash_work(cm: ComputeModel, backward: bool) -> Work:
    """One flash-attention kernel (forward, or its backward) on one rank."""
    heads, s, head = _shape(cm)
    m = cm.model
    d_qk, d_v = (m.qk_dim, m.v_dim) if m.mla else (head, head)
    duration = flash_seconds(
        cm.gpu,
        cm.constants,
        heads=heads,
        kv_heads=kv_heads_per_rank(cm),
        q=s,
        k=s,
        d_qk=d_qk,
        d_v=d_v,
        done=causal_fraction(s),
        backward=backward,
        scale=cm.scenario.attention_scale,
    )
    # the model's FLOPs: 4 b s^2 a d / T forward (Q K^T and P V whole), twice backward
    model_flops = flash_matmul_flops(heads * s * s, d_qk, d_v, False) * (2.0 if backward else 1.0)
    return Work(duration_s=duration, flops=model_flops)


def _flash(cm: ComputeModel) -> tuple[list[Kernel], list[Kernel]]:
    return (
        [Kernel("attention", "forward", "flash attention", flash_work(cm, False), core=True)],
        [Kernel("attention", "input", "flash attention backward", flash_work(cm, True))],
    )

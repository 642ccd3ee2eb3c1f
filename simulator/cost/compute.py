"""How long a GPT block's kernels take on one GPU, and how many FLOPs they do.

One transformer layer is two blocks, each ending in a tensor-parallel
all-reduce (Megatron-LM's f/g operators), and each block is its kernels, as
Megatron-LM runs them (fused bias-GeLU, fused bias-dropout-add; the attention
core as ``cost.attention`` builds it: unfused, with Megatron's softmax rule, or
one flash kernel):

- attention: layernorm, QKV GEMM, scores Q K^T (batched GEMM), scale + mask +
  softmax, attention dropout, probabilities x V (batched GEMM), output
  projection GEMM, bias-dropout-add;
- MLP: layernorm, h -> ffn GEMM, bias-GeLU, ffn -> h GEMM, bias-dropout-add.

Tensor parallelism shards the GEMMs by heads / ffn columns; layernorm, dropout
and the residual are sharded only under sequence parallelism.

The shape follows the model keys (docs/design.md, "Model shapes beyond GPT"): the QKV
GEMM is (heads + 2 x query groups) x head size wide (GQA), fc1 2 x ffn under SwiGLU
with a ``swiglu`` kernel for bias-GeLU, ``rmsnorm`` kernels for RMSNorm, a ``rope``
kernel on Q and K after the QKV GEMM, and without biases the fused kernels lose
their ``bias-`` (same bytes: the bias vector's read was never counted).

A GEMM's time is a roofline: FLOPs / (peak x efficiency) or, if longer, its
operands' bytes / HBM bandwidth. The efficiency depends on the shape (see
``KernelConstants``): output tiles that overhang the matrix (tile
quantization), a last wave of tiles that leaves SMs idle (wave quantization),
and a short inner dimension that cannot hide each tile's fixed prologue and
epilogue. Element-wise kernels are memory bound: bytes / (HBM bandwidth x
efficiency).

The backward of a GEMM Y = X W is two GEMMs, dX = dY W^T (B, the input
gradient) and dW = X^T dY (W, the weight gradient), each with its own shape.
Zero-bubble schedules run them apart; everything else in a backward (the
attention core's gradients and every element-wise backward) belongs to B.

Each weight gradient is added to the gradient buffer (g bytes per weight:
``training.gradient_bytes``) every micro-batch, as Megatron-LM does
(docs/frameworks.md §8): with ``gradient_accumulation_fusion`` inside the dW GEMM,
whose output is then read and written in g bytes instead of written in 2 (2g - 2
more bytes per weight in its memory term; ``wgrad_gemm_accum_fp32``); without it a
separate element-wise add reads the 2-byte gradient and the buffer and writes the
buffer (2 + 2g bytes per weight; the DDP hook's ``main_grad.add_``).

The first stage adds the embedding, the one holding the last virtual stage the
final layernorm, logits GEMM and cross-entropy; the optimizer step (mixed
precision Adam) is memory bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from ..ir.units import gbytes_per_s_to_bytes_per_s
from ..ir.vocabulary import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
from ..scenario import GpuSpec, ModelSpec, ParallelConfig, Scenario, TrainingConfig
from . import mla
from .attention import core_kernels as attention_core_kernels
from .context import core_kernels as context_core_kernels
from .fp8 import Fp8Linear
from .kernels import (
    BYTES_PER_ELEMENT,
    MASK_BYTES,
    ZERO,
    Kernel,
    LinearKernels,
    Work,
    gemm_seconds,
)
from .optimizer import step_bytes_per_param

# MLA's kernels the layer picks out by name (mla.py: its first GEMM's dW and the GEMM
# the SP all-gather feeds)

# Embedding lookup + position add + dropout, per output element: read the word and
# position rows, write the sum, write the mask and the dropped-out result.
EMBEDDING_BYTES_PER_ELEMENT = 9.0
# Megatron's vocabulary-parallel cross-entropy (megatron/mpu/cross_entropy.py in
# 2021, megatron/core/tensor_parallel/cross_entropy.py in Megatron-Core; DeepSpeed's
# Megatron fork runs the same code) is a chain of separate PyTorch kernels over the
# logits, each a full pass through memory, per 16-bit logit in bytes:
# the cast to fp32 (gpt_model's ``output.float()``; inside calculate_logits_max in
# Megatron-Core): read 2, write 4; the max over the vocabulary: read 4; subtract the
# max in place: 4 + 4; exp in place: 4 + 4; the sum of exponentials: read 4; divide
# by it in place (the softmax kept for the backward): 4 + 4. 38 in all.
CROSS_ENTROPY_BYTES_PER_LOGIT = 38.0
# backward: the one-hot subtraction touches one logit per token; grad_input.mul_
# reads and writes the fp32 softmax (4 + 4); the cast's backward turns it into the
# 16-bit gradient of the logits (read 4, write 2). 14 in all.
CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT = 14.0


# SMs Transformer Engine's userbuffers reserve for a pipelined reduce-scatter's
# reduction kernels while the GEMM feeding it runs on the rest (method "pipeline":
# num_sm 16, set_sm_margin; the ring-exchange all-gathers use copy engines and one SM).
# transformer_engine/pytorch/module/base.py initialize_ub, default config (TE 1.x).
UB_REDUCE_SCATTER_SMS = 16


class OverlapGemms(NamedTuple):
    """The GEMMs of a block that --tp-comm-overlap pipelines with its SP collectives:
    ``gather`` is fed by the forward all-gather (QKV, fc1), ``scatter`` feeds the
    forward reduce-scatter (projection, fc2), ``scatter_shared`` is that GEMM on the
    SMs the reduce-scatter leaves, ``gather_backward`` is fed by the backward's gradient
    all-gather (projection dX, fc2 dX)."""

    gather: Work
    scatter: Work
    scatter_shared: Work
    gather_backward: Work


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """One layer on one tensor-parallel rank, for one micro-batch."""

    attention_forward: Work
    mlp_forward: Work
    attention_backward: Work  # input and weight gradients together
    mlp_backward: Work
    attention_core_forward: Work  # what selective recomputation repeats
    attention_weight: Work  # the weight-gradient part of attention_backward
    mlp_weight: Work  # the weight-gradient part of mlp_backward
    # the weight gradient of the block's first GEMM (QKV, fc1): the last kernel of the
    # block's backward, which Megatron-LM's async all-reduce of the input gradient hides
    attention_last_weight: Work
    mlp_last_weight: Work
    attention_overlap: OverlapGemms
    mlp_overlap: OverlapGemms
    # what `recompute_modules` repeats besides the core: the two norms (layernorm), MLA's
    # up-projections and rotary kernel (mla_up_proj), a dense MLP's fc1, activation, fc2
    # (mlp)
    layernorm_forward: Work
    mla_up_forward: Work
    mlp_module_forward: Work

    def selective_forward(self, modules: frozenset[str]) -> Work:
        """The compute a selective backward repeats before the layer's backward: the
        attention core (core_attn), the norms (layernorm), MLA's up-projections
        (mla_up_proj). The dense MLP (mlp) and the MoE modules are the lowering's, with
        their communication."""
        work = ZERO
        if "core_attn" in modules:
            work = work + self.attention_core_forward
        if "layernorm" in modules:
            work = work + self.layernorm_forward
        if "mla_up_proj" in modules:
            work = work + self.mla_up_forward
        return work

    def recompute_s(
        self, granularity: str, forward_s: float, modules: frozenset[str] = frozenset()
    ) -> float:
        """What a backward repeats of its dense layer's forward: nothing, the selective
        modules (``modules``; core attention alone when empty), or the whole forward,
        ``forward_s`` (full; a MoE layer's differs)."""
        if granularity == RECOMPUTE_FULL:
            return forward_s
        if granularity == RECOMPUTE_SELECTIVE:
            chosen = modules or frozenset({"core_attn"})
            extra = self.mlp_module_forward if "mlp" in chosen else ZERO
            return (self.selective_forward(chosen) + extra).duration_s
        return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StageExtras:
    embedding_forward: Work
    embedding_backward: Work
    output_forward: Work  # final layernorm, logits GEMM, cross-entropy (and MTP's extras)
    output_backward: Work
    embedding_weight: Work  # the weight-gradient parts of the backwards above
    output_weight: Work


class ComputeModel:
    """Kernel times for one scenario's shapes on its GPU."""

    def __init__(self, scenario: Scenario) -> None:
        gpu = scenario.cluster.gpu
        self.model: ModelSpec = scenario.model
        self.parallel: ParallelConfig = scenario.parallel
        self.training: TrainingConfig = scenario.training
        self.gpu: GpuSpec = gpu
        self.scenario = scenario
        self.constants = scenario.kernel_constants
        self._stream_bytes_per_s = (
            gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * self.constants.memory_efficiency
        )
        # tokens of a micro-batch on this GPU: with context parallelism its 1/CP share of
        # each sequence (cost.context), which every kernel but attention's scales with
        self.tokens = (
            scenario.training.micro_batch_size
            * scenario.model.seq_length
            // scenario.parallel.cp_size
        )
        # the linear layers' FP8 GEMMs and casts (None: 16-bit, `training.fp8_format` unset)
        self.fp8 = Fp8Linear.of(self)
        # `layer` and `extras`, made once: the lowering asks for them once per stage
        self._layer: LayerWork | None = None
        self._extras: StageExtras | None = None

    def __copy__(self) -> ComputeModel:
        """A copy that makes its own `layer` and `extras` (emit/overlap.py's copy on the
        SMs communication leaves changes its constants)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._layer = other._extras = None
        return other

    # -- kernels ------------------------------------------------------------------------

    def gemm(self, m: float, n: float, k: float, batch: int = 1, extra_bytes: float = 0.0) -> Work:
        return Work(
            duration_s=gemm_seconds(self.gpu, self.constants, m, n, k, batch, extra_bytes),
            flops=2.0 * batch * m * n * k,
        )

    def weight_gradient(self, k_in: float, n_out: float, tokens: float) -> tuple[Work, Work]:
        """The dW GEMM of a k_in x n_out weight and the accumulation of its result into
        the gradient buffer: fused into the GEMM (more bytes in its memory term) or a
        separate add kernel (the second Work; ZERO when fused)."""
        g = self.training.gradient_bytes
        weights = k_in * n_out
        if self.training.mechanism("gradient_accumulation_fusion"):
            return self.gemm(k_in, n_out, tokens, extra_bytes=(2 * g - 2) * weights), ZERO
        return self.gemm(k_in, n_out, tokens), self.memory_bound((2 + 2 * g) * weights)

    def gemm_sharing(self, m: float, n: float, k: float, reserved_sms: int) -> Work:
        """A GEMM on the SMs left when ``reserved_sms`` run a communication kernel (a
        forward linear GEMM: FP8 under `training.fp8_format`)."""
        if self.fp8 is not None:
            return self.fp8.gemm_sharing(m, n, k, reserved_sms)
        c = self.constants
        fewer = dataclasses.replace(c, num_sms=max(1, c.num_sms - reserved_sms))
        return Work(duration_s=gemm_seconds(self.gpu, fewer, m, n, k), flops=2.0 * m * n * k)

    def memory_bound(self, num_bytes: float) -> Work:
        return Work(duration_s=num_bytes / self._stream_bytes_per_s, flops=0.0)

    def kernels(self) -> list[Kernel]:
        """One layer's kernels on one tensor-parallel rank, forward then backward
        (backward in execution order: MLP first)."""
        m, t = self.model, self.parallel.tensor_model_parallel_size
        b, s, h, f = (
            self.training.micro_batch_size,
            m.seq_length,
            m.hidden_size,
            m.ffn_hidden_size,
        )
        e, mask = BYTES_PER_ELEMENT, MASK_BYTES
        tokens = b * s // self.parallel.cp_size  # a CP rank's share of each sequence
        # layernorm, dropout and residual elements per rank (sharded only under SP)
        hidden = tokens * h / (t if self.parallel.sequence_parallel else 1)
        ffn = tokens * f / t
        g, mem = self.gemm, self.memory_bound
        if self.parallel.cp_size > 1:  # flash or fused by the rules: context.py's steps
            core_forward, core_backward = context_core_kernels(self)
        else:
            core_forward, core_backward = attention_core_kernels(self)

        def linear(block: str, name: str, k_in: int, n_out: int) -> LinearKernels:
            """Y[tokens, n_out] = X[tokens, k_in] W: the kernels of its forward, input
            gradient and weight gradient (the last with its accumulation into the gradient
            buffer); in FP8 (``self.fp8``) the GEMMs at the FP8 rate, after their casts."""
            if self.fp8 is not None:
                return self.fp8.linear(block, name, k_in, n_out, tokens)
            weight, accumulate = self.weight_gradient(k_in, n_out, tokens)
            return (
                [Kernel(block, "forward", name, g(tokens, n_out, k_in))],
                [Kernel(block, "input", name + " dX", g(tokens, k_in, n_out))],
                [Kernel(block, "weight", name + " dW", weight + accumulate)],
            )

        if m.mla:  # multi-head latent attention: its down- and up-projections (mla.py)
            qkv = mla.qkv_kernels(self)
        else:
            qkv = linear("attention", "QKV", h, m.qkv_width // t)
        proj = linear("attention", "projection", m.attention_width // t, h)
        fc1 = linear("mlp", "fc1", h, m.fc1_width // t)
        fc2 = linear("mlp", "fc2", f // t, h)
        norm = "rmsnorm" if m.rms_norm else "layernorm"
        bias = "bias-" if m.linear_bias else ""
        dropout_add, act = bias + "dropout-add", bias + "gelu"
        # the activation: GeLU reads and writes ffn elements (backward: reads its input and
        # the gradient, writes one); SwiGLU reads gate and up (2 ffn), writes ffn
        # (backward: reads gate, up and the gradient, writes two gradients)
        act_bytes, act_backward_bytes = 2 * e * ffn, 3 * e * ffn
        if m.gated:
            act, act_bytes, act_backward_bytes = "swiglu", 3 * e * ffn, 5 * e * ffn
        forward = [
            Kernel("attention", "forward", norm, mem(2 * e * hidden)),
            *qkv[0],
            *self.rope_kernels("forward"),
            *core_forward,
            *proj[0],
            Kernel("attention", "forward", dropout_add, mem((3 * e + mask) * hidden)),
            Kernel("mlp", "forward", norm, mem(2 * e * hidden)),
            *fc1[0],
            Kernel("mlp", "forward", act, mem(act_bytes)),
            *fc2[0],
            Kernel("mlp", "forward", dropout_add, mem((3 * e + mask) * hidden)),
        ]
        # Backward element-wise kernels read what they saved and the incoming gradient
        # and write a gradient; a layernorm's backward also adds the residual branch.
        backward = [
            Kernel("mlp", "input", dropout_add, mem((2 * e + mask) * hidden)),
            *fc2[1],
            *fc2[2],
            Kernel("mlp", "input", act, mem(act_backward_bytes)),
            *fc1[1],
            *fc1[2],
            Kernel("mlp", "input", norm, mem(4 * e * hidden)),
            Kernel("attention", "input", dropout_add, mem((2 * e + mask) * hidden)),
            *proj[1],
            *proj[2],
            *core_backward,
            *self.rope_kernels("input"),
            *qkv[1],
            *qkv[2],
            Kernel("attention", "input", norm, mem(4 * e * hidden)),
        ]
        return forward + backward

    def rope_kernels(self, part: str) -> list[Kernel]:
        """Rotary embedding (Transformer Engine's fused kernel): reads and writes Q and K
        (heads + groups) x head size per token and rank; its backward does the same with
        their gradients. None with learned absolute positions."""
        m = self.model
        if not m.rope:
            return []
        t = self.parallel.tensor_model_parallel_size
        tokens = self.tokens
        elements = tokens * (m.num_attention_heads + m.query_groups) * m.head_size / t
        if m.mla:
            elements = mla.rope_elements(self)
        return [
            Kernel("attention", part, "rope", self.memory_bound(2 * BYTES_PER_ELEMENT * elements))
        ]

    # -- what the lowering uses ---------------------------------------------------------

    def layer(self) -> LayerWork:
        """One layer's work (every stage's layers are alike), made once."""
        if self._layer is None:
            self._layer = self._layer_work()
        return self._layer

    def _layer_work(self) -> LayerWork:
        kernels = self.kernels()
        t = self.parallel.tensor_model_parallel_size
        norm = "rmsnorm" if self.model.rms_norm else "layernorm"

        def total(block: str, parts: tuple[str, ...], core_only: bool = False) -> Work:
            work = ZERO
            for kernel in kernels:
                if (
                    kernel.block == block
                    and kernel.part in parts
                    and (kernel.core or not core_only)
                ):
                    work = work + kernel.work
            return work

        return LayerWork(
            attention_forward=total("attention", ("forward",)),
            mlp_forward=total("mlp", ("forward",)),
            attention_backward=total("attention", ("input", "weight")),
            mlp_backward=total("mlp", ("input", "weight")),
            attention_core_forward=total("attention", ("forward",), core_only=True),
            attention_weight=total("attention", ("weight",)),
            mlp_weight=total("mlp", ("weight",)),
            attention_last_weight=next(
                k.work for k in kernels if k.name in ("QKV dW", mla.LAST_WEIGHT)
            ),
            mlp_last_weight=next(k.work for k in kernels if k.name == "fc1 dW"),
            attention_overlap=self._overlap(
                kernels,
                mla.GATHER_FED if self.model.mla else "QKV",
                "projection",
                self.model.attention_width // t,
            ),
            mlp_overlap=self._overlap(kernels, "fc1", "fc2", self.model.ffn_hidden_size // t),
            layernorm_forward=sum(
                (k.work for k in kernels if k.part == "forward" and k.name == norm),
                ZERO,
            ),
            mla_up_forward=sum(
                (
                    k.work
                    for k in kernels
                    if self.model.mla
                    and k.part == "forward"
                    and (k.name.startswith((mla.GATHER_FED, "kv up")) or k.name == "rope")
                ),
                ZERO,
            ),
            mlp_module_forward=sum(
                (
                    k.work
                    for k in kernels
                    if k.block == "mlp"
                    and k.part == "forward"
                    and k.name != norm
                    and not k.name.endswith("dropout-add")
                ),
                ZERO,
            ),
        )

    def _overlap(self, kernels: list[Kernel], first: str, last: str, k_in: int) -> OverlapGemms:
        """``last`` is a row-parallel GEMM, [tokens, k_in] x [k_in, h]."""

        def work(name: str, part: str) -> Work:
            return next(k.work for k in kernels if k.name == name and k.part == part)

        tokens = self.tokens
        h = self.model.hidden_size
        return OverlapGemms(
            gather=work(first, "forward"),
            scatter=work(last, "forward"),
            scatter_shared=self.gemm_sharing(tokens, h, k_in, UB_REDUCE_SCATTER_SMS),
            gather_backward=work(last + " dX", "input"),
        )

    def extras(self) -> StageExtras:
        """The embedding's and the output layer's work, made once."""
        if self._extras is None:
            self._extras = self._extras_work()
        return self._extras

    def _extras_work(self) -> StageExtras:
        m, t = self.model, self.parallel.tensor_model_parallel_size
        b, s, h, v = self.training.micro_batch_size, m.seq_length, m.hidden_size, m.vocab_size
        tokens, e = b * s // self.parallel.cp_size, BYTES_PER_ELEMENT
        logits = tokens * v / t  # vocabulary-parallel: each rank its slice
        # rotary positions: no position row to read (2 bytes of the 9)
        embedding_bytes = EMBEDDING_BYTES_PER_ELEMENT - (2.0 if m.rope else 0.0)
        embedding = self.memory_bound(embedding_bytes * tokens * h)
        # the embedding's gradient is a scatter-add of the incoming gradient into the
        # table's rows: read it (2) and read-modify-write the fp32 rows (8)
        embedding_weight = self.memory_bound(10.0 * tokens * h)
        weight, accumulate = self.weight_gradient(h, v / t, tokens)
        output_weight = weight + accumulate  # dW of the logits GEMM, accumulated
        output_forward = (
            self.memory_bound(2 * e * tokens * h)  # final layernorm
            + self.gemm(tokens, v / t, h)
            + self.memory_bound(CROSS_ENTROPY_BYTES_PER_LOGIT * logits)
        )
        output_backward = (
            self.memory_bound(CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT * logits)
            + self.gemm(tokens, h, v / t)
            + output_weight
            + self.memory_bound(4 * e * tokens * h)  # final layernorm backward
        )
        depths = m.mtp_num_layers or 0
        if depths:
            # multi-token prediction (Megatron-Core multi_token_prediction.py
            # MultiTokenPredictionLayer), per depth beside its transformer layer (which
            # the last stage runs as one of its layers): the next tokens' embedding,
            # RMSNorms of it and of the hidden states, their concatenation projected
            # 2h -> h (eh_proj, column-parallel), and the output layer's final norm,
            # logits and cross-entropy again (the same, shared weights)
            proj_weight, proj_accumulate = self.weight_gradient(2 * h, h / t, tokens)
            proj_w = proj_weight + proj_accumulate
            depth_forward = (
                embedding
                + self.memory_bound(2 * 2 * e * tokens * h)
                + self.gemm(tokens, h / t, 2 * h)
                + output_forward
            )
            depth_backward = (
                output_backward
                + self.gemm(tokens, 2 * h, h / t)
                + proj_w
                + self.memory_bound(2 * 4 * e * tokens * h)
                + embedding_weight
            )
            depth_weight = output_weight + proj_w + embedding_weight
            output_forward = output_forward + depth_forward.scaled(depths)
            output_backward = output_backward + depth_backward.scaled(depths)
            output_weight = output_weight + depth_weight.scaled(depths)
        return StageExtras(
            embedding_forward=embedding,
            embedding_backward=embedding_weight
            + self.memory_bound((2 * e + MASK_BYTES) * tokens * h),  # dropout backward
            output_forward=output_forward,
            output_backward=output_backward,
            embedding_weight=embedding_weight,
            output_weight=output_weight,
        )

    def optimizer(self, num_params: float) -> Work:
        # Adam's step: its state read and written, the gradient read, the weights written
        # (32 bytes per parameter by default; cost/optimizer.py)
        return self.memory_bound(step_bytes_per_param(self.scenario.training) * num_params)

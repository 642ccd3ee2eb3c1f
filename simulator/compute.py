"""How long a GPT block's kernels take on one GPU, and how many FLOPs they do.

One transformer layer is two blocks, each ending in a tensor-parallel
all-reduce (Megatron-LM's f/g operators):

- attention block: layernorm, QKV GEMM, scores (Q K^T), softmax + mask +
  dropout, probabilities x V, output projection, bias-dropout-add;
- MLP block: layernorm, h -> ffn GEMM, bias-GeLU, ffn -> h GEMM,
  bias-dropout-add.

GEMM time is FLOPs / (peak x efficiency); element-wise kernels are memory
bound: bytes moved / (HBM bandwidth x efficiency). Backward GEMMs do twice the
forward FLOPs (input and weight gradients). The first stage adds the
embedding, the last the output layer (logits) and cross-entropy.

Zero-bubble schedules split each backward into B (input gradients) and W
(weight gradients). W is one GEMM per weight GEMM of the forward, with the
same FLOPs (QKV, output projection, both MLP GEMMs; the logits GEMM; the
embedding's scatter-add); B is the rest: the input-gradient GEMMs, the
attention core's backward and every element-wise kernel.

The efficiencies are a first, deliberately simple model; see EFFICIENCY.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ModelSpec, ParallelConfig, Scenario, TrainingConfig
from .units import gbytes_per_s_to_bytes_per_s, tflops_to_flops_per_s

BYTES_PER_ELEMENT = 2  # fp16 / bf16 activations and weights

# Fraction of peak reached, one value for every GPU for now.
# gemm: large transformer GEMMs on A100 reach ~70-80 % of the tensor peak; 0.72 puts
#   the forward pass of one 22B layer (8 x A100, TP 8, Korthikanti et al. 2022
#   Table 4, row D13 of the calibration set) at 7.6 ms against 7.7 ms measured.
# memory: element-wise kernels stream at ~80 % of the HBM datasheet bandwidth.
# A later calibration replaces these with per-GPU, shape-dependent values.
EFFICIENCY = {"gemm": 0.72, "memory": 0.80}

# Adam with fp32 master weights reads and writes params, m, v (3 x 8 bytes), reads
# the fp32 gradient (4) and writes the fp16 weights (2): ~30 bytes, 32 with zeroing.
OPTIMIZER_BYTES_PER_PARAM = 32.0
# Embedding lookup + position add + dropout, per output element (read, write, mask).
EMBEDDING_BYTES_PER_ELEMENT = 8.0
# Cross-entropy over fp32 logits: read logits, write softmax, read again for the loss.
CROSS_ENTROPY_BYTES_PER_LOGIT = 12.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """Time and FLOPs of one kernel sequence on one GPU."""

    duration_s: float
    flops: float

    def __add__(self, other: Work) -> Work:
        return Work(duration_s=self.duration_s + other.duration_s, flops=self.flops + other.flops)

    def __sub__(self, other: Work) -> Work:
        return Work(duration_s=self.duration_s - other.duration_s, flops=self.flops - other.flops)

    def scaled(self, factor: float) -> Work:
        return Work(duration_s=self.duration_s * factor, flops=self.flops * factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """One layer on one tensor-parallel rank, for one micro-batch."""

    attention_forward: Work
    mlp_forward: Work
    attention_backward: Work
    mlp_backward: Work
    attention_core_forward: Work  # what selective recomputation repeats
    attention_weight: Work  # the weight-gradient part of attention_backward
    mlp_weight: Work  # the weight-gradient part of mlp_backward


@dataclass(frozen=True, slots=True, kw_only=True)
class StageExtras:
    embedding_forward: Work
    embedding_backward: Work
    output_forward: Work  # final layernorm, logits GEMM, cross-entropy
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
        self._flops_per_s = tflops_to_flops_per_s(gpu.peak_tflops) * EFFICIENCY["gemm"]
        self._bytes_per_s = gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * EFFICIENCY["memory"]

    def gemm(self, flops: float) -> Work:
        return Work(duration_s=flops / self._flops_per_s, flops=flops)

    def memory_bound(self, num_bytes: float) -> Work:
        return Work(duration_s=num_bytes / self._bytes_per_s, flops=0.0)

    def layer(self) -> LayerWork:
        m, t = self.model, self.parallel.tensor_model_parallel_size
        b, s, h, f, a = (
            self.training.micro_batch_size,
            m.seq_length,
            m.hidden_size,
            m.ffn_hidden_size,
            m.num_attention_heads,
        )
        # Layernorm, dropout and residual work is split across TP ranks only
        # under sequence parallelism; the rest is sharded by heads / ffn columns.
        sp = t if self.parallel.sequence_parallel else 1
        e = BYTES_PER_ELEMENT
        bsh = b * s * h
        scores = b * a * s * s / t  # elements of the attention score matrix per rank

        attention_core = (
            self.gemm(2 * b * s * s * h / t)  # Q K^T
            + self.memory_bound(e * scores * 4.5)  # softmax+mask r/w, dropout r/w + mask
            + self.gemm(2 * b * s * s * h / t)  # probabilities x V
        )
        attention_weights = self.gemm(2 * bsh * 3 * h / t) + self.gemm(2 * bsh * h / t)
        attention = (
            self.memory_bound(e * 2 * bsh / sp)  # layernorm read + write
            + self.gemm(2 * bsh * 3 * h / t)  # QKV
            + attention_core
            + self.gemm(2 * bsh * h / t)  # output projection
            + self.memory_bound(e * 3.5 * bsh / sp)  # bias-dropout-add
        )
        mlp_weights = self.gemm(2 * bsh * f / t) + self.gemm(2 * bsh * f / t)
        mlp = (
            self.memory_bound(e * 2 * bsh / sp)  # layernorm
            + self.gemm(2 * bsh * f / t)  # h -> ffn
            + self.memory_bound(e * 2 * b * s * f / t)  # bias-GeLU read + write
            + self.gemm(2 * bsh * f / t)  # ffn -> h
            + self.memory_bound(e * 3.5 * bsh / sp)  # bias-dropout-add
        )
        # Backward: two GEMMs per forward GEMM, and element-wise kernels read the
        # saved input and the incoming gradient and write a gradient (~2x bytes).
        return LayerWork(
            attention_forward=attention,
            mlp_forward=mlp,
            attention_backward=attention.scaled(2.0),
            mlp_backward=mlp.scaled(2.0),
            attention_core_forward=attention_core,
            attention_weight=attention_weights,
            mlp_weight=mlp_weights,
        )

    def extras(self) -> StageExtras:
        m, t = self.model, self.parallel.tensor_model_parallel_size
        b, s, h, v = self.training.micro_batch_size, m.seq_length, m.hidden_size, m.vocab_size
        bsh = b * s * h
        embedding = self.memory_bound(EMBEDDING_BYTES_PER_ELEMENT * bsh)
        logits = self.gemm(2 * bsh * v / t)
        output = (
            self.memory_bound(BYTES_PER_ELEMENT * 2 * bsh)  # final layernorm
            + logits
            + self.memory_bound(CROSS_ENTROPY_BYTES_PER_LOGIT * b * s * v / t)
        )
        return StageExtras(
            embedding_forward=embedding,
            embedding_backward=embedding.scaled(2.0),
            output_forward=output,
            output_backward=output.scaled(2.0),
            embedding_weight=embedding.scaled(2.0),  # the token ids need no gradient
            output_weight=logits,
        )

    def optimizer(self, num_params: float) -> Work:
        return self.memory_bound(OPTIMIZER_BYTES_PER_PARAM * num_params)

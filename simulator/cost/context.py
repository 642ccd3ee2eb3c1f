"""Context parallelism: attention over a sequence split across CP GPUs.

Megatron-Core with Transformer Engine (Megatron-LM megatron/training/utils.py
`get_batch_on_this_cp_rank`; TE transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py): each sequence is cut into 2 x CP chunks
of c = s / 2CP tokens and CP rank r holds chunks r and 2CP - 1 - r, so every rank has
the same share of the causal work. Everything but the attention core runs on the
rank's s / CP tokens (compute.py scales them); the core needs every earlier token's K
and V, which TE's `cp_comm_type` moves one of three ways (docs/design.md, "Context
parallelism"):

- ``p2p`` (`AttnFuncWithCPAndKVP2P`): CP steps. At step i a rank attends its Q to the
  K/V block it holds while sending that block to the next rank of the ring and
  receiving the next one (forward: steps 0 .. CP-2 send, the last only computes). Step
  0 is the rank's own block, causal over its 2c tokens (the "diagonal" section); every
  later step is half a block pair without a mask: its two Q chunks against the first
  K/V chunk ("lower-triangle", blocks from earlier ranks) or its second Q chunk against
  both ("upper-triangle"), 2c^2 score pairs, as many as the causal diagonal step. The
  backward walks the ring the other way with a buffer of K/V and the dK/dV accumulated
  so far (`p2p_comm_buffers`, K/V's dtype): step 0 sends K/V, steps 1 .. CP-2 K/V and
  dK/dV, step CP-1 dK/dV alone; step i's dK/dV add waits for its receive, so each step
  takes the longer of its compute and its transfer.
- ``all_gather`` (`AttnFuncWithCPAndKVAllGather`, "KV all-gather ... is exposed"): K and
  V all-gathered before the core (forward and again in the backward), the rank's two
  Q chunks attend to the gathered prefix they need (two causal kernels), and the
  backward reduce-scatters dK and dV.
- ``a2a`` (`AttnFuncWithCPAndQKVOA2A`, DeepSpeed-Ulysses): all-to-all of Q, K and V
  (sequence-sharded to head-sharded), the whole causal sequence on heads / CP, then an
  all-to-all of the output back; the backward: the output gradient's all-to-all, the
  core, the all-to-all of dQ, dK and dV.

Kernels are flash kernels (attention.py explains their time) with these shapes; the
FLOPs they report are the model's share, 1/CP of Megatron's 4 b s^2 h / T per rank, so
MFU is per token as without CP. Not modelled: the output and log-sum-exp corrections
between p2p steps (element-wise on a second stream), TE's dual-stream overlap of the
two all_gather kernels, and the chunk reordering copies.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from ..ir.vocabulary import ALL_GATHER, ALL_TO_ALL, CP_A2A, CP_ALL_GATHER, REDUCE_SCATTER, RING_SEND
from .attention import FLASH_BLOCK, flash_seconds
from .kernels import BYTES_PER_ELEMENT, ZERO, Kernel, Work

if TYPE_CHECKING:
    from .compute import ComputeModel

CORE = "cp attention"  # the names of the core's kernels start with this


class Step(NamedTuple):
    """One part of the core on a rank: ``work`` on the compute lane and, when ``kind``
    is a collective kind, a transfer of ``message_bytes`` in the CP group (as
    StageComm.cp takes it): alongside the work (``overlapped``, a ring step) or before
    it, blocking (``work`` is then ZERO)."""

    work: Work
    kind: str | None = None
    message_bytes: float = 0.0
    overlapped: bool = False


def causal_blocks_fraction(q: int, k: int, block: int = FLASH_BLOCK) -> float:
    """Fraction of a q x k score matrix's blocks a causal flash kernel computes when the
    queries are the last q of the k keys (bottom-right aligned, q <= k): row block i
    needs the key blocks up to its diagonal. q = k is attention.causal_fraction."""
    rows, cols = math.ceil(q / block), math.ceil(k / block)
    computed = sum(
        min(cols, math.ceil((k - q + min(q, (i + 1) * block)) / block)) for i in range(rows)
    )
    return computed / (rows * cols)


def _flash(
    cm: ComputeModel, heads: float, q: int, k: int, causal: bool, backward: bool, model_flops: float
) -> Work:
    """A flash kernel of ``heads`` (micro-batch x heads) q x k score matrices, as
    attention.flash_work times one: matmuls at the score GEMM's shape efficiency plus
    the exponentials, or its HBM traffic if longer (Q and O per query row, K and V per
    key row and query group)."""
    d = cm.model.head_size
    done = causal_blocks_fraction(q, k) if causal else 1.0
    groups = heads * cm.model.query_groups / cm.model.num_attention_heads
    duration = flash_seconds(
        cm.gpu,
        cm.constants,
        heads=heads,
        kv_heads=groups,
        q=q,
        k=k,
        d_qk=d,
        d_v=d,
        done=done,
        backward=backward,
        scale=cm.scenario.attention_scale,
    )
    return Work(duration_s=duration, flops=model_flops * (2.0 if backward else 1.0))


class ContextAttention:
    """The attention core of one layer on one CP rank (tensor rank) for one micro-batch:
    its steps forward and backward, and the bytes CP moves (module docstring)."""

    def __init__(self, cm: ComputeModel) -> None:
        m, par, b = cm.model, cm.parallel, cm.training.micro_batch_size
        t, cp = par.tensor_model_parallel_size, par.cp_size
        self.cp, self.comm_type = cp, par.cp_comm
        s, d = m.seq_length, m.head_size
        self.heads = b * m.num_attention_heads / t  # micro-batch x query heads per TP rank
        local = s // cp  # the rank's tokens, two chunks of c
        e = BYTES_PER_ELEMENT
        # K and V of the rank's tokens (g / T groups), and Q (or O) of its tokens
        self.kv_bytes = 2.0 * e * b * local * (m.query_groups / t) * d
        self.q_bytes = e * b * local * (m.num_attention_heads / t) * d
        # Megatron's model FLOPs of the whole core, 4 b s^2 a d / T, this rank's 1/CP
        self.model_flops = 4.0 * self.heads * s * s * d / cp
        self.forward = self._steps(cm, False)
        self.backward = self._steps(cm, True)

    def _steps(self, cm: ComputeModel, backward: bool) -> list[Step]:
        cp, heads, s = self.cp, self.heads, cm.model.seq_length
        c = s // (2 * cp)
        kv = self.kv_bytes
        if self.comm_type == CP_A2A:
            core = _flash(cm, heads / cp, s, s, True, backward, self.model_flops)
            into, out = self.q_bytes + kv, self.q_bytes
            first, last = (out, into) if backward else (into, out)
            return [Step(ZERO, ALL_TO_ALL, first), Step(core), Step(ZERO, ALL_TO_ALL, last)]
        if self.comm_type == CP_ALL_GATHER:
            # rank 0's two kernels: chunk 0 against chunk 0, chunk 2CP-1 against all
            share = self.model_flops / (2 * cp)
            core = _flash(cm, heads, c, c, True, backward, share) + _flash(
                cm, heads, c, s, True, backward, self.model_flops - share
            )
            steps = [Step(ZERO, ALL_GATHER, cp * kv), Step(core)]
            return [*steps, Step(ZERO, REDUCE_SCATTER, cp * kv)] if backward else steps
        # p2p: step 0 the diagonal, then half block pairs (the upper-triangle shape, rank
        # 0's: its second Q chunk against both K/V chunks; the lower one has the same pairs)
        share = self.model_flops / cp
        diagonal = _flash(cm, heads, 2 * c, 2 * c, True, backward, share)
        half = _flash(cm, heads, c, 2 * c, False, backward, share)
        works = [diagonal] + [half] * (cp - 1)
        if not backward:
            return [Step(w, RING_SEND, kv, True) for w in works[:-1]] + [Step(works[-1])]
        sends = [kv] + [2 * kv] * (cp - 2) + [kv]
        return [Step(w, RING_SEND, n, True) for w, n in zip(works, sends, strict=True)]

    def core(self, backward: bool) -> Work:
        """The core's compute, all steps."""
        total = ZERO
        for step in self.backward if backward else self.forward:
            total = total + step.work
        return total

    def bytes_sent(self, backward: bool) -> float:
        """Bytes one rank sends per layer and micro-batch (forward or backward): a ring
        step its message, an all-to-all (CP-1)/CP of its tensor, a ring all-gather or
        reduce-scatter (CP-1)/CP of the whole."""
        sent = 0.0
        for step in self.backward if backward else self.forward:
            if step.kind == RING_SEND:
                sent += step.message_bytes
            elif step.kind is not None:
                sent += step.message_bytes * (self.cp - 1) / self.cp
        return sent


def core_kernels(cm: ComputeModel) -> tuple[list[Kernel], list[Kernel]]:
    """The core's kernels with context parallelism (attention.core_kernels asks): the
    forward's marked as the core (selective recomputation repeats them)."""
    attention = ContextAttention(cm)

    def kernels(backward: bool) -> list[Kernel]:
        part, name = ("input", f"{CORE} backward") if backward else ("forward", CORE)
        steps = attention.backward if backward else attention.forward
        return [
            Kernel("attention", part, f"{name} {i}", step.work, core=not backward)
            for i, step in enumerate(s for s in steps if s.kind is None or s.overlapped)
        ]

    return kernels(False), kernels(True)


class CoreSplit(NamedTuple):
    """What a layer's attention block computes around the core with CP: ``forward_tail``
    after the core in the forward (the projection unless --tp-comm-overlap runs it with
    its reduce-scatter, and dropout-add), ``backward_head`` before it in the backward
    (dropout-add, the projection's dX unless overlapped with its all-gather, its dW
    unless a zero-bubble schedule defers it)."""

    forward_tail: Work
    backward_head: Work


def core_split(cm: ComputeModel, overlap_tp: bool, split: bool) -> CoreSplit:
    kernels = [k for k in cm.kernels() if k.block == "attention"]
    forward = [k for k in kernels if k.part == "forward"]
    backward = [k for k in kernels if k.part != "forward"]
    first_core = next(i for i, k in enumerate(forward) if k.name.startswith(CORE))
    tail = ZERO
    for k in forward[first_core:]:
        if not k.name.startswith(CORE) and not (overlap_tp and k.name == "projection"):
            tail = tail + k.work
    head = ZERO
    for k in backward:
        if k.name.startswith(CORE):
            break
        if not ((overlap_tp and k.name == "projection dX") or (split and k.part == "weight")):
            head = head + k.work
    return CoreSplit(tail, head)

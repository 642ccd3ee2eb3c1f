"""An MoE layer's MLP block on one GPU: its kernels' work and its token dispatch's bytes
(docs/moe.md; moe_ops.py lowers them as ops).

Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py) with its token
dispatchers (token_dispatcher.py), under balanced routing: every expert receives the
same share of the tokens. With n tokens of a micro-batch on a GPU (b s / CP, split
over TP by sequence parallelism: n / TP), E experts, top-k routing, EP and ETP:

- **router**: the h x E GEMM on the GPU's n / TP tokens, softmax and top-k as one
  memory-bound pass (reads the 16-bit logits, writes fp32 probabilities, reads them
  for the top-k, writes k indices (int64) and probabilities (fp32) per token);
- **permute / unpermute**: memory-bound copies of the token rows into expert order
  and back (each row read and written once per copy);
- **dispatch / combine** (`alltoall`): an all-to-all over the EP group, each GPU
  sending its n / TP x k rows (h x 2 bytes each), (EP - 1) / EP of them to other GPUs;
  with ETP > 1 an all-gather of the received rows over the expert tensor-parallel
  group after it (a reduce-scatter before the combine). `allgather`: every GPU's
  n / TP rows all-gathered over the EP x ETP group before, the experts' output
  reduce-scattered after. The backward runs the duals in reverse order;
- **experts**: E / EP local experts, each a grouped GEMM of M = (n / TP) x ETP x EP x
  k / E rows (fewer with a capacity factor below 1: the dropped tokens), at the
  existing tile/wave GEMM model's efficiency for that shape (`gemm` with a batch of
  E / EP: tiles of every expert share the waves), the activation memory-bound;
- **shared experts**: a dense MLP of `moe_shared_expert_intermediate_size` on every
  token, sharded over TP with its own SP all-gather and reduce-scatter, after the
  routed experts (Megatron-Core without `moe_shared_expert_overlap`).

Model FLOPs are the executed ones: a token's top-k experts, so MFU counts the active
parameters. Under FP8 the experts' grouped GEMMs run as the linear layers' FP8 GEMMs
(`_expert_linear`); under routing skew each EP rank's experts get their own rows and
the all-to-alls are all-to-all-vs (routing.py). Shared-expert and dispatcher overlap
are left (docs/moe.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ..ir.vocabulary import MOE_ALLTOALL, MOE_FLEX
from .compute import ComputeModel
from .deepep import received_rows
from .fp8 import FP8_BYTES
from .kernels import BYTES_PER_ELEMENT, MASK_BYTES, ZERO, Work
from .routing import grouped_gemm, rank_rows, skewed

COUNT_BYTES = 8  # a token count (int64)


class MoeBlockWork(NamedTuple):
    """The MoE MLP block's compute, split where its communication goes. Forward:
    ``pre`` (norm, router, permute), dispatch, ``experts``, combine, ``post``
    (unpermute), ``shared`` (shared experts, between their own TP collectives),
    ``tail`` (dropout-add). Backward in execution order: ``tail_b``, ``shared_b``,
    ``post_b``, combine's dual, ``experts_b``, dispatch's dual, ``pre_b``; ``*_w`` are
    the weight-gradient parts inside them (a split schedule's W)."""

    pre: Work
    experts: Work
    post: Work
    shared: Work
    tail: Work
    tail_b: Work
    shared_b: Work
    post_b: Work
    experts_b: Work
    pre_b: Work
    pre_w: Work
    experts_w: Work
    shared_w: Work
    act: Work = ZERO  # the experts' activation inside ``experts`` (moe_act recomputes it)

    @property
    def forward(self) -> Work:
        return self.pre + self.experts + self.post + self.shared + self.tail

    @property
    def backward(self) -> Work:
        return self.tail_b + self.shared_b + self.post_b + self.experts_b + self.pre_b

    @property
    def weight(self) -> Work:
        return self.pre_w + self.experts_w + self.shared_w


class Dispatch(NamedTuple):
    """Message bytes of the dispatcher's collectives for one micro-batch (StageComm.expert
    conventions): the all-to-all's per GPU, the ETP all-gather's and the allgather
    dispatcher's whole gathered tensor."""

    alltoall_bytes: float
    etp_bytes: float
    gather_bytes: float
    count_bytes: float = 0.0  # the alltoall dispatcher's token counts, all-gathered


def expert_gemms(
    cm: ComputeModel, shapes: list[tuple[float, float, float]], extra_bytes: float = 0.0, **kw
) -> Work:
    """The local experts' GEMMs of one linear layer: one grouped GEMM (`moe_grouped_gemm`,
    TEGroupedMLP: the experts' tiles share the GPU's waves, routing.grouped_gemm) or,
    without it, Megatron-Core's SequentialMLP (experts.py): one GEMM per expert after
    another, each with its own last wave and its own operands' bytes (``extra_bytes``,
    an epilogue's over all the experts, split in proportion to their weights)."""
    if cm.training.grouped_gemm or len(shapes) <= 1:
        return grouped_gemm(cm, shapes, extra_bytes, **kw)
    each = extra_bytes / len(shapes)
    return sum((grouped_gemm(cm, [shape], each, **kw) for shape in shapes), ZERO)


def _wgrad(cm: ComputeModel, k_in: float, n_out: float, rows: Sequence[float]) -> Work:
    """The weight gradients of one k_in x n_out weight per expert, each over its expert's
    rows, accumulated into the gradient buffer as compute.weight_gradient does (fused
    into the grouped GEMM or an add)."""
    g = cm.training.gradient_bytes
    weights = len(rows) * k_in * n_out
    shapes = [(k_in, n_out, m) for m in rows]
    if cm.training.mechanism("gradient_accumulation_fusion"):
        return expert_gemms(cm, shapes, extra_bytes=(2 * g - 2) * weights)
    return expert_gemms(cm, shapes) + cm.memory_bound((2 + 2 * g) * weights)


def _expert_linear(
    cm: ComputeModel, ms: Sequence[float], k_in: float, n_out: float
) -> tuple[Work, Work, Work]:
    """One linear layer of every local expert, Y[m_e, n_out] = X[m_e, k_in] W_e, as
    grouped GEMMs: (forward, input gradient, weight gradient accumulated). Under FP8
    (`training.fp8_format`) as cost.fp8's linear layers: the grouped GEMMs at
    the FP8 peak with the FP8 constants, the routed rows' input cast, the experts'
    weights cast once per iteration, the incoming gradient cast before dgrad."""
    fwd = expert_gemms(cm, [(m, n_out, k_in) for m in ms])
    fp8 = cm.fp8
    if fp8 is None:
        return fwd, expert_gemms(cm, [(m, k_in, n_out) for m in ms]), _wgrad(cm, k_in, n_out, ms)
    mem, rows = cm.memory_bound, math.fsum(ms)
    weights = len(ms) * k_in * n_out
    fp8_args = {"peak_tflops": fp8.peak_tflops, "input_bytes": FP8_BYTES}
    forward = (
        mem(fp8.cast_bytes_per_element() * rows * k_in)
        + mem(fp8.weight_cast_bytes_per_element() * weights / fp8.microbatches)
        + expert_gemms(cm, [(m, n_out, k_in) for m in ms], constants=fp8.fprop, **fp8_args)
    )
    dgrad = mem(fp8.cast_bytes_per_element() * rows * n_out) + expert_gemms(
        cm, [(m, k_in, n_out) for m in ms], constants=fp8.split, **fp8_args
    )
    g = cm.training.gradient_bytes
    shapes = [(k_in, n_out, m) for m in ms]
    if cm.training.mechanism("gradient_accumulation_fusion"):
        extra = (2 * g - 2) * weights
        wgrad = expert_gemms(cm, shapes, extra, constants=fp8.split, **fp8_args)
    else:
        wgrad = expert_gemms(cm, shapes, constants=fp8.split, **fp8_args)
        wgrad = wgrad + mem((2 + 2 * g) * weights)
    return forward, dgrad, wgrad


def _shared_linear(
    cm: ComputeModel, name: str, k_in: float, n_out: float, tokens: float
) -> tuple[Work, Work, Work]:
    """A shared expert's linear layer on all ``tokens``: (forward, input gradient, weight
    gradient), FP8 as the dense linear layers under `training.fp8_format`."""
    if cm.fp8 is None:
        g = cm.gemm
        return g(tokens, n_out, k_in), g(tokens, k_in, n_out), _wgrad(cm, k_in, n_out, (tokens,))
    parts = cm.fp8.linear("mlp", name, k_in, n_out, tokens)
    forward, dgrad, wgrad = (sum((kernel.work for kernel in part), ZERO) for part in parts)
    return forward, dgrad, wgrad


def tokens_per_expert(cm: ComputeModel) -> float:
    """M: the rows one local expert computes per micro-batch under balanced routing,
    capped by the capacity factor when one is set (tokens beyond it are dropped)."""
    model, par = cm.model, cm.parallel
    assert model.num_experts is not None  # MoE models only (num_experts set)
    local = cm.tokens / par.tensor_model_parallel_size  # SP: a GPU's share
    routed = local * model.router_topk * par.ep_size * par.etp_size / model.num_experts
    factor = model.moe_expert_capacity_factor
    return routed if factor is None else routed * min(1.0, factor)


def expert_rows(cm: ComputeModel, rank: int) -> tuple[float, ...]:
    """The rows each local expert of EP rank ``rank`` computes per micro-batch: M each
    under balanced routing, the rank's shares of them under skew (routing.py)."""
    if not skewed(cm.model):
        assert cm.model.num_experts is not None  # MoE models only (num_experts set)
        return (tokens_per_expert(cm),) * (cm.model.num_experts // cm.parallel.ep_size)
    return rank_rows(cm, rank)


def dispatch_bytes(cm: ComputeModel, rank: int = 0) -> Dispatch:
    """The dispatcher's message bytes for a GPU of EP rank ``rank`` (its ETP all-gather
    gathers what its experts receive; under skew the all-to-all's bytes are the dropless
    ones, its flows weighted by `routing.rank_loads`)."""
    model, par = cm.model, cm.parallel
    e, h = BYTES_PER_ELEMENT, model.hidden_size
    local = cm.tokens / par.tensor_model_parallel_size
    factor = model.moe_expert_capacity_factor
    kept = model.router_topk * (1.0 if factor is None else min(1.0, factor))
    rows = local * kept  # the GPU's routed token copies that are sent (dropless: all)
    # the alltoall dispatcher's preprocess: every GPU's count of tokens per expert (E
    # int64) all-gathered over the EP x ETP group, from which the all-to-all's splits are
    # read back to the host (token_dispatcher.py `preprocess`)
    assert model.num_experts is not None  # MoE models only (num_experts set)
    counts = par.ep_size * par.etp_size * model.num_experts * COUNT_BYTES
    if skewed(model):
        return Dispatch(
            alltoall_bytes=local * model.router_topk * h * e,
            etp_bytes=math.fsum(expert_rows(cm, rank)) * h * e,
            gather_bytes=par.ep_size * par.etp_size * local * h * e,
            count_bytes=counts,
        )
    return Dispatch(
        alltoall_bytes=rows * h * e,
        etp_bytes=par.etp_size * rows * h * e,
        gather_bytes=par.ep_size * par.etp_size * local * h * e,
        count_bytes=counts,
    )


def moe_recompute_s(work: MoeBlockWork, modules: frozenset[str]) -> float:
    """The MoE modules a selective backward repeats, as compute (the lowering adds the
    dispatcher's all-to-alls of `moe` and the shared experts' TP collectives): the whole
    block (moe), the shared experts (shared_experts), the experts' activation (moe_act)."""
    if "moe" in modules:
        return work.forward.duration_s
    seconds = work.shared.duration_s if "shared_experts" in modules else 0.0
    return seconds + (work.act.duration_s if "moe_act" in modules else 0.0)


def _unfused_permute(cm: ComputeModel, local: float, experts: int) -> tuple[Work, Work]:
    """The alltoall dispatcher's permute and unpermute without `moe_permute_fusion`, as
    PyTorch runs Megatron-Core's moe_utils.py `permute` / `unpermute` on a GPU's
    ``local`` tokens (16-bit rows of h, k copies each, E experts):

    - the routing map turned to int8 and transposed (read and write n E bytes), a stable
      argsort of its n E entries (counted as one pass of 1-byte keys and 8-byte indices,
      read and written: a floor, radix sorts take several) and the probabilities
      transposed (n E 16-bit values read and written): 24 n E bytes, in each direction;
    - permute: `index_select` of the k n rows, each read and written (k reads of a row
      where the fused kernel reads it once);
    - unpermute: the k n rows times their probabilities (read and written), the output
      zeroed (n rows written) and `scatter_add_` of the k n rows into it (each read, and
      its output element read and written once per copy).

    Their backwards move the same bytes (scatter_add's is a gather, index_select's a
    scatter_add)."""
    e, h, k = BYTES_PER_ELEMENT, cm.model.hidden_size, cm.model.router_topk
    index = 24 * local * experts
    permute = cm.memory_bound(2 * e * h * local * k + index)
    unpermute = cm.memory_bound(e * h * local * (5 * k + 1) + index)
    return permute, unpermute


def _rank_works(cm: ComputeModel) -> list[MoeBlockWork]:
    """Every EP rank's block work. A rank's work depends on its experts' rows alone, so
    ranks with the same rows share one computation (imbalanced routing: two kinds)."""
    done: dict[tuple[float, ...], MoeBlockWork] = {}
    works = []
    for rank in range(cm.parallel.ep_size):
        rows = expert_rows(cm, rank)
        if rows not in done:
            done[rows] = _moe_block_work(cm, rank)
        works.append(done[rows])
    return works


def _busiest(works: Sequence[MoeBlockWork]) -> int:
    times = [w.experts.duration_s + w.experts_b.duration_s for w in works]
    return times.index(max(times))


def busiest_rank(cm: ComputeModel) -> int:
    """The EP rank whose experts take longest (the first of equals; 0 when balanced):
    the one symmetric mode's representative computes (routing.py)."""
    if not skewed(cm.model):
        return 0
    return _busiest(_rank_works(cm))


def moe_block_work(cm: ComputeModel, rank: int | None = None) -> MoeBlockWork:
    """The block's work on a GPU of EP rank ``rank``; None: symmetric mode's
    representative, the busiest rank's time with the mean rank's FLOPs (MFU counts the
    model's FLOPs whatever the skew)."""
    if rank is not None or not skewed(cm.model):
        return _moe_block_work(cm, rank or 0)
    ep = cm.parallel.ep_size
    works = _rank_works(cm)
    busiest = works[_busiest(works)]
    fields = {}
    for name in MoeBlockWork._fields:
        mean = math.fsum(getattr(w, name).flops for w in works) / ep
        fields[name] = Work(duration_s=getattr(busiest, name).duration_s, flops=mean)
    return MoeBlockWork(**fields)


def _moe_block_work(cm: ComputeModel, rank: int) -> MoeBlockWork:
    model, par = cm.model, cm.parallel
    e, h, k = BYTES_PER_ELEMENT, model.hidden_size, model.router_topk
    t, etp = par.tensor_model_parallel_size, par.etp_size
    local = cm.tokens / t  # sequence parallel: the GPU's tokens
    ms = expert_rows(cm, rank)
    f, f1 = model.expert_ffn / etp, model.expert_fc1_width / etp
    g, mem = cm.gemm, cm.memory_bound
    norm = mem(2 * e * local * h)
    num_experts = model.num_experts
    assert num_experts is not None  # MoE models only (num_experts set)
    router = g(local, num_experts, h)
    topk = mem(local * (10 * num_experts + 12 * k))
    rows = math.fsum(ms) if skewed(model) else len(ms) * ms[0]
    unpermute, sort = None, ZERO
    if cm.training.moe_dispatcher == MOE_ALLTOALL:
        if cm.training.permute_fusion:
            # Transformer Engine's fused kernels: each token row read once and written to
            # its k copies; back, the k copies read, weighted and summed into one row
            permute = mem(e * h * local * (1 + k))
        else:
            permute, unpermute = _unfused_permute(cm, local, num_experts)
        if len(ms) > 1:
            # sort_chunks_by_idxs: the received rows regrouped by local expert (a copy,
            # read and written), and back before the combine (Megatron-Core
            # token_dispatcher.py, "Permutation 2"); fused or torch.split + cat alike
            sort = mem(2 * e * h * rows)
    elif cm.training.moe_dispatcher == MOE_FLEX:
        # DeepEP reads the tokens where they are; the receiver expands the rows it got
        # (one per token and GPU) into its experts' k per local token (and back)
        permute = mem(e * h * (received_rows(cm) + local * k))
    elif skewed(model):  # allgather: the local experts' rows picked from (and added into) all
        permute = mem(e * h * 2 * rows)
    else:
        permute = mem(e * h * 2 * len(ms) * ms[0])
    act_bytes, act_b_bytes = (3 * e, 5 * e) if model.gated else (2 * e, 3 * e)

    fc1, fc1_dx, fc1_dw = _expert_linear(cm, ms, h, f1)
    fc2, fc2_dx, fc2_dw = _expert_linear(cm, ms, f, h)
    act = mem(act_bytes * rows * f)
    act_b = mem(act_b_bytes * rows * f)
    router_dx, router_dw = g(local, h, num_experts), _wgrad(cm, h, num_experts, (local,))
    shared, shared_b, shared_w = ZERO, ZERO, ZERO
    if model.shared_expert_ffn:
        n = cm.tokens  # all-gathered over TP
        sf = model.shared_expert_ffn / t
        sf1 = (2 if model.gated else 1) * sf
        s_fc1, s_fc1_dx, s_fc1_dw = _shared_linear(cm, "shared fc1", h, sf1, n)
        s_fc2, s_fc2_dx, s_fc2_dw = _shared_linear(cm, "shared fc2", sf, h, n)
        shared = s_fc1 + mem(act_bytes * n * sf) + s_fc2
        shared_w = s_fc2_dw + s_fc1_dw
        shared_b = s_fc2_dx + mem(act_b_bytes * n * sf) + s_fc1_dx + shared_w
    hidden = local * h
    back = permute if unpermute is None else unpermute  # the same rows back, weighted
    return MoeBlockWork(
        pre=norm + router + topk + permute,
        experts=sort + fc1 + act + fc2 + sort,
        post=back,
        shared=shared,
        tail=mem((3 * e + MASK_BYTES) * hidden),
        tail_b=mem((2 * e + MASK_BYTES) * hidden),
        shared_b=shared_b,
        post_b=back,
        experts_b=sort + fc2_dx + fc2_dw + act_b + fc1_dx + fc1_dw + sort,
        pre_b=permute + topk + router_dx + router_dw + mem(4 * e * hidden),
        pre_w=router_dw,
        experts_w=fc2_dw + fc1_dw,
        shared_w=shared_w,
        act=act,
    )

"""DeepEP's normal (training) dispatch and combine: `moe_token_dispatcher_type = "flex"`
(docs/moe.md, "The flex dispatcher").

Megatron-Core's flex dispatcher (`--moe-token-dispatcher-type flex --moe-enable-deepep`,
megatron/core/transformer/moe/token_dispatcher.py, fused_a2a.py) hands the tokens to
DeepEP (github.com/deepseek-ai/DeepEP, README "Normal kernels"), whose kernels move a
token once per destination, not once per expert:

- **across nodes** in two hops: a token goes over RDMA once to each other node holding
  one of its experts, to the GPU with the same local index there (the same NIC rail:
  the same plane of a multi-plane fabric), which forwards it over NVLink to the GPUs of
  its node that hold its experts; tokens for the sender's own node go over NVLink from
  the sender. The combine is the reverse, each forwarder adding its node's partial
  outputs before the one RDMA send back;
- **inside a node** (the EP group on one node) one hop over NVLink, once per
  destination GPU.

Under balanced routing (every token's top-k experts a uniform draw without repetition;
with group-limited routing, `moe_router_num_groups` G and `moe_router_group_topk` g,
first g of the G groups uniformly, then the k experts uniformly among those groups'
experts) a block of u aligned consecutive experts (a GPU's E / EP, a node's) holds at
least one of a token's experts with probability `hit_probability`; with N nodes of
the EP group, a node's hit probability p_N and a GPU's p_G, each GPU sends per
micro-batch of n tokens (rows of R bytes):

    RDMA, to each of the N - 1 same-index GPUs of the other nodes:   n p_N R
    NVLink, to each of the other GPUs of its node (forwarding):      N n p_G R

the second because a GPU forwards what the same-index GPUs of all N nodes (itself
included) send it. Both hops run as one coupled flow (DeepEP pipelines them in chunks):
the all-to-all ends when its busiest link has moved its bytes.

Rows are h x 2 bytes; under FP8 (`training.fp8_format`) the forward dispatch sends FP8
rows with one fp32 scale per 128 channels (DeepEP's dispatch takes FP8 with its scales,
README "Normal kernels"; DeepSeek-V3's report, 3.3.2, "Low-Precision Communication":
dispatch in FP8, the forward and backward combine in BF16); the other three transfers
of a layer stay 16-bit. What DeepEP's behaviour depends on and stepsim does not model:
the SMs its kernels take (`training.moe_comm_sm_fraction` under the overlap, as for
`alltoall`; without the overlap the transfer holds the compute stream, its time the
links'), its chunk sizes and buffers, its CPU-side synchronisation, routing skew
(refused with `flex`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from .fp8 import FP8_BYTES
from .kernels import BYTES_PER_ELEMENT

if TYPE_CHECKING:
    from .compute import ComputeModel

FP8_SCALE_CHANNELS = 128  # DeepEP/DeepSeek-V3: one fp32 scale per 1 x 128 tile
FP8_SCALE_BYTES = 4


def _none_probability(pool: int, block: int, k: int) -> float:
    """P(none of k distinct uniform draws from ``pool`` lands in a fixed ``block``)."""
    if pool - block < k:
        return 0.0
    return math.comb(pool - block, k) / math.comb(pool, k)


def hit_probability(
    experts: int, k: int, block: int, groups: int | None = None, group_topk: int | None = None
) -> float:
    """P(a block of ``block`` aligned consecutive experts holds >= 1 of a token's top-k)
    under balanced routing, optionally group-limited (``groups`` equal groups of
    consecutive experts, ``group_topk`` of them chosen per token). The block and the
    groups nest (one divides the other; the rules check it)."""
    if groups is None or group_topk is None:
        return 1.0 - _none_probability(experts, block, k)
    size = experts // groups  # experts per group
    pool = group_topk * size  # the experts a token chooses among
    if block <= size:  # inside one group: hit only if that group is chosen
        return group_topk / groups * (1.0 - _none_probability(pool, block, k))
    whole = block // size  # the block holds `whole` groups; j of them chosen (hypergeometric)
    total = math.comb(groups, group_topk)
    none = 0.0
    for j in range(0, min(whole, group_topk) + 1):
        ways = math.comb(whole, j) * math.comb(groups - whole, group_topk - j)
        none += ways / total * _none_probability(pool, j * size, k)
    return 1.0 - none


class FlexTraffic(NamedTuple):
    """One micro-batch's flex all-to-all on one GPU, in units of its n tokens' rows:
    ``rdma`` to each same-index GPU of another node, ``nvlink`` to each other GPU of its
    node; ``nodes`` the EP group's, ``node_hit`` and ``gpu_hit`` the hit probabilities."""

    rdma: float
    nvlink: float
    nodes: int
    node_hit: float
    gpu_hit: float


def flex_traffic(cm: ComputeModel) -> FlexTraffic:
    """The pair weights of the flex dispatch for the scenario of ``cm`` (balanced routing,
    ETP 1: the rules check both)."""
    model, par = cm.model, cm.parallel
    gpus_per_node = cm.scenario.cluster.gpus_per_node
    ep, experts, k = par.ep_size, model.num_experts, model.router_topk
    assert experts is not None  # MoE models only (num_experts set)
    per_node = min(ep, gpus_per_node)
    nodes = ep // per_node
    groups, group_topk = model.moe_router_num_groups, model.moe_router_group_topk
    gpu_hit = hit_probability(experts, k, experts // ep, groups, group_topk)
    node_hit = hit_probability(experts, k, experts * per_node // ep, groups, group_topk)
    return FlexTraffic(
        rdma=node_hit if nodes > 1 else 0.0,
        nvlink=nodes * gpu_hit,
        nodes=nodes,
        node_hit=node_hit,
        gpu_hit=gpu_hit,
    )


def row_bytes(cm: ComputeModel, fp8_dispatch: bool) -> float:
    """A token row's bytes on the wire: 16-bit, or FP8 with its fp32 scales."""
    h = cm.model.hidden_size
    if fp8_dispatch:
        return h * FP8_BYTES + h / FP8_SCALE_CHANNELS * FP8_SCALE_BYTES
    return h * BYTES_PER_ELEMENT


def received_rows(cm: ComputeModel) -> float:
    """Rows a GPU receives per micro-batch (one per token and destination GPU): its n
    tokens x EP x the GPU hit probability, by symmetry."""
    local = cm.tokens / cm.parallel.tensor_model_parallel_size
    return local * cm.parallel.ep_size * flex_traffic(cm).gpu_hit

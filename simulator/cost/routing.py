"""Routing skew (`model.moe_routing`; docs/moe.md "Imbalanced, balanced and skewed
routing"): how a micro-batch's routed token copies spread over the experts, what each
EP rank's experts then compute, and the all-to-all-v weights of the dispatch.

**Shares.** Expert e receives the share s_e of the routed token copies (sum 1):
``imbalanced`` (the default) what a balancing router leaves: the expected busiest EP
rank of `busiest_rank_load` on EP rank 0, the other ranks' experts evenly below the
mean (the measured imbalance it starts from is `ModelSpec.expert_load_violation`);
``balanced`` 1/E each; ``zipf`` s_e proportional to 1/(e+1)^x (x =
`moe_routing_zipf_exponent`); ``shares`` a file's (or a tuple's) numbers, normalized. A
token meets an expert at most once among its top-k, so no expert takes more than 1/k of
the copies: a zipf share above it is capped and the excess spread over the others in
proportion to theirs (repeated until none is above; a file's shares must obey it). With
a capacity factor c, expert e keeps min(s_e, c/E): what is beyond is dropped before the
dispatch, as Megatron-Core's token-drop policy does.

**Where the hot experts sit.** Megatron-Core places the experts contiguously on the EP
ranks (EP rank r holds experts r E/EP to (r+1) E/EP - 1: ``local_expert_indices`` in
moe_layer.py), so under zipf EP rank 0 holds the hottest experts. A file places its
shares as it lists them.

**The busiest rank decides the time.** Rank r's load factor is l_r = EP x the kept
shares of its experts (1 for every rank under balance without dropping). Every EP rank
waits for the slowest at the combine (an all-to-all cannot end before every member has
sent), and nothing else in a layer differs between ranks, so a layer takes the time of
the rank whose experts take longest. Symmetric mode's representative computes that
rank's experts (its FLOPs count the mean rank's, so MFU stays the model's); exact mode
gives each GPU its own EP rank's experts and the rendezvous make the others wait.

**The all-to-all-v.** A dispatch sends from every GPU the same number of token copies,
l_b / EP of them to EP rank b; the combine sends them back. Modelled as one coupled flow
whose flows progress in proportion to their bytes (a flow's weight on each link it
crosses is l_b, or l_a for the combine, in place of 1): they all end together, when the
link carrying the most bytes for its capacity has moved them, which no order of the
real flows can beat. Balanced, every weight is 1: the all-to-all of before.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

from ..ir.units import gbytes_per_s_to_bytes_per_s, tflops_to_flops_per_s
from ..scenario import ModelSpec
from ..scenario.moe_rules import BALANCED, IMBALANCED, ZIPF
from .kernels import BYTES_PER_ELEMENT, Work, gemm_seconds

if TYPE_CHECKING:
    from .compute import ComputeModel


def skewed(model: ModelSpec) -> bool:
    """Whether routing is anything but balanced (balanced keeps its former code path);
    `imbalanced` (the default) with no violation is balanced."""
    if not model.moe:
        return False
    routing = model.moe_routing or IMBALANCED
    if routing == IMBALANCED:
        return model.expert_load_violation > 0.0
    return routing != BALANCED


@cache
def _shares(
    experts: int, topk: int, routing: str, exponent: float, given: tuple[float, ...] | None
) -> tuple[float, ...]:
    if routing == BALANCED:
        return (1.0 / experts,) * experts
    if routing == ZIPF:
        raw = [_zipf(e, exponent) for e in range(experts)]
        return _capped(raw, 1.0 / topk)
    total = math.fsum(given or ())
    return tuple(s / total for s in given or ())


def _zipf(expert: int, exponent: float) -> float:
    """1/(e+1)^x; 0 where (e+1)^x overflows a float (many experts, x up to 100)."""
    try:
        return 1.0 / (expert + 1) ** exponent
    except OverflowError:
        return 0.0


def _capped(raw: list[float], cap: float) -> tuple[float, ...]:
    """``raw`` normalized, no share above ``cap``: the excess spread over the uncapped
    shares in proportion to theirs until none is above (water-filling)."""
    fixed: set[int] = set()
    while True:
        free = math.fsum(raw[e] for e in range(len(raw)) if e not in fixed)
        left = max(0.0, 1.0 - cap * len(fixed))
        if free > 0:
            shares = [cap if e in fixed else raw[e] * left / free for e in range(len(raw))]
        else:  # the uncapped shares underflowed to 0: what is left, evenly
            share = left / (len(raw) - len(fixed))
            shares = [cap if e in fixed else share for e in range(len(raw))]
        over = {e for e, s in enumerate(shares) if s > cap * (1 + 1e-12) and e not in fixed}
        if not over:
            return tuple(shares)
        fixed |= over


def expert_shares(model: ModelSpec, ep: int) -> tuple[float, ...]:
    """Each routed expert's share of the routed token copies (sum 1), before dropping,
    with the experts on ``ep`` EP ranks (the imbalanced routing's busiest rank depends
    on how many experts a rank holds)."""
    assert model.num_experts is not None  # MoE models only (num_experts set)
    routing = model.moe_routing or IMBALANCED
    if routing == IMBALANCED:
        return _imbalanced(model.num_experts, ep, model.router_topk, model.expert_load_violation)
    return _shares(
        model.num_experts,
        model.router_topk,
        routing,
        1.0 if model.moe_routing_zipf_exponent is None else model.moe_routing_zipf_exponent,
        model.moe_routing_shares,
    )


def expected_max_normal(n: int) -> float:
    """The expected largest of ``n`` independent standard normal draws, by Blom's
    approximation Phi^-1((n - 0.375) / (n + 0.25)): 4 % above the exact value at n = 2
    (0.589 against 1/sqrt(pi)), within 2 % from n = 5 and 0.6 % from n = 10; 0 for n = 1."""
    from statistics import NormalDist  # here: only MoE runs need it, and it imports decimal

    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def busiest_rank_load(experts: int, ep: int, violation: float) -> float:
    """The imbalanced routing's busiest EP rank: its load over the mean rank's.

    The experts' loads spread evenly over [1 - v, 1 + v] (v = ``violation``, mean 1);
    which experts run hot differs from layer to layer and is not where Megatron-Core
    places them, so a rank holds m = E / EP experts drawn at random. A rank's mean load
    then has the variance v^2 (E + 1) / (3 (E - 1)) / m x (E - m) / (E - 1) (sampling
    without replacement) and the busiest of EP ranks lies, in expectation,
    `expected_max_normal(EP)` of its standard deviations above 1 (normal approximation),
    at most 1 + v (E - m) / (E - 1), the m hottest experts together. Exact where a rank
    holds one expert and every expert is placed (m = 1, EP = E): the hottest, 1 + v."""
    if ep <= 1 or violation == 0.0 or experts <= 1:
        return 1.0
    m = experts // ep
    worst = 1.0 + violation * (experts - m) / (experts - 1)
    if m == 1 and ep == experts:
        return worst
    single = violation**2 * (experts + 1) / (3.0 * (experts - 1))
    spread = math.sqrt(single / m * (experts - m) / (experts - 1))
    return min(worst, 1.0 + spread * expected_max_normal(ep))


@cache
def _imbalanced(experts: int, ep: int, topk: int, violation: float) -> tuple[float, ...]:
    """Shares that put `busiest_rank_load` on EP rank 0 (its experts alike) and the rest
    evenly on the other ranks' experts: the busiest rank and the all-to-all-v's weights
    that the time depends on. Capped at 1/top-k as every routing is."""
    load = busiest_rank_load(experts, ep, violation)
    if load == 1.0:
        return (1.0 / experts,) * experts
    m = experts // ep
    hot = load / experts  # each of rank 0's m experts: load x the balanced 1/E
    rest = (1.0 - hot * m) / (experts - m)
    return _capped([hot] * m + [rest] * (experts - m), 1.0 / topk)


def kept_shares(model: ModelSpec, ep: int) -> tuple[float, ...]:
    """The shares each expert keeps: capped at capacity factor / E when one is set."""
    shares = expert_shares(model, ep)
    factor = model.moe_expert_capacity_factor
    if factor is None:
        return shares
    assert model.num_experts is not None  # MoE models only (num_experts set)
    cap = factor / model.num_experts
    return tuple(min(s, cap) for s in shares)


def rank_loads(model: ModelSpec, ep: int) -> tuple[float, ...]:
    """Each EP rank's load factor l_r: EP x the kept shares of its E / EP experts."""
    assert model.num_experts is not None  # MoE models only (num_experts set)
    kept, local = kept_shares(model, ep), model.num_experts // ep
    return tuple(ep * math.fsum(kept[r * local : (r + 1) * local]) for r in range(ep))


def rank_rows(cm: ComputeModel, rank: int) -> tuple[float, ...]:
    """The rows each of EP rank ``rank``'s experts computes per micro-batch: the EP
    group's routed copies (n / TP x k x EP, x ETP gathered) times the expert's kept share."""
    model, par = cm.model, cm.parallel
    assert model.num_experts is not None  # MoE models only (num_experts set)
    local = cm.tokens / par.tensor_model_parallel_size
    copies = local * model.router_topk * par.ep_size * par.etp_size
    per_rank = model.num_experts // par.ep_size
    kept = kept_shares(model, par.ep_size)[rank * per_rank : (rank + 1) * per_rank]
    return tuple(copies * s for s in kept)


def grouped_gemm(
    cm: ComputeModel,
    shapes: list[tuple[float, float, float]],
    extra_bytes: float = 0.0,
    *,
    peak_tflops: float | None = None,
    input_bytes: float | None = None,
    constants=None,
) -> Work:
    """A grouped GEMM of ``shapes`` (m, n, k), one per expert, as one kernel: the tile
    and wave model of compute.gemm_efficiency over all the experts' tiles together (each
    expert's tiles overhang its own matrix, the last wave is the group's, split-K
    alike for all), and the memory roofline over every operand. Equal shapes: exactly
    `ComputeModel.gemm` with a batch. FP8 (moe.py): ``peak_tflops``, ``input_bytes`` and
    the FP8 kernel ``constants`` of cost.fp8."""
    shapes = [s for s in shapes if s[0] > 0 and s[1] > 0 and s[2] > 0]
    if not shapes:
        return Work(duration_s=0.0, flops=0.0)
    gpu, c = cm.gpu, cm.constants if constants is None else constants
    if len(set(shapes)) == 1:
        m, n, k = shapes[0]
        flops = 2.0 * len(shapes) * m * n * k
        seconds = gemm_seconds(
            gpu,
            c,
            m,
            n,
            k,
            len(shapes),
            extra_bytes,
            peak_tflops=peak_tflops,
            input_bytes=input_bytes,
        )
        return Work(duration_s=seconds, flops=flops)
    peak = tflops_to_flops_per_s(gpu.peak_tflops if peak_tflops is None else peak_tflops)
    tiles = [math.ceil(m / c.tile_m) * math.ceil(n / c.tile_n) for m, n, _ in shapes]
    covered = [t * c.tile_m * c.tile_n for t in tiles]
    count = sum(tiles)
    best = math.inf
    shortest = min(k for _, _, k in shapes)
    for splits in range(1, max(1, min(int(c.num_sms // count), int(shortest) // 16)) + 1):
        total = count * splits
        wave = total / (math.ceil(total / c.num_sms) * c.num_sms)
        seconds = 0.0
        for (m, n, k), area in zip(shapes, covered, strict=True):
            depth = k / splits
            efficiency = c.gemm_efficiency * (m * n / area) * wave * depth / (depth + c.gemm_k_half)
            seconds += 2.0 * m * n * k / (peak * efficiency)
        best = min(best, seconds)
    flops = math.fsum(2.0 * m * n * k for m, n, k in shapes)
    element = BYTES_PER_ELEMENT if input_bytes is None else input_bytes
    memory = extra_bytes + math.fsum(
        element * (m * k + k * n) + BYTES_PER_ELEMENT * m * n for m, n, k in shapes
    )
    stream = gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * c.memory_efficiency
    return Work(duration_s=max(best, memory / stream), flops=flops)

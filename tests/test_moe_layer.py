"""The MoE layer as Megatron-Core runs it (docs/moe.md): the imbalance a balancing router
leaves, grouped or sequential expert GEMMs, fused or unfused permutation, the chunk sort
of several local experts and the alltoall dispatcher's token-count exchange, each by
closed form."""

import dataclasses
import math

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.moe import (
    COUNT_BYTES,
    dispatch_bytes,
    expert_gemms,
    moe_block_work,
    tokens_per_expert,
)
from stepsim.cost.routing import (
    busiest_rank_load,
    expected_max_normal,
    expert_shares,
    grouped_gemm,
    rank_loads,
    rank_rows,
)
from stepsim.ir.vocabulary import EP_COMM
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError
from stepsim.scenario.moe_rules import AUX_LOSS_MAX_VIOLATION, LOSS_FREE_MAX_VIOLATION
from tests.helpers import load
from tests.test_moe import E, H, moe_scenario

IMBALANCED = {"moe_routing": "imbalanced"}


def test_the_busiest_rank_load_in_its_closed_forms():
    # one expert per rank, every expert placed: the hottest expert, 1 + v
    assert busiest_rank_load(8, 8, 0.5) == 1.5
    # nothing to balance: one rank, or no violation
    assert busiest_rank_load(8, 1, 0.5) == 1.0
    assert busiest_rank_load(256, 64, 0.0) == 1.0
    # a rank's mean of m experts drawn from E evenly spread loads: normal approximation
    experts, ep, v = 256, 64, 0.52
    m = experts // ep
    single = v**2 * (experts + 1) / (3 * (experts - 1))
    spread = math.sqrt(single / m * (experts - m) / (experts - 1))
    assert busiest_rank_load(experts, ep, v) == pytest.approx(1 + spread * expected_max_normal(ep))
    # never above the m hottest experts on one rank
    for ep in (2, 4, 8, 16, 32):
        assert 1.0 < busiest_rank_load(64, ep, 1.0) <= 1 + (64 - 64 // ep) / 63


def test_expected_max_normal_is_blom():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)
    assert expected_max_normal(10) == pytest.approx(1.5388, rel=0.006)  # tabulated exact
    assert expected_max_normal(100) == pytest.approx(2.5076, rel=0.006)


def _unset(scenario, **keys):
    return dataclasses.replace(scenario.model, moe_routing=None, **keys)


def test_imbalanced_is_the_default_with_the_measured_violations():
    aux = _unset(moe_scenario(ep=8, dp=8))
    assert aux.expert_load_violation == AUX_LOSS_MAX_VIOLATION
    free = _unset(moe_scenario(ep=8, dp=8), moe_router_enable_expert_bias=True)
    assert free.expert_load_violation == LOSS_FREE_MAX_VIOLATION
    given = moe_scenario(
        ep=8, dp=8, model={**IMBALANCED, "moe_expert_load_max_violation": 0.3}
    ).model
    assert given.expert_load_violation == 0.3
    # 8 experts on 8 ranks: rank 0 holds the hottest expert, the others share the rest
    loads = rank_loads(aux, 8)
    assert loads[0] == pytest.approx(1 + AUX_LOSS_MAX_VIOLATION)
    assert loads[1:] == pytest.approx([(8 - loads[0]) / 7] * 7)
    assert math.fsum(expert_shares(aux, 8)) == pytest.approx(1.0)
    assert rank_loads(aux, 1) == (1.0,)


def test_the_violation_key_goes_with_imbalanced_routing_and_its_range():
    with pytest.raises(ScenarioError, match="moe_expert_load_max_violation=0.3 applies to"):
        moe_scenario(model={"moe_routing": "balanced", "moe_expert_load_max_violation": 0.3})
    with pytest.raises(ScenarioError, match="moe_expert_load_max_violation"):
        moe_scenario(model={**IMBALANCED, "moe_expert_load_max_violation": 1.5})
    dense = load(model={"num_layers": 2, "hidden_size": H, "seq_length": 1024})
    with pytest.raises(ScenarioError, match="moe_router_enable_expert_bias=True needs model.num"):
        dataclasses.replace(dense.model, moe_router_enable_expert_bias=True)


def test_the_busiest_rank_computes_its_load_times_the_balanced_rows():
    balanced = ComputeModel(moe_scenario(ep=8, dp=8))
    skewed = ComputeModel(moe_scenario(ep=8, dp=8, model=IMBALANCED))
    (rows,) = rank_rows(skewed, 0)
    (even,) = rank_rows(balanced, 0)
    assert rows == pytest.approx(even * (1 + AUX_LOSS_MAX_VIOLATION))
    assert moe_block_work(skewed).experts.duration_s > moe_block_work(balanced).experts.duration_s
    # the model's FLOPs stay the mean rank's
    assert moe_block_work(skewed).experts.flops == pytest.approx(
        moe_block_work(balanced).experts.flops
    )


def test_sequential_mlp_runs_one_gemm_per_expert():
    """Without `moe_grouped_gemm` each local expert's GEMM is its own kernel: the sum of
    single GEMMs, never faster than the grouped one, whose tiles share the waves."""
    grouped = ComputeModel(moe_scenario(experts=16, ep=2, dp=2))
    sequential = ComputeModel(
        moe_scenario(experts=16, ep=2, dp=2, training={"moe_grouped_gemm": False})
    )
    shapes = [(512.0, 2 * 2816.0, float(H))] * 8
    one = grouped_gemm(sequential, shapes[:1]).duration_s
    assert expert_gemms(sequential, shapes).duration_s == pytest.approx(8 * one)
    assert expert_gemms(grouped, shapes).duration_s <= 8 * one
    a, b = moe_block_work(grouped), moe_block_work(sequential)
    assert b.experts.duration_s >= a.experts.duration_s
    assert b.experts.flops == a.experts.flops


def test_unfused_permutation_moves_the_rows_as_pytorch_does():
    fused = ComputeModel(moe_scenario(experts=8, ep=8, dp=8))
    unfused = ComputeModel(
        moe_scenario(experts=8, ep=8, dp=8, training={"moe_permute_fusion": False})
    )
    n, k, experts = fused.tokens, 2, 8
    index = 24 * n * experts
    mem = fused.memory_bound
    # forward: one pass over the tokens' rows (fused) against k reads (index_select)
    delta_pre = moe_block_work(unfused).pre.duration_s - moe_block_work(fused).pre.duration_s
    expected = mem(2 * E * H * n * k + index).duration_s - mem(E * H * n * (1 + k)).duration_s
    assert delta_pre == pytest.approx(expected)
    assert moe_block_work(unfused).post.duration_s == pytest.approx(
        mem(E * H * n * (5 * k + 1) + index).duration_s
    )
    assert moe_block_work(fused).post.duration_s == pytest.approx(
        mem(E * H * n * (1 + k)).duration_s
    )


def test_several_local_experts_sort_their_received_rows_both_ways():
    """The alltoall dispatcher regroups the received rows by local expert before the
    experts and back after them (a copy each way); the allgather dispatcher's permute
    picks its rows itself, so the two differ by exactly the two copies."""
    alltoall = ComputeModel(moe_scenario(experts=16, ep=8, dp=8))
    allgather = ComputeModel(
        moe_scenario(experts=16, ep=8, dp=8, training={"moe_token_dispatcher_type": "allgather"})
    )
    rows = 2 * tokens_per_expert(alltoall)  # two local experts
    copy = alltoall.memory_bound(2 * E * H * rows).duration_s
    forward = moe_block_work(alltoall).experts.duration_s
    assert forward == pytest.approx(moe_block_work(allgather).experts.duration_s + 2 * copy)
    backward = moe_block_work(alltoall).experts_b.duration_s
    assert backward == pytest.approx(moe_block_work(allgather).experts_b.duration_s + 2 * copy)
    # one local expert: nothing to sort
    one = ComputeModel(moe_scenario(experts=8, ep=8, dp=8))
    gathered = ComputeModel(
        moe_scenario(experts=8, ep=8, dp=8, training={"moe_token_dispatcher_type": "allgather"})
    )
    assert moe_block_work(one).experts.duration_s == pytest.approx(
        moe_block_work(gathered).experts.duration_s
    )


def test_the_alltoall_dispatcher_gathers_the_token_counts_first():
    scenario = moe_scenario(experts=16, ep=8, dp=8)
    cm = ComputeModel(scenario)
    assert dispatch_bytes(cm).count_bytes == 8 * 16 * COUNT_BYTES
    spans = [s for s in run(scenario).trace.spans if s.kind == EP_COMM and s.microbatch == 0]
    # per MoE layer: counts, dispatch, combine forward; the two duals backward
    assert len(spans) == 2 * 5

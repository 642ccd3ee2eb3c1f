"""The flex (DeepEP) dispatcher and group-limited routing (cost/deepep.py): closed
forms of the per-GPU RDMA and NVLink bytes, the rules, and runs."""

import itertools
import math

import pytest

from stepsim.comm.collectives import Fabric
from stepsim.comm.placement import StageComm, placement_of
from stepsim.cost.compute import ComputeModel
from stepsim.cost.deepep import flex_traffic, hit_probability, row_bytes
from stepsim.ir.vocabulary import ALL_TO_ALL, EP_COMM
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from tests.test_moe import H, S, moe_scenario

FLEX = {"moe_token_dispatcher_type": "flex"}


def _brute_hit(experts, k, block, groups=None, chosen=None) -> float:
    """P(block [0, block) holds >= 1 of a token's experts), by enumerating every draw."""
    size = experts // (groups or 1)
    group_sets = itertools.combinations(range(groups or 1), chosen or 1)
    hits = total = 0.0
    for gs in group_sets:
        pool = [e for g in gs for e in range(g * size, (g + 1) * size)]
        draws = list(itertools.combinations(pool, k))
        hits += sum(any(e < block for e in d) for d in draws) / len(draws)
        total += 1
    return hits / total


@pytest.mark.parametrize(
    ("experts", "k", "block", "groups", "chosen"),
    [
        (8, 2, 2, None, None),
        (8, 3, 4, None, None),
        (8, 2, 1, 4, 2),  # a GPU inside a group
        (8, 2, 2, 4, 2),  # a block of one group
        (8, 3, 4, 4, 2),  # a block of two groups
        (12, 2, 6, 6, 3),
    ],
)
def test_hit_probability_matches_enumeration(experts, k, block, groups, chosen):
    assert hit_probability(experts, k, block, groups, chosen) == pytest.approx(
        _brute_hit(experts, k, block, groups, chosen), rel=1e-12
    )


def test_hit_probability_closed_form_without_groups():
    """1 - C(E - u, k) / C(E, k): DeepSeek-V3's 256 experts, top-8, a node's 32."""
    expected = 1 - math.comb(224, 8) / math.comb(256, 8)
    assert hit_probability(256, 8, 32) == pytest.approx(expected, rel=1e-15)
    # node-limited to 4 of 8 nodes: the node chosen (1/2), then >= 1 of 8 among 128
    limited = 0.5 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert hit_probability(256, 8, 32, 8, 4) == pytest.approx(limited, rel=1e-15)


def _links(scenario, pairs, unit=1.0):
    """(GPU 0's NVLink egress, its NIC egress) multiplicities of the flex transfer."""
    cluster = build_cluster(scenario.cluster, pattern=True)
    fabric = Fabric.of(cluster, 0.0)
    comm = StageComm(scenario, fabric, placement_of(scenario), 0)
    transfer = comm.expert("ep", ALL_TO_ALL, unit, pairs=pairs)
    mults = dict(zip(transfer.links, transfer.mults, strict=True))
    nvlink = fabric.route(0, 1)[0]
    nic = fabric.route(0, 8)[0] if scenario.cluster.num_nodes > 1 else None
    return mults.get(nvlink, 0.0), mults.get(nic, 0.0), transfer


def test_ep_inside_a_node_sends_nothing_over_rdma():
    """EP 8 on one node: each GPU sends each other GPU n x P(it holds one of the token's
    experts) rows, over NVLink only."""
    scenario = moe_scenario(experts=16, topk=4, ep=8, dp=8, training=FLEX)
    traffic = flex_traffic(ComputeModel(scenario))
    gpu_hit = 1 - math.comb(14, 4) / math.comb(16, 4)
    assert traffic.rdma == 0.0 and traffic.nodes == 1
    assert traffic.nvlink == pytest.approx(gpu_hit, rel=1e-15)
    nvlink, _, transfer = _links(scenario, (traffic.rdma, traffic.nvlink))
    assert nvlink == pytest.approx(7 * gpu_hit, rel=1e-15)
    assert transfer.bytes_per_flow == 1.0


@pytest.mark.parametrize("groups", [None, 4])
def test_rdma_and_nvlink_bytes_per_gpu_across_nodes(groups):
    """EP 32 over 4 nodes of 8: GPU 0's NIC carries (N - 1) p_N n rows (once per other
    node), its NVLink N (g - 1) p_G n rows (forwarding for all N same-index senders); with
    node-limited routing (4 groups = nodes, 2 per token) p_N and p_G shrink."""
    model = {"moe_router_num_groups": groups, "moe_router_group_topk": 2} if groups else {}
    scenario = moe_scenario(experts=32, topk=4, ep=32, dp=32, nodes=4, training=FLEX, model=model)
    traffic = flex_traffic(ComputeModel(scenario))
    if groups is None:
        p_node = 1 - math.comb(24, 4) / math.comb(32, 4)
        p_gpu = 1 - math.comb(31, 4) / math.comb(32, 4)
    else:
        p_node = 2 / 4 * (1 - math.comb(8, 4) / math.comb(16, 4))
        p_gpu = 2 / 4 * (1 - math.comb(15, 4) / math.comb(16, 4))
    assert traffic.rdma == pytest.approx(p_node, rel=1e-14)
    assert traffic.nvlink == pytest.approx(4 * p_gpu, rel=1e-14)
    unit = S * H * 2  # a micro-batch's n = S tokens of h 16-bit values
    nvlink, nic, _ = _links(scenario, (traffic.rdma, traffic.nvlink), unit)
    assert nic * unit == pytest.approx(3 * p_node * S * H * 2, rel=1e-14)
    assert nvlink * unit == pytest.approx(4 * 7 * p_gpu * S * H * 2, rel=1e-14)


def test_node_limited_routing_cuts_the_rdma_bytes():
    """Top-4 of 32 experts on 4 nodes: limited to one node, a token crosses the NIC at
    most once."""
    base = moe_scenario(experts=32, topk=4, ep=32, dp=32, nodes=4, training=FLEX)
    limited = moe_scenario(
        experts=32,
        topk=4,
        ep=32,
        dp=32,
        nodes=4,
        training=FLEX,
        model={"moe_router_num_groups": 4, "moe_router_group_topk": 1},
    )
    # one node per token, one of the 4: each other node gets a quarter of the tokens
    assert flex_traffic(ComputeModel(limited)).rdma == 0.25
    assert flex_traffic(ComputeModel(base)).rdma > 0.25


def test_fp8_dispatch_rows_carry_their_scales():
    scenario = moe_scenario(ep=8, dp=8, training={**FLEX, "fp8_format": "e4m3"})
    cm = ComputeModel(scenario)
    assert row_bytes(cm, True) == H + H / 128 * 4
    assert row_bytes(cm, False) == 2 * H


def test_flex_beats_alltoall_across_nodes_and_exact_mode_agrees():
    kwargs = {"experts": 32, "topk": 4, "ep": 16, "dp": 16, "nodes": 2}
    alltoall = run(moe_scenario(**kwargs)).metrics
    flex = moe_scenario(**kwargs, training=FLEX)
    metrics = run(flex).metrics
    assert 0 < metrics.breakdown_s[EP_COMM] < alltoall.breakdown_s[EP_COMM]
    exact = moe_scenario(
        **kwargs, training=FLEX, network={"model": "fair-share", "symmetry": False}
    )
    assert run(exact).metrics.iteration_time_s == pytest.approx(metrics.iteration_time_s, rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ep": 1, "training": FLEX}, "flex' needs parallel.expert_model_parallel_size > 1"),
        (
            {
                "tp": 2,
                "ep": 2,
                "dp": 4,
                "training": FLEX,
                "parallel": {"expert_tensor_parallel_size": 2},
            },
            "expert_tensor_parallel_size = 1 only",
        ),
        (
            {"ep": 8, "dp": 8, "training": FLEX, "model": {"moe_routing": "zipf"}},
            "balanced routing only",
        ),
        (
            {"ep": 8, "dp": 8, "training": FLEX, "model": {"moe_expert_capacity_factor": 1.0}},
            "dropless only",
        ),
        ({"model": {"moe_router_num_groups": 4}}, "needs model.moe_router_group_topk too"),
        (
            {"model": {"moe_router_num_groups": 3, "moe_router_group_topk": 1}},
            "must divide model.num_experts=8",
        ),
        (
            {"model": {"moe_router_num_groups": 2, "moe_router_group_topk": 3}},
            "must be <= model.moe_router_num_groups=2",
        ),
        (
            {"topk": 4, "model": {"moe_router_num_groups": 4, "moe_router_group_topk": 1}},
            "must be >= model.moe_router_topk=4",
        ),
    ],
)
def test_flex_and_group_rules(kwargs, match):
    with pytest.raises(ScenarioError, match=match):
        moe_scenario(**kwargs)

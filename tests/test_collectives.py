"""Routes, collectives and transfers on real cluster graphs, against closed forms."""

import re
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.comm import collectives
from stepsim.comm.collectives import Fabric, LayoutError
from stepsim.emit.lowering import lower
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from tests.helpers import load, time_transfers

TINY = str(Path(__file__).resolve().parent.parent / "scenarios" / "tiny-2gpu.toml")

GB = 1e9
NVLINK_STEP_S = 2e-6  # GPU -> NVSwitch -> GPU, 1 us a link
IB_STEP_S = 0.5e-6 + 2e-6 + 2e-6 + 0.5e-6  # PCIe, IB, IB, PCIe through one switch


def _fabric(base_latency_s=0.0, **cluster):
    """A cluster at line rate (the closed forms below), unless the test says otherwise."""
    cluster = {"nvlink_efficiency": 1.0, "nic_efficiency": 1.0, **cluster}
    c = build_cluster(load(cluster=cluster).cluster)
    return c, Fabric.of(c, base_latency_s)


def _busbw(cluster, collective, n, size):
    return size / time_transfers(cluster, collective) * 2 * (n - 1) / n


def test_routes_use_nvlink_inside_a_node_and_nics_between_nodes():
    cluster, _ = _fabric(num_nodes=2)
    assert [cluster.links[i].kind for i in cluster.route(0, 5)] == ["nvlink", "nvlink"]
    assert [cluster.links[i].kind for i in cluster.route(3, 11)] == ["pcie", "ib", "ib", "pcie"]
    # rail-optimized wiring: GPU 3 leaves through NIC 3, GPU 11 (local 3) is reached by NIC 3
    first, *_, last = (cluster.links[i] for i in cluster.route(3, 11))
    assert first.dst == ("nic", 0, 3) and last.src == ("nic", 1, 3)


def test_ring_all_reduce_on_one_nvswitch_node_matches_closed_form():
    cluster, fabric = _fabric(6e-6, num_nodes=1)
    n, size = 8, 1 * GB
    (ring,) = collectives.ring("all_reduce", [list(range(n))], size, fabric)
    expected = 6e-6 + 2 * (n - 1) * NVLINK_STEP_S + 2 * (n - 1) / n * size / (300 * GB)
    assert time_transfers(cluster, ring) == pytest.approx(expected, rel=1e-12)


def test_ring_across_nodes_is_bound_by_the_nic():
    cluster, fabric = _fabric(num_nodes=4)
    ring = collectives.ring("all_reduce", [[0, 8, 16, 24]], GB, fabric)  # one rail
    expected = 2 * 3 * IB_STEP_S + 2 * 3 / 4 * GB / (200e9 / 8)
    assert time_transfers(cluster, *ring) == pytest.approx(expected, rel=1e-12)


def test_a_group_with_eight_gpus_per_node_runs_eight_rings_one_per_nic():
    cluster, fabric = _fabric(num_nodes=2)
    group = list(range(16))
    channels = collectives.ring_channels(group, fabric)
    assert len(channels) == 8
    exits = {ch[7] for ch in channels}  # the GPU each ring leaves node 0 from
    assert exits == set(range(8))
    # bus bandwidth: 8 NICs of 25 GB/s (NVLink ports carry 8 rings at 37.5 GB/s each)
    ring = collectives.ring("all_reduce", [group], 16 * GB, fabric)
    assert _busbw(cluster, ring, 16, 16 * GB) == pytest.approx(8 * 25 * GB, rel=1e-3)


@pytest.mark.parametrize(
    "fabric",
    [
        {"fabric": "rail-optimized", "nodes_per_leaf": 4},
        {"fabric": "rail-optimized", "nodes_per_leaf": 2, "spine_switches": 8},
    ],
)
def test_rings_across_nodes_stay_on_their_rail(fabric):
    cluster, fab = _fabric(num_nodes=4, **fabric)
    group = list(range(32))
    for channel in collectives.ring_channels(group, fab):
        hops = [
            (a, b)
            for a, b in zip(channel, channel[1:] + channel[:1], strict=True)
            if a // 8 != b // 8
        ]
        assert len(hops) == 4 and all(a % 8 == b % 8 for a, b in hops)
    ring = collectives.ring("all_reduce", [group], 16 * GB, fab)
    assert _busbw(cluster, ring, 32, 16 * GB) == pytest.approx(8 * 25 * GB, rel=5e-3)


def test_reduce_scatter_and_all_gather_are_each_half_an_all_reduce_of_bytes():
    _, fabric = _fabric(num_nodes=1)
    (ar,) = collectives.ring("all_reduce", [list(range(4))], GB, fabric)
    (rs,) = collectives.ring("reduce_scatter", [list(range(4))], GB, fabric)
    (ag,) = collectives.ring("all_gather", [list(range(4))], GB, fabric)
    assert rs.bytes_per_flow == ag.bytes_per_flow == pytest.approx(ar.bytes_per_flow / 2)
    assert collectives.ring("all_reduce", [[3]], GB, fabric) is None


def test_hierarchical_all_reduce_by_phases():
    cluster, fabric = _fabric(num_nodes=4)
    group, size = list(range(32)), 8 * GB
    rs, inter, ag = collectives.two_level_all_reduce("hierarchical", [group], size, fabric)
    # inside nodes: ring reduce-scatter of S over 8 GPUs; across: 8 rings of S/8 over 4 nodes
    assert rs.bytes_per_flow == pytest.approx(7 / 8 * size)
    assert inter.bytes_per_flow == pytest.approx(2 * 3 / 4 * size / 8)
    expected = (
        7 * NVLINK_STEP_S
        + 7 / 8 * size / (300 * GB)
        + 2 * 3 * IB_STEP_S
        + 2 * 3 / 4 * (size / 8) / (25 * GB)
        + 7 * NVLINK_STEP_S
        + 7 / 8 * size / (300 * GB)
    )
    assert time_transfers(cluster, (rs, inter, ag)) == pytest.approx(expected, rel=1e-9)


def test_double_binary_tree_across_two_nodes():
    cluster, fabric = _fabric(num_nodes=2)
    (inter,) = collectives.two_level_all_reduce("tree", [[0, 8]], GB, fabric)
    # each tree sends half up and half down; both trees cross each NIC once per direction
    assert inter.bytes_per_flow == pytest.approx(GB / 2)
    assert time_transfers(cluster, inter) == pytest.approx(2 * IB_STEP_S + GB / 2 / (12.5 * GB))


def test_the_second_tree_turns_the_first_trees_leaves_into_inner_nodes():
    _, fabric = _fabric(num_nodes=7)
    group = [8 * n for n in range(7)]
    (inter,) = collectives.two_level_all_reduce("tree", [group], GB, fabric)
    first, _ = collectives._binary_tree_edges(group)
    second, _ = collectives._binary_tree_edges(group[::-1])
    inner = lambda edges: {parent for _, parent in edges}  # noqa: E731
    assert inner(first) == {0, 8, 16} and inner(second) == {48, 40, 32}
    # no node is inner in both trees, so a NIC sends on at most 4 edges: up and two
    # down in the tree where it is inner, up in the other
    assert max(inter.mults) == 4


def test_auto_picks_the_fastest_estimate_and_ring_inside_a_node():
    cluster, fabric = _fabric(6e-6, num_nodes=16)
    group = list(range(0, 128, 8))  # one GPU per node: tree latency grows with log n
    small = collectives.all_reduce("auto", [group], 1e3, fabric)
    large = collectives.all_reduce("auto", [group], 1e9, fabric)
    ring = collectives.all_reduce("ring", [group], 1e3, fabric)
    tree = collectives.all_reduce("tree", [group], 1e3, fabric)
    estimate = collectives.estimate_s
    assert estimate(tree, fabric.capacities) < estimate(ring, fabric.capacities)
    assert small == tree
    assert estimate(large, fabric.capacities) == min(
        estimate(collectives.all_reduce(a, [group], 1e9, fabric), fabric.capacities)
        for a in ("ring", "tree", "hierarchical")
    )
    inside = list(range(8))
    assert collectives.all_reduce("tree", [inside], GB, fabric) == collectives.ring(
        "all_reduce", [inside], GB, fabric
    )


@pytest.mark.parametrize("node, rings", [("dgx-1-v100", 6), ("v100x4", 6)])
def test_nvlink_mesh_rings_use_every_lane(node, rings):
    cluster, fabric = _fabric(node=node, num_nodes=1)
    n = cluster.gpus_per_node
    channels = cluster.intra_node_rings(list(range(n)))
    assert len(channels) == rings
    # six lanes of 25 GB/s per GPU per direction, all busy: bus bandwidth 150 GB/s
    ring = collectives.ring("all_reduce", [list(range(n))], 10 * GB, fabric)
    assert _busbw(cluster, ring, n, 10 * GB) == pytest.approx(150 * GB, rel=1e-3)


def test_gpus_sharing_one_nic_split_it():
    cluster, fabric = _fabric(node="v100x4", num_nodes=2)
    pairs = [(j, 4 + j) for j in range(4)]
    send = collectives.point_to_point(pairs, GB, fabric)
    assert time_transfers(cluster, send) == pytest.approx(IB_STEP_S + GB / (50 * GB / 4))
    # one sender alone is limited by its PCIe link (16 GB/s), not the 50 GB/s NIC
    alone = collectives.point_to_point(pairs[:1], GB, fabric)
    assert time_transfers(cluster, alone) == pytest.approx(IB_STEP_S + GB / (16 * GB))


def test_oversubscribed_uplink_is_shared_by_the_leaf():
    # 2 nodes per leaf, 2:1 oversubscribed, one spine: the leaf's uplink carries
    # 2 x 8 x 25 / 2 = 200 GB/s; all 16 GPUs of leaf 0 send to leaf 1 at once.
    cluster, fabric = _fabric(
        num_nodes=4, fabric="fat-tree", nodes_per_leaf=2, oversubscription=2.0, spine_switches=1
    )
    pairs = [(g, g + 16) for g in range(16)]
    send = collectives.point_to_point(pairs, GB, fabric)
    latency = 0.5e-6 + 4 * 2e-6 + 0.5e-6
    assert time_transfers(cluster, send) == pytest.approx(latency + GB / (200 * GB / 16))
    # within a leaf nothing is oversubscribed
    local = collectives.point_to_point([(g, g + 8) for g in range(8)], GB, fabric)
    assert time_transfers(cluster, local) == pytest.approx(IB_STEP_S + GB / (25 * GB))


def test_tensor_ring_and_pipeline_send_share_an_nvlink_port():
    cluster, fabric = _fabric(num_nodes=1)
    (ring,) = collectives.ring("all_reduce", [[0, 1]], 2 * GB, fabric)  # 2 GB per edge
    send = collectives.point_to_point([(0, 1)], 2 * GB, fabric)
    alone = time_transfers(cluster, ring)
    both = time_transfers(cluster, ring, send)
    assert alone == pytest.approx(4e-6 + 2 * GB / (300 * GB))  # 2 steps of 2 us
    # The send (2 us latency) streams alone at 300 GB/s until the ring's 4 us latency is
    # paid, then GPU 0's port is shared 150/150 until the send ends, then the ring has it.
    head = 2e-6 * 300 * GB
    expected = 4e-6 + (2 * GB - head) / (150 * GB) + head / (300 * GB)
    assert both == pytest.approx(expected, rel=1e-9)


UNLIKE = (
    "GPUs 2->6 are connected unlike GPUs 0->4, which stepsim simulates on their behalf; "
    "choose tensor x data parallel sizes that split the nodes into alike groups (on a hybrid "
    "cube-mesh: 1, 4 or 8 GPUs, not pairs across quads)"
)
# one DGX-1: stage 0 on GPUs 0-3, stage 1 on 4-7; 0->4 has two NVLink lanes, 2->6 one
CUBE_MESH_PAIRS = {
    "cluster": {"node": "dgx-1-v100", "num_nodes": 1},
    "parallel": {"pipeline_model_parallel_size": 2, "data_parallel_size": 4},
    "training": {"global_batch_size": 16},
}


def test_groups_connected_unlike_are_a_layout_error_of_the_workload():
    scenario = load(**CUBE_MESH_PAIRS)
    with pytest.raises(LayoutError, match=re.escape(UNLIKE)) as info:
        lower(scenario, build_cluster(scenario.cluster))
    assert str(info.value) == UNLIKE
    assert not isinstance(info.value, ScenarioError)


def test_groups_connected_unlike_are_the_users_one_line_error(capsys):
    with pytest.raises(ScenarioError, match=re.escape(UNLIKE)) as info:
        run(load(**CUBE_MESH_PAIRS))
    assert str(info.value) == UNLIKE
    sets = [
        "cluster.node=dgx-1-v100",
        "cluster.gpus_per_node=8",
        "cluster.nics_per_node=4",
        "parallel.data_parallel_size=4",
        "training.global_batch_size=16",
    ]
    argv = ["run", TINY, "--quiet", *(arg for item in sets for arg in ("--set", item))]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"stepsim: error: {UNLIKE}\n"

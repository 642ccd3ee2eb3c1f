"""Set-up by pattern: a cluster from its repeating unit (one switch, fat trees, rails),
and symmetric lowering that leaves out copies and moves stages instead of building them.

Both are exact rewrites of the enumeration they replace, so each test compares the
two paths on small clusters, link by link, route by route, transfer by transfer:
every node kind, one switch and fat trees (2 and 3 levels, rails), several DP sizes,
layouts where a stage is smaller than a server (nothing moved: the fallback), and a
layout the alike check refuses (the same message either way).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from stepsim.comm import collectives, placement
from stepsim.comm.collectives import LayoutError
from stepsim.emit.lowering import lower
from stepsim.ir.flows import Transfer
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from stepsim.topologies import (
    Cluster,
    FabricShape,
    NodeShape,
    PatternCluster,
    TreePatternCluster,
    build_graph,
)
from stepsim.topologies import pattern as pattern_module
from tests.helpers import load

NODES = {  # (nvlink topology, GPUs, NICs): one GPU per NIC, shared NICs, meshes
    "dgx": ("nvswitch", 8, 8),
    "shared-nic": ("nvswitch", 8, 2),
    "v100x4": ("all-to-all", 4, 1),
    "dgx1": ("hybrid-cube-mesh", 8, 4),
    "one-gpu": ("nvswitch", 1, 1),
}
ONE_SWITCH = (
    FabricShape(kind="switch", latency_s=5e-7),
    FabricShape(kind="fat-tree", nodes_per_leaf=8, latency_s=1e-7),  # all under one leaf
)


def _shape(topology: str, gpus: int, nics: int) -> NodeShape:
    return NodeShape(
        gpus=gpus,
        nics=nics,
        nvlink_topology=topology,
        nvlink_bytes_per_s=2.4e11,
        nvlink_latency_s=1e-6,
        pcie_bytes_per_s=2.5e10,
        pcie_latency_s=2e-6,
        nic_bytes_per_s=2.4e10,
    )


@pytest.mark.parametrize("kind", NODES)
@pytest.mark.parametrize("fabric", ONE_SWITCH, ids=["switch", "fat-tree-one-leaf"])
@pytest.mark.parametrize("num_nodes", [1, 2, 3, 5])
def test_the_pattern_gives_the_whole_graphs_links_routes_and_rings(kind, fabric, num_nodes):
    node = _shape(*NODES[kind])
    gpn = node.gpus
    whole = Cluster(
        build_graph(num_nodes, node, fabric, nvlink_domain_gpus=gpn),
        gpus_per_node=gpn,
        nvlink_domain_gpus=gpn,
    )
    pattern = PatternCluster(num_nodes, node, fabric, nvlink_domain_gpus=gpn)
    assert len(pattern.links) == len(whole.links)
    assert list(pattern.links) == whole.links
    assert pattern.capacities == whole.capacities
    assert pattern.links[-1] == whole.links[-1]
    assert [pattern.link_role(i) for i in range(len(whole.links))] == [
        whole.link_role(i) for i in range(len(whole.links))
    ]
    shuffled = np.random.default_rng(0).permutation(len(whole.links))  # any order, on arrays
    assert pattern.link_roles(shuffled) == [whole.link_role(i) for i in shuffled.tolist()]
    for a in range(whole.num_gpus):
        for b in range(whole.num_gpus):
            route = whole.route(a, b)
            assert pattern.route(a, b) == route, (a, b)
            assert pattern.route_latency_s(route) == whole.route_latency_s(route)
            for k in range(num_nodes - max(a, b) // gpn):  # moved by whole servers
                assert pattern.route(a + k * gpn, b + k * gpn) == pattern.translate(route, k)
    for n in range(num_nodes):
        members = list(range(n * gpn, (n + 1) * gpn))
        assert pattern.intra_node_rings(members) == whole.intra_node_rings(members)
    assert list(pattern.graph.edges()) == list(whole.graph.edges())  # drawn when asked


TREES = (
    FabricShape(kind="fat-tree", nodes_per_leaf=2, spines=2, latency_s=1e-7),
    FabricShape(kind="fat-tree", nodes_per_leaf=2, spines=3, oversubscription=2.0),
    FabricShape(kind="fat-tree", levels=3, nodes_per_leaf=1, leaves_per_pod=2, spines=2),
    FabricShape(
        kind="fat-tree", levels=3, nodes_per_leaf=2, leaves_per_pod=2, oversubscription=2.0
    ),
    FabricShape(kind="rail-optimized", nodes_per_leaf=2, spines=2, latency_s=1e-7),
    FabricShape(kind="rail-optimized", nodes_per_leaf=1, spines=4),
)
TREE_NODES = {
    "dgx4": ("nvswitch", 4, 4),
    "shared-nic": ("nvswitch", 4, 2),
    "v100x4": NODES["v100x4"],
}


@pytest.mark.parametrize("kind", TREE_NODES)
@pytest.mark.parametrize(
    "fabric", TREES, ids=["ft", "ft-oversub", "ft3", "ft3-2", "rails", "rails-1"]
)
@pytest.mark.parametrize("num_nodes", [3, 8])
def test_the_tree_pattern_gives_the_whole_graphs_links_and_routes(kind, fabric, num_nodes):
    node = _shape(*TREE_NODES[kind])
    gpn = node.gpus
    whole = Cluster(
        build_graph(num_nodes, node, fabric, nvlink_domain_gpus=gpn),
        gpus_per_node=gpn,
        nvlink_domain_gpus=gpn,
    )
    pattern = TreePatternCluster(num_nodes, node, fabric, nvlink_domain_gpus=gpn)
    assert list(pattern.links) == whole.links
    assert pattern.capacities == whole.capacities
    assert [pattern.link_role(i) for i in range(len(whole.links))] == [
        whole.link_role(i) for i in range(len(whole.links))
    ]
    shuffled = np.random.default_rng(0).permutation(len(whole.links))  # any order, on arrays
    assert pattern.link_roles(shuffled) == [whole.link_role(i) for i in shuffled.tolist()]
    moved = 0
    for a in range(whole.num_gpus):
        for b in range(whole.num_gpus):
            route = whole.route(a, b)
            assert pattern.route(a, b) == route, (a, b)
            assert pattern.route_latency_s(route) == whole.route_latency_s(route)
            for k in range(1, num_nodes):
                last = max(a, b) // gpn + k
                if last < num_nodes and pattern.moves(last, k):
                    assert pattern.route(a + k * gpn, b + k * gpn) == pattern.translate(route, k)
                    moved += 1
    assert moved or pattern.shift_nodes * 2 > num_nodes  # some moves were checked


@pytest.mark.parametrize("kind", ["dgx", "shared-nic"])
def test_a_long_tuple_of_links_moves_as_each_link_does(kind):
    """`translate` moves tuples over 256 links on an array: each link where the loop
    moves it alone (server links and switch ports, in any order)."""
    pattern = PatternCluster(64, _shape(*NODES[kind]), ONE_SWITCH[0], nvlink_domain_gpus=8)
    half = [
        i for i in range(pattern.num_links) if pattern.translate((i,), 1)[0] < pattern.num_links
    ]
    links = tuple(np.random.default_rng(2).permutation(half).tolist())
    assert len(links) > 256
    moved = pattern.translate(links, 1)
    assert moved == tuple(pattern.translate((i,), 1)[0] for i in links)
    assert all(type(i) is int for i in moved)


@pytest.mark.parametrize("kind", ["dgx", "shared-nic", "dgx1"])
def test_the_slowest_hop_is_the_slowest_route_of_all_edges(kind):
    """`slowest_hop_s` asks one route per unit path: the greatest latency of every
    edge's route, to the bit (edges inside servers and between them, any order)."""
    pattern = PatternCluster(16, _shape(*NODES[kind]), ONE_SWITCH[0], nvlink_domain_gpus=8)
    rng = np.random.default_rng(3)
    for _ in range(5):
        pairs = rng.integers(0, pattern.num_gpus, (300, 2)).tolist()
        edges = [(a, b) for a, b in pairs if a != b]
        every = max(pattern.route_latency_s(pattern.route(a, b)) for a, b in edges)
        assert pattern.slowest_hop_s(edges) == every
    inside = [(0, 1), (9, 10)]  # inside servers only: not the switch's latency
    assert pattern.slowest_hop_s(inside) == max(
        pattern.route_latency_s(pattern.route(a, b)) for a, b in inside
    )
    assert pattern.slowest_hop_s([]) is None


def test_build_cluster_uses_the_pattern_only_when_asked():
    one = load(cluster={"num_nodes": 4})
    assert isinstance(build_cluster(one.cluster, pattern=True), PatternCluster)
    assert isinstance(build_cluster(one.cluster), Cluster)  # the whole graph by default
    for cluster in (
        {"fabric": "fat-tree", "nodes_per_leaf": 2},
        {"fabric": "fat-tree", "nodes_per_leaf": 1, "fabric_levels": 3, "leaves_per_pod": 2},
        {"fabric": "rail-optimized", "nodes_per_leaf": 2},
    ):
        spec = load(cluster={"num_nodes": 4, **cluster}).cluster
        assert isinstance(build_cluster(spec, pattern=True), TreePatternCluster), cluster
        assert isinstance(build_cluster(spec), Cluster), cluster


def _transfers(scenario, cluster) -> list:
    workload = lower(scenario, cluster)
    return [(op.lane, op.label, op.transfer) for op in workload.ops if op.transfer is not None]


# layouts over 8-GPU servers: (tp, pp, dp, nodes); a stage of TP 2 x DP 2 is half a
# server, so nothing is moved between stages (the fallback to building each one)
LAYOUTS = [(8, 2, 1, 2), (8, 2, 2, 4), (8, 4, 4, 16), (4, 2, 4, 4), (2, 2, 2, 1), (1, 4, 8, 4)]
LAYOUTS += [(8, 2, 2, 5), (8, 1, 4, 5)]  # a leaf group part filled (fat trees of 2 per leaf)
TRAINING = (
    {"global_batch_size": 16},
    {"global_batch_size": 16, "overlap_grad_reduce": True, "data_parallel_sharding": "optimizer"},
)


FABRIC_KEYS = {
    "switch": {},
    "fat-tree": {"fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2},
    "fat-tree-3": {
        "fabric": "fat-tree",
        "fabric_levels": 3,
        "nodes_per_leaf": 1,
        "leaves_per_pod": 2,
        "spine_switches": 2,
    },
    "rails": {"fabric": "rail-optimized", "nodes_per_leaf": 2, "spine_switches": 2},
}


# every fabric with every layout, but a one-server cluster only on one switch (one
# server is one leaf: a tree has nothing to route)
LOWERING_CASES = [
    pytest.param(
        layout,
        nics,
        training,
        fabric,
        id="{}-{}-{}-tp{}-pp{}-dp{}-n{}".format(fabric, name, nics, *layout),
    )
    for fabric in FABRIC_KEYS
    for training, name in zip(TRAINING, ("1f1b", "zero1-buckets"), strict=True)
    for nics in (8, 2)
    for layout in LAYOUTS
    if fabric == "switch" or layout[3] > 1
]


@pytest.mark.parametrize(("layout", "nics", "training", "fabric"), LOWERING_CASES)
def test_symmetric_lowering_on_the_pattern_builds_the_same_transfers(
    monkeypatch, layout, nics, training, fabric
):
    tp, pp, dp, nodes = layout
    scenario = load(
        cluster={"num_nodes": nodes, "nics_per_node": nics, **FABRIC_KEYS[fabric]},
        parallel={
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "data_parallel_size": dp,
        },
        training=training,
        network={"collective_algorithm": "auto"},
    )
    pattern = build_cluster(scenario.cluster, pattern=True)
    assert isinstance(pattern, PatternCluster | TreePatternCluster)
    expected = _transfers(scenario, build_cluster(scenario.cluster))  # every copy, every stage
    assert _transfers(scenario, pattern) == expected
    phases = [p for _, _, t in expected for p in ((t,) if isinstance(t, Transfer) else t)]
    assert any(m > 1 for p in phases for m in p.mults) or nics == 8 or nodes == 1  # shared NICs
    # what large runs do on arrays and in the run's memo, here at every size: the copies
    # kept (placement), their routes counted (collectives._counted, memo keys) and the
    # moved stages' links (translate)
    monkeypatch.setattr(collectives, "MEMO_EDGES", 0)
    monkeypatch.setattr(placement, "_ARRAY_OFFSETS", 0)
    monkeypatch.setattr(pattern_module, "_ARRAY_LINKS", 0)
    assert _transfers(scenario, build_cluster(scenario.cluster, pattern=True)) == expected


def test_a_layout_wired_unlike_its_copies_is_refused_alike_on_the_pattern():
    # two DGX-1, a stage on each quad: GPU 0 -> 4 has two NVLink lanes, 2 -> 6 one
    scenario = load(
        cluster={"node": "dgx-1-v100", "num_nodes": 2},
        parallel={"pipeline_model_parallel_size": 4, "data_parallel_size": 4},
        training={"global_batch_size": 16},
    )
    messages = []
    for cluster in (build_cluster(scenario.cluster), build_cluster(scenario.cluster, pattern=True)):
        with pytest.raises(LayoutError, match=r"^GPUs \d+->\d+ are connected unlike") as info:
            lower(scenario, cluster)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    with pytest.raises(ScenarioError, match=r"are connected unlike GPUs"):
        run(scenario)


def test_a_symmetric_run_over_the_gpu_limit_runs(monkeypatch):
    monkeypatch.setenv("STEPSIM_MAX_GPUS", "16")
    sets = {
        "cluster": {"num_nodes": 4},
        "parallel": {
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 2,
        },
    }
    result = run(load(**sets))  # 32 GPUs, two servers built
    assert isinstance(result.cluster, PatternCluster)
    with pytest.raises(ScenarioError, match=r"about 32 GPUs, over the limit of 16 GPUs"):
        load(**sets, network={"model": "fair-share", "symmetry": False})


# a rack-scale NVLink domain as one node: 72 GPUs on one NVSwitch, a NIC per GPU
# (the gb200-nvl72 / gb300-nvl72 presets); checked on fewer nodes, every pair routed
NVL72 = ("nvswitch", 72, 72)


@pytest.mark.parametrize(
    ("fabric", "num_nodes"),
    [(ONE_SWITCH[0], 1), (ONE_SWITCH[0], 2), (TREES[0], 3), (TREES[5], 3)],
    ids=["switch-1", "switch-2", "ft-3", "rails-3"],
)
def test_a_72_gpu_node_gives_the_same_links_and_routes_on_the_pattern(fabric, num_nodes):
    node = _shape(*NVL72)
    whole = Cluster(
        build_graph(num_nodes, node, fabric, nvlink_domain_gpus=72),
        gpus_per_node=72,
        nvlink_domain_gpus=72,
    )
    kind = PatternCluster if fabric.kind == "switch" else TreePatternCluster
    pattern = kind(num_nodes, node, fabric, nvlink_domain_gpus=72)
    assert list(pattern.links) == whole.links
    assert pattern.capacities == whole.capacities
    assert [pattern.link_role(i) for i in range(len(whole.links))] == [
        whole.link_role(i) for i in range(len(whole.links))
    ]
    shuffled = np.random.default_rng(0).permutation(len(whole.links))  # any order, on arrays
    assert pattern.link_roles(shuffled) == [whole.link_role(i) for i in shuffled.tolist()]
    for a in range(whole.num_gpus):
        for b in range(whole.num_gpus):
            assert pattern.route(a, b) == whole.route(a, b), (a, b)
    for n in range(num_nodes):
        members = list(range(n * 72, (n + 1) * 72))
        assert pattern.intra_node_rings(members) == whole.intra_node_rings(members) == [members]


@pytest.mark.parametrize("fabric", ["switch", "rails"])
@pytest.mark.parametrize("node", ["gb200-nvl72", "gb300-nvl72"])
def test_symmetric_lowering_over_nvl72_racks_builds_the_same_transfers(node, fabric):
    """TP 8 x DP 9 fills a rack (one stage per NVLink domain), PP 4 spans four racks."""
    rails = {"fabric": "rail-optimized", "nodes_per_leaf": 2, "spine_switches": 2}
    scenario = load(
        cluster={"node": node, "num_nodes": 4, **(rails if fabric == "rails" else {})},
        parallel={
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 4,
            "data_parallel_size": 9,
        },
        training={"global_batch_size": 18},
        network={"collective_algorithm": "auto"},
    )
    pattern = build_cluster(scenario.cluster, pattern=True)
    assert isinstance(pattern, PatternCluster | TreePatternCluster)
    expected = _transfers(scenario, build_cluster(scenario.cluster))
    assert expected and _transfers(scenario, pattern) == expected


def test_the_copies_kept_are_found_alike_on_arrays_and_in_a_loop(monkeypatch):
    """`_kept` on arrays (over `_ARRAY_OFFSETS` offsets) keeps the copies the loop keeps,
    in order: the first of each offset modulo a region, and a later one only where it
    moves a GPU of the representative into one of its servers (a p2p pair's copy moved
    onto its other end)."""
    kept = placement.StageComm._kept
    rng = np.random.default_rng(3)
    later = 0
    for region in (8, 16, 72):
        pattern = SimpleNamespace(region_gpus=region)
        owner = SimpleNamespace(fabric=SimpleNamespace(pattern=pattern))
        for _ in range(40):
            size = int(rng.integers(1, 5))
            rep = sorted(rng.choice(6 * region, size=size, replace=False).tolist())
            offsets = sorted(rng.choice(40 * region, size=300, replace=False).tolist())
            monkeypatch.setattr(placement, "_ARRAY_OFFSETS", 10**9)
            by_loop = kept(owner, rep, offsets)
            monkeypatch.setattr(placement, "_ARRAY_OFFSETS", 0)
            assert kept(owner, rep, offsets) == by_loop
            later += len(by_loop) - len({o % region for o in offsets})
    assert later > 0  # some later copies shared a server, and were kept

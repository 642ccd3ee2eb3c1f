"""Rail-only and multi-plane fabrics: drawing, routes (NVLink forwarding between rails
or planes), rules, the whole-graph set-up in symmetric mode, the topology command."""

import pytest

from stepsim.comm import collectives
from stepsim.comm.collectives import Fabric
from stepsim.engine.core import simulate
from stepsim.engine.network import FairShareNetwork
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import TP_COMM
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from stepsim.topologies import Cluster
from stepsim.topologies.describe import summarize
from tests.helpers import load


def _cluster(**cluster):
    cluster = {"nvlink_efficiency": 1.0, "nic_efficiency": 1.0, **cluster}  # line rate
    return build_cluster(load(cluster=cluster).cluster)


def _hops(cluster, src, dst):
    return [cluster.links[i] for i in cluster.route(src, dst)]


def test_rail_only_same_rail_crosses_one_switch_other_rails_nvlink_first():
    cluster = _cluster(num_nodes=4, fabric="rail-only", nodes_per_leaf=4)
    same = _hops(cluster, 3, 2 * 8 + 3)  # local GPU 3 to local GPU 3 of node 2
    assert [h.kind for h in same] == ["pcie", "ib", "ib", "pcie"]
    assert [h.dst for h in same if h.dst[0] == "switch"] == [("switch", 1, 3)]
    cross = _hops(cluster, 1, 2 * 8 + 5)  # rail 1 to rail 5: over to GPU 5, then rail 5
    assert [h.kind for h in cross] == ["nvlink", "nvlink", "pcie", "ib", "ib", "pcie"]
    assert cross[1].dst == ("gpu", 5) and cross[2].dst == ("nic", 0, 5)
    assert [h.dst for h in cross if h.dst[0] == "switch"] == [("switch", 1, 5)]
    summary = summarize(cluster.graph, 8)
    assert summary["switches_by_level"] == {1: 8}
    assert summary["bisection_bytes_per_s"] == pytest.approx(2 * 8 * 25e9)  # 2 nodes x 8 NICs


def test_multi_plane_keeps_each_nics_traffic_in_its_plane():
    """8 planes, leaf groups of 2 nodes, 2 spines per plane: NIC i's traffic to any
    other node touches plane i's leaves and spines only."""
    cluster = _cluster(num_nodes=8, fabric="multi-plane", nodes_per_leaf=2, spine_switches=2)
    assert summarize(cluster.graph, 8)["switches_by_level"] == {1: 32, 2: 16}
    for i in range(8):
        for node in range(1, 8):
            switches = [h.dst for h in _hops(cluster, i, node * 8 + i) if h.dst[0] == "switch"]
            assert switches and all(
                (s[2] % 8 if s[1] == 1 else s[2] // 2) == i for s in switches
            ), (i, node, switches)
    cross = _hops(cluster, 0, 7 * 8 + 6)
    assert [h.kind for h in cross[:2]] == ["nvlink", "nvlink"] and cross[1].dst == ("gpu", 6)


def test_multi_plane_with_fewer_planes_than_nics():
    cluster = _cluster(num_nodes=4, fabric="multi-plane", fabric_planes=2, nodes_per_leaf=2)
    summary = summarize(cluster.graph, 8)
    assert summary["switches_by_level"] == {1: 4, 2: 8}  # 2 groups x 2 planes; 4 spines each
    same_plane = [h.kind for h in _hops(cluster, 0, 3 * 8 + 2)]  # NIC 2 of node 3: plane 0
    assert same_plane == ["pcie", "ib", "ib", "ib", "ib", "pcie"]
    assert _hops(cluster, 0, 3 * 8 + 1)[0].kind == "nvlink"  # plane 1


def _all_reduce_s(cluster, group, size, algorithm="ring"):
    fabric = Fabric.of(cluster, 6e-6)
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    collective = collectives.all_reduce(algorithm, [group], size, fabric)
    builder.add(lane, TP_COMM, "all-reduce", transfer=collective)
    capacities = [link.bandwidth_bytes_per_s for link in cluster.links]
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


def test_a_ring_over_nodes_on_rail_only_equals_rail_optimized_when_on_rails():
    """A ring with one channel per local GPU over an even number of nodes stays on its
    rail (ring_channels), so no spine is crossed on rail-optimized and both fabrics give
    the same time; over an odd number the hop closing the ring changes rail, which
    rail-only forwards over NVLink."""
    for nodes in (2, 4):
        rails = _cluster(num_nodes=nodes, fabric="rail-optimized", nodes_per_leaf=nodes)
        only = _cluster(num_nodes=nodes, fabric="rail-only", nodes_per_leaf=nodes)
        group = list(range(nodes * 8))
        for size in (1e6, 1e9):
            assert _all_reduce_s(only, group, size) == _all_reduce_s(rails, group, size)
    plane = _cluster(num_nodes=4, fabric="multi-plane", nodes_per_leaf=2)
    tree = _cluster(num_nodes=4, fabric="rail-optimized", nodes_per_leaf=2)
    assert _all_reduce_s(plane, list(range(32)), 1e9) == _all_reduce_s(tree, list(range(32)), 1e9)


def test_plane_fabric_rules():
    rail_only = r"num_nodes=20 must be <= cluster.nodes_per_leaf=16: a rail-only"
    with pytest.raises(ScenarioError, match=rail_only):
        load(cluster={"node": "dgx-h100", "num_nodes": 20, "fabric": "rail-only"})
    planes = r"cluster.fabric_planes=3 must divide cluster.nics_per_node=8"
    with pytest.raises(ScenarioError, match=planes):
        load(cluster={"node": "dgx-h100", "fabric": "multi-plane", "fabric_planes": 3})


def test_symmetric_mode_builds_the_whole_graph_and_matches_exact_mode():
    sets = {
        "cluster": {
            "node": "dgx-h100",
            "num_nodes": 4,
            "fabric": "multi-plane",
            "nodes_per_leaf": 2,
            "spine_switches": 2,
        },
        "parallel": {"tensor_model_parallel_size": 4, "data_parallel_size": 8},
        "training": {"global_batch_size": 16},
    }
    symmetric = load(**sets)
    assert isinstance(build_cluster(symmetric.cluster, pattern=True), Cluster)
    exact = load(**sets, network={"symmetry": False})
    a, b = run(symmetric).metrics, run(exact).metrics
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)

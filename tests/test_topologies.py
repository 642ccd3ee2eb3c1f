"""Cluster graphs: builders, routes and their routing rule, bisection, the topology command."""

import networkx as nx
import pytest

from stepsim.cli import main
from stepsim.run.iteration import build_cluster
from stepsim.scenario.presets import NODES
from stepsim.topologies import Cluster, FabricShape, NodeShape, build_graph
from stepsim.topologies.describe import summarize
from tests.helpers import load


def _cluster(**cluster):
    cluster = {"nvlink_efficiency": 1.0, "nic_efficiency": 1.0, **cluster}  # line rate
    return build_cluster(load(cluster=cluster).cluster)


@pytest.mark.parametrize(
    "fabric, switches, bisection_gb_per_s",
    [
        ({"fabric": "switch"}, {1: 1}, 8 * 8 * 25),
        ({"fabric": "fat-tree", "nodes_per_leaf": 4}, {1: 4, 2: 4}, 8 * 8 * 25),
        (
            {"fabric": "fat-tree", "nodes_per_leaf": 4, "oversubscription": 2.0},
            {1: 4, 2: 4},
            8 * 8 * 25 / 2,
        ),
        ({"fabric": "rail-optimized", "nodes_per_leaf": 4}, {1: 32, 2: 4}, 8 * 8 * 25),
        (
            {
                "fabric": "fat-tree",
                "fabric_levels": 3,
                "nodes_per_leaf": 2,
                "leaves_per_pod": 2,
                "oversubscription": 2.0,
            },
            {1: 8, 2: 16, 3: 4},
            8 * 8 * 25 / 4,
        ),
    ],
)
def test_fabrics_switch_counts_and_bisection(fabric, switches, bisection_gb_per_s):
    summary = summarize(_cluster(num_nodes=16, **fabric).graph, 8)
    assert summary["num_gpus"] == 128 and summary["num_nics"] == 128
    assert summary["switches_by_level"] == switches
    assert summary["bisection_bytes_per_s"] == pytest.approx(bisection_gb_per_s * 1e9)


def test_rail_optimized_keeps_same_rail_traffic_on_one_leaf():
    cluster = _cluster(num_nodes=8, fabric="rail-optimized", nodes_per_leaf=4)
    hops = [cluster.links[i].dst for i in cluster.route(3, 8 * 2 + 3)]  # rail 3, same group
    assert [h for h in hops if h[0] == "switch"] == [("switch", 1, 3)]
    cross = [cluster.links[i].dst for i in cluster.route(3, 8 * 5 + 3)]  # rail 3, other group
    assert [h[1] for h in cross if h[0] == "switch"] == [1, 2, 1]


def test_destination_based_routing_spreads_destinations_over_spines():
    cluster = _cluster(num_nodes=8, fabric="fat-tree", nodes_per_leaf=4)

    def spine(src, dst):
        (hop,) = [
            cluster.links[i].dst
            for i in cluster.route(src, dst)
            if cluster.links[i].dst[:2] == ("switch", 2)
        ]
        return hop[2]

    # destination NIC port mod 4 spines: GPUs 32..39 sit on ports 32..39
    assert [spine(g, 32 + g) for g in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert spine(0, 40) == spine(5, 40) == spine(17, 40)  # by destination only


def test_mesh_routes_take_a_direct_link_or_two_hops():
    cluster = _cluster(node="dgx-1-v100", num_nodes=1)
    assert len(cluster.route(0, 3)) == 1
    two = cluster.route(0, 7)  # not adjacent in the cube-mesh
    assert len(two) == 2 and cluster.links[two[0]].dst[0] == "gpu"
    assert cluster.links[cluster.route(0, 3)[0]].bandwidth_bytes_per_s == pytest.approx(50e9)


def test_topology_command_prints_and_draws(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert (
        main(
            [
                "topology",
                "scenarios/tiny-2gpu.toml",
                "--set",
                "cluster.num_nodes=4",
                "--set",
                "cluster.fabric=fat-tree",
                "--set",
                "cluster.nodes_per_leaf=2",
                "--png",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # two nodes' 200 Gb/s NICs each way, at the 96 % of line rate NCCL reaches
    assert "bisection bandwidth: 96 GB/s" in out and "2 leaf" in out
    assert png.read_bytes().startswith(b"\x89PNG")
    assert main(["topology", "scenarios/mt-nlg-530b-420nodes.toml", "--png", str(png)]) == 2


@pytest.mark.parametrize("node", sorted(NODES))
def test_every_node_preset_is_one_server_that_is_its_own_nvlink_domain(node):
    spec = load(cluster={"node": node, "num_nodes": 3}).cluster
    assert spec.nvlink_domain_gpus == spec.gpus_per_node
    cluster = build_cluster(spec)
    nvlink = nx.Graph((a, b) for a, b, kind in cluster.graph.edges(data="kind") if kind == "nvlink")
    domains = sorted(
        sorted(n[1] for n in c if n[0] == "gpu") for c in nx.connected_components(nvlink)
    )
    gpn = spec.gpus_per_node
    assert domains == [list(range(d * gpn, (d + 1) * gpn)) for d in range(3)]
    assert [cluster.nvlink_domain_of(g) for g in (0, gpn - 1, gpn, 3 * gpn - 1)] == [0, 0, 1, 2]
    # inside a domain only NVLink, between domains out through the GPU's NIC
    assert {cluster.links[i].kind for i in cluster.route(0, gpn - 1)} == {"nvlink"}
    assert cluster.links[cluster.route(gpn - 1, gpn)[0]].dst == ("nic", 0, spec.nics_per_node - 1)


def test_an_nvlink_domain_spanning_servers_is_refused_by_name():
    """A GB200 NVL72 rack: one NVLink domain of 72 GPUs over 18 servers of 4."""
    node = NodeShape(
        gpus=4,
        nics=4,
        nvlink_topology="nvswitch",
        nvlink_bytes_per_s=900e9,
        nvlink_latency_s=1e-6,
        pcie_bytes_per_s=64e9,
        pcie_latency_s=0.5e-6,
        nic_bytes_per_s=50e9,
    )
    message = (
        "an NVLink domain of 72 GPUs over servers of 4 is not modelled: "
        "each server must be its own NVLink domain"
    )
    with pytest.raises(ValueError, match=message):
        build_graph(18, node, FabricShape(), nvlink_domain_gpus=72)
    graph = build_graph(18, node, FabricShape(), nvlink_domain_gpus=4)
    with pytest.raises(ValueError, match=message):
        Cluster(graph, gpus_per_node=4, nvlink_domain_gpus=72)


@pytest.mark.parametrize(
    "fabric",
    [
        {"fabric": "fat-tree", "fabric_levels": 3, "nodes_per_leaf": 2, "leaves_per_pod": 2},
        {"fabric": "rail-optimized", "nodes_per_leaf": 4},
        {"fabric": "fat-tree", "nodes_per_leaf": 4, "oversubscription": 2.0},
    ],
)
def test_switch_paths_are_every_shortest_path_from_one_search_per_source(fabric):
    """The routes' switch paths, built from one breadth-first search per source switch,
    are exactly networkx's all_shortest_paths for every pair of switches, sorted."""
    cluster = _cluster(num_nodes=16, **fabric)
    switches = nx.DiGraph(cluster._switches.edges())
    nodes = sorted(switches)
    for a in nodes:
        for b in nodes:
            if a != b:
                expected = sorted(nx.all_shortest_paths(switches, a, b))
                assert cluster._switch_paths_between(a, b) == expected


@pytest.mark.parametrize(("node", "nic_gb_per_s"), [("gb200-nvl72", 50), ("gb300-nvl72", 100)])
def test_an_nvl72_rack_is_one_72_gpu_nvlink_domain_with_a_nic_per_gpu(node, nic_gb_per_s):
    """Two racks on one switch: per rack 72 NVLink cables (GPU <-> NVSwitch), 72 PCIe
    (GPU <-> its own NIC) and 72 InfiniBand (NIC <-> switch), two directed links each;
    the bisection is one rack's 72 NICs."""
    spec = load(cluster={"node": node, "num_nodes": 2, "nic_efficiency": 1.0}).cluster
    assert (spec.gpus_per_node, spec.nics_per_node, spec.nvlink_domain_gpus) == (72, 72, 72)
    cluster = build_cluster(spec)
    summary = summarize(cluster.graph, spec.gpus_per_node)
    assert (summary["num_gpus"], summary["num_nics"]) == (144, 144)
    assert {kind: v["count"] for kind, v in summary["links"].items()} == {
        "ib": 2 * 144,
        "nvlink": 2 * 144,
        "pcie": 2 * 144,
    }
    assert summary["switches_by_level"] == {1: 1}
    assert summary["bisection_bytes_per_s"] == pytest.approx(72 * nic_gb_per_s * 1e9)
    assert [cluster.nvlink_domain_of(g) for g in (0, 71, 72, 143)] == [0, 0, 1, 1]
    # 900 GB/s per direction at the rack's fitted NVLink fraction, GPUs 0 and 71 one
    # NVSwitch apart, GPU 5 leaving the rack through its own NIC 5
    nvlink = [cluster.links[i].bandwidth_bytes_per_s for i in cluster.route(0, 71)]
    assert nvlink == pytest.approx([900e9 * NODES[node]["nvlink_efficiency"]] * 2)
    assert cluster.links[cluster.route(5, 77)[0]].dst == ("nic", 0, 5)


def test_topology_command_summarises_and_draws_four_nvl72_racks(tmp_path, capsys):
    png = tmp_path / "nvl72.png"
    scenario = "scenarios/llama3-70b-4racks-gb200.toml"
    assert main(["topology", scenario, "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "4 nodes x 72 GPUs (gb200-nvl72) = 288 GPUs, 288 NICs of 400 Gb/s" in out
    # one rack's 72 NICs each way, at the 95 % of line rate assumed from the DGX H100
    assert "bisection bandwidth: 6,840 GB/s" in out
    assert png.read_bytes().startswith(b"\x89PNG")

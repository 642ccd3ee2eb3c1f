"""Routes, ring collectives and point-to-point transfers on real cluster graphs."""

import pytest

from simulator import collectives
from simulator.engine import simulate
from simulator.run import build_cluster
from simulator.workload import TP_COMM, WorkloadBuilder
from tests.helpers import load

GB = 1e9


def _cluster(**cluster):
    return build_cluster(load(cluster=cluster).cluster)


def _time(cluster, *transfers):
    """Run transfers at once, each blocking its own lane; the last one's finish time."""
    builder = WorkloadBuilder()
    for i, transfer in enumerate(transfers):
        lane = builder.lane(gpu=i, stream="compute", stage=0)
        builder.add(lane, TP_COMM, f"t{i}", transfer=transfer)
    trace = simulate(
        builder.build(),
        capacities_bytes_per_s=[link.bandwidth_bytes_per_s for link in cluster.links],
    )
    return trace.end_s


def test_routes_use_nvlink_inside_a_node_and_nics_between_nodes():
    cluster = _cluster(num_nodes=2)
    assert [cluster.links[i].kind for i in cluster.route(0, 5)] == ["nvlink", "nvlink"]
    assert [cluster.links[i].kind for i in cluster.route(3, 11)] == ["pcie", "ib", "ib", "pcie"]
    # rail-optimized: GPU 3 leaves through NIC 3 and GPU 11 (local 3) is reached by NIC 3
    first, *_, last = (cluster.links[i] for i in cluster.route(3, 11))
    assert first.dst == ("nic", 0, 3) and last.src == ("nic", 1, 3)


def test_ring_all_reduce_on_one_nvswitch_node_matches_closed_form():
    cluster = _cluster(num_nodes=1)
    n, size = 8, 1 * GB
    ring = collectives.ring(
        "all_reduce",
        [list(range(n))],
        size,
        cluster.route,
        cluster.route_latency_s,
        base_latency_s=6e-6,
    )
    hop_s = 2 * 1e-6  # GPU -> NVSwitch -> GPU, 1 us a link
    expected = 6e-6 + 2 * (n - 1) * hop_s + 2 * (n - 1) / n * size / (300 * GB)
    assert _time(cluster, ring) == pytest.approx(expected, rel=1e-12)


def test_ring_across_nodes_is_bound_by_the_nic():
    cluster = _cluster(num_nodes=4)
    group = [0, 8, 16, 24]  # GPU 0 of each node, one rail
    ring = collectives.ring(
        "all_reduce", [group], GB, cluster.route, cluster.route_latency_s, base_latency_s=0.0
    )
    step_s = 0.5e-6 + 2e-6 + 2e-6 + 0.5e-6
    expected = 2 * 3 * step_s + 2 * 3 / 4 * GB / (200e9 / 8)
    assert _time(cluster, ring) == pytest.approx(expected, rel=1e-12)


def test_reduce_scatter_and_all_gather_are_each_half_an_all_reduce_of_bytes():
    cluster = _cluster(num_nodes=1)
    args = ([list(range(4))], GB, cluster.route, cluster.route_latency_s, 0.0)
    ar = collectives.ring("all_reduce", *args)
    rs = collectives.ring("reduce_scatter", *args)
    ag = collectives.ring("all_gather", *args)
    assert rs.bytes_per_flow == ag.bytes_per_flow == pytest.approx(ar.bytes_per_flow / 2)
    assert collectives.ring("all_reduce", [[3]], *args[1:]) is None


def test_gpus_sharing_one_nic_split_it():
    # 4 GPUs per node, one 400 Gb/s NIC: four congruent sends share it.
    cluster = _cluster(node="v100x4", num_nodes=2)
    pairs = [(j, 4 + j) for j in range(4)]
    send = collectives.point_to_point(pairs, GB, cluster.route, cluster.route_latency_s)
    latency = 0.5e-6 + 2e-6 + 2e-6 + 0.5e-6
    assert _time(cluster, send) == pytest.approx(latency + GB / (50 * GB / 4))
    # one sender alone is limited by its PCIe link (16 GB/s), not the 50 GB/s NIC
    alone = collectives.point_to_point(pairs[:1], GB, cluster.route, cluster.route_latency_s)
    assert _time(cluster, alone) == pytest.approx(latency + GB / (16 * GB))


def test_tensor_ring_and_pipeline_send_share_an_nvlink_port():
    cluster = _cluster(num_nodes=1)
    ring = collectives.ring(
        "all_reduce", [[0, 1]], 2 * GB, cluster.route, cluster.route_latency_s, 0.0
    )  # 2 GB per ring edge
    send = collectives.point_to_point([(0, 1)], 2 * GB, cluster.route, cluster.route_latency_s)
    alone = _time(cluster, ring)
    both = _time(cluster, ring, send)
    assert alone == pytest.approx(4e-6 + 2 * GB / (300 * GB))  # 2 steps of 2 us
    # The send (2 us latency) streams alone at 300 GB/s until the ring's 4 us latency is
    # paid, then GPU 0's port is shared 150/150 until the send ends, then the ring has it.
    head = 2e-6 * 300 * GB  # bytes the send moves alone
    expected = 4e-6 + (2 * GB - head) / (150 * GB) + head / (300 * GB)
    assert both == pytest.approx(expected, rel=1e-9)

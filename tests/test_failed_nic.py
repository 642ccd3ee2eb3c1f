"""A failed NIC cable, as the job runs after its restart without that NIC
(topologies/detour.py, simulator/run/perturb.py: its GPUs use another NIC of their node)."""

import pytest

from stepsim.comm.collectives import Fabric, collective
from stepsim.ir.vocabulary import ALL_REDUCE
from stepsim.run import perturb
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from stepsim.scenario.perturbation import PerturbationSpec
from tests.helpers import load
from tests.test_perturbation import MIXED, _ring_time_s, with_perturbations

P = PerturbationSpec
DOWN = P(kind="slow_nic", node=1, nic=3, down=True)
# every GPU its own replica, 16 of them on two DGX A100 on one switch
PURE_DP = {
    "cluster": {"num_nodes": 2},
    "parallel": {"data_parallel_size": 16},
    "training": {"global_batch_size": 32},
}


def test_the_failed_nics_gpu_leaves_through_the_nic_beside_it():
    """GPU 11 (node 1, NIC 3) goes up its own PCIe link, then down NIC 2's (GPU 10's)
    and out through NIC 2's cable; back the same way; nothing else moves."""
    s = with_perturbations(load(**PURE_DP), DOWN)
    cluster = build_cluster(s.cluster)
    clean = {(a, b): cluster.route(a, b) for a in range(16) for b in range(16)}
    perturb.fail_links(s, cluster)
    names = [f"{link.src}->{link.dst}" for link in (cluster.links[i] for i in cluster.route(11, 3))]
    assert names[:3] == [
        "('gpu', 11)->('nic', 1, 3)",
        "('gpu', 10)->('nic', 1, 2)",
        "('nic', 1, 2)->('switch', 1, 0)",
    ]
    back = [cluster.links[i] for i in cluster.route(3, 11)]
    assert [(x.src, x.dst) for x in back[-2:]] == [
        (("nic", 1, 2), ("gpu", 10)),
        (("nic", 1, 3), ("gpu", 11)),
    ]
    moved = {k for k, r in clean.items() if cluster.route(*k) != r}
    assert moved == {(a, 11) for a in range(8)} | {(11, b) for b in range(8)}
    assert cluster.own_route(11, 3) == clean[(11, 3)]


def test_two_gpus_sharing_a_nic_double_the_all_reduces_bandwidth_term():
    """Pure data parallelism over two nodes: the ring channels leaving and entering node 1
    through GPUs 10 and 11 now share NIC 2's cable, the bottleneck of every channel's
    common rate (200 Gb/s against PCIe's 32 GB/s shared by two), so the all-reduce's
    bandwidth term doubles; exact mode and the fast path give the same iteration."""
    s = with_perturbations(load(**PURE_DP), DOWN)
    clean, failed = build_cluster(s.cluster), build_cluster(s.cluster)
    perturb.fail_links(s, failed)
    rings = [
        collective("ring", ALL_REDUCE, [list(range(16))], 1e9, Fabric.of(c, 0.0))
        for c in (clean, failed)
    ]
    nic2 = perturb.nic_cable(failed, s, P(kind="slow_nic", node=1, nic=2, bandwidth_factor=1.0))
    assert {dict(zip(phase.links, phase.mults, strict=True))[nic2[0]] for phase in rings[1]} == {2}
    terms = [
        _ring_time_s(c, c.capacities, ring) - sum(phase.latency_s for phase in ring)
        for c, ring in zip((clean, failed), rings, strict=True)
    ]
    assert terms[1] == pytest.approx(2 * terms[0], rel=1e-12)
    exact = run(with_perturbations(s, DOWN, symmetry=False)).metrics
    fast = run(with_perturbations(s, DOWN, symmetry=True)).metrics
    assert fast.iteration_time_s == exact.iteration_time_s
    assert fast.breakdown_s == exact.breakdown_s
    assert exact.iteration_time_s > run(load(**PURE_DP)).metrics.iteration_time_s
    assert exact.perturbations == (
        "slow_nic node=1 nic=3 down=True: the run after the job's restart without NIC 3 of "
        "node 1 (GPU 11 uses NIC 2; the restart itself: stepsim plan goodput)",
    )


TREE = {"num_nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2}
RAILS = {**TREE, "fabric": "rail-optimized"}


@pytest.mark.parametrize(("cluster", "tolerance"), [(None, 1e-3), (TREE, 1e-3), (RAILS, 2e-2)])
def test_the_fast_path_is_within_its_stated_tolerance_of_exact_mode(cluster, tolerance):
    """All tensor ranks' data-parallel rings are one coupled flow (as for a slow NIC).
    On a rail-optimized fabric the detoured GPU reaches its rail's leaf over the
    spines, where the untouched replicas' traffic is represented only on the
    representative's own links: the fast path misses that contention (1.3 % here)."""
    base = load(**MIXED) if cluster is None else load(**{**MIXED, "cluster": cluster})
    p = P(kind="slow_nic", node=5, nic=3, down=True)
    fast = run(with_perturbations(base, p)).metrics.iteration_time_s
    exact = run(with_perturbations(base, p, symmetry=False)).metrics.iteration_time_s
    assert fast == pytest.approx(exact, rel=tolerance)
    assert fast > run(base).metrics.iteration_time_s


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"cluster": {"node": "v100x4", "num_nodes": 2}}, r"node 1 has no other NIC up"),
        (
            {"cluster": {"num_nodes": 2, "fabric": "rail-only"}},
            r"on a rail-only fabric NIC 3 is node 1's only way onto its rail",
        ),
    ],
)
def test_a_nic_its_node_cannot_do_without_is_a_one_line_error(sections, message):
    layout = {"parallel": {"data_parallel_size": 2 * (4 if "node" in sections["cluster"] else 8)}}
    nic = 0 if "node" in sections["cluster"] else 3
    s = load(**{**PURE_DP, **layout, **sections, "network": {"symmetry": False}})
    with pytest.raises(ScenarioError, match=message):
        run(with_perturbations(s, P(kind="slow_nic", node=1, nic=nic, down=True)))

"""NVLink SHARP (NVLS): in-switch all-reduce, reduce-scatter and all-gather as flows on
the GPU <-> NVSwitch links, against closed forms; how a scenario asks for it."""

import pytest

from stepsim.comm import collectives
from stepsim.comm.collectives import Fabric
from stepsim.ir.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from tests.helpers import load, time_transfers

GB = 1e9
EFF = 0.85  # the DGX H100's NVLS efficiency (NCCL's nvlsEfficiency for Hopper)
LINK = 450 * GB  # DGX H100 NVLink per direction, at line rate below
HOP_S = 2e-6  # GPU -> NVSwitch -> GPU


def _fabric(base_latency_s=0.0, **cluster):
    cluster = {"node": "dgx-h100", "nvlink_efficiency": 1.0, "nic_efficiency": 1.0, **cluster}
    spec = load(cluster=cluster).cluster
    c = build_cluster(spec)
    return c, Fabric.of(c, base_latency_s, spec.nvls_fraction)


def _link_bytes(phase):
    """Bytes each link carries (real flows x bytes per flow), by link."""
    return {i: m * phase.bytes_per_flow for i, m in zip(phase.links, phase.mults, strict=True)}


@pytest.mark.parametrize(
    "kind, up_chunks, down_chunks, steps",
    [(ALL_REDUCE, 9, 9, 2), (REDUCE_SCATTER, 8, 1, 1), (ALL_GATHER, 1, 8, 1)],
)
def test_nvls_bytes_on_each_gpu_link_and_time_on_an_idle_node(kind, up_chunks, down_chunks, steps):
    """k = 8 GPUs, S bytes: every GPU's link up to the NVSwitch and down from it carries
    chunks of S/k (all-reduce: S up for the switch's loads, S/k up for the owner's store;
    S/k down to the owner, S down by multicast), each at 1/efficiency of a byte. Alone
    on the node it takes base + steps x hop + the busiest link's bytes / its rate."""
    cluster, fabric = _fabric(6e-6, num_nodes=1)
    k, size = 8, 1 * GB
    (phase,) = collectives.nvls(kind, [list(range(k))], size, fabric)
    by_link = _link_bytes(phase)
    assert len(by_link) == 2 * k  # every GPU's up and down link, nothing else
    for i, nbytes in by_link.items():
        link = cluster.links[i]
        assert link.kind == "nvlink"
        chunks = up_chunks if link.dst[0] == "nvswitch" else down_chunks
        assert nbytes == pytest.approx(chunks * size / k / EFF, rel=1e-12)
    expected = 6e-6 + steps * HOP_S + max(up_chunks, down_chunks) * size / k / EFF / LINK
    assert time_transfers(cluster, (phase,)) == pytest.approx(expected, rel=1e-12)
    assert collectives.estimate_s((phase,), fabric.capacities) == pytest.approx(expected)


def test_nvls_bus_bandwidth_over_the_ring_is_the_bytes_ratio_times_efficiency():
    """Past their latencies the ring moves 2(k-1)/k S per link, NVLS (k+1)/k S /
    efficiency: 1.32 x the ring's bus bandwidth on a DGX H100."""
    cluster, fabric = _fabric(num_nodes=1)
    k, size = 8, 4 * GB
    ring = collectives.all_reduce("ring", [list(range(k))], size, fabric)
    nvls = collectives.all_reduce("nvls", [list(range(k))], size, fabric)
    ratio = (time_transfers(cluster, ring) - ring[0].latency_s) / (
        time_transfers(cluster, nvls) - nvls[0].latency_s
    )
    assert ratio == pytest.approx((2 * (k - 1) / k) / ((k + 1) / k / EFF), rel=1e-9)


def test_nvls_flows_share_links_with_other_traffic():
    """Two NVLS all-reduces of one group at once take twice one's bytes time; two groups of four
    GPUs on one NVSwitch use disjoint links and take what one takes."""
    cluster, fabric = _fabric(num_nodes=1)
    size = 1 * GB
    (whole,) = collectives.nvls(ALL_REDUCE, [list(range(8))], size, fabric)
    one = time_transfers(cluster, (whole,))
    both = whole.latency_s + 2 * (one - whole.latency_s)  # the latencies run side by side
    assert time_transfers(cluster, (whole,), (whole,)) == pytest.approx(both, rel=1e-12)
    (a,) = collectives.nvls(ALL_REDUCE, [[0, 1, 2, 3]], size, fabric)
    (b,) = collectives.nvls(ALL_REDUCE, [[4, 5, 6, 7]], size, fabric)
    assert time_transfers(cluster, (a,), (b,)) == pytest.approx(
        time_transfers(cluster, (a,)), rel=1e-12
    )


def test_nvls_across_nodes_is_nvls_around_trees_and_auto_never_picks_it():
    _, fabric = _fabric(num_nodes=4)
    group = list(range(32))
    phases = collectives.nvls(ALL_REDUCE, [group], 1 * GB, fabric)
    tree = collectives.two_level_all_reduce("tree", [group], 1 * GB, fabric)
    assert phases[1] == tree[1]  # the double binary trees across nodes
    assert {phases[0].mults[0], phases[2].mults[0]} == {8, 1}  # NVLS RS and AG in nodes
    assert collectives.nvls(REDUCE_SCATTER, [group], 1 * GB, fabric) is None  # IB SHARP
    for size in (1e3, 1e6, 1e9):
        for g in ([0, 1, 2, 3, 4, 5, 6, 7], group):
            auto = collectives.all_reduce("auto", [g], size, fabric)
            assert auto != collectives.nvls(ALL_REDUCE, [g], size, fabric)


def test_no_nvls_without_a_reducing_nvswitch_or_for_one_gpu_per_node():
    _, fabric = _fabric(num_nodes=2, nvls_efficiency=0.0)
    assert collectives.nvls(ALL_REDUCE, [list(range(8))], GB, fabric) is None
    _, fabric = _fabric(num_nodes=2)
    assert collectives.nvls(ALL_REDUCE, [[0, 8]], GB, fabric) is None
    ring = collectives.all_reduce("ring", [[0, 8]], GB, fabric)
    assert collectives.all_reduce("nvls", [[0, 8]], GB, fabric) == ring


def test_node_presets_say_whether_their_nvswitch_reduces():
    def fraction(node, **keys):
        return load(cluster={"node": node, **keys}).cluster.nvls_fraction

    assert fraction("dgx-h100") == 0.85 and fraction("dgx-b200") == 0.74
    assert fraction("dgx-a100") == 0.0 and fraction("dgx-1-v100") == 0.0
    assert fraction("dgx-a100", nvls_efficiency=0.5) == 0.5


def test_nvls_is_an_explicit_choice_refused_where_the_switch_cannot_reduce():
    with pytest.raises(ScenarioError, match=r"collective_algorithm='nvls' needs an NVSwitch"):
        load(network={"collective_algorithm": "nvls"})  # dgx-a100
    with pytest.raises(ScenarioError, match=r"nvls_efficiency=0.8 must be 0 for cluster"):
        load(cluster={"node": "dgx-1-v100", "nvls_efficiency": 0.8})


def test_a_tensor_parallel_run_with_nvls_spends_less_on_tp_comm():
    sets = {
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tensor_model_parallel_size": 8},
    }
    ring = run(load(**sets)).metrics
    nvls = run(load(**sets, network={"collective_algorithm": "nvls"})).metrics
    assert 0 < nvls.breakdown_s["tp_comm"] < ring.breakdown_s["tp_comm"]

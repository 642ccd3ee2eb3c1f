"""NVLink SHARP (NVLS): in-switch all-reduce, reduce-scatter and all-gather as flows on
the GPU <-> NVSwitch links, against closed forms; how a scenario asks for it."""

import numpy as np
import pytest

from stepsim.comm import collectives
from stepsim.comm.collectives import Fabric
from stepsim.ir.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from stepsim.report.summary import summary_text
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


def test_nvls_across_nodes_is_nvls_around_trees():
    _, fabric = _fabric(num_nodes=4)
    group = list(range(32))
    phases = collectives.nvls(ALL_REDUCE, [group], 1 * GB, fabric)
    tree = collectives.two_level_all_reduce("tree", [group], 1 * GB, fabric)
    assert phases[1] == tree[1]  # the double binary trees across nodes
    assert {phases[0].mults[0], phases[2].mults[0]} == {8, 1}  # NVLS RS and AG in nodes
    assert collectives.nvls(REDUCE_SCATTER, [group], 1 * GB, fabric) is None  # IB SHARP


def _names(algorithm, kind, group, size, fabric):
    return [name for name, _ in collectives.choices(algorithm, kind, [group], size, fabric)]


@pytest.mark.parametrize("size", [1e3, 1e6, 1e9])
def test_auto_is_nccls_default_nvls_where_the_switch_reduces(size):
    """NCCL_NVLS_ENABLE's default: on a DGX H100 `auto` has NVLS among its candidates
    as `nvls` has, and chooses alike: a TP all-reduce of 8 GPUs runs NVLS at every size
    (one load-reduce and one multicast against the ring's 14 steps and 14/8 S)."""
    _, fabric = _fabric(6e-6, num_nodes=4)
    inside, across = list(range(8)), list(range(32))
    for group in (inside, across):
        for kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER):
            auto = collectives.collective("auto", kind, [group], size, fabric)
            assert auto == collectives.collective("nvls", kind, [group], size, fabric)
    assert collectives.chosen("auto", ALL_REDUCE, [inside], size, fabric)[0] == "nvls"
    assert collectives.all_reduce("auto", [inside], size, fabric) == collectives.nvls(
        ALL_REDUCE, [inside], size, fabric
    )
    assert _names("auto", ALL_REDUCE, across, size, fabric) == [
        "ring",
        "tree",
        "hierarchical",
        "nvls_tree",
    ]
    # NCCL runs NVLS reduce-scatters and all-gathers inside a node only (IB SHARP across)
    assert _names("auto", REDUCE_SCATTER, inside, size, fabric) == ["ring", "nvls"]
    assert _names("auto", ALL_GATHER, across, size, fabric) == ["ring"]


@pytest.mark.parametrize("node", ["dgx-a100", "dgx-1-v100"])
def test_auto_without_nvls_is_the_least_of_ring_and_trees_as_before(node):
    """Where the switch cannot reduce (NVSwitch gen 2, meshes) `auto` is what it always
    was: the least estimate of ring, tree and hierarchical, the ring on a tie."""
    spec = load(cluster={"node": node, "num_nodes": 4}).cluster
    cluster = build_cluster(spec)
    fabric = Fabric.of(cluster, 6e-6, spec.nvls_fraction)
    n = spec.gpus_per_node
    for group in (list(range(n)), list(range(4 * n)), list(range(0, 4 * n, n))):
        for size in (1e3, 1e6, 1e9):
            named = collectives.choices("auto", ALL_REDUCE, [group], size, fabric)
            assert {name for name, _ in named} <= {"ring", "tree", "hierarchical"}
            explicit = [
                collectives.all_reduce(a, [group], size, fabric)
                for a in ("ring", "tree", "hierarchical")
            ]
            best = min(explicit, key=lambda c: collectives.estimate_s(c, fabric.capacities))
            assert collectives.all_reduce("auto", [group], size, fabric) == best
            for kind in (REDUCE_SCATTER, ALL_GATHER):
                assert collectives.collective("auto", kind, [group], size, fabric) == (
                    collectives.ring(kind, [group], size, fabric)
                )


def test_auto_reduce_scatter_in_a_node_crosses_from_nvls_to_the_ring_by_size():
    """Reduce-scatter on one DGX H100 (k = 8, hop h per step, link rate L): NVLS pays
    one step and S / efficiency on the busiest link, the ring k - 1 steps and (k-1)/k S.
    Equal at S* = (k - 2) h L / (1/eff - (k-1)/k): NVLS below, the ring above."""
    _, fabric = _fabric(6e-6, num_nodes=1)
    k, group = 8, list(range(8))
    crossover = (k - 2) * HOP_S * LINK / (1 / EFF - (k - 1) / k)
    assert 17e6 < crossover < 19e6
    for kind in (REDUCE_SCATTER, ALL_GATHER):
        below = collectives.chosen("auto", kind, [group], 0.99 * crossover, fabric)
        above = collectives.chosen("auto", kind, [group], 1.01 * crossover, fabric)
        assert (below[0], above[0]) == ("nvls", "ring")
        ring = collectives.ring(kind, [group], crossover, fabric)
        (phase,) = collectives.nvls(kind, [group], crossover, fabric)
        assert collectives.estimate_s(ring, fabric.capacities) == pytest.approx(
            collectives.estimate_s((phase,), fabric.capacities), rel=1e-9
        )


def test_auto_leaves_nvls_out_of_reduce_scatters_over_more_than_32_gpus_of_a_node():
    """NCCL_MAX_NVLS_ARITY: no NVLS reduce-scatter or all-gather for more than 32 local
    ranks under NCCL's default; all-reduce keeps it; `nvls` asks for it anyway."""
    spec = load(cluster={"node": "gb200-nvl72", "num_nodes": 1}).cluster
    fabric = Fabric.of(build_cluster(spec), 6e-6, spec.nvls_fraction)
    for n, with_nvls in ((32, ["ring", "nvls"]), (64, ["ring"])):
        group = list(range(n))
        assert _names("auto", REDUCE_SCATTER, group, 1e3, fabric) == with_nvls
        assert _names("auto", ALL_REDUCE, group, 1e3, fabric) == ["ring", "nvls"]
        assert _names("nvls", ALL_GATHER, group, 1e3, fabric) == ["ring", "nvls"]


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


def test_a_tensor_parallel_run_under_auto_is_the_nvls_run_on_a_dgx_h100():
    """TP 8 on one DGX H100: `auto` runs what `nvls` runs, and less TP communication
    than without NVLS (`nvls_efficiency = 0`, as NCCL_NVLS_ENABLE=0); the summary says
    what auto chose."""
    sets = {
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tensor_model_parallel_size": 8},
    }
    auto = run(load(**sets))
    nvls = run(load(**sets, network={"collective_algorithm": "nvls"})).metrics
    rings = run(load(**{**sets, "cluster": {**sets["cluster"], "nvls_efficiency": 0.0}}))
    assert auto.metrics.iteration_time_s == nvls.iteration_time_s
    assert auto.metrics.breakdown_s == nvls.breakdown_s
    assert 0 < nvls.breakdown_s["tp_comm"] < rings.metrics.breakdown_s["tp_comm"]
    assert "auto collectives: TP all-reduce by NVLS" in summary_text(auto)
    assert "auto collectives" not in summary_text(rings)


@pytest.mark.parametrize("node", ["dgx-h100", "dgx-a100"])
@pytest.mark.parametrize("kind", [ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER])
def test_the_choice_with_copies_builds_fewer_candidates_and_picks_as_all_of_them(node, kind):
    """With congruent copies `chosen` builds each candidate over the representative
    group first, a lower bound of its estimate with the copies, and builds whole only
    those that can still win: the same (name, collective) as the least of every
    candidate built whole, the first on a tie, at sizes where each candidate wins."""
    spec = load(cluster={"node": node, "num_nodes": 8}).cluster
    cluster = build_cluster(spec)
    fabric = Fabric.of(cluster, 6e-6, spec.nvls_fraction)
    n = spec.gpus_per_node
    layouts = [
        [list(range(j, 8 * n, n)) for j in range(n)],  # one GPU a node: rank j's copies
        [list(range(0, 4 * n)), list(range(4 * n, 8 * n))],  # whole nodes, two groups
        [list(range(0, n)), list(range(n, 2 * n))],  # inside a node
    ]
    seen = set()
    for groups in layouts:
        for size in (1e3, 1e5, 1e7, 1e9):
            every = collectives.choices("auto", kind, groups, size, fabric)
            least = min(every, key=lambda c: collectives.estimate_s(c[1], fabric.capacities))
            assert collectives.chosen("auto", kind, groups, size, fabric) == least
            seen.add(least[0])
    if kind == ALL_REDUCE or node == "dgx-h100":  # (A100: the ring alone scatters, gathers)
        assert len(seen) >= 2  # more than one candidate wins somewhere


def test_large_edge_sets_are_routed_once_per_run_and_cross_what_routing_gives(monkeypatch):
    """The same groups' collectives of several sizes (each stage's gradient buckets)
    route their edges once: `_coupled`'s links and multiplicities and the slowest hop
    are kept in the pattern's memo, keyed by the GPU numbers. What is kept equals what
    routing again gives, and the copies' routes are not kept in the cluster's cache."""
    spec = load(cluster={"node": "dgx-a100", "num_nodes": 128}).cluster
    cluster = build_cluster(spec, pattern=True)
    n = spec.gpus_per_node
    # one GPU a node, 8 copies: the ring (which `tree` also builds) at MEMO_EDGES edges
    groups = [list(range(j, 128 * n, n)) for j in range(n)]
    assert len(groups) * len(groups[0]) == collectives.MEMO_EDGES
    calls = []
    once = cluster.route_once
    monkeypatch.setattr(cluster, "route_once", lambda a, b: calls.append(1) or once(a, b))
    memo: dict = {}
    fabric = Fabric.of(cluster, 6e-6, spec.nvls_fraction, memo)
    built = [collectives.all_reduce("tree", groups, size, fabric) for size in (1e6, 3e8)]
    copy_edges = len(calls)
    assert copy_edges > 0 and memo  # routed, and kept
    assert len(cluster._routes) < copy_edges  # the copies' routes asked once, not cached
    again = collectives.all_reduce("tree", groups, 7e7, fabric)
    assert len(calls) == copy_edges  # a third size: nothing routed again
    # the ring of the other kinds is the all-reduce's ring (`_shaped`: one shape)
    scatter = collectives.collective("ring", REDUCE_SCATTER, groups, 5e6, fabric)
    assert len(calls) == copy_edges
    monkeypatch.setattr(collectives, "MEMO_EDGES", 10**9)  # no memo: everything routed
    fresh = Fabric.of(build_cluster(spec, pattern=True), 6e-6, spec.nvls_fraction)
    for size, collective in zip((1e6, 3e8, 7e7), [*built, again], strict=True):
        assert collectives.all_reduce("tree", groups, size, fresh) == collective
    assert collectives.collective("ring", REDUCE_SCATTER, groups, 5e6, fresh) == scatter
    # other edges (the same GPUs in another order): not what was kept for the first
    monkeypatch.setattr(collectives, "MEMO_EDGES", 1024)
    order = np.random.default_rng(1).permutation(128).tolist()
    shuffled = [[group[i] for i in order] for group in groups]
    known = len(memo)
    kept = collectives.all_reduce("tree", shuffled, 3e8, fabric)
    assert len(memo) > known  # built and kept anew
    assert kept == collectives.all_reduce("tree", shuffled, 3e8, fresh)
    assert kept != built[1]

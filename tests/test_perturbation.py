"""Perturbations: the [[perturbation]] schema, closed forms in exact
mode, who waited for whom, and symmetric mode's fast path against exact mode."""

import dataclasses

import pytest

from stepsim.comm.collectives import Fabric, collective
from stepsim.engine.core import simulate
from stepsim.engine.network import FairShareNetwork
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import ALL_REDUCE, TP_COMM
from stepsim.run import perturb
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError, dumps_toml, scenario_from_dict, scenario_to_dict
from stepsim.scenario.loader import apply_override
from stepsim.scenario.perturbation import PerturbationSpec
from tests.helpers import load, scenario

P = PerturbationSpec


def with_perturbations(s, *perturbations, symmetry=None):
    network = s.network
    if symmetry is not None:
        network = dataclasses.replace(network, symmetry=symmetry)
    return dataclasses.replace(s, network=network, perturbations=tuple(perturbations))


# -- schema ---------------------------------------------------------------------------


def test_tables_load_and_round_trip_through_the_resolved_toml():
    doc = scenario(
        parallel={"data_parallel_size": 8},
        perturbation=[
            {"kind": "slow_gpu", "gpu": 3, "factor": 1.5},
            {"kind": "jitter", "node": 0, "sigma": 0.02, "seed": 7},
            {"kind": "slow_nic", "node": 0, "nic": 1, "bandwidth_factor": 0.5},
        ],
    )
    s = scenario_from_dict(doc)
    assert [p.kind for p in s.perturbations] == ["slow_gpu", "jitter", "slow_nic"]
    text = dumps_toml(scenario_to_dict(s))
    assert '[[perturbation]]\nkind = "slow_gpu"\ngpu = 3\nfactor = 1.5' in text
    import tomllib

    assert scenario_from_dict(tomllib.loads(text)) == s


def test_a_clean_scenario_writes_no_perturbation_table():
    assert "perturbation" not in dumps_toml(scenario_to_dict(load()))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"kind": "slow_gpu", "gpu": 99, "factor": 2.0}, r"gpu=99 is not a GPU .*0 to 7"),
        ({"kind": "slow_gpu", "gpu": 1, "factor": 0.0}, r"factor=0.0 must be positive"),
        ({"kind": "slow_gpu", "gpu": 1, "factor": -1.0}, r"factor=-1.0 must be positive"),
        ({"kind": "slow_gpu", "gpu": 1}, r"kind 'slow_gpu' needs factor"),
        ({"kind": "slow_gpu", "gpu": 1, "node": 0, "factor": 2.0}, r"one of gpu, node"),
        ({"kind": "slow_gpu", "gpu": 1, "factor": 2.0, "sigma": 1.0}, r"sigma=1.0 is not a key"),
        ({"kind": "slow_nic", "node": 0, "nic": 9, "down": True}, r"nic=9 is not a NIC"),
        ({"kind": "slow_nic", "node": 3, "nic": 0, "down": True}, r"node=3 is not a node"),
        ({"kind": "slow_link", "link": 0, "down": False}, r"down=False is only written"),
        ({"kind": "gpu_type", "node": 0, "gpu_model": "z9"}, r"gpu_model='z9' must be one of"),
        ({"kind": "jitter", "sigma": 0.1}, r"kind 'jitter' needs seed"),
        ({"kind": "straggle"}, r"kind='straggle' must be one of"),
        ({"kind": "slow_gpu", "gpu": 1, "factor": 2.0, "speed": 1}, r"unknown key"),
    ],
)
def test_bad_tables_are_one_line_errors_naming_the_perturbation(table, message):
    doc = scenario(perturbation=[{"kind": "slow_gpu", "gpu": 0, "factor": 1.0}, table])
    with pytest.raises(ScenarioError, match=message) as info:
        scenario_from_dict(doc)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("perturbation 2") or "perturbation 2" in str(info.value)


def test_set_refuses_perturbations():
    with pytest.raises(ScenarioError, match=r"\[\[perturbation\]\] tables are not set"):
        apply_override({}, "perturbation.gpu=3")


def test_a_link_index_outside_the_cluster_is_an_error_of_the_run():
    s = with_perturbations(load(), P(kind="slow_link", link=10**6, bandwidth_factor=0.5))
    with pytest.raises(ScenarioError, match=r"link=1000000 is not a link of the cluster"):
        run(s)


# -- closed forms, exact mode -----------------------------------------------------------

PURE_DP = {
    "parallel": {"data_parallel_size": 8},
    "training": {"global_batch_size": 16},
    "network": {"symmetry": False},
}


@pytest.mark.parametrize("symmetry", [False, True])
def test_one_gpu_k_times_slower_in_pure_data_parallel(symmetry):
    """No overlap: the all-reduce starts when the slow GPU is done, so the iteration is
    k x (its compute and optimizer step) + the all-reduce; the other 7 GPUs wait
    (k - 1) x its compute each, charged to its replica."""
    base = run(load(**PURE_DP)).metrics
    k = 1.7
    s = with_perturbations(load(**PURE_DP), P(kind="slow_gpu", gpu=3, factor=k), symmetry=symmetry)
    m = run(s).metrics
    b = base.breakdown_s
    expected = k * (b["compute"] + b["optimizer"]) + b["dp_sync"]
    assert m.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert [w.replica for w in m.waits] == [3]
    assert m.waits[0].gpu_seconds == pytest.approx(7 * (k - 1) * b["compute"], rel=1e-9)


def _ring_time_s(cluster, capacities, transfer_phases):
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    builder.add(lane, TP_COMM, "ring", transfer=transfer_phases)
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


def test_a_link_at_half_rate_doubles_the_ring_all_reduces_bandwidth_term():
    """The ring of GPUs 0, 8, 16, 24 (one per node) enters node 1 through its NIC 0 and
    leaves through it: each direction of that cable is crossed once. At half rate it
    is the bottleneck of every ring edge's common rate."""
    s = load(
        cluster={"num_nodes": 4},
        parallel={"tensor_model_parallel_size": 8, "data_parallel_size": 4},
    )
    s = with_perturbations(s, P(kind="slow_nic", node=1, nic=0, bandwidth_factor=0.5))
    cluster = build_cluster(s.cluster)
    ring = collective("ring", ALL_REDUCE, [[0, 8, 16, 24]], 1e9, Fabric.of(cluster, 0.0))
    nic = perturb.nic_cable(cluster, s, s.perturbations[0])
    for i in nic:  # crossed once per direction
        crossings = [dict(zip(phase.links, phase.mults, strict=True)).get(i, 0) for phase in ring]
        assert sum(crossings) == 1
    latency = sum(phase.latency_s for phase in ring)
    full = _ring_time_s(cluster, cluster.capacities, ring) - latency
    half = _ring_time_s(cluster, perturb.capacities(s, cluster, cluster.capacities), ring)
    assert half - latency == pytest.approx(2 * full, rel=1e-12)


def test_a_failed_uplink_reroutes_and_a_failed_pcie_link_is_an_error():
    tree = {"num_nodes": 4, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2}
    layout = {"tensor_model_parallel_size": 8, "data_parallel_size": 4}
    s = load(cluster=tree, parallel=layout, network={"symmetry": False})
    cluster = build_cluster(s.cluster)
    uplink = next(link.index for link in cluster.links if cluster.link_role(link.index) == "uplink")
    base = run(s).metrics.iteration_time_s
    down = run(with_perturbations(s, P(kind="slow_link", link=uplink, down=True))).metrics
    assert down.iteration_time_s >= base
    pcie = next(link.index for link in cluster.links if cluster.link_role(link.index) == "pcie")
    with pytest.raises(ScenarioError, match=r"a failed pcie link takes its GPU out of the job"):
        run(with_perturbations(s, P(kind="slow_link", link=pcie, down=True)))
    one_spine = load(
        cluster={**tree, "spine_switches": 1}, parallel=layout, network={"symmetry": False}
    )
    only = next(
        link.index
        for link in build_cluster(one_spine.cluster).links
        if link.src[0] == "switch" and link.dst[0] == "switch"
    )
    with pytest.raises(ScenarioError, match=r"cannot reach every leaf"):
        run(with_perturbations(one_spine, P(kind="slow_link", link=only, down=True)))


def test_jitter_is_seeded_and_mean_one():
    s = with_perturbations(load(**PURE_DP), P(kind="jitter", sigma=0.05, seed=3))
    a, b = run(s).metrics, run(s).metrics
    assert a == b
    other = run(with_perturbations(s, P(kind="jitter", sigma=0.05, seed=4))).metrics
    assert other.iteration_time_s != a.iteration_time_s
    base = run(load(**PURE_DP)).metrics
    assert a.iteration_time_s > base.iteration_time_s  # the slowest of 8 GPUs sets the pace


# -- the fast path: symmetric mode against exact mode ----------------------------------

# 8 DGX A100 nodes, TP 4 (two replicas per node, sharing its NICs), PP 4, DP 4, ZeRO-1
# with overlapped buckets: a touched replica's stages without a touched GPU run as one
# lane per TP group
MIXED = {
    "model": {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "seq_length": 1024,
        "vocab_size": 32000,
    },
    "cluster": {"num_nodes": 8},
    "parallel": {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 4,
        "data_parallel_size": 4,
    },
    "training": {
        "global_batch_size": 16,
        "overlap_grad_reduce": True,
        "data_parallel_sharding": "optimizer",
    },
}
# node 5 holds replicas 2 and 3 of stage 2; GPU 36 is tensor rank 0 of replica 1, stage 2
EXACT_CASES = {
    "slow node": P(kind="slow_gpu", node=5, factor=1.3),
    "node of another GPU": P(kind="gpu_type", node=5, gpu_model="a100-sxm4-40gb"),
    "one slow GPU": P(kind="slow_gpu", gpu=36, factor=1.3),
    "jitter on a node": P(kind="jitter", node=5, sigma=0.05, seed=1),
}
# where every GPU of a touched TP group is perturbed alike, per-stage breakdowns agree too
WHOLE_GROUPS = ("slow node", "node of another GPU")


@pytest.mark.parametrize("case", EXACT_CASES)
def test_symmetric_mode_simulates_the_touched_replicas_as_exact_mode_does(case):
    s = with_perturbations(load(**MIXED), EXACT_CASES[case])
    fast = run(s).metrics
    exact = run(with_perturbations(s, EXACT_CASES[case], symmetry=False)).metrics
    assert fast.iteration_time_s == exact.iteration_time_s
    assert fast.iteration_time_s > run(load(**MIXED)).metrics.iteration_time_s
    if case in WHOLE_GROUPS:
        for a, b in zip(fast.stages, exact.stages, strict=True):
            assert a.breakdown_s == pytest.approx(b.breakdown_s, rel=1e-6, abs=1e-12)
        assert [w.cause for w in fast.waits] == [w.cause for w in exact.waits]
        for a, b in zip(fast.waits, exact.waits, strict=True):
            assert a.gpu_seconds == pytest.approx(b.gpu_seconds, rel=1e-9)


def test_a_slow_nic_in_symmetric_mode_is_within_its_stated_tolerance():
    """All tensor ranks' data-parallel rings are one coupled flow in symmetric mode, so a
    slow NIC on one rank's ring slows the others' too: 1e-3 on this case."""
    p = P(kind="slow_nic", node=5, nic=3, bandwidth_factor=0.5)
    s = with_perturbations(load(**MIXED), p)
    fast = run(s).metrics.iteration_time_s
    exact = run(with_perturbations(s, p, symmetry=False)).metrics.iteration_time_s
    assert fast == pytest.approx(exact, rel=1e-3)
    assert fast > run(load(**MIXED)).metrics.iteration_time_s


def test_a_perturbation_that_changes_nothing_leaves_symmetric_mode_as_it_was():
    clean = run(load(**MIXED)).metrics
    s = with_perturbations(load(**MIXED), P(kind="slow_gpu", gpu=36, factor=1.0))
    m = run(s).metrics
    assert m.iteration_time_s == clean.iteration_time_s
    assert m.breakdown_s == pytest.approx(clean.breakdown_s, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("p", "message"),
    [
        (P(kind="slow_gpu", gpu=1, factor=2.0), r"touches data-parallel replica 0"),
        (P(kind="jitter", sigma=0.1, seed=1), r"jitter on every GPU touches every replica"),
    ],
)
def test_what_the_fast_path_cannot_split_is_a_one_line_error(p, message):
    with pytest.raises(ScenarioError, match=message):
        run(with_perturbations(load(**MIXED), p))


def test_the_fast_path_on_a_fat_tree_matches_exact_mode():
    """Two nodes per leaf, two spines: the sends and rings cross uplinks shared with
    other replicas' (D-mod-K), which the representative's coupled flows carry."""
    tree = {"num_nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2}
    p = P(kind="slow_gpu", node=5, factor=1.3)
    s = with_perturbations(load(**{**MIXED, "cluster": tree}), p)
    fast, exact = run(s).metrics, run(with_perturbations(s, p, symmetry=False)).metrics
    assert fast.iteration_time_s == exact.iteration_time_s
    for a, b in zip(fast.stages, exact.stages, strict=True):
        assert a.breakdown_s == pytest.approx(b.breakdown_s, rel=1e-6, abs=1e-12)


VARIANTS = {
    "deepspeed's blocking p2p": {"framework": "deepspeed"},
    "overlapped p2p": {"pipeline_p2p": "overlapped"},
    "ZeRO-2": {"data_parallel_sharding": "gradients"},
    "all-reduce after the flush": {"overlap_grad_reduce": False, "data_parallel_sharding": "none"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_slow_gpu_gives_exact_modes_iteration_under_each_gradient_and_p2p_path(variant):
    training = {**MIXED["training"], **VARIANTS[variant]}
    if variant.startswith("deepspeed"):
        training = {"global_batch_size": 16, "framework": "deepspeed"}
    p = P(kind="slow_gpu", gpu=36, factor=1.3)
    s = with_perturbations(load(**{**MIXED, "training": training}), p)
    exact = run(with_perturbations(s, p, symmetry=False)).metrics
    assert run(s).metrics.iteration_time_s == exact.iteration_time_s

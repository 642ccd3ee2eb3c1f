"""Class mode (comm/classes.py): a link between switches perturbed in symmetric mode,
simulated as classes of GPUs that run alike and certified as it runs, against exact
mode; the certificate and the refinement on their own."""

import dataclasses

import pytest

from stepsim.comm.classes import Partition
from stepsim.comm.placement import Placement
from stepsim.engine.network import FairShareNetwork
from stepsim.ir.flows import Transfer, Uncertified
from stepsim.report.summary import summary_text
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from stepsim.scenario.perturbation import PerturbationSpec
from tests.helpers import load
from tests.test_perturbation import MIXED, with_perturbations

P = PerturbationSpec

# 8 servers, 2 a leaf, 2 spines, uplinks 2:1 oversubscribed: a stage's 8 replicas of 4
# GPUs lie under two leaves, so a leaf's failed uplink slows some replicas' and tensor
# ranks' traffic and not others' (the classes split) and the iteration grows by a third
TREE = {
    "model": MIXED["model"],
    "cluster": {
        "num_nodes": 8,
        "fabric": "fat-tree",
        "nodes_per_leaf": 2,
        "spine_switches": 2,
        "oversubscription": 2.0,
    },
    "parallel": {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 2,
        "data_parallel_size": 8,
    },
    "training": {
        "global_batch_size": 16,
        "overlap_grad_reduce": True,
        "data_parallel_sharding": "optimizer",
    },
}
# rails of 4 servers a leaf: a failed uplink of rail 0 moves tensor rank 0's sends only
RAILS = {
    "model": {**MIXED["model"], "hidden_size": 4096, "num_attention_heads": 32},
    "cluster": {"num_nodes": 16, "fabric": "rail-optimized", "nodes_per_leaf": 4},
    "parallel": {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 2,
        "data_parallel_size": 8,
    },
    "training": {
        "global_batch_size": 32,
        "overlap_grad_reduce": True,
        "data_parallel_sharding": "optimizer",
    },
}


def uplink(s, leaf: int, spine: int = 0) -> int:
    """The link from leaf ``leaf`` up to spine ``spine``."""
    cluster = build_cluster(s.cluster)
    return next(
        x.index
        for x in cluster.links
        if x.src == ("switch", 1, leaf) and x.dst == ("switch", 2, spine)
    )


CASES = {
    "leaf 0 down": (TREE, {}, lambda s: [P(kind="slow_link", link=uplink(s, 0), down=True)]),
    "leaf 2 down": (TREE, {}, lambda s: [P(kind="slow_link", link=uplink(s, 2), down=True)]),
    "leaf 1 at a quarter": (
        TREE,
        {},
        lambda s: [P(kind="slow_link", link=uplink(s, 1), bandwidth_factor=0.25)],
    ),
    "rail 0 down": (RAILS, {}, lambda s: [P(kind="slow_link", link=uplink(s, 0), down=True)]),
    "ZeRO-2": (
        TREE,
        {"data_parallel_sharding": "gradients"},
        lambda s: [P(kind="slow_link", link=uplink(s, 0), down=True)],
    ),
    "no ZeRO, all-reduce after the flush": (
        TREE,
        {"overlap_grad_reduce": False, "data_parallel_sharding": "none"},
        lambda s: [P(kind="slow_link", link=uplink(s, 0), down=True)],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_class_mode_gives_exact_modes_run(case):
    layout, training, perturbations = CASES[case]
    base = load(**{**layout, "training": {**layout["training"], **training}})
    s = with_perturbations(base, *perturbations(base))
    result = run(s)
    exact = run(with_perturbations(s, *s.perturbations, symmetry=False)).metrics
    m = result.metrics
    assert result.classes is not None
    assert result.classes.runs > 1  # the whole stage as one class did not hold
    assert len(result.classes.ranks) * len(result.classes.replicas) > 1
    assert m.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-12)
    for a, b in zip(m.stages, exact.stages, strict=True):
        assert a.breakdown_s == pytest.approx(b.breakdown_s, rel=1e-9, abs=1e-15)
    assert m.breakdown_s == pytest.approx(exact.breakdown_s, rel=1e-9, abs=1e-15)
    assert m.model_tflops_per_gpu == pytest.approx(exact.model_tflops_per_gpu, rel=1e-12)
    waited = sum(w.gpu_seconds for w in m.waits)
    assert waited == pytest.approx(sum(w.gpu_seconds for w in exact.waits), rel=1e-9, abs=1e-15)
    # far fewer lanes than exact mode's one per GPU
    lanes = [lane for lane in result.workload.lanes if lane.stream == "compute"]
    assert len(lanes) < s.parallel.num_gpus / 2


def test_the_failure_is_felt_where_the_classes_split():
    """Not a failure that changes nothing: the oversubscribed tree's iteration grows."""
    clean = run(load(**TREE)).metrics.iteration_time_s
    s = with_perturbations(
        load(**TREE), P(kind="slow_link", link=uplink(load(**TREE), 0), down=True)
    )
    assert run(s).metrics.iteration_time_s > 1.2 * clean


def test_one_class_where_nothing_tells_the_gpus_apart():
    """A stage under one leaf (MIXED's tree): every replica crosses the failed leaf's
    uplinks alike, so the first run's one class a stage holds."""
    tree = {"num_nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2}
    base = load(**{**MIXED, "cluster": tree})
    s = with_perturbations(base, P(kind="slow_link", link=uplink(base, 0), down=True))
    result = run(s)
    assert result.classes is not None and result.classes.runs == 1
    exact = run(with_perturbations(s, *s.perturbations, symmetry=False)).metrics
    assert result.metrics.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-12)
    assert result.metrics.iteration_time_s > run(base).metrics.iteration_time_s
    text = summary_text(result)
    assert "symmetric mode, in classes: 1 class of GPUs a stage" in text
    assert "found in 1 run:" in text


def test_class_mode_refuses_the_analytical_network():
    """The analytical model runs each transfer as if alone: a class transfer's members
    would share links that exact mode's separate transfers do not."""
    s = load(**{**TREE, "network": {"model": "analytical"}})
    s = with_perturbations(s, P(kind="slow_link", link=uplink(s, 0), down=True))
    with pytest.raises(ScenarioError, match=r"need network.model = 'fair-share'"):
        run(s)


def test_the_summary_and_waits_name_the_classes():
    s = with_perturbations(
        load(**TREE), P(kind="slow_link", link=uplink(load(**TREE), 0), down=True)
    )
    result = run(s)
    text = summary_text(result)
    assert "symmetric mode, in classes:" in text
    assert "the max-min certificate" in text
    assert all("ran alike" in w.cause for w in result.metrics.waits)


def test_class_mode_takes_link_perturbations_only():
    base = load(**TREE)
    s = with_perturbations(
        base,
        P(kind="slow_link", link=uplink(base, 0), down=True),
        P(kind="slow_gpu", gpu=5, factor=1.2),
    )
    with pytest.raises(ScenarioError, match=r"take only link perturbations.*acts on a GPU"):
        run(s)


# -- the certificate and the refinement -------------------------------------------------


def _alone(capacities, members):
    """A FairShareNetwork on its own clock that certifies one transfer of links 0 and 1
    (one flow each), its members as given, started alone."""
    import simpy

    transfer = Transfer((0, 1), (1, 1), 1.0, 0.0)
    env = simpy.Environment()
    network = FairShareNetwork(env, capacities, {id(transfer.links): (transfer.links, members)})
    network.start(transfer, lambda _event: None)
    env.run()


def test_a_member_that_would_run_faster_alone_is_named():
    members = ((frozenset({0}), (10,)), (frozenset({1}), (11,)))
    _alone([1.0, 1.0], members)  # both links equally tight: both members held
    with pytest.raises(Uncertified) as caught:
        _alone([1.0, 2.0], members)  # GPU 11's own link has room: it would run faster
    assert caught.value.holders == {10} and caught.value.violators == {11}


def test_a_shared_link_holds_only_the_members_that_cross_it():
    """Two transfers share link 0: the class transfer's member on link 1 alone is not
    held at the shared rate (its link has room), so the recompute's certificate fails."""
    import simpy

    cls = Transfer((0, 1), (1, 1), 1.0, 0.0)
    other = Transfer((0,), (1,), 1.0, 0.0)
    members = ((frozenset({0}), (0,)), (frozenset({1}), (1,)))
    env = simpy.Environment()
    network = FairShareNetwork(env, [1.0, 1.0], {id(cls.links): (cls.links, members)})
    network.start(other, lambda _event: None)
    network.start(cls, lambda _event: None)
    with pytest.raises(Uncertified) as caught:
        env.run()
    assert caught.value.violators == {1}


def test_refinement_separates_the_holders():
    placement = Placement(tensor=4, data=4, pipeline=1)
    whole = Partition.whole(placement)
    # holders: tensor rank 0 of replicas 0 and 1 (GPUs 0 and 4)
    split = whole.refined(placement, Uncertified(frozenset({0, 4}), frozenset({1, 8}), ""))
    assert split.ranks == ((0,), (1, 2, 3))
    assert split.replicas == ((0, 1), (2, 3))
    # holders and violators spread over every rank and replica: the first violator's
    # replica leaves its class
    mixed = Uncertified(frozenset({0, 5}), frozenset({1, 4}), "")
    again = Partition(((0, 1),), ((0, 1),)).refined(Placement(4, 2, 1), mixed)
    assert again.replicas == ((0,), (1,)) and again.ranks == ((0, 1),)


def test_a_partition_of_single_gpus_is_exact_modes():
    placement = Placement(tensor=2, data=2, pipeline=1)
    p = Partition.whole(placement)
    while p.size() < 4:
        gpu = 3 if p.size() == 1 else 2
        p = p.refined(placement, Uncertified(frozenset({0}), frozenset({gpu}), ""))
    assert p.ranks == ((0,), (1,)) and p.replicas == ((0,), (1,))
    assert dataclasses.astuple(p) == (((0,), (1,)), ((0,), (1,)))


def test_refinement_splits_where_holders_and_violators_meet():
    """Holders over every rank and replica (ranks 1-3 everywhere, rank 0 of replicas 2
    and 3) but meeting the violators (rank 0 of replicas 0 and 1) only in class (rank 0,
    replicas 1-3): that class's replicas split; a failure split already changes nothing."""
    placement = Placement(tensor=4, data=4, pipeline=1)
    p = Partition(((0,), (1, 2, 3)), ((0,), (1, 2, 3)))
    holders = frozenset({8, 12} | {t + 4 * d for t in (1, 2, 3) for d in range(4)})
    split = p.refined(placement, Uncertified(holders, frozenset({0, 4}), ""))
    assert split.ranks == p.ranks
    assert split.replicas == ((0,), (1,), (2, 3))
    apart = Uncertified(frozenset({1, 2}), frozenset({0}), "")  # rank 0 against ranks 1, 2
    assert split.refined(placement, apart) is split


def test_class_mode_refuses_a_three_level_tree():
    """Measured too slow there (docs/performance.md): exact mode is the way."""
    tree = {"num_nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 2, "fabric_levels": 3}
    base = load(**{**TREE, "cluster": {**TREE["cluster"], **tree}})
    s = with_perturbations(base, P(kind="slow_link", link=uplink(base, 0), down=True))
    with pytest.raises(ScenarioError, match=r"on 2-level fabrics only"):
        run(s)

"""Symmetric mode (one lane per stage, weighted flows) against exact mode (every GPU).

On scenarios whose replicas are identical the two must agree: the same iteration
time and the same per-stage breakdown, and in exact mode every GPU of a stage has
its stage's breakdown. The cases are chosen for contention: pipeline sends and
gradient buckets sharing a NIC, an oversubscribed fat tree, FSDP's side stream,
zero-bubble V with ZeRO-1 and sequence parallelism, the async all-reduce with trees,
DeepSpeed's gradient path (the tied embedding's all-reduce first, bucketed ZeRO-1), and
DeepSpeed's blocking p2p (Megatron's is the default of the 1F1B cases).
"""

import sys
from pathlib import Path

import pytest

from stepsim.ir.vocabulary import BREAKDOWN_KEYS
from stepsim.report.metrics import compute_lanes, stage_breakdowns
from stepsim.run.iteration import run
from tests.helpers import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from exact_cases import CONTENTION  # noqa: E402

# the contention cases: one catalogue, tools/exact_cases.py's (golden.py --exact
# records them too), each run here in both modes
CASES = {
    name: {key: doc[key] for key in ("model", "cluster", "parallel", "training", "network")}
    for name, doc in CONTENTION.items()
}
# where sharing links must matter: fair-share slower than "analytical" by this much
CONTENDED = {"one-nic-per-node": 1.5, "oversubscribed-fat-tree": 1.3, "interleaved-fsdp": 1.03}


def _both(doc):
    symmetric = run(load(**{**doc, "network": {**doc["network"], "symmetry": True}}))
    exact = run(load(**doc))
    return symmetric, exact


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_mode_agrees_with_symmetric_mode(name):
    symmetric, exact = _both(CASES[name])
    s, e = symmetric.metrics, exact.metrics
    iteration_s = s.iteration_time_s
    assert e.iteration_time_s == pytest.approx(iteration_s, rel=1e-3)
    tolerance_s = 1e-6 * iteration_s
    for mine, theirs in zip(s.stages, e.stages, strict=True):
        assert mine.stands_for_gpus == theirs.stands_for_gpus
        for key in BREAKDOWN_KEYS:
            assert theirs.breakdown_s[key] == pytest.approx(
                mine.breakdown_s[key], abs=tolerance_s
            ), (mine.stage, key)
    # and every GPU of a stage, not only their mean, does what its representative does
    rows = {lane.stage: row for lane, row in zip(_lanes(symmetric), _rows(symmetric), strict=True)}
    for lane, row in zip(_lanes(exact), _rows(exact), strict=True):
        for key in BREAKDOWN_KEYS:
            assert row[key] == pytest.approx(rows[lane.stage][key], abs=tolerance_s)
    assert e.hardware_tflops_per_gpu == pytest.approx(s.hardware_tflops_per_gpu, rel=1e-3)
    if name in CONTENDED:
        doc = CASES[name]
        alone = run(
            load(**{**doc, "network": {**doc["network"], "model": "analytical", "symmetry": True}})
        )
        assert iteration_s > CONTENDED[name] * alone.metrics.iteration_time_s


def _lanes(result):
    return compute_lanes(result.workload.lanes)


def _rows(result):
    return stage_breakdowns(result.trace)


def test_exact_mode_simulates_every_gpu_and_every_flow():
    symmetric, exact = _both(CASES["one-nic-per-node"])
    gpus = 8 * 4 * 2
    assert len(_lanes(symmetric)) == 4 and len(_lanes(exact)) == gpus
    assert sorted(lane.gpu for lane in _lanes(exact)) == list(range(gpus))
    assert all(lane.stands_for == 1 for lane in exact.workload.lanes)
    # each TP all-reduce is one transfer per replica, each pipeline send one per GPU
    assert exact.trace.num_transfers > 4 * symmetric.trace.num_transfers


def test_exact_mode_waits_for_the_slowest_member_of_a_collective():
    # Stretch one GPU's compute: its tensor-parallel partner waits at every all-reduce,
    # which only exact mode can show.
    from stepsim.emit import lowering
    from stepsim.engine.core import simulate
    from stepsim.engine.network import FairShareNetwork
    from stepsim.run.iteration import build_cluster

    doc = {**CASES["one-nic-per-node"], "network": {"symmetry": False}}
    scenario = load(**doc)
    cluster = build_cluster(scenario.cluster)
    workload = lowering.lower(scenario, cluster)
    slow_gpu = 1  # tensor rank 1 of replica 0, stage 0
    ops = tuple(
        op._replace(duration_s=op.duration_s * 1.5)
        if workload.lanes[op.lane].gpu == slow_gpu
        else op
        for op in workload.ops
    )
    network = FairShareNetwork.factory([link.bandwidth_bytes_per_s for link in cluster.links])
    base = simulate(workload, network=network)
    slow = simulate(workload._replace(ops=ops), network=network)
    assert slow.end_s > base.end_s
    tp_wait = dict.fromkeys((span.gpu for span in slow.spans), 0.0)
    for span in slow.spans:
        if span.kind == "tp_comm" and span.stream == "compute":
            tp_wait[span.gpu] += span.end_s - span.start_s
    # the partner (GPU 0) spends longer in all-reduces than the slow GPU itself
    assert tp_wait[0] > tp_wait[slow_gpu]

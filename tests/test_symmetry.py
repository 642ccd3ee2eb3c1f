"""Symmetric mode (one lane per stage, weighted flows) against exact mode (every GPU).

On scenarios whose replicas are identical the two must agree: the same iteration
time and the same per-stage breakdown, and in exact mode every GPU of a stage has
its stage's breakdown. The cases are chosen for contention: pipeline sends and
gradient buckets sharing a NIC, an oversubscribed fat tree, FSDP's side stream,
zero-bubble V with ZeRO-1 and sequence parallelism, the async all-reduce with trees,
DeepSpeed's gradient path (the tied embedding's all-reduce first, bucketed ZeRO-1), and
DeepSpeed's blocking p2p (Megatron's is the default of the 1F1B cases).
"""

import pytest

from stepsim.ir.vocabulary import BREAKDOWN_KEYS
from stepsim.report.metrics import compute_lanes, stage_breakdowns
from stepsim.run.iteration import run
from tests.helpers import load

MODEL = {"num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048}
# a node is one tensor-parallel group, so data-parallel rings and pipeline sends both
# leave the node through its NICs
LAYOUT = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 4,
    "data_parallel_size": 2,
}


def _case(cluster=None, parallel=None, training=None, network=None):
    return {
        "model": MODEL,
        "cluster": {"num_nodes": 8, "nic_gbps": 50.0, **(cluster or {})},
        "parallel": {**LAYOUT, **(parallel or {})},
        "training": {"global_batch_size": 16, **(training or {})},
        "network": {"model": "fair-share", **(network or {})},
    }


CASES = {
    # one 25 Gb/s NIC per node: gradient buckets and both directions' pipeline sends
    # of eight GPUs queue on it (fair sharing doubles the iteration over "analytical")
    "one-nic-per-node": _case(
        cluster={"nics_per_node": 1, "nic_gbps": 25.0}, training={"overlap_grad_reduce": True}
    ),
    # one node per leaf, uplinks at 1/8: every flow between nodes crosses the spines
    "oversubscribed-fat-tree": _case(
        cluster={"fabric": "fat-tree", "nodes_per_leaf": 1, "oversubscription": 8.0}
        | {"nic_gbps": 100.0},
        training={"overlap_grad_reduce": True},
        network={"collective_algorithm": "ring"},
    ),
    # FSDP's gathers and reduce-scatters on a side stream, beside the pipeline sends
    # (overlapped: sends that run beside compute, where sharing the NIC shows most)
    "interleaved-fsdp": _case(
        parallel={"virtual_pipeline_model_parallel_size": 2},
        training={
            "schedule": "interleaved",
            "data_parallel_sharding": "full",
            "pipeline_p2p": "overlapped",
        },
    ),
    # the same under Megatron's blocking batched calls (rendezvous across chunks and the
    # ring from the last rank to the first)
    "interleaved-fsdp-blocking-p2p": _case(
        parallel={"virtual_pipeline_model_parallel_size": 2},
        training={
            "schedule": "interleaved",
            "data_parallel_sharding": "full",
            "pipeline_p2p": "batched-blocking",
        },
    ),
    "zbv-zero1-sequence-parallel": _case(
        cluster={"nic_gbps": 25.0},
        parallel={"sequence_parallel": True},
        training={
            "schedule": "zbv",
            "data_parallel_sharding": "optimizer",
            "recompute_granularity": "selective",
        },
    ),
    # DeepSpeed's sequential blocking p2p (rendezvous of two stage lanes), meta messages,
    # whole gradients from every tensor rank and the re-gather, on one NIC per node
    "deepspeed-0.5.0-sequential-p2p": _case(
        cluster={"nics_per_node": 1, "nic_gbps": 25.0},
        training={"framework": "deepspeed", "framework_version": "0.5.0"},
    ),
    "async-allreduce-tree-buckets": _case(
        training={"async_tensor_model_parallel_allreduce": True, "overlap_grad_reduce": True},
        network={"collective_algorithm": "tree"},
    ),
    # DeepSpeed's gradient path: the tied embedding's all-reduce (a rendezvous of the
    # first and last stage) before ZeRO-1's bucketed all-reduce of bf16 gradients
    "deepspeed-tied-zero1-buckets": _case(
        cluster={"nic_gbps": 25.0},
        training={
            "params_dtype": "bf16",
            "communication_data_type": "bf16",
            "data_parallel_sharding": "optimizer",
            "zero_grad_collective": "all-reduce",
            "reduce_bucket_size": 20_000_000,
            "allgather_bucket_size": 20_000_000,
            "tied_grad_reduce_order": "before-dp",
            "gradient_accumulation_fusion": False,
        },
    ),
}
# where sharing links must matter: fair-share slower than "analytical" by this much
CONTENDED = {"one-nic-per-node": 1.5, "oversubscribed-fat-tree": 1.3, "interleaved-fsdp": 1.03}


def _both(doc):
    symmetric = run(load(**doc))
    exact = run(load(**{**doc, "network": {**doc["network"], "symmetry": False}}))
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
        alone = run(load(**{**doc, "network": {**doc["network"], "model": "analytical"}}))
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

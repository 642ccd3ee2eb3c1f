"""Data-parallel strategies: plain all-reduce, distributed optimizer (ZeRO-1), FSDP."""

import pytest

from simulator.run import run
from simulator.vocabulary import DP_SYNC
from tests.helpers import load

BASE = {
    "cluster": {"num_nodes": 4},
    "parallel": {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 1,
        "data_parallel_size": 4,
    },
    "training": {"global_batch_size": 8},  # 2 micro-batches per replica
}


def _run(sharding, **extra):
    training = {**BASE["training"], "data_parallel_sharding": sharding, **extra}
    return run(load(**{**BASE, "training": training}))


def test_memory_per_gpu_by_sharding():
    none, zero1, fsdp = (_run(s).memory[0] for s in ("none", "optimizer", "full"))
    params = none.params
    assert none.optimizer_bytes == 12 * params
    assert zero1.optimizer_bytes == pytest.approx(12 * params / 4)
    assert zero1.weights_bytes == none.weights_bytes == 2 * params
    layer = (12 * 1024 * 1024 + 7 * 1024) / 8 + 6 * 1024  # one layer on one of 8 TP ranks
    rest = params - 4 * layer  # embedding (and final norm), gathered with the first layer
    assert fsdp.optimizer_bytes == pytest.approx(12 * params / 4)
    assert fsdp.weights_bytes == pytest.approx(2 * params / 4 + 2 * (2 * layer + rest))
    assert fsdp.gradients_bytes == pytest.approx(2 * params / 4 + 2 * (layer + rest))


def test_distributed_optimizer_moves_the_same_bytes_as_an_all_reduce():
    none = _run("none").metrics.breakdown_s
    zero1 = _run("optimizer").metrics.breakdown_s
    # reduce-scatter + all-gather = one all-reduce of bytes; one more launch latency
    assert zero1["dp_sync"] == pytest.approx(none["dp_sync"], abs=50e-6)
    assert zero1["optimizer"] == pytest.approx(none["optimizer"] / 4)


def test_fsdp_gathers_every_layer_twice_and_reduces_once_per_micro_batch():
    result = _run("full")
    side = [
        op
        for op in result.workload.ops
        if op.kind == DP_SYNC and result.workload.lanes[op.lane].stream == "dp"
    ]
    layers, microbatches = 4, 2
    gathers = [op for op in side if "all-gather" in op.label]
    reduces = [op for op in side if "reduce-scatter" in op.label]
    assert len(gathers) == 2 * layers * microbatches
    assert len(reduces) == layers * microbatches


def test_fsdp_never_computes_a_layer_before_its_gather_ends():
    result = _run("full")  # one stage: embedding, 4 layers of two blocks, output
    spans = result.trace.spans
    gather_end = {}
    for sp in spans:
        if sp.stream == "dp" and "all-gather" in sp.label:
            words = sp.label.split()
            gather_end[(words[0], int(words[-1]))] = sp.end_s
    for mb in range(2):
        fwd = [sp for sp in spans if sp.label == f"F{mb}" and sp.kind == "forward"]
        bwd = [sp for sp in spans if sp.label == f"B{mb}" and sp.kind == "backward"]
        for i in range(4):
            assert gather_end[(f"F{mb}", i)] <= fwd[1 + 2 * i].start_s
            assert gather_end[(f"B{mb}", 3 - i)] <= bwd[1 + 2 * i].start_s
        assert gather_end[(f"F{mb}", 0)] <= fwd[0].start_s  # the embedding rides with layer 0


def test_fsdp_with_a_very_fast_network_hides_its_communication():
    fast = {"cluster": {"num_nodes": 4, "nic_gbps": 1e6, "pcie_gbytes_per_s": 1e6}}
    training = {**BASE["training"], "data_parallel_sharding": "full"}
    metrics = run(load(**{**BASE, **fast, "training": training})).metrics
    assert metrics.breakdown_s[DP_SYNC] < 0.05 * metrics.iteration_time_s
    slow = {"cluster": {"num_nodes": 4, "nic_gbps": 10}}
    slow_metrics = run(load(**{**BASE, **slow, "training": training})).metrics
    assert slow_metrics.breakdown_s[DP_SYNC] > 0.5 * slow_metrics.iteration_time_s


def test_fsdp_interleaves_reduce_scatters_with_the_gathers_ahead_like_fsdp():
    result = _run("full")
    side = next(lane for lane in result.workload.lanes if lane.stream == "dp")
    labels = [result.workload.ops[i].label for i in side.ops]
    backward = [label.split(" ", 1)[1] for label in labels if label.startswith("B0 ")]
    assert backward == [
        "all-gather layer 3",
        "all-gather layer 2",
        "reduce-scatter layer 3",
        "all-gather layer 1",
        "reduce-scatter layer 2",
        "all-gather layer 0",
        "reduce-scatter layer 1",
        "reduce-scatter layer 0",
    ]


def test_fsdp_output_layer_waits_for_its_weights_on_the_last_stage():
    two_stages = {
        **BASE,
        "parallel": {
            **BASE["parallel"],
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 2,
        },
        "cluster": {"num_nodes": 4},
    }
    result = run(
        load(**{**two_stages, "training": {**BASE["training"], "data_parallel_sharding": "full"}})
    )
    ops = result.workload.ops
    last = next(
        lane for lane in result.workload.lanes if lane.stream == "compute" and lane.stage == 1
    )
    output_backward = next(ops[i] for i in last.ops if ops[i].label == "B0")
    assert [ops[d].label for d in output_backward.deps] == [
        "B0 all-gather layer 1"
    ]  # the last layer's gather, which carries the output weights

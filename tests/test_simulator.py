"""The whole path on small scenarios: FLOPs, breakdown, memory, determinism, deadlocks."""

import pytest

from simulator.engine import DeadlockError, simulate
from simulator.memory import (
    activation_bytes_per_layer,
    layer_params_per_rank,
    stage_params_per_rank,
)
from simulator.run import run
from simulator.workload import BARRIER, FORWARD, PP_SEND, WorkloadBuilder
from tests.helpers import load

TWO_NODES = {
    "cluster": {"num_nodes": 2},
    "parallel": {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "data_parallel_size": 4,
    },
    "training": {"global_batch_size": 32, "recompute_granularity": "full"},
}


def test_hardware_flops_match_megatron_formula_with_full_recompute():
    # Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration
    s = load(**TWO_NODES)
    r = run(s).metrics
    B, sq, lay, h, V = 32, 1024, 4, 1024, 32000
    hardware = 96 * B * sq * lay * h**2 * (1 + sq / (6 * h) + V / (16 * lay * h))
    model = 72 * B * sq * lay * h**2 * (1 + sq / (6 * h) + V / (12 * lay * h))
    per_gpu_s = 1e12 * r["num_gpus"] * r["iteration_time_s"]
    assert r["hardware_tflops_per_gpu"] * per_gpu_s == pytest.approx(hardware, rel=1e-9)
    assert r["model_tflops_per_gpu"] * per_gpu_s == pytest.approx(model, rel=1e-9)
    assert r["mfu"] == pytest.approx(r["model_tflops_per_gpu"] / 312.0)


def test_breakdown_adds_up_to_the_iteration_on_every_stage():
    r = run(load(**TWO_NODES)).metrics
    for stage in r["stages"]:
        assert sum(stage["breakdown_s"].values()) == pytest.approx(r["iteration_time_s"])
        assert stage["stands_for_gpus"] == 2 * 4
    assert r["breakdown_s"]["tp_comm"] > 0 and r["breakdown_s"]["dp_sync"] > 0
    assert 0 < r["bubble_fraction"] < 1


def test_same_input_same_spans_bit_for_bit():
    a, b = run(load(**TWO_NODES)), run(load(**TWO_NODES))
    assert a.trace.spans == b.trace.spans and a.metrics == b.metrics


def test_overlapping_grad_reduce_hides_data_parallel_sync():
    plain = run(load(**TWO_NODES)).metrics
    overlapped = run(
        load(**{**TWO_NODES, "training": {**TWO_NODES["training"], "overlap_grad_reduce": True}})
    ).metrics
    assert overlapped["breakdown_s"]["dp_sync"] < plain["breakdown_s"]["dp_sync"]
    assert overlapped["iteration_time_s"] < plain["iteration_time_s"]


def test_slower_nics_slow_only_the_inter_node_parts():
    fast = run(load(**TWO_NODES)).metrics
    slow_doc = {**TWO_NODES, "cluster": {"num_nodes": 2, "nic_gbps": 10}}
    slow = run(load(**slow_doc)).metrics
    assert slow["iteration_time_s"] > fast["iteration_time_s"]
    assert slow["breakdown_s"]["compute"] == pytest.approx(fast["breakdown_s"]["compute"])
    assert slow["breakdown_s"]["tp_comm"] == pytest.approx(fast["breakdown_s"]["tp_comm"])


def test_analytical_network_never_slower_than_fair_share():
    doc = {**TWO_NODES, "training": {**TWO_NODES["training"], "overlap_grad_reduce": True}}
    fair = run(load(**doc)).metrics
    analytical = run(load(**doc, network={"model": "analytical"})).metrics
    assert analytical["iteration_time_s"] <= fair["iteration_time_s"] * (1 + 1e-12)


def test_layer_params_and_memory_by_hand():
    s = load(**TWO_NODES)
    h = 1024
    t1 = load()  # TP 1
    assert layer_params_per_rank(t1) == 12 * h * h + 13 * h  # Narayanan et al. 2021, Sec 5.1
    # TP 2: the weight matrices and their sharded biases split, layernorms and two biases do not
    assert layer_params_per_rank(s) == (12 * h * h + 7 * h) / 2 + 6 * h
    first = stage_params_per_rank(s, 0)
    assert first == 2 * layer_params_per_rank(s) + 32000 * h / 2 + 1024 * h
    # full recompute keeps each layer's input: 2 s b h bytes per layer per micro-batch
    assert activation_bytes_per_layer(s) == 2 * 1024 * 1 * h
    stage0 = run(s).memory[0]
    assert stage0.inflight_microbatches == 2  # 1F1B: p - stage
    assert stage0.weights_bytes == 2 * first and stage0.optimizer_bytes == 12 * first
    assert stage0.activations_bytes == 2 * 2 * (2 * 1024 * h)


def test_no_recompute_activations_follow_korthikanti():
    s = load(parallel={"tensor_model_parallel_size": 2})
    sbh, a, sq, h, t = 1024 * 1024, 16, 1024, 1024, 2
    assert activation_bytes_per_layer(s) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * sq / (h * t))
    )


def test_deadlock_names_the_blocked_ops():
    builder = WorkloadBuilder()
    a = builder.lane(gpu=0, stream="compute", stage=0)
    b = builder.lane(gpu=1, stream="compute", stage=1)
    builder.add(a, FORWARD, "F0", duration_s=1.0, deps=["y"])
    builder.add(a, PP_SEND, "x", blocking=False, key="x", transfer=None)
    builder.add(b, BARRIER, "needs x", deps=["x"])
    builder.add(b, FORWARD, "F1", duration_s=1.0, key="y")
    with pytest.raises(DeadlockError, match="2 lanes cannot go on.*'F0' waits for forward 'F1'"):
        simulate(builder.build())

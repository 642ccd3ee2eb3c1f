"""Data-parallel strategies: plain all-reduce, distributed optimizer (ZeRO-1), ZeRO-2, FSDP."""

import pytest

from stepsim.comm.placement import StageComm, placement_of
from stepsim.cost.compute import ComputeModel
from stepsim.cost.params import layer_params_per_rank, stage_params_per_rank
from stepsim.emit.dataparallel import (
    AllReduceAfterFlush,
    DataParallel,
    DeepSpeedStage2,
    DistributedOptimizer,
    OverlappedBuckets,
    ShardedGradients,
)
from stepsim.emit.fsdp import FullySharded
from stepsim.emit.gpuops import GpuOps
from stepsim.emit.lowering import lower
from stepsim.emit.strategy import strategy_for
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import BARRIER, COMPUTE_STREAM, DP_SYNC, OPTIMIZER
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
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


def test_zero2_keeps_a_share_of_the_gradients_and_one_layer_whole():
    none, zero2 = (_run(s).memory[0] for s in ("none", "gradients"))
    params = none.params
    layer = (12 * 1024 * 1024 + 7 * 1024) / 8 + 6 * 1024  # one layer on one of 8 TP ranks
    rest = params - 4 * layer  # embedding and final norm: their buffer kept whole too
    assert zero2.optimizer_bytes == pytest.approx(12 * params / 4)
    assert zero2.weights_bytes == none.weights_bytes == 2 * params
    # every gradient's 1/D shard, one layer's and the rest's whole buffers
    assert zero2.gradients_bytes == pytest.approx(2 * params / 4 + 2 * (layer + rest))


def test_zero2_reduce_scatters_every_layer_and_the_embedding_of_every_micro_batch():
    """Megatron-FSDP's optim_grads reduces on every backward, every parameter: per
    micro-batch L layer reduce-scatters and one of the embedding/output weights (after
    the last layer, on the rank holding the embedding), m (L + 1) in all, non-blocking,
    then ZeRO-1's parameter all-gather; nothing is left to reduce after the flush. Each
    moves half an all-reduce's bytes per ring edge, and together they reduce-scatter
    the stage's parameters once per micro-batch: (D-1)/D x m x N x 2 bytes per edge."""
    sync, _ = _compute_lane_sync("gradients", False)
    labels = [label for label, _, _ in sync]
    per_microbatch = [
        f"{layer} micro-batch {mb}"
        for mb in (0, 1)
        for layer in (*LAYERS, "grads embedding/output")
    ]
    assert labels == [*per_microbatch, "params all-gather"]
    assert all(not blocking for _, blocking, _ in sync[:-1])
    buckets, _ = _compute_lane_sync("none", True)  # the layers' and embedding's all-reduces
    assert [b for _, _, b in sync[:5]] == [b / 2 for _, _, b in buckets]
    scenario = _scenario("gradients")
    params, d, m = stage_params_per_rank(scenario, 0), 4, 2
    assert sum(b for _, _, b in sync[:-1]) == pytest.approx((d - 1) / d * m * params * 2)


def _two_stages(sharding, **training):
    parallel = {**BASE["parallel"], "pipeline_model_parallel_size": 2, "data_parallel_size": 2}
    training = {**BASE["training"], "data_parallel_sharding": sharding, **training}
    network = {"collective_algorithm": "ring"}
    scenario = load(**{**BASE, "parallel": parallel, "training": training, "network": network})
    workload = lower(scenario, build_cluster(scenario.cluster))
    lanes = [lane for lane in workload.lanes if lane.stream == COMPUTE_STREAM]
    return [[workload.ops[i] for i in lane.ops] for lane in lanes]


def test_zero2_reduces_the_output_layer_first_and_the_tied_embedding_shard_once():
    """PP 2: the last stage's output weights are reduce-scattered before its layers in
    each micro-batch (their gradient comes first), the first stage's embedding after its
    layers; the tied embedding's all-reduce between them moves the local shard, 1/D of
    what ZeRO-1 moves (finalize_model_grads under Megatron-FSDP)."""
    first, last = _two_stages("gradients")
    dp = [
        [op.label for op in ops if op.kind == DP_SYNC and op.label.endswith("micro-batch 0")]
        for ops in (first, last)
    ]
    layers = ["grads layer 1 micro-batch 0", "grads layer 0 micro-batch 0"]
    rest = "grads embedding/output micro-batch 0"
    assert dp == [[*layers, rest], [rest, *layers]]
    tied = [
        [op.transfer[0].bytes_per_flow for op in ops if op.label.startswith("tied")]
        for ops in (_two_stages("optimizer")[0], first)
    ]
    assert tied[1] == [tied[0][0] / 2]


def _deepspeed(bucket_layers, overlap=False):
    """ZeRO-2 under framework deepspeed, buckets of ``bucket_layers`` layers' elements."""
    scenario = _scenario("gradients", overlap)
    layer = layer_params_per_rank(scenario)
    training = {
        **BASE["training"],
        "data_parallel_sharding": "gradients",
        "overlap_grad_reduce": overlap,
        "framework": "deepspeed",
        "reduce_bucket_size": int(bucket_layers * layer),
    }
    scenario = load(**{**BASE, "training": training, "network": {"collective_algorithm": "ring"}})
    workload = lower(scenario, build_cluster(scenario.cluster))
    lane = next(lane for lane in workload.lanes if lane.stream == COMPUTE_STREAM)
    return scenario, [workload.ops[i] for i in lane.ops]


def test_deepspeed_zero2_reduces_every_micro_batch_in_buckets_as_they_fill():
    """DeepSpeed's stage 2: each backward fills buckets of reduce_bucket_size elements
    in gradient order and reduces one before the gradient that would overflow it, the
    rest at the end (the embedding, larger than a bucket of 2.5 layers, alone): 3
    blocking reduce-scatters per micro-batch, 6 here, moving the stage's parameters once
    per micro-batch; with 0, one bucket per backward."""
    scenario, ops = _deepspeed(2.5)
    assert isinstance(
        strategy_for(
            GpuOps(WorkloadBuilder(), _comm(scenario), 0, 0), scenario, ComputeModel(scenario)
        ),
        DeepSpeedStage2,
    )
    sync = [op for op in ops if op.kind == DP_SYNC]
    per_microbatch = [
        f"grads {held} micro-batch {mb}"
        for mb in (0, 1)
        for held in ("layer 3 to layer 2", "layer 1 to layer 0", "embedding/output")
    ]
    assert [op.label for op in sync] == [*per_microbatch, "params all-gather"]
    assert all(op.blocking for op in sync)
    params, d, m = stage_params_per_rank(scenario, 0), 4, 2
    moved = sum(op.transfer[0].bytes_per_flow for op in sync[:-1])
    assert moved == pytest.approx((d - 1) / d * m * params * 2)
    _, whole = _deepspeed(0)
    assert [op.label for op in whole if op.kind == DP_SYNC][:2] == [
        "grads layer 3 to embedding/output micro-batch 0",
        "grads layer 3 to embedding/output micro-batch 1",
    ]


def test_deepspeed_zero2_with_overlap_comm_keeps_one_bucket_in_flight():
    """overlap_comm: buckets in the background, but the device is synchronised before
    each bucket and after the last of each backward (average_tensor, the epilogue)."""
    _, ops = _deepspeed(2.5, overlap=True)
    seen = [
        ("bucket" if op.kind == DP_SYNC and not op.blocking else op.label)
        for op in ops
        if op.kind in (DP_SYNC, BARRIER)
    ]
    one = [
        "bucket",
        "wait for gradient bucket",
        "bucket",
        "wait for gradient bucket",
        "bucket",
        "wait for gradient bucket (epilogue)",
    ]
    assert seen[: 2 * len(one)] == one * 2


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


def _scenario(sharding, overlap=False, data=4):
    parallel = {**BASE["parallel"], "data_parallel_size": data}
    training = {
        **BASE["training"],
        "global_batch_size": 2 * data,  # 2 micro-batches per replica
        "data_parallel_sharding": sharding,
        "overlap_grad_reduce": overlap,
    }
    network = {"collective_algorithm": "ring"}
    return load(**{**BASE, "parallel": parallel, "training": training, "network": network})


@pytest.mark.parametrize(
    ("sharding", "overlap", "data", "mode"),
    [
        ("none", False, 1, DataParallel),
        ("full", True, 1, DataParallel),  # one replica: nothing to shard or overlap
        ("none", False, 4, AllReduceAfterFlush),
        ("none", True, 4, OverlappedBuckets),
        ("optimizer", False, 4, DistributedOptimizer),
        ("optimizer", True, 4, DistributedOptimizer),
        ("gradients", False, 4, ShardedGradients),
        ("full", False, 4, FullySharded),
    ],
)
def test_one_strategy_object_per_mode(sharding, overlap, data, mode):
    scenario = _scenario(sharding, overlap, data)
    comm = StageComm(scenario, fabric=None, placement=placement_of(scenario), stage=0)
    gpu = GpuOps(WorkloadBuilder(), comm, 0, 0)
    assert type(strategy_for(gpu, scenario, ComputeModel(scenario))) is mode


def _comm(scenario):
    return StageComm(scenario, fabric=None, placement=placement_of(scenario), stage=0)


def _compute_lane_sync(sharding, overlap):
    """(label, blocking, bytes per flow of the first phase) of the compute lane's DP ops."""
    workload = lower(scenario := _scenario(sharding, overlap), build_cluster(scenario.cluster))
    lane = next(lane for lane in workload.lanes if lane.stream == COMPUTE_STREAM)
    ops = [workload.ops[i] for i in lane.ops]
    sync = [
        (op.label, op.blocking, op.transfer[0].bytes_per_flow) for op in ops if op.kind == DP_SYNC
    ]
    return sync, ops


LAYERS = ["grads layer 3", "grads layer 2", "grads layer 1", "grads layer 0"]


def test_each_mode_syncs_gradients_where_it_should():
    flush, _ = _compute_lane_sync("none", False)
    buckets, ops = _compute_lane_sync("none", True)
    zero1, _ = _compute_lane_sync("optimizer", False)
    zero1_buckets, _ = _compute_lane_sync("optimizer", True)
    fsdp, fsdp_ops = _compute_lane_sync("full", False)
    assert [(label, blocking) for label, blocking, _ in flush] == [("grads all-reduce", True)]
    assert [(label, blocking) for label, blocking, _ in buckets] == [
        *((label, False) for label in LAYERS),
        ("grads embedding/output", False),
    ]
    barrier = next(op for op in ops if op.kind == BARRIER)
    assert barrier.label == "wait for gradient buckets" and len(barrier.deps) == 5
    assert [label for label, _, _ in zero1] == ["grads reduce-scatter", "params all-gather"]
    assert [label for label, _, _ in zero1_buckets] == [
        *LAYERS,
        "grads embedding/output",
        "params all-gather",
    ]
    # a ring all-reduce moves 2(n-1)/n of the message on every edge, a reduce-scatter
    # (ZeRO-1's buckets) and an all-gather (n-1)/n
    for (_, _, all_reduce), (_, _, reduce_scatter) in zip(buckets, zero1_buckets[:5], strict=True):
        assert all_reduce == 2 * reduce_scatter
    assert flush[0][2] == 2 * zero1[0][2] == 2 * zero1[1][2]
    # FSDP syncs on its side lane; the compute lane only waits for the last reduce-scatter
    assert fsdp == []
    assert [op.label for op in fsdp_ops if op.kind == BARRIER] == [
        "wait for gradient reduce-scatters"
    ]


@pytest.mark.parametrize(
    ("sharding", "share"), [("none", 1), ("optimizer", 4), ("gradients", 4), ("full", 4)]
)
def test_sharded_modes_step_the_optimizer_on_their_share(sharding, share):
    scenario = _scenario(sharding)
    workload = lower(scenario, build_cluster(scenario.cluster))
    (step,) = [op for op in workload.ops if op.kind == OPTIMIZER]
    params = stage_params_per_rank(scenario, 0)
    assert step.duration_s == ComputeModel(scenario).optimizer(params / share).duration_s


def _gather_ahead(**training):
    return run(
        load(
            **{
                **BASE,
                "training": {
                    **BASE["training"],
                    "data_parallel_sharding": "optimizer",
                    "overlap_grad_reduce": True,
                    "overlap_param_gather": True,
                    **training,
                },
                "network": {"collective_algorithm": "ring"},
            }
        )
    )


def test_overlapped_param_gather_moves_the_step_all_gather_ahead_of_the_first_forward():
    blocking = run(
        load(
            **{
                **BASE,
                "training": {
                    **BASE["training"],
                    "data_parallel_sharding": "optimizer",
                    "overlap_grad_reduce": True,
                },
                "network": {"collective_algorithm": "ring"},
            }
        )
    )
    ahead = _gather_ahead()
    ops = ahead.workload.ops
    side = [op for op in ops if ahead.workload.lanes[op.lane].stream == "dp"]
    # one gather per layer in the forward's order, nothing left after the step
    assert [op.label for op in side] == [f"params all-gather layer {n}" for n in range(4)]
    assert not [op for op in ops if op.label == "params all-gather"]
    (step,) = [op for op in blocking.workload.ops if op.label == "params all-gather"]
    # the gathers move what the blocking one did: every parameter once (the first one
    # with the embedding and output weights)
    assert sum(op.transfer[0].bytes_per_flow for op in side) == pytest.approx(
        step.transfer[0].bytes_per_flow
    )
    # the first micro-batch's layer n starts once gather n has ended (the embedding
    # rides with layer 0), and the gathers start with the iteration, back to back
    spans = ahead.trace.spans
    gathers = [sp for sp in spans if sp.label.startswith("params all-gather")]
    assert gathers[0].start_s == 0.0
    fwd = [sp for sp in spans if sp.label == "F0" and sp.kind == "forward"]
    assert gathers[0].end_s <= fwd[0].start_s
    for n, gather in enumerate(gathers):
        assert gather.end_s <= fwd[1 + 2 * n].start_s
    # with the gathers hidden behind the forward the iteration is shorter
    assert ahead.metrics.iteration_time_s < blocking.metrics.iteration_time_s


def test_overlapped_param_gather_needs_the_distributed_optimizer():
    with pytest.raises(ScenarioError, match="training.overlap_param_gather"):
        load(training={"overlap_param_gather": True})


def test_deepspeed_refuses_zero2_with_pipeline_parallelism():
    with pytest.raises(ScenarioError, match="DeepSpeed's pipeline engine refuses ZeRO-2"):
        load(
            parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 2},
            training={
                "global_batch_size": 8,
                "framework": "deepspeed",
                "data_parallel_sharding": "gradients",
            },
        )

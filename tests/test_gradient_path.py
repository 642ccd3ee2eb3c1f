"""The gradient path (docs/frameworks.md §4-§6, §8): precision of accumulation and
reduction, ZeRO-1's collective and buckets, the tied embedding's all-reduce between the
first and the last stage, and gradient-accumulation fusion; closed forms by hand."""

import dataclasses
import math

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.params import stage_params_per_rank
from stepsim.emit.lowering import lower
from stepsim.ir.vocabulary import COMPUTE_STREAM, DP_SYNC, OPTIMIZER
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from tests.helpers import load

H, V, F = 1024, 32000, 4096  # the helper's model: hidden, vocabulary, 4h


def _dp_scenario(data=4, **training):
    """TP 8 in each of four DGX A100 nodes, one stage, DP ``data``: every DP group has one
    GPU per node, so its ring is one channel over the NICs."""
    return load(
        cluster={"num_nodes": 4},
        parallel={
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 1,
            "data_parallel_size": data,
        },
        training={"global_batch_size": 2 * data, **training},
        network={"collective_algorithm": "ring"},
    )


def _dp_ops(scenario):
    workload = lower(scenario, build_cluster(scenario.cluster))
    lane = next(lane for lane in workload.lanes if lane.stream == COMPUTE_STREAM)
    return [workload.ops[i] for i in lane.ops if workload.ops[i].kind == DP_SYNC]


# -- §4 precision ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("training", "c"),
    [
        ({}, 2),  # fp16: gradients accumulate and travel in fp16 (either framework)
        ({"params_dtype": "bf16"}, 4),  # Megatron bf16: the fp32 main_grad is reduced
        ({"params_dtype": "bf16", "communication_data_type": "bf16"}, 2),  # DeepSpeed bf16
        ({"accumulate_allreduce_grads_in_fp32": True}, 4),
    ],
)
def test_dp_ring_all_reduce_moves_two_n_c_times_d_minus_one_over_d(training, c):
    scenario = _dp_scenario(**training)
    (grads,) = _dp_ops(scenario)
    n, d = stage_params_per_rank(scenario, 0), 4
    # ring, one channel: 2(D-1) steps of N c / D bytes on every edge
    assert grads.transfer[0].bytes_per_flow == pytest.approx(2 * (d - 1) * n * c / d, rel=1e-12)


def test_megatron_bf16_holds_18_bytes_per_parameter():
    fp16 = run(_dp_scenario()).memory[0]
    bf16 = run(_dp_scenario(params_dtype="bf16")).memory[0]
    params = bf16.params
    assert fp16.gradients_bytes == 2 * params
    assert bf16.gradients_bytes == 4 * params
    total = bf16.weights_bytes + bf16.gradients_bytes + bf16.optimizer_bytes
    assert total == pytest.approx(18 * params)


def test_bf16_gradients_cannot_accumulate_in_bf16():
    with pytest.raises(ScenarioError, match=r"accumulate_allreduce_grads_in_fp32=False must be"):
        _dp_scenario(params_dtype="bf16", accumulate_allreduce_grads_in_fp32=False)


# -- §5 ZeRO-1 -------------------------------------------------------------------------


def test_deepspeed_zero1_all_reduces_gradients_twice_the_bytes_of_megatrons_reduce_scatter():
    megatron = _dp_ops(_dp_scenario(data_parallel_sharding="optimizer"))
    deepspeed = _dp_ops(
        _dp_scenario(data_parallel_sharding="optimizer", zero_grad_collective="all-reduce")
    )
    assert [op.label for op in megatron] == ["grads reduce-scatter", "params all-gather"]
    assert [op.label for op in deepspeed] == ["grads all-reduce", "params all-gather"]
    n, d = stage_params_per_rank(_dp_scenario(), 0), 4
    # fp16: Megatron (N g + 2N)(D-1)/D, DeepSpeed 2N 2(D-1)/D + 2N (D-1)/D per edge
    assert megatron[0].transfer[0].bytes_per_flow == pytest.approx(2 * n * (d - 1) / d)
    assert deepspeed[0].transfer[0].bytes_per_flow == pytest.approx(2 * 2 * n * (d - 1) / d)
    assert megatron[1].transfer[0].bytes_per_flow == pytest.approx(2 * n * (d - 1) / d)
    assert deepspeed[1].transfer == megatron[1].transfer


def test_buckets_add_one_latency_per_extra_call():
    """Analytical network: split into k calls of 1/k the bytes, a collective costs k-1
    more launch latencies; DeepSpeed makes ceil(N/B) gradient calls and max(1, N // B)
    parameter gathers."""

    def sync(**training):
        base = _dp_scenario(
            data_parallel_sharding="optimizer", zero_grad_collective="all-reduce", **training
        )
        network = dataclasses.replace(base.network, model="analytical")
        scenario = dataclasses.replace(base, network=network)
        result = run(scenario)
        return result.metrics.breakdown_s[DP_SYNC], _dp_ops(scenario)

    n = stage_params_per_rank(_dp_scenario(), 0)
    bucket = 1_000_000
    whole, (grads, gather) = sync()
    split, ops = sync(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    reduces, gathers = math.ceil(n / bucket), max(1, int(n // bucket))
    # per TP rank: 4 layers of (12h^2 + 3h + f)/8 + 6h, the embedding V h / 8 + s h, a norm
    assert n == 4 * ((12 * H * H + 3 * H + F) / 8 + 6 * H) + V * H / 8 + 1024 * H + 2 * H
    assert (reduces, gathers) == (12, 11)
    assert [op.label for op in ops] == [
        *(f"grads all-reduce {i}/{reduces}" for i in range(1, reduces + 1)),
        *(f"params all-gather {i}/{gathers}" for i in range(1, gathers + 1)),
    ]
    extra = (reduces - 1) * grads.transfer[0].latency_s + (gathers - 1) * gather.transfer[
        0
    ].latency_s
    assert split - whole == pytest.approx(extra, rel=1e-6)


# -- §6 tied embedding -----------------------------------------------------------------


def _two_nodes(**training):
    """Two stages on two one-GPU nodes joined by one 100 Gb/s NIC each; no latency, no
    other limit; one replica."""
    return load(
        cluster={
            "num_nodes": 2,
            "gpus_per_node": 1,
            "nics_per_node": 1,
            "nic_gbps": 100,
            "nic_efficiency": 1.0,
            "pcie_gbytes_per_s": 1e6,
            "nvlink_latency_us": 0,
            "pcie_latency_us": 0,
            "ib_latency_us": 0,
            "collective_base_latency_us": 0,
        },
        parallel={"pipeline_model_parallel_size": 2},
        training={"global_batch_size": 4, **training},
        network={"collective_algorithm": "ring"},
    )


@pytest.mark.parametrize("training", [{}, {"params_dtype": "bf16"}])
def test_tied_embedding_adds_one_two_rank_all_reduce_of_v_h_g(training):
    g = 4 if training else 2
    tied = run(_two_nodes(**training))
    untied = run(_two_nodes(share_embeddings_and_output_weights=False, **training))
    # a ring of two: the message crosses the NIC once each way, V h g bytes at 100 Gb/s
    expected = V * H * g / (100e9 / 8)
    grown = tied.metrics.iteration_time_s - untied.metrics.iteration_time_s
    assert grown == pytest.approx(expected, rel=1e-9)
    ops = [op for op in tied.workload.ops if op.kind == DP_SYNC]
    assert [op.label for op in ops] == ["tied embedding grads all-reduce"] * 2
    assert {tied.workload.lanes[op.lane].stage for op in ops} == {0, 1}


def test_tied_embedding_uses_the_accumulation_dtype_even_when_dp_sends_bf16():
    """DeepSpeed bf16: DP collectives in bf16, the tied all-reduce from the fp32 _hp_grad."""
    bf16 = run(_two_nodes(params_dtype="bf16", communication_data_type="bf16"))
    (op, _) = [op for op in bf16.workload.ops if op.kind == DP_SYNC]
    assert op.transfer[0].bytes_per_flow == V * H * 4


def _ordered(order, sharding="none"):
    scenario = load(
        cluster={"num_nodes": 2},
        parallel={
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 4,
        },
        training={
            "global_batch_size": 8,
            "tied_grad_reduce_order": order,
            "data_parallel_sharding": sharding,
        },
    )
    workload = lower(scenario, build_cluster(scenario.cluster))
    stages = {}
    for lane in workload.lanes:
        ops = [workload.ops[i] for i in lane.ops]
        stages[lane.stage] = [op.label for op in ops if op.kind in (DP_SYNC, OPTIMIZER)]
    return stages


def test_tied_all_reduce_order_megatron_and_deepspeed():
    tied, grads, step = "tied embedding grads all-reduce", "grads all-reduce", "optimizer"
    assert _ordered("after-dp") == {0: [grads, tied, step], 1: [grads, tied, step]}
    assert _ordered("before-dp") == {0: [tied, grads, step], 1: [tied, grads, step]}
    # Megatron-LM 2022's distributed optimizer: the tied all-reduce, then the reduce-scatter
    rs, ag = "grads reduce-scatter", "params all-gather"
    megatron_2022 = _ordered("before-reduce-scatter", "optimizer")
    assert megatron_2022[1] == [tied, rs, step, ag]
    assert _ordered("after-dp", "optimizer")[1] == [rs, tied, step, ag]
    assert _ordered("before-reduce-scatter") == _ordered("after-dp")


def test_no_tied_all_reduce_on_one_stage_or_when_untied():
    assert _dp_ops(_dp_scenario(data=1)) == []
    untied = _two_nodes(share_embeddings_and_output_weights=False)
    assert [op for op in run(untied).workload.ops if op.kind == DP_SYNC] == []


# -- §8 gradient-accumulation fusion ---------------------------------------------------


def test_unfused_accumulation_adds_m_l_10_weights_per_micro_batch_over_hbm():
    """One stage, one GPU, bf16 (fp32 main_grad): without fusion every micro-batch adds a
    kernel reading the 2-byte gradient and the 4-byte buffer and writing the buffer (10
    bytes per weight), for each layer's four GEMM weights and the logits weight; with
    fusion the compute-bound dW GEMMs take what they took."""
    m, layers = 8, 4

    def iteration(fusion):
        scenario = load(
            model={"seq_length": 2048},
            training={"params_dtype": "bf16", "gradient_accumulation_fusion": fusion},
        )
        return run(scenario).metrics.iteration_time_s, scenario

    fused, scenario = iteration(True)
    unfused, _ = iteration(False)
    gpu, constants = scenario.cluster.gpu, scenario.cluster.gpu.kernels
    layer_weights = 3 * H * H + H * H + H * F + F * H
    stream = gpu.hbm_gbytes_per_s * 1e9 * constants.memory_efficiency
    expected = m * 10 * (layers * layer_weights + H * V) / stream
    assert unfused - fused == pytest.approx(expected, rel=1e-9)


def test_fused_accumulation_charges_2g_minus_2_bytes_per_weight_to_the_dw_gemm():
    """A memory-bound dW GEMM (fc1 of the helper's model on 64 tokens): fused, its output
    is read and written in g bytes instead of written in 2, 2g - 2 more per weight."""
    tokens = 64

    def dw(dtype):
        training = {"params_dtype": dtype, "gradient_accumulation_fusion": True}
        scenario = load(model={"seq_length": tokens}, training=training)
        model = ComputeModel(scenario)
        (kernel,) = [k for k in model.kernels() if k.name == "fc1 dW"]
        return kernel.work.duration_s, model

    fp16, model = dw("fp16")
    bf16, _ = dw("bf16")
    gpu = model.gpu
    stream = gpu.hbm_gbytes_per_s * 1e9 * gpu.kernels.memory_efficiency
    plain = model.gemm(H, F, tokens).duration_s
    assert plain == pytest.approx(2 * (H * tokens + tokens * F + H * F) / stream)  # memory bound
    assert fp16 - plain == pytest.approx(2 * H * F / stream)  # g = 2: 2 more bytes
    assert bf16 - plain == pytest.approx(6 * H * F / stream)  # g = 4: 6 more bytes


def _end_of_iteration(order):
    """p = 2, m = 1, D = 4: (stage 0's last backward end, each stage's sync spans by label)."""
    scenario = load(
        cluster={"num_nodes": 2},
        parallel={
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 4,
        },
        # overlapped p2p: a stage's last op is its last backward, as §3(d) assumes (a
        # blocking send would end it later; tests/test_frameworks.py covers that)
        training={
            "global_batch_size": 4,
            "tied_grad_reduce_order": order,
            "pipeline_p2p": "overlapped",
        },
    )
    result = run(scenario)
    first = {0: 0, 1: 8}  # tensor rank 0 of replica 0 of each stage
    spans = {stage: {} for stage in first}
    backward_end = {}
    for span in result.trace.spans:
        for stage, gpu in first.items():
            if span.gpu != gpu or span.stream != COMPUTE_STREAM:
                continue
            if span.kind in (DP_SYNC, OPTIMIZER):
                spans[stage][span.label] = span
            elif span.kind in ("backward", "tp_comm"):  # a backward ends with its TP all-reduce
                backward_end[stage] = max(backward_end.get(stage, 0.0), span.end_s)
    return backward_end, spans, result.trace.end_s


def test_megatron_reduces_then_ties_deepspeed_ties_then_reduces():
    """§3(d): Megatron ends at t_end(stage 0) + A0 + E + O, stage 1's reduction starting
    at its own last backward; DeepSpeed's stage 1 cannot start its reduction before
    t_end(stage 0) + E."""
    tied, grads, step = "tied embedding grads all-reduce", "grads all-reduce", "optimizer"
    end, spans, _ = _end_of_iteration("after-dp")
    assert spans[1][grads].start_s == end[1] < end[0]
    assert spans[0][grads].start_s == end[0]
    assert spans[0][tied].start_s == spans[0][grads].end_s
    assert spans[0][step].start_s == spans[0][tied].end_s == spans[1][tied].end_s
    end, spans, _ = _end_of_iteration("before-dp")
    assert spans[0][tied].start_s == spans[1][tied].start_s == end[0]
    for stage in (0, 1):
        assert spans[stage][grads].start_s == spans[stage][tied].end_s
        assert spans[stage][step].start_s == spans[stage][grads].end_s

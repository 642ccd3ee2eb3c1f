"""Mixture of experts: parameter counts, dispatch bytes by closed form, FLOPs, placement
of the EP groups on the links, and the rules (docs/moe.md)."""

import pytest

from stepsim.comm.collectives import Fabric
from stepsim.comm.placement import StageComm, placement_of
from stepsim.cost.compute import ComputeModel
from stepsim.cost.memory import fp8_linear_params_per_rank, fp8_weight_bytes
from stepsim.cost.moe import dispatch_bytes, moe_block_work, tokens_per_expert
from stepsim.cost.params import active_params, model_params
from stepsim.ir.vocabulary import ALL_TO_ALL, BREAKDOWN_KEYS, EP_COMM
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ModelSpec, ScenarioError
from stepsim.scenario.presets import MODELS
from tests.helpers import load

E = 2  # bytes per bf16 element
H, S = 1024, 1024


def moe_scenario(experts=8, topk=2, ep=1, tp=1, dp=1, nodes=1, model=None, **sections):
    parallel = {
        "tensor_model_parallel_size": tp,
        "data_parallel_size": dp,
        **({"expert_model_parallel_size": ep} if ep > 1 else {}),
        **({"sequence_parallel": True} if tp > 1 else {}),
        **sections.pop("parallel", {}),
    }
    training = {"global_batch_size": 8 * dp, "attention_backend": "flash"}
    if ep > 1:
        training["moe_token_dispatcher_type"] = "alltoall"
    return load(
        model={
            "num_layers": 2,
            "hidden_size": H,
            "seq_length": S,
            "swiglu": True,
            "num_experts": experts,
            "moe_router_topk": topk,
            "moe_routing": "balanced",  # the closed forms' (the default is imbalanced)
            **(model or {}),
        },
        cluster={"node": "dgx-h100", "num_nodes": nodes, **sections.pop("cluster", {})},
        parallel=parallel,
        training={**training, **sections.pop("training", {})},
        **sections,
    )


# published (total, active) parameters: Mixtral (Jiang et al. 2024: 46.7B / 12.9B;
# Mistral's 8x22B announcement: 141B / 39B), Qwen3 (235B / 22B, the model's name and
# card), gpt-oss (OpenAI's model card: 116.8B / 5.1B, its active count leaving out the
# input embedding, a lookup)
PUBLISHED = {
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.05e9),
    "mixtral-8x22b": (141e9, 39e9, 0.5e9),
    "qwen3-235b-a22b": (235e9, 22e9, 0.5e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_match_the_published(name):
    total, active, tolerance = PUBLISHED[name]
    model = ModelSpec(preset=name, **MODELS[name])
    assert model_params(model, tied=False) == pytest.approx(total, abs=tolerance)
    assert active_params(model, tied=False) == pytest.approx(active, abs=tolerance)


def test_gpt_oss_counts_its_active_parameters_without_the_input_embedding():
    model = ModelSpec(preset="gpt-oss-120b", **MODELS["gpt-oss-120b"])
    assert model_params(model, tied=False) == pytest.approx(116.83e9, abs=0.01e9)
    embedding = model.vocab_size * model.hidden_size
    assert active_params(model, tied=False) - embedding == pytest.approx(5.13e9, abs=0.01e9)


def test_mixtral_layer_by_hand():
    """Attention (GQA) + 8 SwiGLU experts + router + two RMSNorms, per layer."""
    model = ModelSpec(preset="mixtral-8x7b", **MODELS["mixtral-8x7b"])
    h, f = 4096, 14336
    attention = h * (32 + 2 * 8) * 128 + 32 * 128 * h
    layer = attention + 8 * 3 * h * f + h * 8 + 2 * h
    assert model_params(model, tied=False) == 32 * layer + 2 * 32000 * h + h


@pytest.mark.parametrize("ep", [2, 4, 8])
@pytest.mark.parametrize("topk", [1, 2])
def test_alltoall_bytes_per_rank_under_balance(ep, topk):
    """Each rank sends its tokens x topk rows, (EP - 1) / EP of them to other ranks: one
    coupled flow of every ordered pair, tokens x topk x h x 2 / EP bytes each."""
    scenario = moe_scenario(topk=topk, ep=ep, dp=ep)
    cm = ComputeModel(scenario)
    tokens = S  # one sequence per micro-batch, TP 1
    assert dispatch_bytes(cm).alltoall_bytes == tokens * topk * H * E
    cluster = build_cluster(scenario.cluster, pattern=True)
    fabric = Fabric.of(cluster, 0.0)
    comm = StageComm(scenario, fabric, placement_of(scenario), 0)
    transfer = comm.expert("ep", ALL_TO_ALL, dispatch_bytes(cm).alltoall_bytes)
    assert transfer.bytes_per_flow == tokens * topk * H * E / ep
    sent_per_rank = (ep - 1) * transfer.bytes_per_flow
    assert sent_per_rank == tokens * topk * (ep - 1) / ep * H * E


def test_tokens_per_expert_balanced_and_capped_by_capacity():
    cm = ComputeModel(moe_scenario(experts=8, topk=2, ep=4, dp=4))
    assert tokens_per_expert(cm) == S * 2 * 4 / 8
    capped = ComputeModel(
        moe_scenario(experts=8, topk=2, ep=4, dp=4, model={"moe_expert_capacity_factor": 0.5})
    )
    assert tokens_per_expert(capped) == S * 2 * 4 / 8 * 0.5
    assert moe_block_work(capped).experts.flops == moe_block_work(cm).experts.flops / 2


def model_flops(scenario):
    m = run(scenario).metrics
    return m.model_tflops_per_gpu * 1e12 * m.num_gpus * m.iteration_time_s


def test_moe_model_flops_are_the_active_parameters_flops():
    """Top-k experts of width f do the FLOPs of one dense MLP of width k f; the router
    adds its h x E GEMM (forward, dX, dW: 6 x tokens x h x E per layer)."""
    experts, topk, f = 8, 2, 4 * H
    moe = moe_scenario(experts=experts, topk=topk)
    dense = load(
        model={
            "num_layers": 2,
            "hidden_size": H,
            "seq_length": S,
            "swiglu": True,
            "ffn_hidden_size": topk * f,
        },
        cluster={"node": "dgx-h100", "num_nodes": 1},
        training={"global_batch_size": 8, "attention_backend": "flash"},
    )
    tokens = 8 * S
    router = 6 * tokens * H * experts * 2
    assert model_flops(moe) == pytest.approx(model_flops(dense) + router, rel=1e-9)


def test_ep_inside_a_node_is_faster_than_across_nodes():
    """16 experts over EP 8 (one node's NVLink) or EP 16 (two nodes: the NICs)."""
    inside = run(moe_scenario(experts=16, ep=8, dp=16, nodes=2)).metrics
    across = run(moe_scenario(experts=16, ep=16, dp=16, nodes=2)).metrics
    assert 0 < inside.breakdown_s[EP_COMM] < across.breakdown_s[EP_COMM]


def test_dense_runs_report_no_expert_category_and_moe_runs_do():
    dense = run(load(cluster={"node": "dgx-h100", "num_nodes": 1})).metrics
    assert tuple(dense.breakdown_s) == BREAKDOWN_KEYS
    moe = run(moe_scenario(ep=8, dp=8)).metrics
    assert EP_COMM in moe.breakdown_s


def test_allgather_dispatcher_moves_the_ep_group_all_tokens():
    scenario = moe_scenario(ep=8, dp=8, training={"moe_token_dispatcher_type": "allgather"})
    cm = ComputeModel(scenario)
    assert dispatch_bytes(cm).gather_bytes == 8 * S * H * E
    assert run(scenario).metrics.breakdown_s[EP_COMM] > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"experts": 8, "ep": 3, "dp": 6}, "must divide model.num_experts=8"),
        ({"experts": 8, "topk": 9}, r"must be <= model.num_experts=8"),
        (
            {"experts": 16, "ep": 16, "dp": 8},
            r"must divide TP x CP x DP=8",
        ),
        (
            {"tp": 2, "parallel": {"sequence_parallel": False}},
            "sequence_parallel=False must be true for an MoE model",
        ),
        (
            {"tp": 4, "dp": 2, "parallel": {"expert_tensor_parallel_size": 2}},
            "must be 1 or the tensor-parallel size 4",
        ),
        (
            {"dp": 2, "training": {"data_parallel_sharding": "full"}},
            "data_parallel_sharding='full' cannot be `full` for an MoE model",
        ),
    ],
)
def test_rules(kwargs, match):
    with pytest.raises(ScenarioError, match=match):
        moe_scenario(**kwargs)


def test_moe_keys_need_num_experts():
    with pytest.raises(ScenarioError, match="model.moe_router_topk=2 needs model.num_experts"):
        load(model={"moe_router_topk": 2})
    with pytest.raises(ScenarioError, match="expert_model_parallel_size=2 needs model.num_exp"):
        load(parallel={"expert_model_parallel_size": 2, "data_parallel_size": 2})


def test_moe_layer_freq_makes_every_kth_layer_moe():
    model = moe_scenario(model={"num_layers": 6, "moe_layer_freq": 3}).model
    assert [model.is_moe_layer(i) for i in range(6)] == [True, False, False, True, False, False]
    assert model.num_moe_layers == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tp": 2, "ep": 4, "dp": 8, "nodes": 2, "parallel": {"expert_tensor_parallel_size": 2}},
        {"tp": 2, "ep": 4, "dp": 4, "training": {"moe_token_dispatcher_type": "allgather"}},
        {"ep": 4, "dp": 2, "parallel": {"context_parallel_size": 2}},
        {
            "ep": 4,
            "dp": 4,
            "parallel": {"pipeline_model_parallel_size": 2},
            "training": {"schedule": "zbh1", "global_batch_size": 32},
        },
    ],
)
def test_layouts_with_experts_run_and_report_their_communication(kwargs):
    """ETP = TP, the allgather dispatcher, EP folded over CP, a split schedule."""
    metrics = run(moe_scenario(**kwargs)).metrics
    assert metrics.breakdown_s[EP_COMM] > 0
    assert sum(metrics.breakdown_s.values()) == pytest.approx(metrics.iteration_time_s)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ep": 4, "dp": 8, "training": {"use_distributed_optimizer": True}},
        {"tp": 2, "ep": 2, "dp": 4, "parallel": {"expert_tensor_parallel_size": 2}},
        {"tp": 2, "ep": 2, "dp": 4, "training": {"moe_token_dispatcher_type": "allgather"}},
    ],
)
def test_exact_mode_agrees_with_symmetric_mode(kwargs):
    """Every GPU's lanes and its own EP, ETP and expert-data-parallel groups (exact) give
    the representative's time (symmetric): the congruent groups' multiplicities hold."""
    symmetric = moe_scenario(**kwargs)
    exact = moe_scenario(**kwargs, network={"model": "fair-share", "symmetry": False})
    assert run(exact).metrics.iteration_time_s == pytest.approx(
        run(symmetric).metrics.iteration_time_s, rel=1e-9
    )


def test_search_layouts_keep_the_base_expert_parallelism():
    from stepsim.plan.planning import apply_layout
    from stepsim.plan.space import Layout

    base = moe_scenario(ep=4, dp=8)
    layout = Layout(
        tp=2,
        pp=1,
        dp=4,
        micro_batch=1,
        schedule="1f1b",
        chunks=1,
        recompute="selective",
        sharding="none",
        sequence_parallel=True,
    )
    edited = apply_layout(base, layout)
    assert edited.parallel.ep_size == 4
    # ETP follows TP (unset in the base): TP 2 x DP 4 / (EP 4 x ETP 2)
    assert edited.parallel.expert_data_parallel_size == 1


def test_mixtral_weights_and_optimizer_per_gpu_by_hand():
    """EP 8 on one node, DP 8, ZeRO-1: a GPU holds one expert per layer and every dense
    weight; the dense optimizer states are sharded over DP 8, the expert ones over the
    expert-data-parallel group of TP x DP / EP = 1 GPU (not sharded)."""
    from stepsim.run.iteration import memory_per_stage
    from stepsim.scenario import scenario_from_dict
    from tests.helpers import scenario

    doc = scenario(
        cluster={"node": "dgx-h100", "num_nodes": 1},
        parallel={"data_parallel_size": 8, "expert_model_parallel_size": 8},
        training={"global_batch_size": 8, "data_parallel_sharding": "optimizer"},
    )
    s = scenario_from_dict({**doc, "model": {"preset": "mixtral-8x7b"}})
    h, f = 4096, 14336
    dense = 32 * (h * 48 * 128 + 32 * 128 * h + h * 8 + 2 * h) + 2 * 32000 * h + h
    experts = 32 * 3 * h * f  # one expert per layer
    memory = memory_per_stage(s)[0]
    assert memory.weights_bytes == 2 * (dense + experts)
    assert memory.optimizer_bytes == pytest.approx(12 * (dense / 8 + experts), rel=1e-12)


def test_fine_grained_experts_run_their_grouped_gemms_less_efficiently():
    """Same expert FLOPs per token (k x expert width), smaller per-expert GEMMs: 8
    experts of 4096 (top-2) against 64 of 512 (top-16) on one GPU. The tile/wave model
    gives the small shapes a lower rate; nothing else differs."""
    coarse = moe_block_work(ComputeModel(moe_scenario(model={"moe_ffn_hidden_size": 4096})))
    fine = moe_block_work(
        ComputeModel(moe_scenario(experts=64, topk=16, model={"moe_ffn_hidden_size": 512}))
    )
    assert fine.experts.flops == coarse.experts.flops
    assert fine.experts.duration_s > coarse.experts.duration_s


def test_fp8_experts_run_their_grouped_gemms_at_the_fp8_rate_after_their_casts():
    """One local expert (E = EP = 8): its fc1 and fc2 are precision.Fp8Linear's GEMMs of
    M rows (fprop), each after the routed rows' cast and the weight's per-iteration cast;
    the activation stays 16-bit."""
    bf16 = moe_scenario(ep=8, dp=8)
    fp8 = moe_scenario(ep=8, dp=8, training={"fp8_format": "hybrid", "fp8_recipe": "blockwise"})
    cm = ComputeModel(fp8)
    q, mem = cm.fp8, cm.memory_bound
    m, f = tokens_per_expert(cm), cm.model.expert_ffn
    f1 = cm.model.expert_fc1_width
    cast, weight_cast = q.cast_bytes_per_element(), q.weight_cast_bytes_per_element()
    mb = fp8.num_microbatches
    expected = (
        mem(cast * m * H).duration_s
        + mem(weight_cast * H * f1 / mb).duration_s
        + q.gemm(m, f1, H, fprop=True).duration_s
        + mem(3 * E * m * f).duration_s  # SwiGLU, 16-bit
        + mem(cast * m * f).duration_s
        + mem(weight_cast * f * H / mb).duration_s
        + q.gemm(m, H, f, fprop=True).duration_s
    )
    work = moe_block_work(cm).experts
    assert work.duration_s == pytest.approx(expected)
    assert work.flops == moe_block_work(ComputeModel(bf16)).experts.flops
    assert run(fp8).metrics.iteration_time_s < run(bf16).metrics.iteration_time_s


def test_fp8_weight_caches_count_each_stages_own_dense_and_moe_layers():
    """DeepSeek's dense first layers: a stage holding them caches their wide MLPs' FP8
    copies, a stage of MoE layers only its E / EP experts' and shared experts'; the two
    together are the model's (the mean layer's x the layers)."""
    fp8 = {"fp8_format": "hybrid", "fp8_recipe": "blockwise"}
    scenario = moe_scenario(
        experts=8,
        ep=8,
        dp=8,
        nodes=2,
        model={"num_layers": 4, "first_k_dense_replace": 2, "ffn_hidden_size": 4 * H},
        parallel={"pipeline_model_parallel_size": 2},
        training=fp8,
    )
    m = scenario.model
    copies = fp8_weight_bytes(scenario, 1) / fp8_linear_params_per_rank(scenario)
    attention = H * m.qkv_width + m.attention_width * H
    dense = attention + 3 * H * 4 * H  # SwiGLU: fc1 2 x 4h wide, fc2 4h
    moe = attention + 3 * H * m.expert_ffn  # one local expert (8 experts over EP 8)
    assert fp8_weight_bytes(scenario, 2, 0) == pytest.approx(2 * dense * copies)
    assert fp8_weight_bytes(scenario, 2, 1) == pytest.approx(2 * moe * copies)
    both = fp8_weight_bytes(scenario, 2, 0) + fp8_weight_bytes(scenario, 2, 1)
    assert both == pytest.approx(fp8_weight_bytes(scenario, 4))

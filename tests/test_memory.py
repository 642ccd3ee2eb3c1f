"""Memory per GPU by hand, and layouts that do not fit."""

import pytest

from stepsim.cli import main
from stepsim.cost.memory import WORKSPACE_BYTES, activation_bytes_per_layer, out_of_memory
from stepsim.run.iteration import memory_per_stage
from tests.helpers import load

BIG = [
    "--set",
    "model.hidden_size=16384",
    "--set",
    "model.num_attention_heads=128",
    "--set",
    "model.num_layers=32",
]


def test_selective_recompute_with_sequence_parallel_keeps_34_sbh_over_t():
    """Korthikanti et al. 2022, Table 2: selective recomputation + SP: s b h 34 / t."""
    s = load(
        parallel={
            "tensor_model_parallel_size": 4,
            "sequence_parallel": True,
            "data_parallel_size": 2,
        },
        training={"recompute_granularity": "selective"},
    )
    assert activation_bytes_per_layer(s) == 1024 * 1 * 1024 * 34 / 4


def test_total_is_the_parts_plus_the_workspace():
    s = load(parallel={"pipeline_model_parallel_size": 2}, training={"global_batch_size": 8})
    for stage in memory_per_stage(s):
        parts = stage.as_gib()
        assert parts["workspace"] == WORKSPACE_BYTES / 2**30 == 2.0
        assert stage.total_bytes == pytest.approx(
            stage.weights_bytes
            + stage.gradients_bytes
            + stage.optimizer_bytes
            + stage.activations_bytes
            + WORKSPACE_BYTES
        )
    assert out_of_memory(s, memory_per_stage(s)) is None


def test_a_layout_that_does_not_fit_is_an_error_naming_the_stage(capsys):
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "out of memory: pipeline stage 0 needs" in err and "GiB over" in err
    assert "2 of 2 stages do not fit" in err and "--allow-oom" in err


def test_allow_oom_simulates_with_a_warning(capsys):
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG, "--allow-oom"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: out of memory")
    assert "WARNING: out of memory" in captured.out


def test_a_sweep_marks_the_points_that_do_not_fit(capsys):
    assert (
        main(
            [
                "sweep",
                "scenarios/tiny-2gpu.toml",
                "--set",
                "model.num_layers=4,32",
                "--set",
                "model.hidden_size=16384",
                "--set",
                "model.num_attention_heads=128",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count(" OOM\n") == 2 and "OOM: does not fit" in out


def test_the_allow_oom_hint_is_a_field_of_its_own(capsys):
    """run's line is the memory model's problem, then its --allow-oom hint; plan's is
    the problem alone (no string surgery on run's line)."""
    from stepsim.plan.questions import check_fits
    from stepsim.scenario import ScenarioError

    s = load(model={"hidden_size": 16384, "num_attention_heads": 128, "num_layers": 32})
    problem = out_of_memory(s, memory_per_stage(s))
    assert problem.override == "--allow-oom simulates it anyway"
    assert problem.problem.startswith("out of memory: pipeline stage 0 needs")
    assert problem.problem.endswith("a sharded optimizer would help")
    assert str(problem) == f"{problem.problem}; {problem.override}"
    with pytest.raises(ScenarioError, match=r"would help$") as err:
        check_fits(s)
    assert str(err.value) == problem.problem
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith("would help; --allow-oom simulates it anyway")


def test_sharding_takes_effect_with_more_than_one_replica_only():
    """One decision for the memory model and the search's bound: ZeRO-1 and FSDP shard
    the optimizer over D replicas; with D = 1 there is nothing to shard over."""
    from stepsim.cost.memory import optimizer_sharded, sharding_of

    two = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1}}
    for sharding, sharded in (("none", False), ("optimizer", True), ("full", True)):
        training = {"data_parallel_sharding": sharding}
        one = load(**two, training=training)
        assert (sharding_of(one), optimizer_sharded(one)) == ("none", False)
        dp2 = load(**two, parallel={"data_parallel_size": 2}, training=training)
        assert (sharding_of(dp2), optimizer_sharded(dp2)) == (sharding, sharded)
        (replicated,) = memory_per_stage(load(**two, parallel={"data_parallel_size": 2}))
        (mine,) = memory_per_stage(dp2)
        halved = replicated.optimizer_bytes / 2 if sharded else replicated.optimizer_bytes
        assert mine.optimizer_bytes == halved


# -- Megatron-Core (megatron 2024) against older engines: each changed term by hand ---
# Korthikanti et al. 2022's shapes: s tokens, b micro-batch, h hidden, a heads, t TP.
# The tiny defaults (tests.helpers.scenario): s = 1024, h = 1024, a = 16, 4 layers,
# V = 32000, GELU MLP of 4h, fp16, megatron 2021 unless a test says otherwise.
S, H, A, V = 1024, 1024, 16, 32000
SBH = S * 1 * H  # b = 1
CORE = {"framework_version": "2024"}


def test_only_megatron_2024_counts_as_megatron_core():
    from stepsim.cost.memory import megatron_core

    assert megatron_core(load(training=CORE))
    assert not megatron_core(load())  # the helper pins 2021
    assert not megatron_core(load(training={"framework_version": "2022"}))
    deepspeed = load(training={"framework": "deepspeed", "framework_version": "0.5.4"})
    assert not megatron_core(deepspeed)


def test_the_loss_keeps_16_bit_logits_beside_fp32_ones_in_megatron_core():
    """Last stage, PP 2, 1F1B, m = 4 (in flight 1), no recomputation: activations are
    its 2 layers of one micro-batch plus the logits, s b V x 4 bytes (Korthikanti Sec
    4.3) in 2021 and x (2 + 4) in Megatron-Core (its bf16 logits alive while
    `calculate_logits_max` makes the fp32 copy the loss keeps)."""
    pp2 = {"pipeline_model_parallel_size": 2}
    for training, per_logit in (({}, 4), (CORE, 6)):
        s = load(parallel=pp2, training={"global_batch_size": 4, **training})
        last = memory_per_stage(s)[1]
        assert last.inflight_activations == 1
        layers = 2 * activation_bytes_per_layer(s)
        assert last.activations_bytes == layers + per_logit * S * V


def test_fp8_with_flash_attention_keeps_o_in_16_bits_and_its_fp8_copy():
    """One layer, TP 1, no SP, flash attention, no recomputation. BF16: 34 s b h (Q, K, V,
    O 2 bytes each; the MLP's 2 + 8 + 8; norms' inputs 2 + 2 and outputs 2 + 2, masks
    1 + 1) plus the log-sum-exp, 4 a s b. FP8 (TE): QKV's, fc1's and fc2's inputs in
    1 byte (-1 -1 -4), and the projection's FP8 copy (+1) beside O, which the fused
    kernel keeps in 2 bytes (TE FusedAttnFunc saves q, k, v, out): 34 - 5 = 29 s b h,
    not the 27 that would free O."""
    h100 = {"node": "dgx-h100", "num_nodes": 1}
    flash = {"attention_backend": "flash", **CORE}
    lse = 4 * A * S
    bf16 = load(cluster=h100, training={**flash, "params_dtype": "bf16"})
    assert activation_bytes_per_layer(bf16) == 34 * SBH + lse
    fp8 = load(cluster=h100, training={**flash, "params_dtype": "bf16", "fp8_format": "hybrid"})
    assert activation_bytes_per_layer(fp8) == 29 * SBH + lse


def _moe(dispatcher: str, topk: int) -> dict:
    return {
        "model": {"num_experts": 4, "moe_router_topk": topk},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"expert_model_parallel_size": 1},
        "training": {**CORE, "params_dtype": "bf16", "moe_token_dispatcher_type": dispatcher},
    }


@pytest.mark.parametrize(
    ("dispatcher", "topk", "kept_rows"),
    [("alltoall", 2, 2 * S), ("alltoall", 1, S), ("allgather", 2, 2 * S), ("allgather", 1, 0)],
)
def test_the_combine_keeps_the_weighted_rows(dispatcher, topk, kept_rows):
    """An MoE layer, TP 1, EP 1 (all 4 experts local), no drops: the experts keep k
    rows per token of fc1's input (h), the GELU's input (4h) and fc2's input (4h) in 2
    bytes, in place of the dense MLP's; Megatron-Core r0.8.0's combine multiplies the k
    rows by their probabilities and keeps them (alltoall: moe_utils `unpermute`;
    allgather: `* scores` only when k > 1): kept_rows x h x 2 bytes."""
    from stepsim.cost.memory import moe_activation_bytes

    s = load(**_moe(dispatcher, topk))
    dense = activation_bytes_per_layer(s)
    experts = topk * S * 2 * (H + 4 * H + 4 * H)
    mlp = S * 2 * (4 * H + 4 * H)  # the dense MLP's fc1 and fc2 inputs, given way
    assert moe_activation_bytes(s, dense) == dense - mlp + experts + kept_rows * H * 2


def test_a_recomputed_layer_shares_its_input_with_its_checkpoint_in_megatron_core():
    """Full recomputation, PP 2, 1F1B, m = 4: stage 0 holds 2 micro-batches x 2 layers of
    checkpoints (2 s b h each) and, during a backward, one layer's whole activations;
    Megatron-Core recomputes on a detached view of the checkpoint (CheckpointFunction),
    so that layer's input is not counted twice; 2021 counts it as before."""
    pp2 = {"pipeline_model_parallel_size": 2}
    for training, shared in (({}, 0), (CORE, 2 * SBH)):
        s = load(
            parallel=pp2,
            training={"global_batch_size": 4, "recompute_granularity": "full", **training},
        )
        first = memory_per_stage(s)[0]
        assert first.inflight_activations == 2
        whole = activation_bytes_per_layer(s, "none")
        assert first.activations_bytes == 2 * 2 * 2 * SBH + whole - shared


def _tiny_gpt(**training) -> tuple:
    """A 2-layer GPT whose parameters are counted by hand: h 256, 4 heads, MLP 1024,
    V 1024, s 64, learned positions, tied, biases: a layer is QKV 256 x 768 + 768,
    projection 256 x 256 + 256, fc1 256 x 1024 + 1024, fc2 1024 x 256 + 256, two norms
    2 x 512 = 789,760; two layers, the embedding 262,144, positions 16,384 and the
    final norm 512: 1,858,560."""
    model = {
        "num_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "seq_length": 64,
        "vocab_size": 1024,
    }
    two = {"node": "dgx-a100", "num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1}
    s = load(model=model, cluster=two, parallel={"data_parallel_size": 2}, training=training)
    (stage,) = memory_per_stage(s)
    assert stage.params == 1_858_560
    return stage, 1_858_560


def test_16_bit_gradients_get_an_fp32_copy_at_the_optimizer_step_in_megatron_core():
    """fp16 gradients: Megatron-Core's step casts the gradients it steps on to fp32 (4
    bytes per parameter, /D with the distributed optimizer; the docs' 20 and 4 + 16/d
    bytes per parameter), when no activations are held: the peak is the larger of the
    two, the excess counted with the optimizer. Here the activations are small (s 64)."""
    for sharding, d in (("none", 1), ("optimizer", 2)):
        training = {"data_parallel_sharding": sharding, "global_batch_size": 2}
        old, p = _tiny_gpt(**training)
        assert old.optimizer_bytes == 12 * p / d  # 2021: as before
        new, _ = _tiny_gpt(**training, **CORE)
        assert 4 * p / d > new.activations_bytes
        assert new.optimizer_bytes == 12 * p / d + 4 * p / d - new.activations_bytes
        # bf16 with its fp32 gradient buffer (Megatron-LM's default): nothing is copied
        bf16, _ = _tiny_gpt(**training, **CORE, params_dtype="bf16")
        assert bf16.optimizer_bytes == 12 * p / d and bf16.gradients_bytes == 4 * p


# Megatron-LM's own memory tests, measured on DGX H100 (NVIDIA/Megatron-LM d98e8a64dd,
# tests/functional_tests/test_cases/gpt/gpt3_7b_tp{4_pp1,1_pp4}_memory_speed/
# model_config.yaml and golden_values_dev_dgx_h100.json: `mem-max-allocated-bytes`, the
# peak of torch.cuda.memory_stats()["allocated_bytes.all.peak"], logged on the last
# rank): a 7B GPT (32 layers, h 4096, 32 heads in 8 groups, GELU MLP of 4h, vocabulary
# 131,073 padded by 128 x TP, untied, learned positions), s 8192, BF16, the distributed
# optimizer, 8 GPUs. PyTorch's peak holds the tensors, not the CUDA context, NCCL or
# fragmentation (WORKSPACE_BYTES), so it is compared with weights + gradients +
# optimizer + activations. Checked to 5 %, not to three digits (docs/memory.md).
MEASURED_7B_GIB = {(4, 1): 53.219, (1, 4): 56.551}


@pytest.mark.parametrize(("tp", "pp"), list(MEASURED_7B_GIB))
def test_the_tensors_are_near_megatron_lms_measured_peak(tp, pp):
    from stepsim.cost.memory import stage_memory
    from stepsim.scenario import scenario_from_dict

    doc = {
        "name": "gpt3-7b-memory-speed",
        "model": {
            "num_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_query_groups": 8,
            "seq_length": 8192,
            "vocab_size": 131584 if tp == 4 else 131200,
            "untie_embeddings_and_output_weights": True,
        },
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "data_parallel_size": 2,
            **({"virtual_pipeline_model_parallel_size": 8} if pp > 1 else {}),
        },
        "training": {
            "micro_batch_size": 2 if tp == 4 else 1,
            "global_batch_size": 8,
            "schedule": "interleaved" if pp > 1 else "1f1b",
            "use_distributed_optimizer": True,
            "params_dtype": "bf16",
            "framework": "megatron",
            "framework_version": "2024",
        },
        "network": {"model": "fair-share"},
    }
    s = scenario_from_dict(doc)
    last = pp - 1
    # the measured run's Megatron-Core dropped r0.8.0's all-forwards-first warm-up for
    # m = p (pipeline_parallel/schedules.py `get_pp_rank_microbatches`): its last rank
    # runs (v - 1) p = 28 forwards, then 1F1B: 29 chunks of one layer in flight
    inflight = 29 if pp > 1 else 1
    stage = stage_memory(s, last, inflight)
    tensors = stage.total_bytes - stage.workspace_bytes
    assert tensors / 2**30 == pytest.approx(MEASURED_7B_GIB[(tp, pp)], rel=0.05)


def test_megatron_2025_weights_the_experts_activation_and_keeps_no_combine_rows():
    """Megatron-Core from core_r0.12.1 (megatron 2025) applies the router probabilities
    inside the experts: the combine keeps no weighted rows (moe_combine_bytes is 0), while
    r0.8.0 (2024) keeps k x local tokens x h x 2 bytes under the alltoall dispatcher."""
    from stepsim.cost.memory import moe_combine_bytes
    from tests.test_moe import moe_scenario

    old = moe_scenario(ep=8, dp=8, training={"framework_version": "2024"})
    new = moe_scenario(ep=8, dp=8, training={"framework_version": "2025"})
    local = 1024.0
    assert moe_combine_bytes(old, local, 0.0) == local * 2 * 1024 * 2
    assert moe_combine_bytes(new, local, 0.0) == 0.0


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("store", [False, True])
def test_an_moe_layer_keeps_the_dense_layer_plus_its_experts_fc1_input(fp8, store):
    """Top-1 of 2 experts as wide as the dense MLP, balanced, no shared experts, the
    probabilities applied in the experts (2025: no combine rows): each local token is
    one expert row, which keeps what the dense MLP keeps (the activation's input in 2
    bytes, or 1 with `activation_func_fp8_input_store`; fc2's input in 2, FP8: 1) plus
    fc1's own input, h x 2 bytes (FP8: 1), which the dense layer counts with the norm."""
    from stepsim.cost.memory import activation_bytes_per_layer, moe_activation_bytes
    from tests.test_moe import H, S, moe_scenario

    training = {"framework_version": "2025", "activation_func_fp8_input_store": store}
    if fp8:
        training.update(fp8_format="e4m3", params_dtype="bf16")
    s = moe_scenario(experts=2, topk=1, training=training, model={"moe_ffn_hidden_size": 4 * H})
    dense = activation_bytes_per_layer(s, dense_mlp=False)
    assert moe_activation_bytes(s, dense) - dense == S * H * (1 if fp8 else 2)


def test_the_fp8_activation_input_store_keeps_the_swiglu_input_in_one_byte():
    from stepsim.cost.memory import activation_bytes_per_layer
    from tests.test_moe import H, S

    model = {"swiglu": True, "hidden_size": H, "seq_length": S, "num_attention_heads": 16}
    plain = load(model=model)
    stored = load(model=model, training={"activation_func_fp8_input_store": True})
    fc1_width = 2 * plain.model.ffn_hidden_size
    saved = activation_bytes_per_layer(plain) - activation_bytes_per_layer(stored)
    assert saved == S * fc1_width  # one byte per element of the s x b x fc1 input
    with pytest.raises(Exception, match=r"supported only for SwiGLU"):
        load(training={"activation_func_fp8_input_store": True})

"""`training.recompute_modules` (Megatron-Core's --recompute-modules under selective
recomputation): what each module repeats, by closed form on the trace, and the rules."""

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.moe import moe_block_work
from stepsim.ir.vocabulary import EP_COMM, RECOMPUTE
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError
from tests.helpers import load
from tests.test_moe import moe_scenario

H, S, LAYERS, MB = 1024, 1024, 2, 4


def _dense(modules=None, **model):
    training = {
        "global_batch_size": MB,
        "recompute_granularity": "selective",
        "attention_backend": "flash",
    }
    if modules is not None:
        training["recompute_modules"] = modules
    return load(
        model={"num_layers": LAYERS, "hidden_size": H, "seq_length": S, **model},
        training=training,
    )


def _recomputed_s(result, gpu=0):
    return sum(
        s.end_s - s.start_s for s in result.trace.spans if s.gpu == gpu and s.kind == RECOMPUTE
    )


def test_core_attention_is_the_default_module():
    plain, named = run(_dense()), run(_dense("core_attn"))
    assert plain.metrics.iteration_time_s == named.metrics.iteration_time_s
    layer = ComputeModel(_dense()).layer()
    expected = MB * LAYERS * layer.attention_core_forward.duration_s
    assert _recomputed_s(plain) == pytest.approx(expected, rel=1e-9)


def test_each_dense_module_repeats_its_forward_kernels():
    scenario = _dense("core_attn,layernorm,mlp")
    layer = ComputeModel(scenario).layer()
    per_layer = (
        layer.attention_core_forward + layer.layernorm_forward + layer.mlp_module_forward
    ).duration_s
    assert _recomputed_s(run(scenario)) == pytest.approx(MB * LAYERS * per_layer, rel=1e-9)
    # the norms and the MLP: memory-bound norms, fc1, activation and fc2
    assert layer.layernorm_forward.flops == 0 and layer.layernorm_forward.duration_s > 0
    assert layer.mlp_module_forward.flops == pytest.approx(2 * 2 * S * H * 4 * H)


def test_mla_up_projections_repeat_the_q_and_kv_up_gemms_and_rope():
    scenario = _dense(
        "mla_up_proj",
        multi_latent_attention=True,
        q_lora_rank=256,
        kv_lora_rank=128,
        qk_head_dim=64,
        qk_pos_emb_head_dim=32,
        v_head_dim=64,
        num_attention_heads=16,
        add_bias_linear=False,
    )
    layer = ComputeModel(scenario).layer()
    m = scenario.model
    up_flops = 2 * S * (m.q_lora_rank * 16 * (64 + 32) + m.kv_lora_rank * 16 * (64 - 0 + 64))
    assert layer.mla_up_forward.flops == pytest.approx(up_flops)
    assert _recomputed_s(run(scenario)) == pytest.approx(
        MB * LAYERS * layer.mla_up_forward.duration_s, rel=1e-9
    )


def _moe(modules, **model):
    return moe_scenario(
        ep=8,
        dp=8,
        model=model,
        training={"recompute_granularity": "selective", "recompute_modules": modules},
    )


def test_the_moe_module_repeats_the_dispatchers_all_to_alls():
    """Per MoE layer and micro-batch the forward has 3 expert collectives (the counts,
    the dispatch, the combine) and the backward 2; recomputing the MoE layer adds the
    forward's 3 again, and its compute."""
    scenario = _moe("moe")
    result = run(scenario)
    spans = [s for s in result.trace.spans if s.gpu == 0 and s.kind == EP_COMM]
    assert len(spans) == scenario.num_microbatches * 2 * (3 + 2 + 3)
    work = moe_block_work(ComputeModel(scenario))
    expected = scenario.num_microbatches * 2 * work.forward.duration_s
    assert _recomputed_s(result) == pytest.approx(expected, rel=1e-9)


def test_moe_act_repeats_the_experts_activation_only():
    scenario = _moe("moe_act")
    work = moe_block_work(ComputeModel(scenario))
    assert work.act.duration_s > 0 and work.act.flops == 0
    expected = scenario.num_microbatches * 2 * work.act.duration_s
    assert _recomputed_s(run(scenario)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "modules, match",
    [
        ("core_attn,attn", "has 'attn'; each must be one of core_attn, moe_act"),
        ("mlp,mlp", "names a module twice"),
        ("core_attn,", "must name modules, comma-separated"),
        ("mla_up_proj", "needs model.multi_latent_attention"),
        ("moe_act", "needs an MoE model"),
    ],
)
def test_recompute_module_errors(modules, match):
    with pytest.raises(ScenarioError, match=f"training.recompute_modules=.*{match}"):
        _dense(modules)


def test_recompute_modules_need_selective():
    with pytest.raises(ScenarioError, match='applies with training.recompute_granularity = "sel'):
        load(
            model={"num_layers": LAYERS, "hidden_size": H, "seq_length": S},
            training={"global_batch_size": MB, "recompute_modules": "mlp"},
        )
    with pytest.raises(ScenarioError, match="moe already repeats the whole MoE layer"):
        _moe("moe,moe_act")
    with pytest.raises(ScenarioError, match="shared_experts, which needs"):
        _moe("shared_experts")


def test_each_module_keeps_less_activation_memory_by_its_closed_form():
    """Korthikanti's count per layer, one rank (TP 1, bytes per token x h): layernorm
    drops QKV's and fc1's inputs (2 + 2 bytes), mlp a dense MLP's fc1 output and fc2
    input (2 x fc1 width + 2 x ffn), and core_attn the core's (flash: its fp32
    log-sum-exp per head). A module left out keeps what it kept."""
    from stepsim.cost.memory import activation_bytes_per_layer

    sbh = S * 1 * H
    core = activation_bytes_per_layer(_dense("core_attn"))
    norms = activation_bytes_per_layer(_dense("core_attn,layernorm"))
    assert core - norms == pytest.approx(4 * sbh)
    model = _dense().model
    mlp = activation_bytes_per_layer(_dense("core_attn,mlp"))
    assert core - mlp == pytest.approx(sbh * (2 * model.fc1_width + 2 * model.ffn_hidden_size) / H)
    # no core_attn: the flash kernel's log-sum-exp stays (4 bytes per query row and head)
    neither = activation_bytes_per_layer(_dense("layernorm"))
    heads = model.num_attention_heads
    assert neither - norms == pytest.approx(S * heads * 4)


def test_the_moe_modules_drop_the_routed_rows_they_recompute():
    from stepsim.cost.memory import activation_bytes_per_layer, moe_activation_bytes

    def moe_bytes(modules):
        scenario = _moe(modules)
        return moe_activation_bytes(
            scenario, activation_bytes_per_layer(scenario, dense_mlp=False)
        ), scenario

    core, scenario = moe_bytes("core_attn")
    act, _ = moe_bytes("core_attn,moe_act")
    whole, _ = moe_bytes("core_attn,moe")
    m = scenario.model
    local = S  # TP 1, micro-batch 1
    rows = local * m.router_topk  # balanced
    assert core - act == pytest.approx(rows * 2 * m.expert_ffn)
    experts = rows * 2 * (H + m.expert_fc1_width + m.expert_ffn)
    combine = rows * H * 2  # the tests' engine weights after the experts (megatron 2021)
    assert core - whole == pytest.approx(experts + combine)


def test_fp8_experts_keep_their_linear_inputs_in_one_byte():
    """Under FP8 the routed rows' fc1 input (h) and fc2 input (ffn) are TE's FP8 copies,
    1 byte each; the activation's input (fc1's output) stays 16-bit. The MoE layer gives
    way to the dense MLP's inputs as the dense layer counted them (fc2's in 1 byte)."""
    from stepsim.cost.memory import activation_bytes_per_layer, moe_activation_bytes

    def experts_only(training):
        scenario = moe_scenario(ep=8, dp=8, training=training)
        dense = activation_bytes_per_layer(scenario, dense_mlp=False)
        return moe_activation_bytes(scenario, dense) - dense, scenario

    bf16, scenario = experts_only({})
    fp8, _ = experts_only({"fp8_format": "hybrid", "fp8_recipe": "delayed"})
    m = scenario.model
    rows = S * m.router_topk
    # less the dense MLP's fc2 input the layer gives way to, which FP8 counts in 1 byte
    # too (S local tokens at TP 1)
    assert bf16 - fp8 == pytest.approx(rows * (H + m.expert_ffn) - S * m.ffn_hidden_size)

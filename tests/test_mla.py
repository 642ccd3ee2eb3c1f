"""Multi-head latent attention (cost/mla.py), DeepSeek-V3's preset and its dense first
layers (`first_k_dense_replace`): parameters and FLOPs by closed form, and the rules."""

import pytest

from stepsim.cost.attention import causal_fraction, flash_work
from stepsim.cost.compute import ComputeModel
from stepsim.cost.params import active_params, layer_params, model_params
from stepsim.run.iteration import run
from stepsim.scenario import ModelSpec, ScenarioError
from stepsim.scenario.presets import MODELS
from tests.helpers import load

H, A, QL, KVL, DN, DR, DV = 1024, 16, 256, 128, 64, 32, 64
MLA = {
    "multi_latent_attention": True,
    "q_lora_rank": QL,
    "kv_lora_rank": KVL,
    "qk_head_dim": DN,
    "qk_pos_emb_head_dim": DR,
    "v_head_dim": DV,
}
LLAMA = {"swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope"}


def mla_scenario(tp=1, attention="flash", **model):
    return load(
        model={
            "num_layers": 2,
            "hidden_size": H,
            "num_attention_heads": A,
            "seq_length": 1024,
            "add_bias_linear": False,
            **LLAMA,
            **MLA,
            **model,
        },
        cluster={"node": "dgx-h100", "num_nodes": 1},
        parallel={"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1},
        training={"global_batch_size": 8 * 8 // tp, "attention_backend": attention},
    )


def test_one_mla_layer_by_hand():
    """Q: h q_lora + q_lora a (d_n + d_r); K/V: h (kv_lora + d_r) + kv_lora a (d_n + d_v);
    output a d_v h; the two latents' RMSNorms; then the SwiGLU MLP and the layer's norms."""
    model = mla_scenario().model
    f = model.ffn_hidden_size
    attention = (
        H * QL + QL * A * (DN + DR) + H * (KVL + DR) + KVL * A * (DN + DV) + A * DV * H + QL + KVL
    )
    sharded, replicated = layer_params(model)
    assert sharded + replicated == attention + 3 * H * f + 2 * H
    # the down-projections and the latents' norms sit whole on every tensor rank
    assert replicated == H * QL + H * (KVL + DR) + QL + KVL + 2 * H


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mla_flops_by_closed_form(tp):
    """Per token and rank: 2 x the up-projections' and the projection's weights / TP, the
    down-projections' whole on the rank's tokens (n / TP under SP); the core's 2 s (d_n +
    d_r) + 2 s d_v per head (the model's FLOPs, no causal skip) for a / TP heads."""
    cm = ComputeModel(mla_scenario(tp=tp))
    n = cm.tokens
    kernels = [k for k in cm.kernels() if k.block == "attention" and k.part == "forward"]
    flops = sum(k.work.flops for k in kernels)
    ups = QL * A * (DN + DR) + KVL * A * (DN + DV) + A * DV * H
    downs = H * QL + H * (KVL + DR)
    core = 2 * n * (DN + DR) + 2 * n * DV
    assert flops == pytest.approx(2 * n * ups / tp + 2 * n / tp * downs + n * A / tp * core)
    backward = [k for k in cm.kernels() if k.block == "attention" and k.part != "forward"]
    assert sum(k.work.flops for k in backward) == pytest.approx(2 * flops)


def test_mla_without_its_keys_set_takes_megatron_cores_defaults():
    model = ModelSpec(
        num_layers=2,
        hidden_size=H,
        num_attention_heads=A,
        ffn_hidden_size=4 * H,
        seq_length=1024,
        vocab_size=1000,
        add_bias_linear=False,
        multi_latent_attention=True,
    )
    assert (model.q_lora, model.kv_lora, model.qk_dim, model.v_dim) == (512, 512, 192, 128)
    assert model.attention_width == A * 128


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_mla_runs_and_its_step_grows_with_the_latents(attention):
    small = run(mla_scenario(attention=attention)).metrics.iteration_time_s
    wide = run(mla_scenario(attention=attention, q_lora_rank=4 * QL)).metrics
    assert wide.iteration_time_s > small
    assert 0 < wide.mfu < 1


def test_deepseek_v3_parameters_match_the_published_671b_and_37b():
    """671B total: the 61 layers, the input embedding and the output layer, without the
    multi-token-prediction module (the report's 671B; the checkpoint's 685B has it).
    37B activated: ours 37.55B counting both the embedding and the output layer, 36.6B
    without the input embedding (a lookup): the report's 37B either way."""
    model = ModelSpec(preset="deepseek-v3", **MODELS["deepseek-v3"])
    assert model.num_moe_layers == 58
    assert not model.is_moe_layer(2) and model.is_moe_layer(3)
    assert model_params(model, tied=False) == pytest.approx(671e9, abs=0.1e9)
    assert active_params(model, tied=False) == pytest.approx(37e9, abs=0.6e9)
    embedding = model.vocab_size * model.hidden_size
    assert active_params(model, tied=False) - embedding == pytest.approx(37e9, abs=0.6e9)


def test_first_k_dense_replace_with_moe_layer_freq():
    """Layer i is MoE when i >= k and i mod freq = 0 (Hugging Face's DeepSeek rule)."""
    model = ModelSpec(
        num_layers=10,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=1024,
        seq_length=128,
        vocab_size=1000,
        num_experts=4,
        first_k_dense_replace=3,
        moe_layer_freq=2,
    )
    assert [i for i in range(10) if model.is_moe_layer(i)] == [4, 6, 8]


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({"multi_latent_attention": False}, "model.q_lora_rank=256 needs model.multi_latent"),
        ({"num_query_groups": 4}, "model.num_query_groups=4 cannot be set with model.multi"),
        ({"add_bias_linear": True}, "model.add_bias_linear=True must be false with model.multi"),
    ],
)
def test_mla_rules(model, match):
    with pytest.raises(ScenarioError, match=match):
        mla_scenario(**model)


def test_mla_refuses_context_parallelism_and_first_k_dense_needs_an_moe_layer():
    with pytest.raises(ScenarioError, match="must be 1 with model.multi_latent_attention"):
        load(
            model={"num_layers": 2, "hidden_size": H, "num_attention_heads": A, **LLAMA, **MLA}
            | {"seq_length": 1024, "add_bias_linear": False},
            cluster={"node": "dgx-h100", "num_nodes": 1},
            parallel={"context_parallel_size": 2},
            training={"global_batch_size": 8, "attention_backend": "flash"},
        )
    with pytest.raises(ScenarioError, match="first_k_dense_replace=2 must be < model.num_layers"):
        mla_scenario(num_experts=4, first_k_dense_replace=2)


def test_mla_flash_backward_runs_three_qk_and_two_v_matmuls():
    """Flash backward recomputes S = Q K^T and runs dQ and dK over the Q/K width, dP and
    dV over V's: 2 s^2 (3 (d_n + d_r) + 2 d_v) per head (416 / 160 = 2.6 x the forward's
    matmuls here), not 2.5 x as with one head width; the model's FLOPs stay 2 x."""
    cm = ComputeModel(mla_scenario())
    heads, s = A, cm.model.seq_length
    a = cm.gpu.attention_kernels  # the H100's flash constants (cost.attention)
    loop = s * causal_fraction(s)
    shape = cm.gpu.peak_tflops * 1e12 * loop / (loop + a.kv_half)
    exps = a.exp_exposed * cm.gpu.tensor_flops_per_exp * heads * s * s * causal_fraction(s)
    forward, backward = flash_work(cm, False), flash_work(cm, True)
    ratio = (backward.duration_s * shape * a.backward_efficiency - exps) / (
        forward.duration_s * shape * a.forward_efficiency - exps
    )
    assert ratio == pytest.approx((3 * (DN + DR) + 2 * DV) / (DN + DR + DV))
    assert backward.flops == 2 * forward.flops

"""Llama-family shapes: GQA, SwiGLU, RMSNorm, rope, untied embeddings, biases; the
presets' parameter counts against the published ones; the keys' rules."""

import dataclasses

import pytest

from stepsim.cost.attention import flash_hbm_bytes
from stepsim.cost.compute import ComputeModel
from stepsim.cost.memory import activation_bytes_per_layer
from stepsim.cost.params import model_params, stage_params_per_rank
from stepsim.run.iteration import run as simulate
from stepsim.scenario import ModelSpec, ScenarioError
from stepsim.scenario.presets import MODELS
from tests.helpers import load

# Published parameter counts, and how far the count of the preset's shape may lie from
# each (the shapes' own counts, printed by each model's safetensors index, are in the
# comments; ours equal those exactly for the Llama family).
PUBLISHED = {
    # Brown et al. 2020 Table 2.1: 175.0B; ours 174.6B (vocabulary 51200, learned
    # positions, tied): 0.22 % under
    "gpt3-175b": (175.0e9, 0.005),
    # Smith et al. 2022: 530B; ours 529.6B: 0.08 % under
    "mt-nlg-530b": (530e9, 0.002),
    # meta-llama/Llama-2-7b-hf model card: 6.74B (6,738,415,616)
    "llama2-7b": (6.74e9, 0.001),
    # Llama-2-13b-hf: 13.0B (13,015,864,320)
    "llama2-13b": (13.0e9, 0.002),
    # Llama-2-70b-hf: 69.0B (68,976,648,192); the "~69B"
    "llama2-70b": (69.0e9, 0.001),
    # Meta-Llama-3-8B: 8.03B (8,030,261,248)
    "llama3-8b": (8.03e9, 0.001),
    # Meta-Llama-3-70B: 70.6B (70,553,706,496)
    "llama3-70b": (70.6e9, 0.001),
    # Llama 3 paper (arXiv 2407.21783) "405B"; Llama-3.1-405B: 405,853,388,800, 0.21 % over
    "llama3.1-405b": (405e9, 0.003),
    # mistralai/Mistral-7B-v0.1: 7.24B (7,241,732,096)
    "mistral-7b": (7.24e9, 0.001),
    # Qwen/Qwen2.5-72B model card: "Number of Parameters: 72.7B" (72,706,203,648, QKV
    # biases included)
    "qwen2.5-72b": (72.7e9, 0.001),
    # mixtures of experts, total parameters (active ones: tests/test_moe.py):
    # Jiang et al. 2024: Mixtral 8x7B 46.7B (ours 46,702,792,704)
    "mixtral-8x7b": (46.7e9, 0.001),
    # Mistral's Mixtral 8x22B announcement: 141B (ours 140.6B)
    "mixtral-8x22b": (141e9, 0.005),
    # Qwen3-235B-A22B model card: 235B (ours 235.09B; q/k norms not modelled)
    "qwen3-235b-a22b": (235e9, 0.001),
    # OpenAI's gpt-oss model card: 116.83B (ours 116.83B)
    "gpt-oss-120b": (116.83e9, 0.001),
    # DeepSeek-V3 report (arXiv 2412.19437): 671B without its MTP module (ours 671.03B;
    # tests/test_mla.py)
    "deepseek-v3": (671e9, 0.001),
}


def _spec(name: str) -> ModelSpec:
    values = {"ffn_hidden_size": 4 * MODELS[name]["hidden_size"], **MODELS[name]}
    return ModelSpec(preset=name, **values)


def test_every_preset_has_a_published_count():
    assert set(PUBLISHED) == set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_preset_parameter_count_matches_the_published_one(name):
    model = _spec(name)
    published, tolerance = PUBLISHED[name]
    count = model_params(model, tied=not model.untie_embeddings_and_output_weights)
    assert abs(count - published) <= tolerance * published


def test_llama_family_counts_are_the_checkpoints_exactly():
    exact = {
        "llama2-7b": 6_738_415_616,
        "llama2-70b": 68_976_648_192,
        "llama3-8b": 8_030_261_248,
        "llama3.1-405b": 405_853_388_800,
        "mistral-7b": 7_241_732_096,
        "qwen2.5-72b": 72_706_203_648,
    }
    for name, count in exact.items():
        assert model_params(_spec(name), tied=False) == count, name


# -- closed forms on one small GQA + SwiGLU model --------------------------------------------

A, G, D, H, F, S, T, B = 16, 4, 64, 1024, 2816, 1024, 2, 2
LLAMA = {
    "num_query_groups": G,
    "ffn_hidden_size": F,
    "swiglu": True,
    "normalization": "RMSNorm",
    "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True,
    "add_bias_linear": False,
}


def _small(model=None, **training):
    return load(
        model={"hidden_size": H, "num_attention_heads": A, "seq_length": S, **(model or {})},
        parallel={"tensor_model_parallel_size": T, "data_parallel_size": 8 // T},
        training={"micro_batch_size": B, "global_batch_size": 8 * B, **training},
    )


def _work(scenario, name, part="forward"):
    kernels = ComputeModel(scenario).kernels()
    return next(k.work for k in kernels if k.name == name and k.part == part)


def _names(scenario):
    return [k.name for k in ComputeModel(scenario).kernels()]


def test_gqa_qkv_gemm_is_heads_plus_two_groups_wide():
    tokens = B * S
    llama = _small(LLAMA)
    assert _work(llama, "QKV").flops == 2 * tokens * H * (A + 2 * G) * D / T
    assert _work(llama, "QKV dX", "input").flops == 2 * tokens * H * (A + 2 * G) * D / T
    assert _work(_small(), "QKV").flops == 2 * tokens * H * 3 * H / T  # GPT: 3 h
    # the projection maps heads x d back to h whatever the groups
    assert _work(llama, "projection").flops == 2 * tokens * A * D * H / T


def test_gqa_flash_kernel_moves_k_and_v_per_group():
    e = 2
    for groups in (A, G, 2):
        cm = ComputeModel(_small({**LLAMA, "num_query_groups": groups}, attention_backend="flash"))
        assert flash_hbm_bytes(cm, False) == e * B * S * D * (2 * A + 2 * groups) / T
        assert flash_hbm_bytes(cm, True) == e * B * S * D * (4 * A + 4 * groups) / T


def test_gqa_keeps_k_and_v_activations_per_group():
    """Korthikanti's 4 sbh of K and V become 4 s b g d (per TP rank without SP)."""
    gqa = activation_bytes_per_layer(_small(LLAMA))
    mha = activation_bytes_per_layer(_small({**LLAMA, "num_query_groups": A}))
    assert mha - gqa == pytest.approx(4 * S * B * (A - G) * D / T, rel=1e-12)


def test_gqa_attention_core_flops_are_the_query_heads():
    """Scores and context are per query head: GQA shares K/V, not the matmuls."""
    gqa = _work(_small(LLAMA, attention_backend="flash"), "flash attention")
    assert gqa.flops == 4 * B * S * S * A * D / T


def test_swiglu_mlp_flops_are_three_matrices():
    tokens = B * S
    llama = _small(LLAMA)
    fc1, fc2 = _work(llama, "fc1"), _work(llama, "fc2")
    assert fc1.flops == 2 * tokens * H * 2 * F / T
    assert fc2.flops == 2 * tokens * F * H / T
    assert fc1.flops + fc2.flops == 6 * tokens * H * F / T
    gpt = _small({"ffn_hidden_size": F})
    assert _work(gpt, "fc1").flops + _work(gpt, "fc2").flops == 4 * tokens * H * F / T


def test_swiglu_kernel_replaces_bias_gelu():
    e, ffn = 2, B * S * F / T
    llama = _small(LLAMA)
    cm = ComputeModel(llama)
    assert _work(llama, "swiglu") == cm.memory_bound(3 * e * ffn)  # gate, up in; out
    assert _work(llama, "swiglu", "input") == cm.memory_bound(5 * e * ffn)
    assert "bias-gelu" not in _names(llama) and "bias-gelu" in _names(_small())
    assert "gelu" in _names(_small({"add_bias_linear": False}))


def test_llama_layer_kernels_name_the_shape():
    names = _names(_small(LLAMA))
    assert "rmsnorm" in names and "layernorm" not in names
    assert "dropout-add" in names and "bias-dropout-add" not in names
    assert names.count("rope") == 2  # forward and backward
    assert "rope" not in _names(_small())


def test_rope_moves_q_and_k():
    llama = _small(LLAMA)
    elements = B * S * (A + G) * D / T
    assert _work(llama, "rope") == ComputeModel(llama).memory_bound(2 * 2 * elements)


def test_layer_params_of_the_llama_shape():
    model = _small(LLAMA).model
    layer = H * (A + 2 * G) * D + A * D * H + 3 * H * F + 2 * H  # two RMSNorm weights
    assert model_params(model, tied=False) == 4 * layer + 2 * 32000 * H + H
    gpt = _small().model  # learned positions, LayerNorm and biases, tied
    gpt_layer = 12 * H * H + 13 * H
    assert model_params(gpt) == 4 * gpt_layer + 32000 * H + S * H + 2 * H


def test_untied_output_layer_on_one_stage_counts_its_own_weights():
    untied = _small(LLAMA)
    tied = _small({**LLAMA, "untie_embeddings_and_output_weights": False})
    extra = stage_params_per_rank(untied, 0) - stage_params_per_rank(tied, 0)
    assert extra == 32000 * H / T
    assert untied.training.share_embeddings_and_output_weights is False


def test_untie_and_share_contradicting_is_an_error():
    with pytest.raises(ScenarioError, match=r"untie_embeddings_and_output_weights.*contradicts"):
        _small(LLAMA, share_embeddings_and_output_weights=True)
    agreed = _small(LLAMA, share_embeddings_and_output_weights=False)
    assert agreed.model.untie_embeddings_and_output_weights


def test_groups_must_divide_heads_and_tp_the_groups():
    with pytest.raises(ScenarioError, match=r"model\.num_query_groups.*must divide"):
        _small({"num_query_groups": 3})
    with pytest.raises(ScenarioError, match=r"tensor_model_parallel_size.*num_query_groups=1"):
        _small({"num_query_groups": 1})


def test_attention_backend_is_the_public_name():
    fused = _small(attention_backend="fused")
    assert fused.training.mechanism("attention_kernel") == "flash"
    assert _small(attention_backend="unfused").training.mechanism("attention_kernel") == "unfused"
    flash = _small(attention_backend="flash")
    assert flash == dataclasses.replace(flash)  # still a valid scenario
    with pytest.raises(ScenarioError, match=r"attention_backend.*contradicts"):
        _small(attention_backend="unfused", attention_kernel="flash")
    with pytest.raises(ScenarioError, match=r"training\.attention_backend.*'local'"):
        _small(attention_backend="local")


def test_flash_activations_have_no_s_squared_term():
    flash = activation_bytes_per_layer(_small(LLAMA, attention_backend="flash"))
    sbh = S * B * H
    sharded = (4 * A * D + 4 * G * D + 2 * 2 * F + 2 * F) / H
    assert flash == pytest.approx(sbh * (10 + sharded / T + 4 * A / (H * T)), rel=1e-12)


def test_a_llama_scenario_runs_and_reports_model_flops():
    scenario = _small(LLAMA, attention_backend="flash")
    metrics = simulate(scenario).metrics
    assert 0 < metrics.mfu < 1


def _file(tmp_path, model, training=""):
    text = (
        'name = "t"\n[model]\n' + model + "\n[cluster]\n"
        'node = "dgx-h100"\nnum_nodes = 1\n[parallel]\ntensor_model_parallel_size = 8\n'
        "[training]\nglobal_batch_size = 8\n" + training + "\n[network]\n"
    )
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_bad_model_keys_are_one_line_cli_errors(tmp_path):
    from tests.helpers import cli_error

    llama = 'preset = "llama3-8b"\nseq_length = 1024'
    line = cli_error(_file(tmp_path, llama + "\nnum_query_groups = 4"))
    assert "tensor_model_parallel_size=8" in line and "num_query_groups=4" in line
    line = cli_error(_file(tmp_path, llama, "share_embeddings_and_output_weights = true"))
    assert "untie_embeddings_and_output_weights" in line and "contradicts" in line
    line = cli_error(_file(tmp_path, llama + '\nnormalization = "rmsnorm"'))
    assert "model.normalization" in line and "RMSNorm" in line


def test_a_preset_file_resolves_and_loads_back(tmp_path):
    from stepsim.scenario import load_scenario
    from stepsim.scenario.loader import dumps_toml, scenario_to_dict

    scenario = load_scenario(_file(tmp_path, 'preset = "qwen2.5-72b"\nnum_layers = 8'))
    assert scenario.model.qkv_bias and not scenario.model.linear_bias
    assert scenario.training.share_embeddings_and_output_weights is False
    again = tmp_path / "again.toml"
    again.write_text(dumps_toml(scenario_to_dict(scenario)), encoding="utf-8")
    assert load_scenario(again) == scenario


def test_plan_counts_the_shipped_llama_scenarios_parameters():
    """plan's one-GPU layout drops the overlaps that need the dropped sharding and SP."""
    from stepsim.plan.planning import model_params as plan_params
    from stepsim.scenario import load_scenario

    scenario = load_scenario("scenarios/llama2-70b-64nodes-h100.toml")
    assert scenario.training.overlap_param_gather and scenario.training.tp_comm_overlap
    assert plan_params(scenario) == model_params(scenario.model, tied=False) == 68_976_648_192

"""Hugging Face config.json files in (`model.hf_config`, `--hf-config`): the cited
config of each preset's model gives exactly the preset's model; explicit keys win; the
parameter counts of GPT-2 and GPT-NeoX-20B in closed form; every refusal one line.
The files are tests/data/hf/*/config.json (tests/data/hf/README.md cites each)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from stepsim.cost.params import model_params
from stepsim.scenario import ScenarioError, dumps_toml, load_scenario, scenario_from_dict
from stepsim.scenario import scenario_to_dict as to_dict
from stepsim.scenario.hfconfig import ARCHITECTURES, model_keys
from stepsim.scenario.presets import MODELS
from tests.helpers import main_in_process, scenario

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf"
# each config.json and the preset its fields were cited for (presets.py's comments)
PRESET_OF = {
    "Llama-2-7b-hf": "llama2-7b",
    "Meta-Llama-3-8B": "llama3-8b",
    "Mistral-7B-v0.1": "mistral-7b",
    "Qwen2.5-72B": "qwen2.5-72b",
    "Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "DeepSeek-V3": "deepseek-v3",
    "gpt-oss-120b": "gpt-oss-120b",
}
# what a config.json says beyond a preset: DeepSeek-V3's group-limited routing (8 groups,
# 4 chosen), which its preset leaves to the scenario (scenarios/deepseek-v3-2048-h800.toml)
BEYOND_PRESET = {"deepseek-v3": {"moe_router_num_groups": 8, "moe_router_group_topk": 4}}


def _model_doc(**model):
    """A scenario dict (tests.helpers' tiny one) whose [model] is exactly ``model``."""
    doc = scenario()
    doc["model"] = model
    return doc


def _config(tmp_path: Path, fields: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(fields))
    return path


def _error(call, *args, **kwargs) -> ScenarioError:
    with pytest.raises(ScenarioError) as err:
        call(*args, **kwargs)
    assert "\n" not in str(err.value)
    return err.value


@pytest.mark.parametrize("folder", sorted(PRESET_OF))
def test_each_cited_config_gives_its_presets_model(folder):
    preset = PRESET_OF[folder]
    want = {k: v for k, v in MODELS[preset].items() if k != "seq_length"}
    assert model_keys(HF / folder / "config.json", folder) == {
        **want,
        **BEYOND_PRESET.get(preset, {}),
    }
    seq = MODELS[preset]["seq_length"]
    path = str(HF / folder / "config.json")
    from_hf = scenario_from_dict(_model_doc(hf_config=path, seq_length=seq)).model
    from_preset = scenario_from_dict(_model_doc(preset=preset)).model
    assert from_hf.hf_config == path
    assert replace(from_hf, hf_config=None) == replace(
        from_preset, preset=None, **BEYOND_PRESET.get(preset, {})
    )


def test_gpt2_and_gpt_neox_in_closed_form():
    """GPT-2 small: tied, learned positions over its 1024 tokens, 4h FFN: 12 L h^2 +
    13 L h + (V + s) h + 2 h = 124,439,808 (its checkpoint's count). GPT-NeoX-20B:
    untied, rope: 12 L h^2 + 13 L h + 2 V h + 2 h = 20,554,567,680 (its paper's)."""
    gpt2 = scenario_from_dict(_model_doc(hf_config=str(HF / "gpt2/config.json"), seq_length=1024))
    m = gpt2.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size) == (12, 768, 3072, 50257)
    assert not m.rope and not m.gated and not m.rms_norm and m.linear_bias
    assert gpt2.training.share_embeddings_and_output_weights
    L, h, V = 12, 768, 50257
    assert model_params(m) == 12 * L * h * h + 13 * L * h + (V + 1024) * h + 2 * h == 124_439_808

    neox = scenario_from_dict(
        _model_doc(hf_config=str(HF / "gpt-neox-20b/config.json"), seq_length=2048)
    )
    m = neox.model
    assert m.rope and not m.gated and not m.rms_norm and m.linear_bias
    assert m.untie_embeddings_and_output_weights
    assert not neox.training.share_embeddings_and_output_weights
    L, h, V = 44, 6144, 50432
    expected = 12 * L * h * h + 13 * L * h + 2 * V * h + 2 * h
    assert model_params(m, tied=False) == expected == 20_554_567_680


def test_explicit_keys_win_and_the_path_is_the_scenarios_folders(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "Meta-Llama-3-8B/config.json").read_text())
    text = (
        'name = "hf"\n[model]\nhf_config = "models/config.json"\nseq_length = 2048\n'
        "num_layers = 2\nvocab_size = 1000\n[cluster]\nnode = 'dgx-a100'\nnum_nodes = 1\n"
        "[parallel]\ntensor_model_parallel_size = 1\npipeline_model_parallel_size = 1\n"
        "[training]\nmicro_batch_size = 1\nglobal_batch_size = 8\n[network]\n"
    )
    (tmp_path / "s.toml").write_text(text)
    loaded = load_scenario(tmp_path / "s.toml", ["model.num_query_groups=4"])
    m = loaded.model
    assert (m.num_layers, m.vocab_size, m.num_query_groups) == (2, 1000, 4)  # given
    assert (m.hidden_size, m.ffn_hidden_size, m.seq_length) == (4096, 14336, 2048)  # file
    assert m.hf_config == str((folder / "config.json").resolve())
    # the resolved file holds every key and the absolute path: it loads back equal
    (tmp_path / "resolved.toml").write_text(dumps_toml(to_dict(loaded)))
    assert load_scenario(tmp_path / "resolved.toml") == loaded


def test_the_command_lines_hf_config_replaces_the_files_preset(tmp_path):
    """--hf-config drops the scenario's preset and the keys the config gives, keeps the
    preset's seq_length (the training length) and lets --set win."""
    shipped = ROOT / "scenarios" / "mixtral-8x7b-16-h100.toml"
    base = load_scenario(shipped)
    path = HF / "Mixtral-8x7B-v0.1" / "config.json"
    assert load_scenario(shipped, hf_config=path).model == replace(
        base.model, preset=None, hf_config=str(path)
    )
    edited = load_scenario(shipped, ["model.num_layers=16"], hf_config=path).model
    assert edited == replace(base.model, preset=None, hf_config=str(path), num_layers=16)


def test_run_with_hf_config_is_run_with_its_keys_set():
    """`stepsim run --hf-config` simulates the same model as the keys written out."""
    tiny = str(ROOT / "scenarios" / "tiny-2gpu.toml")
    gpt2 = str(HF / "gpt2" / "config.json")
    by_file = main_in_process("run", tiny, "--hf-config", gpt2, "--json", "--quiet")
    keys = ["model.num_layers=12", "model.hidden_size=768", "model.num_attention_heads=12"]
    keys += ["model.vocab_size=50257", "model.ffn_hidden_size=3072"]
    by_keys = main_in_process("run", tiny, "--json", *(a for k in keys for a in ("--set", k)))
    assert by_file[0] == by_keys[0] == 0
    assert json.loads(by_file[1]) == json.loads(by_keys[1])


def test_a_preset_and_an_hf_config_together_are_refused():
    path = str(HF / "gpt2" / "config.json")
    err = _error(scenario_from_dict, _model_doc(hf_config=path, preset="gpt3-175b", seq_length=8))
    assert str(err).startswith(f"model.hf_config={path!r} and model.preset='gpt3-175b' both fill")
    assert err.key == "model.hf_config"


def test_seq_length_is_not_taken_from_the_file():
    path = str(HF / "Llama-2-7b-hf" / "config.json")  # max_position_embeddings 4096
    err = _error(scenario_from_dict, _model_doc(hf_config=path))
    assert str(err).startswith(f"missing key model.seq_length: model.hf_config={path!r} gives")
    assert err.key == "model.seq_length"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe"},
            "architectures[0]='Glm4MoeForCausalLM' is not an architecture stepsim reads; it "
            "reads " + ", ".join(ARCHITECTURES),
        ),
        ({"model_type": "qwen3moe"}, "model_type='qwen3moe' is not an architecture stepsim "),
        ({"architectures": ["LLamaForCausalLM"]}, "did you mean 'LlamaForCausalLM'?"),
        (
            {"architectures": ["LlamaForCausalLM"], "hidden_size": 64},
            "has no field 'num_hidden_layers', which a LlamaForCausalLM config.json must give",
        ),
        ({"model_type": "gpt2", "n_layer": "12"}, "field 'n_layer'='12' must be an integer"),
        ({"model_type": "gpt2", "n_layer": True}, "field 'n_layer'=True must be an integer"),
        (
            {"model_type": "gpt2", "n_layer": 0, "n_embd": 64, "n_head": 4, "vocab_size": 9},
            "field 'n_layer' gives model.num_layers=0 must be positive",
        ),
        (
            {"model_type": "qwen3", **{k: 8 for k in ("num_hidden_layers", "hidden_size")}},
            "has no field 'num_attention_heads'",
        ),
        ([1, 2], "a config.json holds one JSON object, not list"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_key_the_file_and_the_field(tmp_path, fields, message):
    path = _config(tmp_path, fields)
    err = _error(scenario_from_dict, _model_doc(hf_config=str(path), seq_length=8))
    assert str(err).startswith(f"model.hf_config={str(path)!r}")
    assert message in str(err)


def test_files_that_are_not_json_or_not_there(tmp_path):
    (tmp_path / "bad.json").write_text("[1, 2")
    err = _error(model_keys, tmp_path / "bad.json", "model.hf_config='bad.json'")
    assert str(err).startswith("model.hf_config='bad.json': not valid JSON: ")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert "not valid JSON" in str(_error(model_keys, tmp_path / "deep.json", "x"))
    err = _error(model_keys, tmp_path / "none.json", "model.hf_config='none.json'")
    assert str(err) == "cannot read model.hf_config='none.json': No such file or directory"


QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 100,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
}


def test_what_a_family_cannot_express_is_refused_and_what_it_can_is_mapped(tmp_path):
    # Qwen3-MoE's dense first layers are first_k_dense_replace; head_dim 32 != 64 / 4
    keys = model_keys(_config(tmp_path, {**QWEN3_MOE, "mlp_only_layers": [0, 1]}), "x")
    assert (keys["first_k_dense_replace"], keys["kv_channels"]) == (2, 32)
    for fields, message in (
        ({"mlp_only_layers": [1, 3]}, "x: mlp_only_layers=[1, 3] is not modelled"),
        ({"decoder_sparse_step": 2}, "x: decoder_sparse_step=2 is not modelled"),
        ({"head_dim": None}, "x has no field 'head_dim'"),  # Qwen3's class default is 128
    ):
        err = _error(model_keys, _config(tmp_path, {**QWEN3_MOE, **fields}), "x")
        assert str(err).startswith(message)
    # GQA equal to the heads and head_dim equal to hidden / heads are left out
    llama = {
        "model_type": "llama",
        **{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
        **{"num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 96, "vocab_size": 9},
    }
    keys = model_keys(_config(tmp_path, {**llama, "attention_bias": True}), "x")
    assert "num_query_groups" not in keys and "kv_channels" not in keys
    assert (keys["add_bias_linear"], keys["add_qkv_bias"]) == (False, True)


def test_hf_config_flag_errors_are_one_line_exit_2(tmp_path):
    tiny = str(ROOT / "scenarios" / "tiny-2gpu.toml")
    missing = str(tmp_path / "no.json")
    code, out, err = main_in_process("run", tiny, "--hf-config", missing)
    assert (code, out) == (2, "")
    assert (
        err == f"stepsim: error: cannot read --hf-config {missing!r}: No such file or directory\n"
    )

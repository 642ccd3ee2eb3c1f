"""The schema read from the specs: the loader's tables, the README's, the resolved TOML."""

import re
from dataclasses import MISSING, replace
from pathlib import Path

import pytest

from stepsim.scenario import ScenarioError, frameworks, scenario_from_dict, scenario_to_dict
from stepsim.scenario.schema import ARRAYS, SECTIONS, TOP_LEVEL, check_value, keys, markdown_table
from stepsim.topologies import FABRICS
from tests.helpers import load, scenario

README = Path(__file__).resolve().parents[1] / "scenarios" / "README.md"


def test_the_readme_holds_exactly_the_generated_key_tables():
    text = README.read_text(encoding="utf-8")
    for section in keys():
        assert markdown_table(section) in text, "regenerate: python -m stepsim.scenario"
    # no other key table: one header per section, and the jobs file's [[job]] table
    # (tests/test_jobs.py checks that one)
    assert text.count("| Key | Type | Unit | Default | Values | Meaning |") == len(keys()) + 1
    assert frameworks.markdown_table() in text, "regenerate: python -m stepsim.scenario"


def test_keys_are_the_spec_fields_with_key_metadata_in_field_order():
    assert list(keys()) == [TOP_LEVEL, *SECTIONS, *ARRAYS]
    assert list(keys()["model"]) == [
        "preset",
        "hf_config",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_hidden_size",
        "seq_length",
        "vocab_size",
        "num_query_groups",
        "kv_channels",
        "swiglu",
        "normalization",
        "position_embedding_type",
        "untie_embeddings_and_output_weights",
        "add_bias_linear",
        "add_qkv_bias",
        "multi_latent_attention",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_head_dim",
        "qk_pos_emb_head_dim",
        "v_head_dim",
        "mtp_num_layers",
        "num_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size",
        "moe_layer_freq",
        "first_k_dense_replace",
        "moe_expert_capacity_factor",
        "moe_router_num_groups",
        "moe_router_group_topk",
        "moe_routing",
        "moe_expert_load_max_violation",
        "moe_router_enable_expert_bias",
        "moe_routing_zipf_exponent",
        "moe_routing_shares_file",
    ]
    assert "custom_orders" not in keys()["training"]  # read from the file, not a key
    assert "moe_routing_shares" not in keys()["model"]  # likewise
    assert [k.name for k in keys()["model"].values() if k.required] == [
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "vocab_size",
    ]
    gpu = keys()["cluster"]["gpu"]
    assert (gpu.type, gpu.by_name, gpu.preset, gpu.default) == (str, True, True, MISSING)
    assert "a100-sxm4-80gb" in gpu.choices


def test_types_ranges_and_choices_come_from_the_field_metadata():
    cluster = keys()["cluster"]
    assert check_value(cluster["nic_gbps"], 200) == 200.0  # ints become floats
    assert type(check_value(cluster["nic_gbps"], 200)) is float
    assert check_value(cluster["ib_latency_us"], 0) == 0.0  # latencies may be zero
    for key, value, message in (
        ("num_nodes", 0, "cluster.num_nodes=0 must be positive"),
        ("num_nodes", 100_001, "cluster.num_nodes=100001 must be between 1 and 100000"),
        ("num_nodes", True, "cluster.num_nodes=True must be an integer"),
        ("nic_gbps", "fast", "cluster.nic_gbps='fast' must be a number"),
        ("ib_latency_us", -1.0, "cluster.ib_latency_us=-1.0 must be >= 0"),
        ("oversubscription", float("inf"), "cluster.oversubscription=inf must be a finite number"),
        ("fabric", "ring", "cluster.fabric='ring' must be one of: " + ", ".join(FABRICS)),
    ):
        with pytest.raises(ScenarioError, match="^" + re.escape(message)) as err:
            check_value(cluster[key], value)
        assert str(err.value) == message
        assert (err.value.key, err.value.value) == (f"cluster.{key}", value)


def test_the_resolved_toml_lists_every_key_the_scenario_sets_in_schema_order():
    doc = scenario_to_dict(load(training={"schedule": "interleaved", "global_batch_size": 8}))
    assert list(doc) == ["name", *SECTIONS]
    for section in SECTIONS:
        assert list(doc[section]) == [k for k in keys()[section] if k in doc[section]]
    # None values are left out; the GPU is written by its preset name
    assert "preset" not in doc["model"] and "schedule_file" not in doc["training"]
    assert doc["cluster"]["gpu"] == "a100-sxm4-80gb"
    assert doc["parallel"]["virtual_pipeline_model_parallel_size"] == 2  # derived, written


def test_required_keys_come_from_the_schema(monkeypatch):
    """The loader names a missing key from the specs' defaults (Key.required), in every
    section: each required key left out of a file is named, and a key made required in
    the schema is asked for without any change to the loader."""
    doc = scenario()
    doc["model"]["ffn_hidden_size"] = 4096  # derived when left out; kept for the loop below
    for section in SECTIONS:
        for key in keys()[section].values():
            if not key.required or key.name not in doc[section]:
                continue
            without = {**doc, section: {k: v for k, v in doc[section].items() if k != key.name}}
            with pytest.raises(ScenarioError, match=rf"^missing key {key.full_name}"):
                scenario_from_dict(without)
    batch = keys()["training"]["micro_batch_size"]
    assert not batch.required
    monkeypatch.setitem(keys()["training"], "micro_batch_size", replace(batch, default=MISSING))
    without = {**doc, "training": {"global_batch_size": 8}}
    with pytest.raises(ScenarioError, match=r"^missing key training\.micro_batch_size$"):
        scenario_from_dict(without)

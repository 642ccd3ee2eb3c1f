"""Scenario files: presets, overrides, defaults, round trip, and one-line errors."""

import re

import pytest

from stepsim.scenario import (
    ScenarioError,
    apply_override,
    dumps_toml,
    load_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from tests.helpers import load, scenario


def test_presets_fill_in_and_keys_override_them():
    doc = scenario(cluster={"node": "dgx-h100", "num_nodes": 2, "nic_gbps": 200})
    doc["model"] = {"preset": "gpt3-175b", "num_layers": 48}
    s = scenario_from_dict(doc)
    assert s.model.num_layers == 48 and s.model.hidden_size == 12288
    assert s.model.ffn_hidden_size == 4 * 12288
    assert s.cluster.gpu.name == "h100-sxm5-80gb" and s.cluster.nic_gbps == 200.0
    assert s.cluster.nvlink_gbytes_per_s == 450.0


def test_data_parallel_size_is_derived_from_the_gpu_count():
    doc = scenario(
        cluster={"num_nodes": 2},
        parallel={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
    )
    del doc["parallel"]["data_parallel_size"]
    doc["training"]["global_batch_size"] = 16
    s = scenario_from_dict(doc)
    assert s.parallel.data_parallel_size == 4
    assert s.num_microbatches == 4


def test_overrides_parse_toml_values_and_bare_words():
    doc = scenario()
    apply_override(doc, "training.schedule=gpipe")
    apply_override(doc, "cluster.nic_gbps=135")
    apply_override(doc, "parallel.sequence_parallel=true")
    apply_override(doc, 'name="renamed"')
    s = scenario_from_dict(doc)
    assert s.training.schedule == "gpipe" and s.cluster.nic_gbps == 135.0
    assert s.parallel.sequence_parallel is True and s.name == "renamed"


def test_resolved_toml_loads_back_to_the_same_scenario(tmp_path):
    doc = scenario(training={"recompute_granularity": "full"})
    doc["model"] = {"preset": "mt-nlg-530b"}
    s = scenario_from_dict(doc)
    path = tmp_path / "resolved.toml"
    path.write_text(dumps_toml(scenario_to_dict(s)))
    assert load_scenario(path) == s


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "parallel.tensor_model_parallel_size=6",
            "parallel.tensor_model_parallel_size=6 must divide model.num_attention_heads=16",
        ),
        (
            "parallel.pipeline_model_parallel_size=3",
            "parallel.pipeline_model_parallel_size=3 must divide model.num_layers=4",
        ),
        (
            "training.micro_batch_size=3",
            "training.global_batch_size=8 must be divisible by micro_batch_size x "
            "data_parallel_size=3 x 1=3",
        ),
        (
            "parallel.data_parallel_size=16",
            "asks for tensor x pipeline x data = 16 GPUs but the cluster has 8",
        ),
        ("training.schedule=zigzag", "training.schedule='zigzag' must be one of: gpipe, 1f1b"),
        ("training.recompute=full", "unknown key 'training.recompute'"),
        ("model.hidden_size=big", "model.hidden_size='big' must be an integer"),
        (
            "model.hidden_size=1000",
            "model.num_attention_heads=16 must divide model.hidden_size=1000",
        ),
        ("cluster.nic_gbps=-5", "cluster.nic_gbps=-5.0 must be positive"),
        ("cluster.nic_gbps=true", "cluster.nic_gbps=True must be a number"),
        ("cluster.gpu=a200", "cluster.gpu='a200' must be one of"),
        ("training.overlap_grad_reduce=1", "training.overlap_grad_reduce=1 must be true or false"),
        (
            "parallel.virtual_pipeline_model_parallel_size=2",
            "virtual_pipeline_model_parallel_size=2 needs a schedule with chunks",
        ),
        ("cluster.nics_per_node=16", "cluster.nics_per_node=16 must be <= cluster.gpus_per_node=8"),
        ("network.model=packet", "network.model='packet' must be one of"),
        ("oops.key=1", "unknown section 'oops'"),
        ("cluster.fabric=torus", "cluster.fabric='torus' must be one of: switch, fat-tree"),
        ("cluster.fabric_levels=4", "cluster.fabric_levels=4 must be between 2 and 3"),
        ("cluster.oversubscription=0.5", "cluster.oversubscription=0.5 must be between 1"),
        ("cluster.nvlink_topology=ring", "cluster.nvlink_topology='ring' must be one of"),
        (
            "training.data_parallel_sharding=zero3",
            "training.data_parallel_sharding='zero3' must be one of: "
            "none, optimizer, gradients, full",
        ),
        (
            "network.collective_algorithm=nvls",
            "network.collective_algorithm='nvls' must be one of: ring, tree, hierarchical, auto",
        ),
        ("cluster.nvlink_gbytes_per_s=1e-320", "must be between 0.001 and 1e+07"),
        ("cluster.num_nodes=10000000", "cluster.num_nodes=10000000 must be between 1 and 100000"),
        ("cluster.nics_per_node=3", "cluster.nics_per_node=3 must divide cluster.gpus_per_node=8"),
        ("model.num_layers=400000000", "ops, over the limit of 5,000,000 ops"),
        ("justaword", "must look like section.key=value"),
    ],
)
def test_bad_input_names_key_value_and_rule(override, message):
    doc = scenario()
    with pytest.raises(ScenarioError, match=re.escape(message)) as info:
        apply_override(doc, override)
        scenario_from_dict(doc)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_keys_are_named():
    doc = scenario()
    del doc["training"]["global_batch_size"]
    with pytest.raises(ScenarioError, match="missing key training.global_batch_size"):
        scenario_from_dict(doc)
    doc = scenario(cluster={"node": None})
    del doc["cluster"]["node"]
    with pytest.raises(ScenarioError, match="missing key cluster.gpu"):
        scenario_from_dict(doc)


def test_unknown_top_level_key_and_bad_files(tmp_path):
    with pytest.raises(ScenarioError, match="unknown key 'modle' at top level"):
        scenario_from_dict({**scenario(), "modle": {}})
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(tmp_path / "missing.toml")


def test_layouts_that_break_replica_symmetry_are_refused():
    doc = scenario(
        cluster={"gpus_per_node": 6, "nics_per_node": 2, "num_nodes": 3},
        parallel={"tensor_model_parallel_size": 4, "data_parallel_size": 3},
        training={"global_batch_size": 6},
    )
    with pytest.raises(
        ScenarioError,
        match="tensor_model_parallel_size=4 must divide or be a "
        "multiple of cluster.gpus_per_node=6",
    ):
        scenario_from_dict(doc)
    doc = scenario(
        cluster={"num_nodes": 3},
        parallel={
            "tensor_model_parallel_size": 2,
            "data_parallel_size": 3,
            "pipeline_model_parallel_size": 2,
        },
        training={"global_batch_size": 6},
    )
    with pytest.raises(
        ScenarioError,
        match=r"tensor x data parallel size=6 \(the GPUs of one "
        r"pipeline stage\) must divide",
    ):
        scenario_from_dict(doc)


def test_strings_with_control_characters_survive_the_round_trip(tmp_path):
    s = scenario_from_dict(scenario(name='a\nb\t"c"\x7f'))
    path = tmp_path / "r.toml"
    path.write_text(dumps_toml(scenario_to_dict(s)))
    assert load_scenario(path).name == s.name


def test_non_utf8_file_is_a_clear_error(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "\xff\xfe"\n')
    with pytest.raises(ScenarioError, match="is not UTF-8 text"):
        load_scenario(path)


def test_nvlink_mesh_rules():
    doc = scenario(cluster={"nvlink_topology": "all-to-all"})
    with pytest.raises(ScenarioError, match="gpus_per_node=8 must be <= 7 for"):
        scenario_from_dict(doc)
    doc = scenario(cluster={"node": "dgx-1-v100", "gpus_per_node": 4, "nics_per_node": 4})
    with pytest.raises(ScenarioError, match="gpus_per_node=4 must be 8 for"):
        scenario_from_dict(doc)


def test_files_that_cannot_be_read_are_one_line_each(tmp_path):
    """Both readers (a TOML file, a schedule file) name the file and the reason."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ScenarioError) as err:
        load_scenario(missing)
    assert (
        str(err.value) == f"cannot read scenario file {str(missing)!r}: No such file or directory"
    )
    doc = scenario(training={"schedule": "custom", "schedule_file": "orders.txt"})
    (tmp_path / "orders.txt").write_bytes(b"F0 \xff\n")
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(doc, base_dir=tmp_path)
    assert str(err.value) == "training.schedule_file='orders.txt' is not UTF-8 text"
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(doc, base_dir=tmp_path / "elsewhere")
    assert (
        str(err.value)
        == "cannot read training.schedule_file='orders.txt': No such file or directory"
    )


def test_use_distributed_optimizer_is_megatron_cores_switch_for_zero_1():
    """`--use-distributed-optimizer` sets the sharding; false, or a contradicting
    sharding, is checked against data_parallel_sharding."""
    dp = {"data_parallel_size": 8}
    on = load(parallel=dp, training={"use_distributed_optimizer": True})
    assert on.training.data_parallel_sharding == "optimizer"
    full = {"use_distributed_optimizer": True, "data_parallel_sharding": "full"}
    assert load(parallel=dp, training=full).training.data_parallel_sharding == "full"
    off = load(parallel=dp, training={"use_distributed_optimizer": False})
    assert off.training.data_parallel_sharding == "none"
    for given in (
        {"use_distributed_optimizer": True, "data_parallel_sharding": "none"},
        {"use_distributed_optimizer": False, "data_parallel_sharding": "optimizer"},
    ):
        with pytest.raises(ScenarioError, match="use_distributed_optimizer.*contradicts"):
            load(parallel=dp, training=given)

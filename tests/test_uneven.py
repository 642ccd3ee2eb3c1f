"""Uneven pipeline stages (Megatron-Core's four split keys): the rules and their
errors, closed forms for time and memory, and the published shapes that need them."""

import dataclasses
import re

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.params import layer_params_per_rank
from stepsim.plan.bound import iteration_lower_bound_s
from stepsim.run.iteration import run
from stepsim.scenario.errors import ScenarioError
from tests.helpers import load

# no communication worth the name: NVLink at the schema's top bandwidth, no latency
FREE_LINKS = {
    "node": "dgx-a100",
    "num_nodes": 1,
    "gpus_per_node": 2,
    "nics_per_node": 2,
    "nvlink_gbytes_per_s": 1e7,
    "nvlink_latency_us": 0.0,
    "collective_base_latency_us": 0.0,
}


def _layers(**parallel):
    return load(parallel={"pipeline_model_parallel_size": 2, **parallel}, cluster=FREE_LINKS)


def test_even_split_without_the_keys():
    s = load(model={"num_layers": 8}, parallel={"pipeline_model_parallel_size": 4})
    assert s.chunk_layers == ((2,), (2,), (2,), (2,))


def test_first_stage_one_layer_and_the_rest_on_the_last():
    s = _layers(decoder_first_pipeline_num_layers=1)
    assert s.chunk_layers == ((1,), (3,))
    s = _layers(decoder_last_pipeline_num_layers=3)
    assert s.chunk_layers == ((1,), (3,))


def test_pp2_layers_1_and_3_iteration_is_the_closed_form():
    # 1F1B on 2 stages, 8 micro-batches; stage 1 (3 layers + output) is the slower, so it
    # never waits once the first forward arrives: F0 + m (F1 + B1), then its optimizer;
    # stage 0 ends with its last backward and its optimizer step. (The tied embedding's
    # all-reduce, which would join the two ends first, has its own test in
    # test_gradient_path.py.)
    s = dataclasses.replace(
        base := _layers(decoder_first_pipeline_num_layers=1),
        training=dataclasses.replace(base.training, share_embeddings_and_output_weights=False),
    )
    compute = ComputeModel(s)
    layer, extras = compute.layer(), compute.extras()
    f = (layer.attention_forward + layer.mlp_forward).duration_s
    b = (layer.attention_backward + layer.mlp_backward).duration_s
    f0 = extras.embedding_forward.duration_s + f
    b0 = b + extras.embedding_backward.duration_s
    f1 = 3 * f + extras.output_forward.duration_s
    b1 = 3 * b + extras.output_backward.duration_s
    m = s.num_microbatches
    result = run(s)
    opt = [compute.optimizer(mem.params).duration_s for mem in result.memory]
    stage1_done = f0 + m * (f1 + b1)
    expected = max(stage1_done + opt[1], stage1_done + b0 + opt[0])
    assert result.trace.end_s == pytest.approx(expected, rel=1e-6)
    assert iteration_lower_bound_s(s) <= result.trace.end_s


def test_memory_of_each_stage_follows_its_layers():
    s = _layers(decoder_first_pipeline_num_layers=1)
    even = load(parallel={"pipeline_model_parallel_size": 2}, cluster=FREE_LINKS)
    layer = layer_params_per_rank(s)
    uneven_mem, even_mem = run(s).memory, run(even).memory
    # one layer moves from stage 0 to stage 1
    assert uneven_mem[0].params == pytest.approx(even_mem[0].params - layer)
    assert uneven_mem[1].params == pytest.approx(even_mem[1].params + layer)
    # activations: stage 0 holds 2 forwards of 1 layer, stage 1 one of 3 (1F1B)
    per_layer = (even_mem[0].activations_bytes) / (2 * 2)
    assert uneven_mem[0].activations_bytes == pytest.approx(2 * 1 * per_layer)


def test_bloom_70_layers_on_12_stages():
    # BLOOM-176B (bigscience Megatron-DeepSpeed, partition_method type:transformer|embedding):
    # 5, 6 x 10, 5 layers; in Megatron-Core's keys, first = last = 5
    s = load(
        model={"num_layers": 70},
        cluster={"num_nodes": 2, "gpus_per_node": 6, "nics_per_node": 6},
        parallel={
            "pipeline_model_parallel_size": 12,
            "decoder_first_pipeline_num_layers": 5,
            "decoder_last_pipeline_num_layers": 5,
        },
        training={"global_batch_size": 12},
    )
    assert [sum(c) for c in s.chunk_layers] == [5] + [6] * 10 + [5]
    result = run(s)
    assert result.trace.end_s > 0


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("zbh1", 1), ("interleaved", 2)])
def test_zero_bubble_setting_first_and_last_one_layer_fewer(schedule, chunks):
    # Qi et al. 2023's setting: the embedding and the loss each take a layer's place
    s = load(
        model={"num_layers": 14},
        cluster={"num_nodes": 1, "gpus_per_node": 4, "nics_per_node": 4},
        parallel={
            "pipeline_model_parallel_size": 4,
            "virtual_pipeline_model_parallel_size": chunks,
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        },
        training={"schedule": schedule},
    )
    per_rank = [sum(c) for c in s.chunk_layers]
    assert per_rank == [3, 4, 4, 3]
    if chunks == 2:
        assert s.chunk_layers == ((1, 2), (2, 2), (2, 2), (2, 1))
    assert run(s).trace.end_s > 0


def test_zbv_loss_is_on_rank_0():
    s = load(
        model={"num_layers": 14},
        cluster={"num_nodes": 1, "gpus_per_node": 4, "nics_per_node": 4},
        parallel={
            "pipeline_model_parallel_size": 4,
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        },
        training={"schedule": "zbv"},
    )
    # 16 counted layers on 8 virtual stages; stages 0 and 7 are both on rank 0
    assert s.chunk_layers == ((1, 1), (2, 2), (2, 2), (2, 2))
    assert run(s).trace.end_s > 0


ERRORS = [
    (
        {"decoder_first_pipeline_num_layers": 1, "account_for_loss_in_pipeline_split": True},
        "parallel.decoder_first_pipeline_num_layers=1 cannot be set together with "
        "parallel.account_for_embedding_in_pipeline_split or account_for_loss_in_pipeline_"
        "split (Megatron-Core refuses the mix)",
    ),
    (
        {"pipeline_model_parallel_size": 1, "decoder_last_pipeline_num_layers": 4},
        "parallel.decoder_last_pipeline_num_layers=4 needs "
        "parallel.pipeline_model_parallel_size > 1 (found 1)",
    ),
    (
        {"decoder_first_pipeline_num_layers": 1, "decoder_last_pipeline_num_layers": 2},
        "parallel.decoder_first_pipeline_num_layers=1 plus "
        "parallel.decoder_last_pipeline_num_layers=2 must equal model.num_layers=4 with "
        "parallel.pipeline_model_parallel_size=2 (no stage left between them)",
    ),
    (
        {"pipeline_model_parallel_size": 3, "decoder_first_pipeline_num_layers": 1},
        "parallel.decoder_first_pipeline_num_layers=1 leaves 3 of model.num_layers=4 for the "
        "other 2 of parallel.pipeline_model_parallel_size=3 stages, which must split them "
        "evenly, at least one each",
    ),
    (
        {"account_for_loss_in_pipeline_split": True},
        "parallel.pipeline_model_parallel_size=2 must divide model.num_layers + 1 for the loss "
        "= 5 (account_for_*_in_pipeline_split)",
    ),
    (
        {
            "pipeline_model_parallel_size": 6,
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        },
        "parallel.pipeline_model_parallel_size=6 leaves a virtual stage without a "
        "transformer layer: 6 counted layers over 6 virtual stages, one fewer on the first "
        "and/or last",
    ),
    (
        {"pipeline_model_parallel_size": 3},
        "parallel.pipeline_model_parallel_size=3 must divide model.num_layers=4",
    ),
]


@pytest.mark.parametrize("parallel, message", ERRORS)
def test_rules_name_the_key_and_the_rule(parallel, message):
    doc = {"pipeline_model_parallel_size": 2, **parallel}
    with pytest.raises(ScenarioError, match=re.escape(message)) as error:
        load(parallel=doc, cluster={"num_nodes": 1, "gpus_per_node": 6, "nics_per_node": 6})
    assert str(error.value) == message


def test_chunks_must_divide_the_edge_and_middle_stages():
    with pytest.raises(
        ScenarioError, match=r"^parallel\.decoder_first_pipeline_num_layers=3 must be divisible"
    ) as error:
        load(
            model={"num_layers": 12},
            parallel={
                "pipeline_model_parallel_size": 4,
                "virtual_pipeline_model_parallel_size": 2,
                "decoder_first_pipeline_num_layers": 3,
            },
            training={"schedule": "interleaved"},
        )
    assert str(error.value) == (
        "parallel.decoder_first_pipeline_num_layers=3 must be divisible by "
        "parallel.virtual_pipeline_model_parallel_size=2"
    )
    s = load(
        model={"num_layers": 12},
        parallel={
            "pipeline_model_parallel_size": 4,
            "virtual_pipeline_model_parallel_size": 2,
            "decoder_first_pipeline_num_layers": 2,
            "decoder_last_pipeline_num_layers": 2,
        },
        training={"schedule": "interleaved"},
    )
    assert s.chunk_layers == ((1, 1), (2, 2), (2, 2), (1, 1))
    assert run(s).trace.end_s > 0


def test_search_splits_layers_that_do_not_divide_as_megatron_users_do():
    from stepsim.plan.planning import apply_layout
    from stepsim.plan.space import SearchSpace, layouts, pipeline_sizes, uneven_split

    assert uneven_split(70, 12) == (5, 5)  # BLOOM: 5, 6 x 10, 5
    assert uneven_split(14, 4) == (3, 3)
    assert uneven_split(13, 4) == (2, 3)  # the first stage the fewer
    assert uneven_split(14, 4, chunks=2) == (2, 4)
    assert uneven_split(96, 8) is None  # even
    assert uneven_split(10, 8) is None  # no stage may hold more than the middle ones
    assert pipeline_sizes(14) == [1, 2, 3, 4, 5, 6, 7, 8, 14]
    base = load(
        model={"num_layers": 14},
        cluster={"num_nodes": 1, "gpus_per_node": 4, "nics_per_node": 4},
        parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 2},
    )
    space = SearchSpace(
        tp=(1,), pp=(4,), micro_batch=(1,), schedules=("1f1b",), recompute=("none",)
    )
    (layout,) = [x for x in layouts(base, space) if x.sharding == "none"]
    assert (layout.first_layers, layout.last_layers) == (3, 3)
    assert layout.key == "tp1-pp4-first3-last3-dp1-mb1-1f1b-v1-none-none-nosp"
    assert "parallel.decoder_first_pipeline_num_layers=3" in layout.overrides()
    assert [sum(c) for c in apply_layout(base, layout).chunk_layers] == [3, 4, 4, 3]


def test_rule_of_thumb_takes_the_smallest_pipeline_even_when_it_splits_unevenly():
    from stepsim.plan.search import rule_of_thumb

    # 13 layers of hidden 8192 at TP 2: about 6.4 GiB of model state a layer, too many
    # for one 80 GiB stage; two stages hold them as 6 and 7
    base = load(
        model={"num_layers": 13, "hidden_size": 8192, "num_attention_heads": 64},
        cluster={"num_nodes": 2, "gpus_per_node": 2, "nics_per_node": 2},
        parallel={"data_parallel_size": 4},
        training={"global_batch_size": 16},
    )
    layout = rule_of_thumb(base)
    assert (layout.tp, layout.pp, layout.first_layers, layout.last_layers) == (2, 2, 6, 7)


def test_exact_mode_agrees_with_the_symmetric_one_on_an_uneven_split():
    doc = dict(
        model={"num_layers": 6},
        cluster={"num_nodes": 1, "gpus_per_node": 4, "nics_per_node": 4},
        parallel={
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 2,
            "decoder_first_pipeline_num_layers": 2,
        },
    )
    exact = load(**doc, network={"model": "fair-share", "symmetry": False})
    assert run(load(**doc)).trace.end_s == run(exact).trace.end_s


def test_unequal_chunks_hold_their_own_layers_in_flight():
    from stepsim.cost.memory import activation_bytes_per_layer, inflight_layers

    # looped BFS holds every forward of both chunks at its peak: m (1 + 2) layers on rank 0,
    # whose first chunk gave a layer's place to the embedding
    s = load(
        model={"num_layers": 14},
        cluster={"num_nodes": 1, "gpus_per_node": 4, "nics_per_node": 4},
        parallel={
            "pipeline_model_parallel_size": 4,
            "virtual_pipeline_model_parallel_size": 2,
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        },
        training={"schedule": "looped_bfs", "global_batch_size": 4},
    )
    assert s.chunk_layers[0] == (1, 2)
    assert inflight_layers(s, 0) == 4 * 3
    memory = run(s).memory[0]
    assert memory.activations_bytes == activation_bytes_per_layer(s) * 12


def test_schedule_study_with_stage_layers_is_the_closed_form(capsys):
    import json

    from stepsim.cli import main

    # per-layer F 1, B 2; stage 1's 3 layers bound it: F0 + m (F1 + B1) + B0 = 1 + 4 x 9 + 2
    args = ["schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4"]
    args += ["--forward", "1", "--backward", "2", "--stage-layers", "1,3", "--json"]
    assert main(args) == 0
    study = json.loads(capsys.readouterr().out)
    assert study["makespan"] == 39.0 and study["ideal"] == 36.0
    assert study["per_rank_busy"] == [12.0, 36.0]
    assert main([*args[:-3], "--stage-layers", "1,2,3"]) == 2
    assert "--stage-layers=1,2,3 gives 3 counts for 2 stages" in capsys.readouterr().err

"""Every schedule in the full simulator: op order, FLOPs, memory, and agreement with
the abstract pipeline of the same op times."""

import re

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.orders import stage_orders
from stepsim.emit.abstract import abstract_pipeline
from stepsim.engine.core import simulate
from stepsim.ir.vocabulary import BACKWARD, DP_SYNC, FORWARD, PP_SEND, WEIGHT
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError, dumps_toml, load_scenario, scenario_to_dict
from stepsim.schedules import SCHEDULES, build, parse_label, peak_inflight, step_label
from tests.helpers import load

P, M, LAYERS = 4, 8, 8
FULL = list(SCHEDULES)


def _scenario(name, **training):
    v = 2 if SCHEDULES[name].chunked else 1
    if SCHEDULES[name].placement == "dual":  # dualpipe's copies: untied embeddings
        training = {"share_embeddings_and_output_weights": False, **training}
    return load(
        model={"num_layers": LAYERS, "vocab_size": 16, "seq_length": 512},
        parallel={"pipeline_model_parallel_size": P, "virtual_pipeline_model_parallel_size": v},
        training={"global_batch_size": M, "schedule": name, **training},
    )


def _passes(result, lane):
    """The (kind, micro-batch, chunk) passes a compute lane ran, in order."""
    seen = []
    for op_id in result.workload.lanes[lane].ops:
        op = result.workload.ops[op_id]
        if op.kind in (FORWARD, BACKWARD, WEIGHT) and op.microbatch >= 0:
            step = parse_label(op.label)
            if not seen or seen[-1] != step:
                seen.append(step)
    return seen


@pytest.fixture(scope="module")
def results():
    return {name: run(_scenario(name)) for name in FULL}


@pytest.mark.parametrize("name", FULL)
def test_each_stage_runs_its_schedule_order(results, name):
    result = results[name]
    v = result.scenario.parallel.virtual_pipeline_model_parallel_size
    for rank, order in enumerate(stage_orders(result.scenario)):
        assert _passes(result, rank) == order
    if not SCHEDULES[name].timed:
        assert stage_orders(result.scenario) == build(name, P, M, v)


@pytest.mark.parametrize("name", FULL)
def test_same_flops_whatever_the_schedule(results, name):
    def flops(r):
        return r.metrics.hardware_tflops_per_gpu * r.metrics.iteration_time_s

    assert flops(results[name]) == pytest.approx(flops(results["1f1b"]), rel=1e-9)


@pytest.mark.parametrize("name", FULL)
def test_memory_counts_the_schedules_peak_inflight_chunks(results, name):
    result = results[name]
    orders = stage_orders(result.scenario)
    for stage, order in zip(result.memory, orders, strict=True):
        assert stage.inflight_activations == peak_inflight(order, "W")


@pytest.mark.parametrize("name", FULL)
def test_full_simulator_agrees_with_the_abstract_pipeline(results, name):
    """With no TP/DP, a tiny vocabulary and uniform stages the full simulator is the
    abstract pipeline with F, B, W from the compute model and c from one pipeline send;
    what is left is the embedding/loss work and sends sharing links (a few per cent)."""
    result, info = results[name], SCHEDULES[name]
    v = result.scenario.parallel.virtual_pipeline_model_parallel_size
    layer = ComputeModel(result.scenario).layer()
    per_chunk = LAYERS // (P * (1 if info.placement == "dual" else v))  # dual: whole stages
    forward = (layer.attention_forward + layer.mlp_forward).duration_s * per_chunk
    weight = (layer.attention_weight + layer.mlp_weight).duration_s * per_chunk
    backward = (layer.attention_backward + layer.mlp_backward).duration_s * per_chunk
    if info.split_backward:
        backward -= weight
    else:
        weight = 0.0
    send = next(s for s in result.trace.spans if s.kind == PP_SEND)
    abstract = simulate(
        abstract_pipeline(
            stage_orders(result.scenario),
            forward_s=forward,
            backward_s=backward,
            weight_s=weight,
            p2p_latency_s=send.end_s - send.start_s,
            num_chunks=v,
            placement=info.placement,
        )
    )
    compute_end = max(s.end_s for s in result.trace.spans if s.kind in (FORWARD, BACKWARD, WEIGHT))
    assert compute_end == pytest.approx(abstract.end_s, rel=0.025)
    assert compute_end >= abstract.end_s


def test_schedules_rank_as_the_papers_say(results):
    time = {name: r.metrics.iteration_time_s for name, r in results.items()}
    assert time["interleaved"] < time["1f1b"]
    assert time["zbh2"] < time["zbh1"] < time["1f1b"]
    assert time["interleaved_zb"] < time["interleaved"]
    assert time["zbv"] < time["zbh1"]


def test_split_backward_moves_weight_gemms_into_w():
    result = run(_scenario("zbh1"))
    weight = sum(op.flops for op in result.workload.ops if op.kind == WEIGHT)
    layer = ComputeModel(result.scenario).layer()
    output = ComputeModel(result.scenario).extras().output_weight
    layers = (layer.attention_weight + layer.mlp_weight).flops * LAYERS * M
    assert weight == pytest.approx(layers + output.flops * M, rel=1e-12)


@pytest.mark.parametrize("name", ["interleaved", "zbh2", "interleaved_zb"])
@pytest.mark.parametrize("sharding", ["optimizer", "full"])
def test_schedules_run_with_data_parallel_sharding_and_overlap(name, sharding):
    s = load(
        model={"num_layers": LAYERS},
        cluster={"num_nodes": 2},
        parallel={
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 4,
            "sequence_parallel": True,
        },
        training={
            "global_batch_size": 32,
            "schedule": name,
            "data_parallel_sharding": sharding,
            "overlap_grad_reduce": True,
            "recompute_granularity": "selective",
        },
    )
    r = run(s).metrics
    for stage in r.stages:
        assert sum(stage.breakdown_s.values()) == pytest.approx(r.iteration_time_s)
    assert r.breakdown_s[DP_SYNC] > 0


@pytest.mark.parametrize(
    ("training", "parallel", "message"),
    [
        (
            {"schedule": "1f1b"},
            {"virtual_pipeline_model_parallel_size": 2},
            "parallel.virtual_pipeline_model_parallel_size=2 needs a schedule with chunks",
        ),
        (
            {"schedule": "interleaved"},
            {"virtual_pipeline_model_parallel_size": 1},
            "parallel.virtual_pipeline_model_parallel_size=1 must be at least 2",
        ),
        (
            {"schedule": "interleaved", "global_batch_size": 6},
            {},
            "needs micro-batches (6) to be a multiple of the micro-batch group size (4)",
        ),
        (
            {"schedule": "zbh1", "microbatch_group_size_per_vp_stage": 2},
            {},
            "training.microbatch_group_size_per_vp_stage=2 applies to interleaved schedules",
        ),
        (
            {"schedule": "interleaved", "microbatch_group_size_per_vp_stage": 2},
            {},
            "needs a micro-batch group size (2) of at least the number of ranks (4)",
        ),
        (
            {"schedule": "interleaved"},
            {"virtual_pipeline_model_parallel_size": 3},
            "x pipeline_model_parallel_size=4 must divide model.num_layers=8",
        ),
    ],
)
def test_bad_schedule_settings_name_key_value_and_rule(training, parallel, message):
    with pytest.raises(ScenarioError, match=re.escape(message)) as info:
        load(
            model={"num_layers": LAYERS},
            parallel={"pipeline_model_parallel_size": P, **parallel},
            training={"global_batch_size": M, **training},
        )
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["interleaved", "zbv"])
def test_fsdp_with_one_layer_per_chunk(name):
    s = load(
        model={"num_layers": 4},
        cluster={"gpus_per_node": 4, "nics_per_node": 4},
        parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 2},
        training={"global_batch_size": 8, "schedule": name, "data_parallel_sharding": "full"},
    )
    r = run(s).metrics
    for stage in r.stages:
        assert sum(stage.breakdown_s.values()) == pytest.approx(r.iteration_time_s)


def test_zbv_needs_two_chunks_in_a_scenario():
    with pytest.raises(ScenarioError, match="virtual_pipeline_model_parallel_size=4 must be 2"):
        load(
            model={"num_layers": 16},
            parallel={"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4},
            training={"schedule": "zbv"},
        )


def test_group_size_key_reaches_the_schedule():
    r = run(_scenario("interleaved", microbatch_group_size_per_vp_stage=8))
    assert _passes(r, 0) == build("interleaved", P, M, 2, 8)[0]
    assert _passes(r, 0) != build("interleaved", P, M, 2)[0]


def _custom(tmp_path, name, **training):
    v = 2 if SCHEDULES[name].chunked else 1
    path = tmp_path / f"{name}.txt"
    orders = stage_orders(_scenario(name))
    path.write_text("\n".join(" ".join(step_label(s, v) for s in o) for o in orders) + "\n")
    return load(
        model={"num_layers": LAYERS, "vocab_size": 16, "seq_length": 512},
        parallel={"pipeline_model_parallel_size": P},
        training={"global_batch_size": M, "schedule": "custom", "schedule_file": str(path),
                  **training},
    )  # fmt: skip


@pytest.mark.parametrize(("name", "placement"), [("zbh1", "looped"), ("zbv", "v")])
def test_a_custom_schedule_file_runs_like_the_named_schedule(results, tmp_path, name, placement):
    custom = run(_custom(tmp_path, name, schedule_placement=placement))
    assert custom.scenario.parallel.virtual_pipeline_model_parallel_size == (
        2 if name == "zbv" else 1
    )
    assert custom.trace.spans == results[name].trace.spans
    assert [m.total_bytes for m in custom.memory] == [m.total_bytes for m in results[name].memory]


def test_a_custom_schedule_round_trips_through_the_resolved_toml(tmp_path):
    scenario = _custom(tmp_path, "interleaved")
    text = dumps_toml(scenario_to_dict(scenario))
    (tmp_path / "resolved.toml").write_text(text)
    assert load_scenario(tmp_path / "resolved.toml") == scenario


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"schedule": "custom"}, "missing key training.schedule_file"),
        ({"schedule": "1f1b", "schedule_file": "x.txt"}, "applies to training.schedule='custom'"),
        (
            {"schedule": "custom", "schedule_file": "nowhere.txt"},
            "cannot read training.schedule_file='nowhere.txt'",
        ),
        ({"schedule": "custom", "schedule_file": "{two}"}, "has 2 ranks but parallel.pipeline"),
        ({"schedule": "custom", "schedule_file": "{stuck}"}, "the orders deadlock: rank 0 at B0"),
    ],
)
def test_bad_custom_schedules_name_key_value_and_rule(tmp_path, training, message):
    (tmp_path / "two.txt").write_text("F0 F1 B0 B1\nF0 B0 F1 B1\n")
    (tmp_path / "stuck.txt").write_text("F0 B0 F1 B1\nF0 F1 B0 B1\n")
    if "schedule_file" in training:
        name = training["schedule_file"].strip("{}")
        if name in ("two", "stuck"):
            training = {**training, "schedule_file": str(tmp_path / f"{name}.txt")}
    p = 2 if "stuck" in str(training.get("schedule_file")) else P
    with pytest.raises(ScenarioError, match=re.escape(message)) as info:
        load(
            model={"num_layers": LAYERS},
            parallel={"pipeline_model_parallel_size": p},
            training={"global_batch_size": 2 if p == 2 else M, **training},
        )
    assert message in str(info.value)

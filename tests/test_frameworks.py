"""The framework table and the pipeline p2p mechanisms (docs/frameworks.md §1, §2):
closed forms derived by hand on two-stage pipelines."""

import dataclasses

import pytest

from stepsim.ir.vocabulary import BACKWARD, FORWARD, OPTIMIZER, PP_SEND, RECOMPUTE, TP_COMM
from stepsim.report.summary import summary_text
from stepsim.run.iteration import run
from stepsim.scenario import (
    ScenarioError,
    TrainingConfig,
    frameworks,
    scenario_from_dict,
    scenario_to_dict,
)
from stepsim.scenario.frameworks import versions
from stepsim.schedules import build
from stepsim.schedules.p2p import Call, Step, Xfer, deepspeed_calls, megatron_calls
from tests.helpers import load, scenario

NO_LATENCY = {
    "nvlink_latency_us": 0.0,
    "pcie_latency_us": 0.0,
    "ib_latency_us": 0.0,
    "collective_base_latency_us": 0.0,
}
COMPUTE = (FORWARD, BACKWARD, RECOMPUTE)


def _two_stages(m, p2p, **training):
    """Two stages on one node's NVLink, TP 1, no latency: X is one activation's
    transfer, the same both ways. The tied embedding's all-reduce between the two
    stages (tests/test_gradient_path.py) is left out of these closed forms."""
    training = {"share_embeddings_and_output_weights": False, **training}
    return run(
        load(
            model={"vocab_size": 16},
            cluster=NO_LATENCY,
            parallel={"pipeline_model_parallel_size": 2},
            training={"global_batch_size": m, "pipeline_p2p": p2p, **training},
        )
    )


def _pass_s(result, gpu, kind, mb=0):
    """One pass's compute time on one GPU (F: forward, B: backward with recompute)."""
    kinds = (FORWARD,) if kind == "F" else (BACKWARD, RECOMPUTE)
    return sum(
        s.end_s - s.start_s
        for s in result.trace.spans
        if s.gpu == gpu and s.kind in kinds and s.microbatch == mb and s.stream == "compute"
    )


def _optimizer_s(result, gpu):
    spans = result.trace.spans
    return sum(s.end_s - s.start_s for s in spans if s.gpu == gpu and s.kind == OPTIMIZER)


def _transfer_s(result):
    send = next(s for s in result.trace.spans if s.kind == PP_SEND)
    return send.end_s - send.start_s


@pytest.mark.parametrize("mode", frameworks.PIPELINE_P2P_MODES)
def test_one_microbatch_adds_exactly_two_transfers_in_every_mode(mode):
    """m = 1: F0, X, F1, B1, X, B0, then stage 0's optimizer step, whatever blocks."""
    r = _two_stages(1, mode)
    f0, b0, f1, b1 = (_pass_s(r, g, k) for g in (0, 1) for k in "FB")
    x = _transfer_s(r)
    expected = f0 + f1 + b1 + b0 + 2 * x + _optimizer_s(r, 0)
    assert r.metrics.iteration_time_s == pytest.approx(expected, rel=1e-9)


def test_two_microbatches_block_by_one_and_two_transfers():
    """m = 2, 1F1B (stage 1's F + B longer than stage 0's F and B, X shorter than all):
    overlapped ends at f0 + 2(f1 + b1) + b0 + 2X + O; Megatron's batched blocking p2p
    adds one X (the second activation waits for stage 1's call after its first
    backward), DeepSpeed's sequential calls two (receive-activation and send-gradient
    serialised on both stages). frameworks.md §1(d), derived for unequal stages."""
    runs = {mode: _two_stages(2, mode) for mode in frameworks.PIPELINE_P2P_MODES}
    r = runs["overlapped"]
    f0, b0, f1, b1 = (_pass_s(r, g, k) for g in (0, 1) for k in "FB")
    x = _transfer_s(r)
    assert x < min(f0, b0) and f1 + b1 > max(f0, b0)
    base = f0 + 2 * (f1 + b1) + b0 + 2 * x + _optimizer_s(r, 0)
    extra = {"overlapped": 0, "batched-blocking": 1, "sequential-blocking": 2}
    for mode, result in runs.items():
        assert result.metrics.iteration_time_s == pytest.approx(base + extra[mode] * x, rel=1e-9), (
            mode
        )


def test_waiting_for_the_other_stage_in_a_blocking_call_is_bubble_not_p2p():
    """Stage 0 reaches its call for the first gradient long before stage 1 sends it:
    that wait is idle; only the transfer itself (X) is exposed p2p."""
    r = _two_stages(1, "batched-blocking")
    stage0 = r.metrics.stages[0]
    assert stage0.breakdown_s["pp_p2p"] == pytest.approx(2 * _transfer_s(r), rel=1e-9)


def _tp_stages(m, **training):
    """Two stages on two nodes, TP 2 inside each node, one NIC per GPU, no latency."""
    return run(
        load(
            model={"vocab_size": 16},
            cluster={"num_nodes": 2, **NO_LATENCY},
            parallel={
                "tensor_model_parallel_size": 2,
                "pipeline_model_parallel_size": 2,
                "data_parallel_size": 1,
            },
            training={"global_batch_size": m, **training},
        )
    )


def _ag_s(result, gpu, label):
    return [
        s.end_s - s.start_s
        for s in result.trace.spans
        if s.gpu == gpu and s.kind == TP_COMM and s.label == label and s.stream == "compute"
    ]


def _span_s(result, gpu, kind, suffix):
    spans = [
        s.end_s - s.start_s
        for s in result.trace.spans
        if s.gpu == gpu and s.kind == kind and s.label.endswith(suffix)
    ]
    return max(spans, default=0.0)


@pytest.mark.parametrize(
    "training, shards, wholes, metas, gathers",
    [
        # Megatron: S/T each way, the receiver all-gathers on both stages
        ({"framework": "megatron"}, 2, 0, 0, 2),
        # DeepSpeed >= 0.5.4: S/T each way, each after a meta message; the re-gather
        ({"framework": "deepspeed", "framework_version": "0.5.4"}, 2, 0, 2, 3),
        # DeepSpeed <= 0.5.3: gradients whole; the re-gather runs while stage 1 computes
        ({"framework": "deepspeed", "framework_version": "0.5.0"}, 1, 1, 1, 1),
    ],
)
def test_scatter_gather_closed_forms(training, shards, wholes, metas, gathers):
    """frameworks.md §2(d): two stages on two nodes, TP 2 in each, one NIC per GPU,
    m = 1, no latency. Against the same run with whole tensors (2(F+B) + 2X) the
    iteration changes by shards X/T + wholes X + metas x meta + gathers x AG - 2X."""
    r = _tp_stages(1, **training)
    whole = _tp_stages(1, **training, scatter_gather_tensors_in_pipeline=False)
    x = _span_s(whole, 0, PP_SEND, "F0")
    sends = [s.end_s - s.start_s for s in r.trace.spans if s.kind == PP_SEND and s.gpu == 0]
    data = x / 2
    assert max(sends) == pytest.approx(x if wholes else data, rel=1e-9)
    meta = min(sends) if metas else 0.0  # DeepSpeed's meta message, before the data
    ag = max(_span_s(r, g, TP_COMM, "gather") for g in (0, 2))
    assert ag > 0 and meta < data / 100
    change = shards * data + wholes * x + metas * meta + gathers * ag - 2 * x
    assert r.metrics.iteration_time_s - whole.metrics.iteration_time_s == pytest.approx(
        change, rel=1e-6, abs=1e-12
    )


# -- the table and its resolution ---------------------------------------------------


def test_every_mechanism_row_has_its_training_key_defaulting_to_the_framework():
    names = {f.name: f for f in dataclasses.fields(TrainingConfig)}
    for name, (values, source) in frameworks.MECHANISMS.items():
        assert names[name].default is None and "help" in names[name].metadata, name
        assert len(values) == len(frameworks.VERSIONS) and source, name


def test_a_key_left_out_takes_the_framework_default_and_a_given_one_wins():
    deepspeed = load(training={"framework": "deepspeed"}).training
    assert deepspeed.mechanism("framework_version") == "0.5.4"
    assert deepspeed.mechanism("pipeline_p2p") == "sequential-blocking"
    given = load(training={"framework": "deepspeed", "pipeline_p2p": "overlapped"}).training
    assert given.mechanism("pipeline_p2p") == "overlapped"
    # the Python API resolves too, and a replaced framework re-resolves
    megatron = dataclasses.replace(deepspeed, framework="megatron", framework_version=None)
    assert megatron.mechanism("pipeline_p2p") == "batched-blocking"
    assert megatron.engine_label == "megatron 2025"


def test_a_scenario_naming_no_version_runs_the_newest_modelled_and_says_so():
    doc = scenario()
    del doc["training"]["framework_version"]  # the helper pins 2021 for its closed forms
    unnamed = scenario_from_dict(doc)
    assert unnamed.training.mechanism("framework_version") == versions("megatron")[-1] == "2025"
    assert unnamed.training.mechanism("attention_kernel") == "flash"  # not 2021's s x s scores
    assert unnamed.training.mechanism("moe_probs_in_experts")  # Megatron-Core 0.12.1 on
    text = summary_text(run(unnamed))
    assert "megatron 2025 engine (newest modelled, no version set;" in text
    pinned = summary_text(run(load(training={"framework_version": "2024"})))
    assert "megatron 2024 engine (batched-blocking p2p" in pinned
    assert "newest modelled" not in pinned
    # DeepSpeed's newest modelled PipelineEngine is the default, as before
    assert load(training={"framework": "deepspeed"}).training.engine_label == "deepspeed 0.5.4"


def test_params_dtype_left_out_is_bf16_only_under_todays_megatron_core_on_bf16_gpus():
    doc = scenario()
    del doc["training"]["framework_version"]
    today = scenario_from_dict(doc).training
    assert today.params_dtype == "bf16"
    assert today.gradient_bytes == 4  # Megatron forces fp32 accumulation with --bf16
    assert load(training={"framework_version": "2024"}).training.params_dtype == "fp16"
    assert load(training={"framework": "deepspeed"}).training.params_dtype == "fp16"
    v100 = scenario(cluster={"node": "dgx-2", "num_nodes": 1})
    del v100["training"]["framework_version"]
    assert scenario_from_dict(v100).training.params_dtype == "fp16"  # no bf16 tensor cores
    given = scenario(training={"params_dtype": "fp16"})
    del given["training"]["framework_version"]
    assert scenario_from_dict(given).training.params_dtype == "fp16"  # as written
    assert scenario_to_dict(scenario_from_dict(doc))["training"]["params_dtype"] == "bf16"
    with pytest.raises(ScenarioError, match=r"training.params_dtype='bf16' needs an A100"):
        scenario_from_dict(
            scenario(cluster={"node": "dgx-2", "num_nodes": 1}, training={"params_dtype": "bf16"})
        )


def test_the_resolved_toml_writes_the_resolved_mechanisms():
    doc = scenario_to_dict(load(training={"framework": "deepspeed", "framework_version": "0.5.0"}))
    assert doc["training"]["pipeline_p2p"] == "sequential-blocking"
    assert doc["training"]["pipeline_grads_partitioned"] is False
    assert doc["training"]["framework_version"] == "0.5.0"


def test_an_unmodelled_schedule_falls_back_to_overlapped_and_says_so():
    t = load(
        parallel={"pipeline_model_parallel_size": 2},
        training={"schedule": "zbh1", "global_batch_size": 8},
    ).training
    assert t.mechanism("pipeline_p2p") == "overlapped"
    assert "not modelled for zbh1" in t.framework_note


def test_the_run_header_names_every_change_the_framework_made():
    """Both of zbh1's changes (p2p overlapped, async TP all-reduce off) reach the header."""
    from stepsim.report.summary import _p2p_text
    from stepsim.scenario import load_scenario

    text = _p2p_text(load_scenario("tiny-2gpu", ["training.schedule=zbh1"]).training)
    assert "not modelled for zbh1" in text and "async TP all-reduce off for zbh1" in text


@pytest.mark.parametrize(
    "training, message",
    [
        (
            {"framework": "deepspeed", "framework_version": "2021"},
            r"training.framework_version='2021' must be one of deepspeed's: 0.5.0, 0.5.4",
        ),
        (
            {"schedule": "gpipe", "pipeline_p2p": "sequential-blocking"},
            r"training.pipeline_p2p='sequential-blocking' is modelled for training.schedule "
            r"in 1f1b only \(found 'gpipe'\)",
        ),
    ],
)
def test_bad_framework_settings_name_key_value_and_rule(training, message):
    with pytest.raises(ScenarioError, match=message):
        load(training=training)


# -- the call sites ------------------------------------------------------------------


def test_megatron_batches_a_send_with_the_other_direction_receive():
    """1F1B, p = 2, m = 2, stage 1: recv_forward; F0 B0; send_backward_recv_forward;
    F1 B1; send_backward."""
    calls = megatron_calls(build("1f1b", 2, 2, 1)[1], 1, 2)
    assert calls == [
        Call((Xfer("recv", "F", 0),)),
        Step("F", 0),
        Step("B", 0),
        Call((Xfer("send", "B", 0), Xfer("recv", "F", 1))),
        Step("F", 1),
        Step("B", 1),
        Call((Xfer("send", "B", 1),)),
    ]


@pytest.mark.parametrize("p, m", [(2, 1), (3, 5), (4, 8), (8, 3)])
def test_deepspeed_train_schedule_runs_the_1f1b_order(p, m):
    """frameworks.md §1(b): DeepSpeed's per-stage F/B order is Megatron's 1F1B."""
    order = build("1f1b", p, m, 1)
    for stage in range(p):
        passes = [x for x in deepspeed_calls(stage, p, m) if isinstance(x, Step)]
        assert passes == order[stage]


def test_gpipe_with_batched_blocking_p2p_adds_two_transfers_at_two_microbatches():
    """GPipe, m = 2 (X shorter than every pass): overlapped ends at
    f0 + max(f0, f1) + f1 + b1 + max(b0, b1) + b0 + 2X + O (stage 1's second forward
    waits for its input or its first forward; stage 0's second backward for its
    gradient or its first backward). Batched blocking: stage 0's call holding send F1
    and receive B0 ends only with B0's gradient, which moves after the activation: + 2X
    (derived for either stage the slower)."""
    runs = {
        mode: _two_stages(2, mode, schedule="gpipe") for mode in ("overlapped", "batched-blocking")
    }
    r = runs["overlapped"]
    f0, b0, f1, b1 = (_pass_s(r, g, k) for g in (0, 1) for k in "FB")
    x = _transfer_s(r)
    assert x < min(f0, b0, f1, b1)
    base = f0 + max(f0, f1) + f1 + b1 + max(b0, b1) + b0 + 2 * x + _optimizer_s(r, 0)
    assert r.metrics.iteration_time_s == pytest.approx(base, rel=1e-9)
    blocking = runs["batched-blocking"].metrics.iteration_time_s
    assert blocking == pytest.approx(base + 2 * x, rel=1e-9)

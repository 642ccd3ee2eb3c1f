"""FP8 training (`[training] fp8_format`, `fp8_recipe`, `fp8_param_gather`): closed forms
of the FP8 GEMMs, the casts, the memory and the parameter all-gather, and the rules."""

import dataclasses
import math

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.memory import (
    activation_bytes_per_layer,
    fp8_linear_params_per_rank,
    gathered_param_bytes,
    stage_memory,
)
from stepsim.report.summary import summary_text
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError, scenario_from_dict, scenario_to_dict
from stepsim.scenario.presets import GPUS
from tests.helpers import cli_error, load

H100 = {"node": "dgx-h100", "num_nodes": 1}
B200 = {"node": "dgx-b200", "num_nodes": 1}


def _h100(cluster=H100, **training):
    return load(cluster=cluster, training={"params_dtype": "bf16", **training})


def _kernels(s):
    return {(k.part, k.name): k.work for k in ComputeModel(s).kernels()}


def test_a_large_fp8_gemm_runs_at_the_fp8_peak_times_its_efficiency():
    """Tiles fill the matrix (3072 = 12 x 256, 2816 = 22 x 128) and make exactly two
    waves of the 132 SMs, so the efficiency is the constant times k / (k + k_half)."""
    s = _h100(fp8_format="hybrid")
    fp8 = ComputeModel(s).fp8
    gpu = s.cluster.gpu
    m, n, k = 3072, 2816, 16384
    assert math.ceil(m / 256) * math.ceil(n / 128) == 2 * gpu.num_sms
    flops = 2.0 * m * n * k
    depth = k / (k + gpu.fp8_kernels.gemm_k_half)
    for fprop, efficiency in ((False, 0.62), (True, 0.67)):  # dgrad/wgrad split, fprop fast
        work = fp8.gemm(m, n, k, fprop=fprop)
        assert work.flops == flops
        expected = flops / (1978.9e12 * efficiency * depth)
        assert work.duration_s == pytest.approx(expected, rel=1e-12)
    # blockwise keeps the split accumulator for fprop too
    blockwise = ComputeModel(_h100(fp8_format="e4m3", fp8_recipe="blockwise")).fp8
    assert blockwise.gemm(m, n, k, fprop=True).duration_s == pytest.approx(
        flops / (1978.9e12 * 0.62 * depth), rel=1e-12
    )


def test_a_thin_fp8_gemm_streams_one_byte_inputs_and_a_16_bit_output():
    s = _h100(fp8_format="hybrid")
    fp8 = ComputeModel(s).fp8
    m, n, k = 65536, 65536, 16  # k = 16: memory bound
    hbm = 3350e9 * s.kernel_constants.memory_efficiency
    expected = (1 * (m * k + k * n) + 2 * m * n) / hbm
    assert fp8.gemm(m, n, k, fprop=False).duration_s == pytest.approx(expected, rel=1e-12)


def test_the_linear_gemms_run_in_fp8_and_the_rest_stays_16_bit():
    bf16, fp8 = _kernels(_h100()), _kernels(_h100(fp8_format="hybrid"))
    for name in ("QKV", "projection", "fc1", "fc2"):
        for part, label in (("forward", name), ("input", name + " dX"), ("weight", name + " dW")):
            assert fp8[part, label].flops == bf16[part, label].flops
            assert fp8[part, label].duration_s < bf16[part, label].duration_s
    for key in set(bf16) - {
        k for k in bf16 if k[1].split()[0] in ("QKV", "projection", "fc1", "fc2")
    }:
        assert fp8[key] == bf16[key]  # attention core, norms, element-wise: unchanged
    s = _h100(fp8_format="hybrid")
    assert ComputeModel(s).extras() == ComputeModel(_h100()).extras()  # embedding, logits


@pytest.mark.parametrize(
    ("cluster", "recipe", "cast_bytes", "fused"),
    [
        (H100, "delayed", 4, True),  # read 2, write 1 + the transpose Hopper's GEMMs need
        (H100, "tensorwise", 6, False),  # + an amax pass; the norm does not cast
        (H100, "blockwise", 4, True),  # + the column-wise copy (1 x 128 blocks)
        (B200, "delayed", 3, True),  # Blackwell's FP8 GEMMs take any layout: no transpose
        (B200, "mxfp8", 4, True),  # + the column-wise copy (1 x 32 blocks)
    ],
)
def test_cast_kernels_move_their_bytes_at_the_streaming_rate(cluster, recipe, cast_bytes, fused):
    s = _h100(cluster, fp8_format="e4m3", fp8_recipe=recipe)
    kernels = _kernels(s)
    gpu, t = s.cluster.gpu, 1
    stream = gpu.hbm_gbytes_per_s * 1e9 * s.kernel_constants.memory_efficiency
    tokens, h, f = 1024, 1024, 4096
    m = s.num_microbatches

    def seconds(num_bytes):
        return pytest.approx(num_bytes / stream, rel=1e-12)

    assert kernels["forward", "projection input cast"].duration_s == seconds(
        cast_bytes * tokens * h
    )
    assert kernels["forward", "fc2 input cast"].duration_s == seconds(cast_bytes * tokens * f / t)
    if fused:  # the layernorm writes QKV's and fc1's FP8 inputs
        assert ("forward", "QKV input cast") not in kernels
    else:
        assert kernels["forward", "QKV input cast"].duration_s == seconds(cast_bytes * tokens * h)
    # each weight once per iteration, spread over the m forwards
    assert kernels["forward", "fc1 weight cast"].duration_s == seconds(cast_bytes * h * f / m)
    # the incoming gradient, before dgrad (it feeds dgrad and wgrad)
    assert kernels["input", "QKV grad cast"].duration_s == seconds(cast_bytes * tokens * 3 * h)


def test_fp8_parameters_need_only_their_second_copy():
    gather = {"fp8_param_gather": True, "data_parallel_sharding": "optimizer"}
    hopper = _kernels(_h100(fp8_format="hybrid", **gather))
    stream = 3350e9 * GPUS["h100-sxm5-80gb"].kernels.memory_efficiency
    m = 8  # global batch 8 over one replica
    assert hopper["forward", "fc1 weight cast"].duration_s == pytest.approx(
        2 * 1024 * 4096 / m / stream, rel=1e-12
    )
    blackwell = _kernels(_h100(B200, fp8_format="hybrid", **gather))
    assert ("forward", "fc1 weight cast") not in blackwell  # FP8 already, no transpose


def test_fp8_weight_memory_per_recipe_and_with_fp8_parameters():
    def weights(cluster, **training):
        s = _h100(cluster, **training)
        return stage_memory(s, 0, 1).weights_bytes, fp8_linear_params_per_rank(s) * 4

    base, linear = weights(H100)
    assert linear == 4 * (3 + 1 + 4 + 4) * 1024 * 1024  # 4 layers of 12 h^2
    # TE's FP8 cache of every linear weight and its transpose (Hopper): 2 bytes more
    assert weights(H100, fp8_format="hybrid")[0] == pytest.approx(base + 2 * linear)
    assert weights(B200, fp8_format="hybrid")[0] == pytest.approx(base + linear)  # no transpose
    # kept in FP8: 1 byte and its transpose instead of 2 (Hopper), 1 instead of 2 (Blackwell)
    gather = {"fp8_param_gather": True, "data_parallel_sharding": "optimizer"}
    assert weights(H100, fp8_format="hybrid", **gather)[0] == pytest.approx(base)
    assert weights(B200, fp8_format="hybrid", **gather)[0] == pytest.approx(base - linear)


def test_fp8_activations_keep_the_linear_inputs_in_one_byte():
    """Korthikanti's 34 sbh + 5 a s^2 b per layer: QKV's, fc1's, the projection's and
    fc2's inputs (2 + 2 + 2 + 8 sbh of it, GPT's shape) are saved in FP8, half as big."""
    bf16, fp8 = _h100(), _h100(fp8_format="hybrid")
    sbh = 1024 * 1 * 1024
    saved = (1 + 1 + 1 + 4) * sbh
    assert activation_bytes_per_layer(fp8) == pytest.approx(
        activation_bytes_per_layer(bf16) - saved
    )
    # full recomputation keeps only the layer's 16-bit input either way
    assert activation_bytes_per_layer(fp8, "full") == activation_bytes_per_layer(bf16, "full")


def test_fp8_param_all_gather_moves_half_the_bytes_of_the_16_bit_one():
    s = _h100(
        {"node": "dgx-h100", "num_nodes": 2},
        fp8_format="hybrid",
        fp8_param_gather=True,
        data_parallel_sharding="optimizer",
    )
    linear = fp8_linear_params_per_rank(s)
    assert gathered_param_bytes(s, linear, 1) == linear  # FP8: 1 byte
    plain = dataclasses.replace(s, training=dataclasses.replace(s.training, fp8_param_gather=None))
    assert gathered_param_bytes(plain, linear, 1) == 2 * linear
    # the simulated gather: linear weights in FP8, embedding, norms and biases in 16 bits
    training = {
        "global_batch_size": 16,
        "params_dtype": "bf16",
        "fp8_format": "hybrid",
        "data_parallel_sharding": "optimizer",
    }
    layout = {"tensor_model_parallel_size": 8, "data_parallel_size": 2}
    cluster = {"node": "dgx-h100", "num_nodes": 2}

    def gather_bytes(**extra):
        result = run(load(cluster=cluster, parallel=layout, training={**training, **extra}))
        (op,) = [op for op in result.workload.ops if op.label == "params all-gather"]
        return op.transfer[0].bytes_per_flow, result

    fp8_bytes, result = gather_bytes(fp8_param_gather=True)
    bf16_bytes, _ = gather_bytes()
    # 2 bytes per parameter less 1 per linear weight of the stage's 4 layers
    params = stage_memory(result.scenario, 0, 1).params
    linear = 4 * fp8_linear_params_per_rank(result.scenario)
    assert fp8_bytes / bf16_bytes == pytest.approx((2 * params - linear) / (2 * params), rel=1e-12)


def test_fp8_rules_say_which_key_and_why():
    with pytest.raises(ScenarioError, match=r"training.fp8_format.*FP8 tensor cores.*a100"):
        load(training={"fp8_format": "hybrid"})  # the DGX A100 default
    with pytest.raises(ScenarioError, match=r"training.fp8_recipe='mxfp8'.*Blackwell"):
        _h100(fp8_format="e4m3", fp8_recipe="mxfp8")
    with pytest.raises(ScenarioError, match=r"training.fp8_recipe='delayed'.*no effect"):
        _h100(fp8_recipe="delayed")
    with pytest.raises(ScenarioError, match=r"training.fp8_param_gather.*no effect"):
        _h100(fp8_param_gather=True, data_parallel_sharding="optimizer")
    with pytest.raises(ScenarioError, match=r"training.fp8_param_gather.*distributed optimizer"):
        _h100(fp8_format="hybrid", fp8_param_gather=True)
    with pytest.raises(ScenarioError, match=r"training.fp8_format='fp4'.*must be one of"):
        _h100(fp8_format="fp4")
    # an FP8 GPU older than Hopper (compute capability 8.9) has no block-scaled GEMMs
    s = _h100()
    ada = dataclasses.replace(s.cluster.gpu, compute_capability=(8, 9))
    cluster = dataclasses.replace(s.cluster, gpu=ada)
    training = dataclasses.replace(s.training, fp8_format="e4m3", fp8_recipe="blockwise")
    with pytest.raises(ScenarioError, match=r"training.fp8_recipe='blockwise'.*9.0 or newer"):
        dataclasses.replace(s, cluster=cluster, training=training)
    _h100(B200, fp8_format="e4m3", fp8_recipe="mxfp8")  # Blackwell runs it
    _h100(B200, fp8_format="e4m3", fp8_recipe="blockwise")


def test_a_bad_fp8_key_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "a100"\n[model]\npreset = "llama2-7b"\n'
        '[cluster]\nnode = "dgx-a100"\nnum_nodes = 1\n'
        "[training]\nglobal_batch_size = 8\n",
        encoding="utf-8",
    )
    line = cli_error(path, "--set", 'training.fp8_format="hybrid"')
    assert "training.fp8_format='hybrid'" in line and "FP8 tensor cores" in line


def test_absent_fp8_keys_leave_the_scenario_as_it_was():
    s = _h100()
    written = scenario_to_dict(s)["training"]
    assert not {"fp8_format", "fp8_recipe", "fp8_param_gather"} & set(written)
    assert ComputeModel(s).fp8 is None
    # with FP8 the resolved keys load back to the same scenario
    fp8 = _h100(fp8_format="hybrid", fp8_recipe="tensorwise")
    assert scenario_from_dict(scenario_to_dict(fp8)) == fp8


def test_an_fp8_run_is_faster_and_says_how_its_gemms_were_calibrated():
    bf16 = run(_h100())
    hopper = run(_h100(fp8_format="hybrid"))
    assert hopper.metrics.iteration_time_s < bf16.metrics.iteration_time_s
    assert hopper.metrics.model_tflops_per_gpu > bf16.metrics.model_tflops_per_gpu
    text = summary_text(hopper)
    assert "FP8 hybrid (delayed)" in text and "of the BF16 peak, 989.4 TFLOP/s" in text
    assert "FP8 GEMM kernel measurements on a real H100" in text
    blackwell = summary_text(run(_h100(B200, fp8_format="e4m3", fp8_recipe="mxfp8")))
    assert "FP8 e4m3 (mxfp8)" in blackwell
    assert "OpenXLA matmul table's B200 FP8" in blackwell.split("FP8 GEMMs")[1]

"""The kernel-level compute model against closed forms, and calibration files."""

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

from stepsim.calibration.fit import GemmTiming, MemoryTiming, fit_constants
from stepsim.cli import main
from stepsim.cost.compute import ComputeModel
from stepsim.cost.kernels import gemm_efficiency, gemm_seconds
from stepsim.scenario import KernelConstants, ScenarioError, load_scenario, read_calibration
from stepsim.scenario.presets import GPUS
from tests.helpers import benchmark_script, load

ROOT = Path(__file__).resolve().parent.parent
C = KernelConstants(
    gpu="a100-sxm4-80gb",
    num_sms=4,
    tile_m=256,
    tile_n=128,
    gemm_efficiency=0.8,
    gemm_k_half=32.0,
    memory_efficiency=0.75,
    source="test",
)


def test_full_waves_of_whole_tiles_lose_only_the_inner_dimension_term():
    # 2 x 2 tiles fill 4 SMs exactly
    assert gemm_efficiency(C, 512, 256, 4096) == pytest.approx(0.8 * 4096 / (4096 + 32))


def test_tile_quantization_pays_for_the_padding():
    # 257 rows need two 256-row tiles, 4 tiles on 4 SMs
    assert gemm_efficiency(C, 257, 256, 4096) == pytest.approx(0.8 * 257 / 512 * 4096 / 4128)


def test_wave_quantization_idles_sms_in_the_last_wave():
    # 5 tiles on 4 SMs: two waves, 5 of 8 slots busy (too many tiles to split k)
    assert gemm_efficiency(C, 5 * 256, 128, 4096) == pytest.approx(0.8 * 5 / 8 * 4096 / 4128)


def test_split_k_fills_the_gpu_when_tiles_are_few():
    # one tile on 4 SMs: k split 4 ways, each split 1024 deep
    assert gemm_efficiency(C, 256, 128, 4096) == pytest.approx(0.8 * 1024 / (1024 + 32))
    # batched: 4 heads of one tile each fill the SMs without splitting
    assert gemm_efficiency(C, 256, 128, 64, batch=4) == pytest.approx(0.8 * 64 / 96)


def _model(**parallel):
    s = load(
        model={"hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048},
        parallel=parallel,
        training={"micro_batch_size": 2, "global_batch_size": 16},
    )
    return s, ComputeModel(s)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_layer_flops_are_megatrons_count(tp):
    """Narayanan et al. 2021: a layer's forward is 24 b s h^2 (1 + s / 6h) FLOPs, the
    backward twice that; the weight gradients are the four weight GEMMs' 24 b s h^2."""
    s, compute = _model(tensor_model_parallel_size=tp, data_parallel_size=8 // tp)
    b, seq, h = 2, 2048, 2048
    forward = 24 * b * seq * h * h * (1 + seq / (6 * h)) / tp
    layer = compute.layer()
    assert (layer.attention_forward + layer.mlp_forward).flops == pytest.approx(forward)
    assert (layer.attention_backward + layer.mlp_backward).flops == pytest.approx(2 * forward)
    assert (layer.attention_weight + layer.mlp_weight).flops == pytest.approx(
        24 * b * seq * h * h / tp
    )
    assert layer.attention_core_forward.flops == pytest.approx(4 * b * seq * seq * h / tp)


def test_element_wise_kernels_stream_at_the_memory_efficiency():
    s, compute = _model()
    hbm = GPUS["a100-sxm4-80gb"].hbm_gbytes_per_s * 1e9
    eff = GPUS["a100-sxm4-80gb"].kernels.memory_efficiency
    softmax = next(k for k in compute.kernels() if k.name == "softmax" and k.part == "forward")
    scores = 2 * 16 * 2048 * 2048  # b a s^2 elements, fp16 read and written
    assert softmax.work.duration_s == pytest.approx(2 * 2 * scores / (hbm * eff))
    assert softmax.work.flops == 0


def test_a_gemm_too_thin_to_compute_is_bound_by_its_bytes():
    s, compute = _model()
    hbm = GPUS["a100-sxm4-80gb"].hbm_gbytes_per_s * 1e9
    eff = GPUS["a100-sxm4-80gb"].kernels.memory_efficiency
    outer = compute.gemm(8192, 8192, 1)  # an outer product writes 128 MiB
    assert outer.duration_s == pytest.approx(2 * (8192 + 8192 + 8192 * 8192) / (hbm * eff))


def test_sequence_parallel_shards_only_the_element_wise_kernels():
    _, plain = _model(tensor_model_parallel_size=8)
    _, sp = _model(tensor_model_parallel_size=8, sequence_parallel=True)
    for a, b in zip(plain.kernels(), sp.kernels(), strict=True):
        if a.name in ("layernorm", "bias-dropout-add"):
            assert b.work.duration_s == pytest.approx(a.work.duration_s / 8)
        else:
            assert b.work == a.work


def test_fit_recovers_the_constants_that_made_the_timings():
    gpu = GPUS["h100-sxm5-80gb"]
    truth = dataclasses.replace(
        GPUS["h100-sxm5-80gb"].kernels,
        gemm_efficiency=0.66,
        gemm_k_half=40.0,
        memory_efficiency=0.9,
    )
    shapes = [(4096, 4096, k, 1) for k in (64, 128, 512, 4096)] + [(2048, 2048, 128, 32)]
    gemms = [GemmTiming(*s, gemm_seconds(gpu, truth, *s)) for s in shapes]
    memory = [MemoryTiming(3e9, 3e9 / (gpu.hbm_gbytes_per_s * 1e9 * 0.9))]
    fitted = fit_constants(gpu, truth.num_sms, gemms, memory, "test")
    assert (fitted.gemm_efficiency, fitted.gemm_k_half) == (0.66, 40.0)
    assert fitted.memory_efficiency == pytest.approx(0.9)


@pytest.fixture(scope="module")
def synthetic_file(tmp_path_factory):
    """The calibration file measure_kernels.py writes without a GPU."""
    path = tmp_path_factory.mktemp("calibration") / "a100.toml"
    script = benchmark_script("measure_kernels")
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--synthetic", "a100-sxm4-80gb", "--out", str(path)]) == 0
    return path


def test_calibration_file_from_the_script_drives_run(synthetic_file, tmp_path, capsys):
    assert read_calibration(synthetic_file) == dataclasses.replace(
        GPUS["a100-sxm4-80gb"].kernels, source="synthetic: the built-in model's own times"
    )
    efficiency = GPUS["a100-sxm4-80gb"].kernels.gemm_efficiency
    slow = tmp_path / "slow.toml"
    slow.write_text(
        synthetic_file.read_text().replace(
            f"gemm_efficiency = {efficiency!r}", f"gemm_efficiency = {efficiency / 2!r}"
        )
    )
    times = []
    for f in (synthetic_file, slow):
        assert main(["run", "scenarios/tiny-2gpu.toml", "--calibration", str(f), "--json"]) == 0
        times.append(json.loads(capsys.readouterr().out)["iteration_time_s"])
    assert times[1] > 1.3 * times[0]


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            (
                f"gemm_efficiency = {GPUS['a100-sxm4-80gb'].kernels.gemm_efficiency!r}",
                "gemm_efficiency = 1.5",
            ),
            "constants.gemm_efficiency=1.5 must be between",
        ),
        (("num_sms = 108", "num_sms = 1.5"), "constants.num_sms=1.5 must be int"),
        (('gpu = "a100-sxm4-80gb"', 'gpu = "h100-sxm5-80gb"'), "has gpu='h100-sxm5-80gb' but"),
        (("tile_m = 256", "tile_m = 256\nwarp = 3"), "unknown key constants.warp"),
        (("[constants]", "[constant]"), "needs a [constants] table"),
    ],
)
def test_bad_calibration_files_are_one_line_errors(synthetic_file, tmp_path, capsys, edit, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(synthetic_file.read_text().replace(*edit, 1))
    assert main(["run", "scenarios/tiny-2gpu.toml", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario("scenarios/tiny-2gpu.toml", calibration=bad)


def test_cross_entropy_is_megatrons_chain_of_full_passes_over_the_fp32_logits():
    # Megatron's vocab-parallel cross-entropy: cast to fp32 (2 + 4), max (4), subtract
    # (4 + 4), exp (4 + 4), sum (4), divide (4 + 4) = 38 bytes per logit forward; the
    # backward's mul_ (4 + 4) and cast back to 16 bits (4 + 2) = 14
    scenario = load(
        model={"vocab_size": 51200},
        parallel={"tensor_model_parallel_size": 2},
        training={"global_batch_size": 8, "micro_batch_size": 2},
    )
    model = ComputeModel(scenario)
    extras = model.extras()
    tokens, h = 2 * scenario.model.seq_length, scenario.model.hidden_size
    logits = tokens * 51200 / 2
    gpu = scenario.cluster.gpu
    rate = gpu.hbm_gbytes_per_s * 1e9 * scenario.kernel_constants.memory_efficiency
    layernorm = 2 * 2 * tokens * h / rate
    gemm = model.gemm(tokens, 51200 / 2, h).duration_s
    assert extras.output_forward.duration_s == pytest.approx(layernorm + gemm + 38 * logits / rate)
    backward_rest = (
        model.gemm(tokens, h, 51200 / 2).duration_s
        + extras.output_weight.duration_s
        + 4 * 2 * tokens * h / rate
    )
    assert extras.output_backward.duration_s == pytest.approx(backward_rest + 14 * logits / rate)

"""Every GPU preset is one complete record, and every node preset names one."""

import dataclasses

import pytest

from stepsim.calibration.fit import calibration_toml
from stepsim.cost.compute import ComputeModel
from stepsim.scenario import GpuSpec, KernelConstants, read_calibration
from stepsim.scenario.presets import CALIBRATED_GPU, CALIBRATED_GPUS, GPUS, NODES
from tests.helpers import load


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_gpu_preset_is_complete_and_in_range(name):
    gpu = GPUS[name]
    assert gpu.name == name and gpu.kernels.gpu == name
    assert {f.name for f in dataclasses.fields(GpuSpec)} == {
        "name",
        "peak_tflops",
        "peak_tflops_fp8",
        "peak_tflops_fp4",
        "compute_capability",
        "memory_gib",
        "hbm_gbytes_per_s",
        "tensor_flops_per_exp",
        "kernels",
        "fp8_kernels",
        "attention_kernels",
    }, "a new GpuSpec field needs a check here"
    assert gpu.peak_tflops > 0 and gpu.memory_gib > 0 and gpu.hbm_gbytes_per_s > 0
    # 16 exponentials per SM per clock against the tensor FLOPs per SM per clock:
    # 64 (Volta), 128 (Ampere), 256 (Hopper); Blackwell: the dense BF16 peak over the
    # published EX2 rate, 5 (Blackwell) or 10.7 (Blackwell Ultra) x 10^12 per second
    exp_rate = {"b200-sxm-180gb": 5.0, "gb200": 5.0, "b300-sxm-288gb": 10.7, "gb300": 10.7}
    if name in exp_rate:
        assert gpu.tensor_flops_per_exp == gpu.peak_tflops / exp_rate[name]
    else:
        assert gpu.tensor_flops_per_exp in (64, 128, 256)
    # FP8 tensor cores (Hopper) run twice the FP16/BF16 rate; older GPUs have none
    assert gpu.peak_tflops_fp8 is None or gpu.peak_tflops_fp8 == pytest.approx(
        2 * gpu.peak_tflops, rel=1e-4
    )
    # FP8 from compute capability 8.9 (Ada, Hopper); FP4 and its doubled rate on Blackwell
    # (10.x); FP8 GEMM constants exactly where there is an FP8 peak
    major, minor = gpu.compute_capability
    assert (gpu.peak_tflops_fp8 is not None) == ((major, minor) >= (8, 9))
    assert (gpu.peak_tflops_fp4 is not None) == (major == 10)
    assert gpu.peak_tflops_fp4 is None or 1.5 <= gpu.peak_tflops_fp4 / gpu.peak_tflops_fp8 <= 3
    assert (gpu.fp8_kernels is None) == (gpu.peak_tflops_fp8 is None)
    if gpu.fp8_kernels is not None:
        f = gpu.fp8_kernels
        assert 0 < f.gemm_efficiency <= f.fast_accum_gemm_efficiency <= 1 and f.gemm_k_half >= 0
        assert f.source.strip()
    # flash attention's own constants exactly on the GPUs with attention kernel timings:
    # Hopper and Blackwell (the V100s and A100s run it at the score GEMM's efficiency)
    a = gpu.attention_kernels
    assert (a is not None) == (major >= 9)
    if a is not None:
        assert 0 < a.backward_efficiency <= a.forward_efficiency <= 1 and a.kv_half >= 0
        assert 0 <= a.exp_exposed <= 1 and a.source.strip()
    assert isinstance(gpu.kernels, KernelConstants)
    assert gpu.num_sms == gpu.kernels.num_sms > 0
    assert gpu.kernel_provenance.strip()
    c = gpu.kernels
    assert c.tile_m > 0 and c.tile_n > 0 and c.gemm_k_half >= 0
    assert 0 < c.gemm_efficiency <= 1 and 0 < c.memory_efficiency <= 1


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_gpu_presets_constants_pass_as_a_calibration_file(name, tmp_path):
    """The loader's checks of a measured file (types, ranges, known GPU) hold for
    the built-in constants too, and the file round-trips them exactly."""
    path = tmp_path / f"{name}.toml"
    path.write_text(calibration_toml(GPUS[name].kernels, [], []), encoding="utf-8")
    assert read_calibration(path) == GPUS[name].kernels


def test_only_the_calibrated_gpus_say_they_were_fitted():
    fitted = sorted(name for name, gpu in GPUS.items() if gpu.kernel_provenance.startswith("fit"))
    assert fitted == sorted(CALIBRATED_GPUS.values()) and CALIBRATED_GPU in fitted
    for name in sorted(set(GPUS) - set(fitted) - set(KERNEL_TABLE_GPUS)):
        label = GPUS[name].kernel_provenance
        assert label.startswith("uncalibrated: scaled from ")
        source = label.removeprefix("uncalibrated: scaled from ")
        assert source in fitted and GPUS[source].kernels.gemm_efficiency == (
            GPUS[name].kernels.gemm_efficiency
        )


# The Hopper and Blackwell GPUs besides the H100: every constant from kernel timings (a
# published micro-benchmark table in scenarios/validation/kernels/ or a measurement file
# in benchmarks/measured/), their own or their die's, and the label says which.
# name: (the GPU whose GEMM fractions it has, whose memory_efficiency, whose attention)
KERNEL_TABLE_GPUS = {
    "h200-sxm-141gb": ("h100-sxm5-80gb", "h200-sxm-141gb", "h200-sxm-141gb"),
    "h800-sxm5-80gb": ("h100-sxm5-80gb", "h100-sxm5-80gb", "h100-sxm5-80gb"),
    "b200-sxm-180gb": ("b200-sxm-180gb", "gb200", "b200-sxm-180gb"),
    "gb200": ("b200-sxm-180gb", "gb200", "gb200"),
    "b300-sxm-288gb": ("b200-sxm-180gb", "gb300", "gb300"),
    "gb300": ("b200-sxm-180gb", "gb300", "gb300"),
}


@pytest.mark.parametrize("name", sorted(KERNEL_TABLE_GPUS))
def test_hopper_and_blackwell_constants_come_from_kernel_timings_and_say_so(name):
    gpu = GPUS[name]
    gemms, memory, attention = (GPUS[g] for g in KERNEL_TABLE_GPUS[name])
    assert (gpu.kernels.gemm_efficiency, gpu.kernels.gemm_k_half) == (
        gemms.kernels.gemm_efficiency,
        gemms.kernels.gemm_k_half,
    )
    assert gpu.kernels.memory_efficiency == memory.kernels.memory_efficiency
    a, b = gpu.attention_kernels, attention.attention_kernels
    assert a is not None and b is not None
    assert dataclasses.replace(a, source="") == dataclasses.replace(b, source="")
    for label in (gpu.kernel_provenance, gpu.fp8_kernels.source, a.source):
        assert "uncalibrated" not in label and "kernel" in label
    # what a label borrows, it names: the same die's fit
    if gemms is not gpu and gemms.name != "h100-sxm5-80gb":
        assert "B200's kernel fit" in gpu.kernel_provenance
    if name == "b200-sxm-180gb":
        assert "OpenXLA" in gpu.kernel_provenance and "cuDNN 9.13" in a.source
        assert gpu.fp8_kernels.gemm_efficiency == gpu.fp8_kernels.fast_accum_gemm_efficiency


# name: (dense BF16, dense FP8 TFLOP/s, memory GB, HBM GB/s, SMs), docs/reference.md
TODAYS_GPUS = {
    "h800-sxm5-80gb": (989.4, 1978.9, 80.0, 3350.0, 132),
    "b200-sxm-180gb": (2250.0, 4500.0, 180.0, 8000.0, 148),
    "gb200": (2500.0, 5000.0, 186.0, 8000.0, 148),
    "b300-sxm-288gb": (2250.0, 4500.0, 288.0, 8000.0, 160),
    "gb300": (2500.0, 5000.0, 279.0, 8000.0, 160),
}


@pytest.mark.parametrize("name", sorted(TODAYS_GPUS))
def test_todays_gpus_carry_their_sourced_figures(name):
    gpu = GPUS[name]
    figures = (gpu.peak_tflops, gpu.peak_tflops_fp8, gpu.memory_gib)
    assert figures + (gpu.hbm_gbytes_per_s, gpu.num_sms) == TODAYS_GPUS[name]


def test_the_dgx2_preset_is_sixteen_v100s_on_nvswitch_with_eight_100g_nics():
    dgx2 = NODES["dgx-2"]
    assert dgx2["gpu"] == "v100-sxm3-32gb" and dgx2["gpus_per_node"] == 16
    assert dgx2["nvlink_topology"] == "nvswitch" and dgx2["nvlink_gbytes_per_s"] == 150.0
    assert (dgx2["nics_per_node"], dgx2["nic_gbps"]) == (8, 100.0)
    # every key a node preset fills is there (the DGX A100's keys as the reference)
    assert set(NODES["dgx-a100"]) <= set(dgx2)
    gpu = GPUS["v100-sxm3-32gb"]
    assert (gpu.peak_tflops, gpu.memory_gib, gpu.hbm_gbytes_per_s, gpu.num_sms) == (
        125.0,
        32.0,
        900.0,
        80,
    )
    scenario = load(
        cluster={"node": "dgx-2", "num_nodes": 1},
        parallel={"tensor_model_parallel_size": 16},
        training={"micro_batch_size": 1, "global_batch_size": 1},
    )
    assert scenario.cluster.gpu == gpu and scenario.cluster.gpus_per_node == 16


@pytest.mark.parametrize("node", sorted(NODES))
def test_every_node_preset_names_a_gpu_preset(node):
    assert NODES[node]["gpu"] in GPUS


def test_a_gpu_known_only_by_its_record_runs_on_its_own_constants():
    """No table keyed by GPU name stands between a GpuSpec and the compute model: a
    GPU that no preset lists still computes, with the constants it carries."""
    base = load()
    a100 = base.cluster.gpu
    kernels = dataclasses.replace(a100.kernels, gpu="test-gpu", num_sms=54)
    gpu = dataclasses.replace(a100, name="test-gpu", kernels=kernels)
    scenario = dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, gpu=gpu))
    assert scenario.kernel_constants is kernels
    # 12 x 10 = 120 tiles of 256 x 128 (gemm_k_half 0, large k: no split-K): three
    # waves of which 120/162 busy on 54 SMs, two waves 120/216 busy on the A100's 108
    tiles = (256 * 12, 128 * 10, 4096)
    ratio = (
        ComputeModel(scenario).gemm(*tiles).duration_s / ComputeModel(base).gemm(*tiles).duration_s
    )
    assert ratio == pytest.approx((120 / 216) / (120 / 162))


def test_a_calibration_overrides_the_gpu_records_constants():
    base = load()
    measured = dataclasses.replace(base.cluster.gpu.kernels, gemm_efficiency=0.5, source="test")
    assert base.kernel_constants is base.cluster.gpu.kernels
    assert dataclasses.replace(base, calibration=measured).kernel_constants is measured


def test_every_run_says_how_its_gpus_constants_were_obtained(tmp_path):
    """metrics.json's "calibration" and the run summary: fitted, scaled from a fitted
    GPU, or the --calibration file."""
    from stepsim.report.summary import summary_text
    from stepsim.run.iteration import run
    from stepsim.scenario import dumps_toml, load_scenario
    from tests.helpers import scenario

    fitted = run(load())
    assert fitted.metrics.calibration == GPUS[CALIBRATED_GPU].kernel_provenance
    assert fitted.metrics.calibration.startswith("fit on the A100 calibration set")
    assert fitted.metrics.to_json()["calibration"] == fitted.metrics.calibration
    assert fitted.metrics.calibration in summary_text(fitted)

    scaled = run(load(cluster={"node": "dgx-a100", "gpu": "a100-sxm4-40gb"}))
    assert scaled.metrics.to_json()["calibration"] == "uncalibrated: scaled from a100-sxm4-80gb"
    assert "uncalibrated: scaled from a100-sxm4-80gb" in summary_text(scaled)
    h200 = run(load(cluster={"node": "dgx-h200"}))
    assert h200.metrics.calibration == GPUS["h200-sxm-141gb"].kernel_provenance
    assert "cuDNN 9.19 SDPA" in summary_text(h200)

    constants = dataclasses.replace(GPUS[CALIBRATED_GPU].kernels, source="measured here")
    calibration = tmp_path / "a100.toml"
    calibration.write_text(calibration_toml(constants, [], []), encoding="utf-8")
    path = tmp_path / "s.toml"
    path.write_text(dumps_toml(scenario()), encoding="utf-8")
    label = run(load_scenario(path, calibration=calibration)).metrics.calibration
    assert label == f"calibration file {str(calibration)!r}: measured here"


def test_the_gb200_scenario_fills_each_rack_with_a_stage_and_names_its_kernel_tables():
    from stepsim.scenario import load_scenario

    scenario = load_scenario("scenarios/llama3-70b-4racks-gb200.toml")
    cluster, parallel = scenario.cluster, scenario.parallel
    assert (cluster.gpu, cluster.num_nodes, cluster.nvlink_domain_gpus) == (GPUS["gb200"], 4, 72)
    assert parallel.tensor_model_parallel_size * parallel.data_parallel_size == 72
    # what metrics.json's "calibration" and the summary print (checked on a run above)
    assert scenario.kernel_constants.source == GPUS["gb200"].kernel_provenance
    assert "GB200" in scenario.kernel_constants.source

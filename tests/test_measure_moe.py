"""benchmarks/measure_moe_kernels.py without a GPU: its --synthetic file (the model's
columns), the skewed row split it times, and the bytes its permute rows carry."""

import contextlib
import csv
import io

from tests.helpers import benchmark_script

GPU = "h200-sxm-141gb"


def test_row_counts_keep_the_total_and_the_kernel_alignment():
    script = benchmark_script("measure_moe_kernels")
    for experts in (2, 4, 8, 32):
        counts = script.row_counts(experts, 4096, skewed=True)
        assert sum(counts) == 4096 * experts
        assert all(c % 16 == 0 and c > 0 for c in counts)
        assert counts == sorted(counts) and counts[0] < 4096 < counts[-1]
    assert script.row_counts(8, 1024, skewed=False) == [1024] * 8


def test_synthetic_file_has_every_kernel_at_the_models_own_time(tmp_path):
    script = benchmark_script("measure_moe_kernels")
    out = tmp_path / "moe.csv"
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--synthetic", GPU, "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["kernel"] for r in rows} == {"grouped", "swiglu", "permute", "unpermute"}
    assert {float(r["queued_ratio"]) for r in rows} == {1.0}
    gpu = script.GPUS[GPU]
    stream = gpu.hbm_gbytes_per_s * 1e9 * gpu.kernels.memory_efficiency
    for r in rows:
        if r["kernel"] == "swiglu":  # rows x FFN outputs, two 16-bit inputs and one output each
            assert float(r["gbytes"]) * 1e9 == 6 * int(r["m"]) * int(r["n"])
            assert abs(float(r["model_s"]) - float(r["gbytes"]) * 1e9 / stream) < 1e-15
        if r["kernel"] == "grouped" and r["skewed"] == "False":
            # equal experts: the group's FLOPs are experts x 2 m n k of one expert
            m, n, k, e = (int(r[c]) for c in ("m", "n", "k", "experts"))
            assert abs(float(r["tflop"]) * 1e12 - 2.0 * m * n * k) <= 1e-6 * m * n * k
            assert (k if r["gemm"] == "fc1_wgrad" else m) == e * int(r["rows"])
    # a group of four equal experts is one batched GEMM in the model: four times one
    # expert's time at most (waves shared), and no less than one expert's
    one = [r for r in rows if r["family"] == "deepseek-v3" and r["gemm"] == "fc1"]
    by_experts = {int(r["experts"]): float(r["model_s"]) for r in one if r["rows"] == "4096"}
    assert by_experts[4] < by_experts[8] < by_experts[32] <= 8 * by_experts[4] * (1 + 1e-12)

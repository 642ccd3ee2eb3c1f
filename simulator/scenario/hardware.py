"""Named GPUs and nodes that scenario files can refer to (re-exported by
simulator.scenario.presets, which scenario files and the schema read).

Every number carries its source. Hardware figures are vendor datasheet values
(copied from the project's reference notes, docs/reference.md, which lists the
sources of the H800 and Blackwell figures); latencies are derived from published
NCCL measurements as explained next to them.
"""

from __future__ import annotations

import dataclasses

from .gpu import AttentionKernelConstants, Fp8KernelConstants, GpuSpec, KernelConstants

# Kernel constants: the only numbers of the compute model that are not shapes or
# datasheet values (simulator.workload.compute explains each).
#
# num_sms: the datasheets (V100 80, A100 108, H100 SXM5 132, H200 132).
# tile_m x tile_n: the output tile of the fp16 tensor-core GEMM kernels cuBLAS
#   picks for large transformer shapes on Volta..Hopper (256 x 128; CUTLASS's
#   largest default threadblock tile).
# gemm_efficiency, gemm_k_half, memory_efficiency: fitted per GPU on that GPU's
#   calibration set by benchmarks/calibrate.py --gpu a100|v100|h100, one set of
#   constants for all rows of the set (docs/calibration.md says how, with the
#   commands; docs/validation.md shows what remains):
#   - A100: Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 4
#     (DGX A100 80 GB);
#   - V100: the Megatron-LM README's DGX-2 table of 2020 (16 x V100 SXM3 32 GB);
#   - H100: Megatron-Core r0.8.0's weak-scaling table (NVIDIA/Megatron-LM README, 2024).
#   A GPU with no calibration data of its own carries the fractions of the closest
#   calibrated one and says so in its label ("uncalibrated: scaled from ...").
#   The H100's two fractions are the values its kernels were measured to reach
#   (benchmarks/measured/, docs/calibration.md: large GEMMs 0.69 of the peak sustained
#   under the power cap, element-wise 0.91 of the HBM bandwidth), held fixed; only
#   gemm_k_half is fitted on the set, its rows run as Megatron-Core r0.8.0 runs them
#   (flash attention through Transformer Engine, --tp-comm-overlap). The set is still
#   not met (docs/validation.md).
_FITS = {
    "a100": {"gemm_efficiency": 0.75, "gemm_k_half": 0.0, "memory_efficiency": 0.70},
    "v100": {"gemm_efficiency": 0.73, "gemm_k_half": 8.0, "memory_efficiency": 0.95},
    "h100": {"gemm_efficiency": 0.69, "gemm_k_half": 128.0, "memory_efficiency": 0.91},
}
_SOURCES = {
    "a100": "fit on the A100 calibration set (Megatron-LM 2021 Table 1 + Korthikanti 2022 "
    "Table 4; benchmarks/calibrate.py --gpu a100)",
    "v100": "fit on the V100 DGX-2 set (Megatron-LM README 2020; "
    "benchmarks/calibrate.py --gpu v100)",
    "h100": "fit on the H100 set (Megatron-Core r0.8.0 2024; benchmarks/calibrate.py --gpu h100) "
    "with gemm_efficiency and memory_efficiency fixed at kernel measurements on a real H100 "
    "(benchmarks/measured/); flash attention fit on cuDNN 9.1 kernel timings (FlashAttention-3 "
    "paper Figs. 5-6, scenarios/validation/kernels/); the set is not met (docs/calibration.md)",
}
# the GPU each calibration set ran on, which benchmarks/calibrate.py fits
CALIBRATED_GPUS = {"a100": "a100-sxm4-80gb", "v100": "v100-sxm3-32gb", "h100": "h100-sxm5-80gb"}
CALIBRATED_GPU = CALIBRATED_GPUS["a100"]


def _scaled(family: str) -> str:
    return f"uncalibrated: scaled from {CALIBRATED_GPUS[family]}"


# FP8 GEMM constants, fractions of the dense FP8 peak, from kernel measurements only
# (docs/calibration.md, "FP8 GEMMs"): FP8 GEMMs timed with benchmarks/measure_kernels.py
# --precision fp8 on a real H100 SXM5 (benchmarks/measured/h100-sxm5-80gb-fp8*.toml,
# 2026-11-23). Split accumulation (TE's dgrad and wgrad): back-to-back 8192^3 FP8 GEMMs
# sustained 1,230 TFLOP/s under the 700 W power cap, 0.62 of 1,978.9 (the median of the
# 22 GEMMs of at least 1 TFLOP, default timing, 1,231); fast accumulation (TE's fprop):
# the same median 1,330 TFLOP/s, 0.67 (default timing matched the sustained rate within
# 0.5 % for BF16 and for FP8). gemm_k_half: the FP8 fit's 256 (fp8.toml), the per-tile
# cost at twice the BF16 rate. The other FP8 GPUs carry the H100's and say so.
_FP8_FITS = {
    "h100": {"gemm_efficiency": 0.62, "fast_accum_gemm_efficiency": 0.67, "gemm_k_half": 256.0}
}
_FP8_SOURCES = {
    "h100": "FP8 GEMM kernel measurements on a real H100 (benchmarks/measured/"
    "h100-sxm5-80gb-fp8*.toml; docs/calibration.md)",
}


# Kernel-table constants of the Hopper and Blackwell GPUs other than the H100: fitted
# only on published kernel micro-benchmarks (scenarios/validation/kernels/, its README.md
# cites every file; `stepsim validate --kernels` compares every row), by
# stepsim.calibration.kernels (benchmarks/calibrate.py --kernels runs each fit and prints
# its rows; docs/calibration.md, "Kernel tables", has the numbers). Each GPU takes a
# fitted constant from a table of its own where one exists, else from the GPU of the
# same die, and its label says which.
#
# GEMMs (gemm_efficiency, gemm_k_half), B200: the OpenXLA matmul table's sm_100_B200
# BF16 rows (xla_matmul_sm90_b200.csv X251-X500) whose time is 20 us or more, 51 rows
# (X325 ... X500); grid 0.30-1.00 x 0-1024, least squared relative error: 0.71 / 288
# (rms 6.7 %). GB200 (the same die at 1,200 W), B300 and GB300 (no sm_103 GEMM table)
# carry these fractions of their own peaks. H200 and H800 (the H100's die) carry the
# H100's: 0.69 measured on a real H100, 128 fitted on its set.
_B200_GEMMS = {"gemm_efficiency": 0.71, "gemm_k_half": 288.0}
# memory_efficiency: the median fraction of the HBM bandwidth cuDNN's RMSNorm / LayerNorm
# kernels reached, forward and backward (cudnn_norms.csv, bytes as cuDNN's benchmark
# counts them), over the rows of 1,024 columns or more and 20 us or more: H200 N31-N38,
# N42 (17 timings) 0.76; GB200 N1-N8, N12 (16) 0.72; GB300 N16-N23, N27 (16) 0.72. The
# B200 (the GB200's die and 8 TB/s HBM3e) takes the GB200's, the B300 the GB300's; the
# H800 (the H100's die and 3.35 TB/s HBM3) the H100's measured 0.91.
_NORM_MEMORY = {"h200": 0.76, "gb200": 0.72, "gb300": 0.72}
# FP8 GEMMs, B200: the same table's e4m3 x e4m3 -> bf16 rows of 20 us or more, 28 rows
# (X350 ... X500): 0.80 / 616 (rms 8.9 %), fast accumulation the same (Blackwell has one
# accumulation path; the split is Hopper's). Per-tensor scaled: no MXFP8 or blockwise
# GEMM is in any table. The table's sm_90 FP8 rows are left out (above the H100's dense
# FP8 peak: the README there).
_B200_FP8 = {"gemm_efficiency": 0.80, "fast_accum_gemm_efficiency": 0.80, "gemm_k_half": 616.0}
_KERNEL_TABLES = "scenarios/validation/kernels/"
_LABELS = {
    "h200": "the H100's GEMM constants (same die); memory_efficiency fit on cuDNN norm kernel "
    f"timings of an H200, flash attention on cuDNN 9.19 SDPA timings of an H200 ({_KERNEL_TABLES})",
    "h800": "the H100's constants (same die and HBM3): kernel measurements on a real H100, "
    "gemm_k_half fit on the H100 set, flash attention on cuDNN 9.1 kernel timings",
    "b200": "GEMMs fit on the OpenXLA matmul table's B200 BF16 kernel timings; memory_efficiency "
    "the GB200's cuDNN norm fit (same die and HBM3e); flash attention fit on cuDNN 9.13 SDPA "
    f"timings of a B200 ({_KERNEL_TABLES})",
    "gb200": "GEMMs the B200's kernel fit (same die; OpenXLA B200 BF16 timings); memory_efficiency "
    "fit on cuDNN norm kernel timings of a GB200, flash attention on cuDNN 9.22 SDPA timings of "
    f"a GB200 ({_KERNEL_TABLES})",
    "b300": "GEMMs the B200's kernel fit (no sm_103 GEMM table); memory_efficiency and flash "
    "attention the GB300's fits (same die: cuDNN norm and cuDNN 9.22 SDPA timings of a GB300; "
    f"{_KERNEL_TABLES})",
    "gb300": "GEMMs the B200's kernel fit (no sm_103 GEMM table); memory_efficiency fit on cuDNN "
    "norm kernel timings of a GB300, flash attention on cuDNN 9.22 SDPA timings of a GB300 "
    f"({_KERNEL_TABLES})",
}
_FP8_LABELS = {
    "hopper": "the H100's FP8 GEMM kernel measurements (same die; benchmarks/measured/"
    "h100-sxm5-80gb-fp8*.toml)",
    "b200": "fit on the OpenXLA matmul table's B200 FP8 (e4m3, per-tensor scaled) kernel timings "
    f"({_KERNEL_TABLES}); MXFP8 and blockwise GEMMs not measured",
    "blackwell": "the B200's FP8 kernel fit (OpenXLA B200 FP8 timings; same die, or no sm_103 "
    "table); MXFP8 and blockwise GEMMs not measured",
}


# Flash attention (cost.attention: forward and backward efficiency, kv_half, the
# exponentials' exposed share), fitted on attention kernel timings alone, apart from the
# GEMMs' constants; grid 0.30-1.00 x 0-2048 x 0-1 (stepsim.calibration.kernels.
# fit_attention), least squared relative error over:
# - H100: cuDNN 9.1.1 (the kernel Megatron-Core r0.8.0 runs through Transformer Engine on
#   Hopper: TE prefers its FusedAttention, cuDNN, over FlashAttention-2 on sm90;
#   docs/calibration.md) in the FlashAttention-3 paper's Fig. 5 (forward, read from the
#   plot; fa3_h100_fwd_fig5.csv, the cudnn rows of head dimension 64 and 128, F2 ...
#   F71, 24 rows) and Fig. 6 (backward, a secondary transcription, non-causal inferred;
#   fa3_h100_bwd_SECONDARY.csv B2 ... B35, 12 rows): 0.91 / 0.60 / 192 / 1.0 (rms 7.1 %).
# - H200: cuDNN 9.19 SDPA training benchmark, cudnn_sdpa_training.csv S41-S63 (llama3.1
#   forward and backward, dsv3 forward; 23 rows): 0.86 / 0.65 / 432 / 0.35 (rms 3.1 %).
# - B200: cuDNN 9.13 SDPA (frontend, bf16), cudnn_sdpa_b200_gb300_cudnn913.csv C1-C9
#   forward and backward (18 timings, all head dimension 128, causal; the exposed share
#   held at the GB200's 0.0, which these rows cannot tell apart): 0.75 / 0.55 / 1104 / 0.0
#   (rms 8.6 %).
# - GB200: cuDNN 9.22 SDPA training benchmark, the llama3.1 and dsv3 rows of S1-S123 (40
#   rows): 0.70 / 0.53 / 432 / 0.0 (rms 7.3 %). GB300: the same of S21-S143 (40 rows):
#   0.83 / 0.59 / 464 / 0.0 (rms 6.0 %). The B300 carries the GB300's (same die), the
#   H800 the H100's.
def _attention(f: float, b: float, kv: float, x: float, source: str) -> AttentionKernelConstants:
    return AttentionKernelConstants(
        forward_efficiency=f, backward_efficiency=b, kv_half=kv, exp_exposed=x, source=source
    )


_ATTENTION = {
    "h100": _attention(
        0.91,
        0.60,
        192.0,
        1.0,
        "fit on cuDNN 9.1 kernel timings of an H100 (FlashAttention-3 paper Fig. 5 forward, read "
        "from the plot; Fig. 6 backward, a secondary transcription; head dimensions 64 and 128)",
    ),
    "h200": _attention(
        0.86,
        0.65,
        432.0,
        0.35,
        "fit on cuDNN 9.19 SDPA kernel timings of an H200 (llama3.1, dsv3)",
    ),
    "b200": _attention(
        0.75,
        0.55,
        1104.0,
        0.0,
        "fit on cuDNN 9.13 SDPA kernel timings of a B200 (causal, head dimension 128; the "
        "exponentials' share the GB200's)",
    ),
    "gb200": _attention(
        0.70,
        0.53,
        432.0,
        0.0,
        "fit on cuDNN 9.22 SDPA kernel timings of a GB200 (llama3.1, dsv3)",
    ),
    "gb300": _attention(
        0.83,
        0.59,
        464.0,
        0.0,
        "fit on cuDNN 9.22 SDPA kernel timings of a GB300 (llama3.1, dsv3)",
    ),
}
_ATTENTION["h800"] = dataclasses.replace(
    _ATTENTION["h100"], source="the H100's (same die): " + _ATTENTION["h100"].source
)
_ATTENTION["b300"] = dataclasses.replace(
    _ATTENTION["gb300"], source="the GB300's (same die): " + _ATTENTION["gb300"].source
)


# Dense FP16/BF16 tensor-core FLOPs per SM per clock (peak / (SMs x boost clock):
# V100 8 tensor cores x 64 FMA x 2; A100 and H100 4 x 256 and 4 x 512 FMA x 2, NVIDIA's
# A100 and H100 architecture white papers) over the 16 exponentials (ex2, the MUFU
# special-function units) an SM issues per clock on compute capability 7.0-9.0 (CUDA C++
# Programming Guide, "Arithmetic Instructions" throughput table). Both run on the SM
# clock, so the ratio holds whatever clock the power cap leaves. Shah et al. 2024
# (FlashAttention-3, arXiv 2407.08608, Sec 3) give the H100's: 989 TFLOP/s of matmul
# against 3.9 TFLOP/s of exponentials, 256.
_TENSOR_FLOPS_PER_SM_CLOCK = {"v100": 1024, "a100": 2048, "h100": 4096}
EXPONENTIALS_PER_SM_CLOCK = 16


def _gpu(
    name: str,
    *,
    peak_tflops: float,
    peak_tflops_fp8: float | None,
    peak_tflops_fp4: float | None,
    compute_capability: tuple[int, int],
    memory_gib: float,
    hbm_gbytes_per_s: float,
    num_sms: int,
    family: str,
    fitted: bool,
    tensor_flops_per_exp: float | None = None,
    tables: str | None = None,
) -> GpuSpec:
    """A GPU record whose kernel constants are the 256 x 128 tile and the fractions
    fitted on ``family``'s calibration set, with the GPU's own SM count; ``fitted``
    says whether this GPU is the one that set ran on (else: scaled from it).
    ``tables``: the Hopper or Blackwell GPU whose kernel-table constants and labels
    (_LABELS, _NORM_MEMORY, _B200_GEMMS, _B200_FP8, _ATTENTION above) the record takes
    instead. ``tensor_flops_per_exp``: the family's per-SM-clock ratio unless given (the
    Blackwell GPUs give theirs from the published rates, see _BLACKWELL_EXP)."""
    fractions = dict(_FITS[family])
    source = _SOURCES[family] if fitted else _scaled(family)
    fp8_fractions = _FP8_FITS.get(family)
    fp8_source = _FP8_SOURCES.get(family) if fitted else _scaled(family)
    attention = _ATTENTION.get(family) if fitted else None
    if tables is not None:
        blackwell = tables not in ("h200", "h800")
        source = _LABELS[tables]
        if blackwell:
            fractions.update(_B200_GEMMS)
        memory = {"b200": "gb200", "b300": "gb300", "h800": None}.get(tables, tables)
        if memory is not None:
            fractions["memory_efficiency"] = _NORM_MEMORY[memory]
        fp8_fractions = _B200_FP8 if blackwell else _FP8_FITS["h100"]
        fp8_source = _FP8_LABELS[
            "b200" if tables == "b200" else "blackwell" if blackwell else "hopper"
        ]
        attention = _ATTENTION[tables]
    kernels = KernelConstants(
        gpu=name, num_sms=num_sms, tile_m=256, tile_n=128, source=source, **fractions
    )
    fp8_kernels = None
    if peak_tflops_fp8 is not None:
        assert fp8_fractions is not None and fp8_source is not None
        fp8_kernels = Fp8KernelConstants(source=fp8_source, **fp8_fractions)
    return GpuSpec(
        name=name,
        peak_tflops=peak_tflops,
        peak_tflops_fp8=peak_tflops_fp8,
        peak_tflops_fp4=peak_tflops_fp4,
        compute_capability=compute_capability,
        memory_gib=memory_gib,
        hbm_gbytes_per_s=hbm_gbytes_per_s,
        tensor_flops_per_exp=(
            _TENSOR_FLOPS_PER_SM_CLOCK[family] / EXPONENTIALS_PER_SM_CLOCK
            if tensor_flops_per_exp is None
            else tensor_flops_per_exp
        ),
        kernels=kernels,
        fp8_kernels=fp8_kernels,
        attention_kernels=attention,
    )


# Dense FP16/BF16 tensor peak, memory and HBM bandwidth: NVIDIA datasheets for
# V100, A100 and H100 and the H200 product brief. Memory is what CUDA reports
# (rounded GiB), which is what a training run can use. V100 has no BF16: its
# peak is FP16. Dense FP8 (Hopper only): the H100 datasheet's 3,958 TFLOP/s
# with sparsity, halved (1978.9 dense in the H100 architecture white paper); the
# H200 brief quotes the same 3,958. V100 and A100 have no FP8 tensor cores.
# V100 SXM3 32 GB (the DGX-2's GPU): the same GV100 chip, 32 GB and 900 GB/s as the
# SXM2 part, 125 TFLOP/s FP16 (the DGX-2 datasheet's 2 PFLOP/s over 16 GPUs);
# ../shared/reference/hardware.md lists the V100 figures.
#
# Today's GPUs (docs/reference.md lists each figure with its source):
# - H800 SXM5 80 GB: the H100 SXM5 die with NVLink cut to 400 GB/s both directions
#   together (200 per direction) and FP64 cut; "same silicon", same 80 GB, 3.35 TB/s and
#   low-precision tensor rates (philisun.com "NVIDIA H800 vs H100" comparison table), so
#   the H100 SXM5's peaks and 132 SMs.
# - B200 (DGX/HGX B200, 1,000 W): docs.nvidia.com DGX B200 user guide (8 x B200,
#   1,440 GB: 180 GB each; 2 NVSwitches, 14.4 TB/s aggregate: 1.8 TB/s per GPU, 900 per
#   direction) and nvidia.com DGX B200 (64 TB/s HBM3e: 8 TB/s each; FP8 72 PFLOP/s with
#   sparsity over 8 GPUs: 4.5 dense each); dense BF16 2,250 and FP4 9,000 TFLOP/s (HGX
#   B200 at 1,000 W; glennklockwood.com/garden/processors/B200, ml-engineering's H200 vs
#   B200 table). 148 SMs (74 enabled per die; Chips and Cheese, "Nvidia's B200").
# - GB200 (the NVL72's B200 at 1,200 W): nvidia.com GB200 NVL72, rack figures over 72
#   GPUs with sparsity halved: FP16/BF16 360 PFLOP/s -> 2,500 dense, FP8 720 -> 5,000,
#   FP4 1,440 -> 10,000; 13.4 TB HBM3e -> 186 GB (the MLPerf v6.1 GB200 system
#   description's 186 GB per GPU), 576 TB/s -> 8 TB/s; NVLink 130 TB/s -> 1.8 TB/s per
#   GPU. Same die as B200: 148 SMs.
# - B300 (HGX B300, Blackwell Ultra): NVIDIA technical blog "Inside NVIDIA Blackwell
#   Ultra" (160 SMs, 288 GB HBM3e, 8 TB/s, 15 PFLOP/s dense NVFP4 for the GB300 part);
#   dense BF16 2,250 and FP8 4,500 TFLOP/s for the HGX part (Verda's GB300 NVL72 post,
#   glennklockwood.com/garden/processors/B300 agree).
# - GB300 (the NVL72's B300): nvidia.com GB300 NVL72 rack figures over 72 GPUs, sparsity
#   halved: BF16 360 PFLOP/s -> 2,500, FP8 720 -> 5,000 (Verda: 2.5 / 5 PFLOP/s dense
#   per GPU); 279 GB HBM3e per GPU as the rack's 20 TB gives it (Verda's per-GPU table);
#   8 TB/s; 160 SMs.
# Memory of the Blackwell parts is the datasheet's GB (the H100/H200 rows' GiB differ
# from theirs by under 1 %, but these have not been checked against what CUDA reports).
# Dense FP4 (Blackwell only; nothing in stepsim computes in FP4, the record carries it):
# B200 9,000, GB200 10,000, GB300 15,000 as above; HGX B300 13,125 (glennklockwood.com
# B300's HGX table, "13 PF"; sources differ between 13 and 14 PFLOP/s, docs/reference.md).
# Compute capability (CUDA's list of GPUs, developer.nvidia.com/cuda-gpus): V100 7.0,
# A100 8.0, H100 / H200 / H800 9.0, B200 / GB200 10.0, B300 / GB300 10.3 (sm_103).
#
# Flash attention's exponentials on Blackwell: NVIDIA's "Inside NVIDIA Blackwell Ultra"
# table (copied in Verda's GB300 post) gives the special-function units' EX2 rate,
# 5 TeraExponentials/s on Blackwell and 10.7 on Blackwell Ultra (SFU throughput for
# attention doubled). No per-SM-clock figure is published, so the ratio is the two
# published rates: dense BF16 TFLOP/s over tera-exponentials per second.
_BLACKWELL_EXP_PER_S = {"blackwell": 5.0, "blackwell-ultra": 10.7}  # 10^12 exp/s

GPUS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        _gpu(
            "v100-sxm2-32gb",
            peak_tflops=125.0,
            peak_tflops_fp8=None,
            peak_tflops_fp4=None,
            compute_capability=(7, 0),
            memory_gib=32.0,
            hbm_gbytes_per_s=900.0,
            num_sms=80,
            family="v100",
            fitted=False,
        ),
        _gpu(
            "v100-sxm3-32gb",
            peak_tflops=125.0,
            peak_tflops_fp8=None,
            peak_tflops_fp4=None,
            compute_capability=(7, 0),
            memory_gib=32.0,
            hbm_gbytes_per_s=900.0,
            num_sms=80,
            family="v100",
            fitted=True,
        ),
        _gpu(
            "a100-sxm4-40gb",
            peak_tflops=312.0,
            peak_tflops_fp8=None,
            peak_tflops_fp4=None,
            compute_capability=(8, 0),
            memory_gib=40.0,
            hbm_gbytes_per_s=1555.0,
            num_sms=108,
            family="a100",
            fitted=False,
        ),
        _gpu(
            "a100-sxm4-80gb",
            peak_tflops=312.0,
            peak_tflops_fp8=None,
            peak_tflops_fp4=None,
            compute_capability=(8, 0),
            memory_gib=80.0,
            hbm_gbytes_per_s=2039.0,
            num_sms=108,
            family="a100",
            fitted=True,
        ),
        _gpu(
            "h100-sxm5-80gb",
            peak_tflops=989.4,
            peak_tflops_fp8=1978.9,
            peak_tflops_fp4=None,
            compute_capability=(9, 0),
            memory_gib=80.0,
            hbm_gbytes_per_s=3350.0,
            num_sms=132,
            family="h100",
            fitted=True,
        ),
        _gpu(
            "h200-sxm-141gb",
            peak_tflops=989.4,
            peak_tflops_fp8=1978.9,
            peak_tflops_fp4=None,
            compute_capability=(9, 0),
            memory_gib=140.0,
            hbm_gbytes_per_s=4800.0,
            num_sms=132,
            family="h100",
            fitted=False,
            tables="h200",
        ),
        _gpu(
            "h800-sxm5-80gb",
            peak_tflops=989.4,
            peak_tflops_fp8=1978.9,
            peak_tflops_fp4=None,
            compute_capability=(9, 0),
            memory_gib=80.0,
            hbm_gbytes_per_s=3350.0,
            num_sms=132,
            family="h100",
            fitted=False,
            tables="h800",
        ),
        _gpu(
            "b200-sxm-180gb",
            peak_tflops=2250.0,
            peak_tflops_fp8=4500.0,
            peak_tflops_fp4=9000.0,
            compute_capability=(10, 0),
            memory_gib=180.0,
            hbm_gbytes_per_s=8000.0,
            num_sms=148,
            family="h100",
            fitted=False,
            tables="b200",
            tensor_flops_per_exp=2250.0 / _BLACKWELL_EXP_PER_S["blackwell"],
        ),
        _gpu(
            "gb200",
            peak_tflops=2500.0,
            peak_tflops_fp8=5000.0,
            peak_tflops_fp4=10000.0,
            compute_capability=(10, 0),
            memory_gib=186.0,
            hbm_gbytes_per_s=8000.0,
            num_sms=148,
            family="h100",
            fitted=False,
            tables="gb200",
            tensor_flops_per_exp=2500.0 / _BLACKWELL_EXP_PER_S["blackwell"],
        ),
        _gpu(
            "b300-sxm-288gb",
            peak_tflops=2250.0,
            peak_tflops_fp8=4500.0,
            peak_tflops_fp4=13125.0,
            compute_capability=(10, 3),
            memory_gib=288.0,
            hbm_gbytes_per_s=8000.0,
            num_sms=160,
            family="h100",
            fitted=False,
            tables="b300",
            tensor_flops_per_exp=2250.0 / _BLACKWELL_EXP_PER_S["blackwell-ultra"],
        ),
        _gpu(
            "gb300",
            peak_tflops=2500.0,
            peak_tflops_fp8=5000.0,
            peak_tflops_fp4=15000.0,
            compute_capability=(10, 3),
            memory_gib=279.0,
            hbm_gbytes_per_s=8000.0,
            num_sms=160,
            family="h100",
            fitted=False,
            tables="gb300",
            tensor_flops_per_exp=2500.0 / _BLACKWELL_EXP_PER_S["blackwell-ultra"],
        ),
    )
}

# Latencies (one directed hop). The small-message ring all-reduce on one DGX
# A100 takes 10 us with 2 GPUs and 33.7 us with 8 (nccl-tests issue #123): a
# fit gives ~6 us of fixed cost plus ~2 us per ring step, and one NVLink step is
# two hops (GPU -> NVSwitch -> GPU), hence 1 us a hop and 6 us base. NCCL's
# tuner (src/graph/tuning.cc) charges 2.7-9.6 us per inter-node step; one such
# step here is PCIe + IB + IB + PCIe = 0.5 + 2 + 2 + 0.5 = 5 us.
_LATENCIES = {
    "nvlink_latency_us": 1.0,
    "pcie_latency_us": 0.5,
    "ib_latency_us": 2.0,
    "collective_base_latency_us": 6.0,
}

# What NCCL reaches of the line rate: measured all-reduce bus bandwidth (which a
# ring over the links would make equal to the per-direction link rate) divided by
# that rate; NVIDIA GTC24 talk S62129, copied in docs/reference.md:
# DGX A100 232 GB/s in a node over 300, 192 GB/s between nodes over 8 x 25;
# DGX H100 370 over 450, 380 over 8 x 50; V100 NVLink 2 node 122 over 150;
# one 200/400 Gb/s NIC 24/48 GB/s over 25/50 (used for the V100 nodes' NICs).
_EFFICIENCY = {
    "a100": {"nvlink_efficiency": 232 / 300, "nic_efficiency": 192 / 200},
    "h100": {"nvlink_efficiency": 370 / 450, "nic_efficiency": 380 / 400},
    "v100": {"nvlink_efficiency": 122 / 150, "nic_efficiency": 24 / 25},
}
# Today's nodes, fitted on published collective timings alone (scenarios/validation/
# collectives/, its README.md cites every file; `stepsim validate --kernels` compares
# every row, `stepsim validate --network-fits` runs each fit;
# stepsim.calibration.collectives.COLLECTIVE_FITS; docs/calibration.md, "Network
# constants", has the rows): each row's collective run alone through stepsim's network
# on the node preset, grid 0.30-1.00 by 0.01, least squared relative time error over the
# large rows (groups of 8 GPUs or more, 128 MiB or more of the buffer per rank):
# - DGX B200 NVLink 0.68: OpenXLA's collective table, sm_100_B200, all-gather,
#   reduce-scatter and all-to-all of 8 GPUs at 1 and 2 GiB, the collectives stepsim runs
#   as rings or all-to-alls there (XC71, XC72, XC83, XC84, XC95, XC96; rms 3.0 %).
#   Its all-reduces (NVLS in stepsim) are checks: stepsim is 13-14 % faster than XLA's
#   at 1 and 2 GiB (XC59, XC60) and 3-20 % slower than ml-engineering's NCCL 2.27 sweep
#   of one P6-B200 from 1 to 16 GiB (ML7-ML11).
# - DGX B200 NICs 0.96: ml-engineering's all-reduce over 4 AWS P6-B200 nodes (8 x 400
#   Gb/s EFA each, modelled as the preset's NICs; a ring across nodes, bound by the
#   NICs) at 4, 8 and 16 GiB (ML20-ML22; rms 0.2 %).
# - GB200 NVL72 NVLink 0.75: the same table's sm_100_GB200 rows of those kinds, groups of
#   8 to 72 GPUs (60 rows, XC160-XC316; rms 3.9 %). GB300 NVL72 NVLink 0.74: its sm_103
#   rows (60 rows, XC380-XC536; rms 4.3 %).
# - DGX H200 NVLink 0.80: its only tables are all-reduces by NVLS on one node (NCCL's
#   nvlsEfficiency 0.85, NVLS_EFFICIENCY below, taken as it is): Azure ND H200 v5 (AZ17-
#   AZ20) and ml-engineering (ML29-ML33, ML51-ML55, ML62-ML66; rms 1.2 %).
# The DGX A100, DGX H100 and V100 nodes keep NVIDIA's measured fractions above (the
# sm_90 rows of the same XLA table would give the DGX H100 0.75, Azure's NVLS rows 0.80:
# docs/calibration.md). Not fitted, no table: the DGX H200's and GB200 NVL72's NICs (the
# DGX H100's ConnectX-7 at 400 Gb/s, its 380/400), the GB300 NVL72's ConnectX-8 (800
# Gb/s; the DGX H100's fraction, assumed) and the HGX H800's NVLink and NICs (the DGX
# H100's two fractions, assumed: no H800 collective table).
_ASSUMED_EFFICIENCY = _EFFICIENCY["h100"]
_NIC_H100 = _EFFICIENCY["h100"]["nic_efficiency"]
_FITTED_EFFICIENCY = {
    "dgx-h200": {"nvlink_efficiency": 0.80, "nic_efficiency": _NIC_H100},
    "dgx-b200": {"nvlink_efficiency": 0.68, "nic_efficiency": 0.96},
    "gb200-nvl72": {"nvlink_efficiency": 0.75, "nic_efficiency": _NIC_H100},
    "gb300-nvl72": {"nvlink_efficiency": 0.74, "nic_efficiency": _NIC_H100},
}
_COLLECTIVE_TABLES = "scenarios/validation/collectives/"
# Where these nodes' two fractions came from, for the run summary's "network constants"
# line; the other nodes' are NVIDIA's measured bus bandwidths above.
NETWORK_SOURCES: dict[str, str] = {
    "dgx-h200": "NVLink fit on NVLS all-reduce timings of 8 H200s (Azure, ml-engineering); "
    f"NICs the DGX H100's measured fraction (same ConnectX-7) ({_COLLECTIVE_TABLES})",
    "hgx-h800": "uncalibrated: the DGX H100's NVLink and NIC fractions (no H800 collective "
    "timings)",
    "dgx-b200": "NVLink fit on OpenXLA's B200 collective timings, NICs on all-reduces over 4 "
    f"AWS P6-B200 nodes (ml-engineering) ({_COLLECTIVE_TABLES})",
    "gb200-nvl72": "NVLink fit on OpenXLA's GB200 NVL72 collective timings; NICs the DGX "
    f"H100's measured fraction (same ConnectX-7) ({_COLLECTIVE_TABLES})",
    "gb300-nvl72": "NVLink fit on OpenXLA's sm_103 NVL72 collective timings; NICs "
    f"uncalibrated: the DGX H100's ConnectX-7 fraction ({_COLLECTIVE_TABLES})",
}

# NVLink figures are per GPU and per direction (the datasheets quote both
# directions together: 300 / 600 / 900 GB/s). PCIe: Gen3 x16 ~16 GB/s,
# Gen4 x16 ~32 GB/s, Gen5 x16 ~64 GB/s per direction (nominal).
NODES: dict[str, dict[str, object]] = {
    # DGX A100: 8 x A100 on NVSwitch, 8 x 200 Gb/s HDR InfiniBand for compute.
    "dgx-a100": {
        "gpu": "a100-sxm4-80gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 200.0,
        "nvlink_gbytes_per_s": 300.0,
        "pcie_gbytes_per_s": 32.0,
        **_EFFICIENCY["a100"],
        **_LATENCIES,
    },
    # DGX H100: 8 x H100 SXM5, NVLink 4, 8 x ConnectX-7 NDR 400 Gb/s.
    "dgx-h100": {
        "gpu": "h100-sxm5-80gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 450.0,
        "pcie_gbytes_per_s": 64.0,
        **_EFFICIENCY["h100"],
        **_LATENCIES,
    },
    # DGX H200: as DGX H100 with H200 GPUs. NVLink fraction fitted on its NVLS all-reduce
    # timings, NICs the DGX H100's (_FITTED_EFFICIENCY above).
    "dgx-h200": {
        "gpu": "h200-sxm-141gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 450.0,
        "pcie_gbytes_per_s": 64.0,
        **_FITTED_EFFICIENCY["dgx-h200"],
        **_LATENCIES,
    },
    # H800 node as DeepSeek-V3 trained on it (DeepSeek-AI 2024, arXiv 2412.19437, Sec 3.1
    # and 3.2.2): 8 x H800 on NVLink + NVSwitch, one 400 Gb/s InfiniBand NIC per GPU
    # (50 GB/s); the H800's NVLink is 400 GB/s both directions together: 200 per
    # direction (the paper measures about 160 GB/s of it). NVLink and NIC fractions: the
    # DGX H100's, assumed (no H800 collective timings; NETWORK_SOURCES says so).
    "hgx-h800": {
        "gpu": "h800-sxm5-80gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 200.0,
        "pcie_gbytes_per_s": 64.0,
        **_ASSUMED_EFFICIENCY,
        **_LATENCIES,
    },
    # DGX B200: 8 x B200 on two NVLink 5 NVSwitches (14.4 TB/s aggregate: 1.8 TB/s per
    # GPU, 900 per direction), 8 x ConnectX-7 single-port 400 Gb/s for compute
    # (docs.nvidia.com DGX B200 user guide, hardware overview); PCIe Gen5 (its Xeon 8570s).
    # NVLink and NIC fractions fitted on collective timings (_FITTED_EFFICIENCY above).
    "dgx-b200": {
        "gpu": "b200-sxm-180gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 900.0,
        "pcie_gbytes_per_s": 64.0,
        **_FITTED_EFFICIENCY["dgx-b200"],
        **_LATENCIES,
    },
    # GB200 NVL72: one rack, 72 GPUs in one NVLink domain (9 NVSwitch trays, 130 TB/s:
    # 1.8 TB/s per GPU, 900 per direction) over 18 compute trays of 4 GPUs, each tray
    # with 4 ConnectX-7 400 Gb/s: one NIC per GPU (nvidia.com GB200 NVL72; the MLPerf
    # v6.1 GB200 NVL72 system description lists 4 ConnectX-7 per 4-GPU tray). Modelled
    # as one 72-GPU node: with a NIC per GPU the trays' borders change no link or route
    # (topologies.node). ConnectX-7 is PCIe Gen5 x16. NVLink fraction fitted on the NVL72's
    # collective timings, NICs the DGX H100's (_FITTED_EFFICIENCY above).
    "gb200-nvl72": {
        "gpu": "gb200",
        "gpus_per_node": 72,
        "nics_per_node": 72,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 900.0,
        "pcie_gbytes_per_s": 64.0,
        **_FITTED_EFFICIENCY["gb200-nvl72"],
        **_LATENCIES,
    },
    # GB300 NVL72: the same rack with B300 GPUs; each compute tray has 4 ConnectX-8
    # (800 Gb/s) for the compute network, one per GPU (docs.nvidia.com Enterprise RA,
    # "NVL72 AI factory" components; nvidia.com GB300 NVL72 lists 72 ConnectX-8).
    # Each B300 reaches its ConnectX-8 over PCIe Gen6 x16 (NVIDIA's Hot Chips 2025
    # ConnectX-8 talk, as ServeTheHome reported it): 128 GB/s per direction, nominal.
    # NVLink fraction fitted on sm_103 NVL72 collective timings; NICs the DGX H100's
    # fraction, assumed (_FITTED_EFFICIENCY above).
    "gb300-nvl72": {
        "gpu": "gb300",
        "gpus_per_node": 72,
        "nics_per_node": 72,
        "nic_gbps": 800.0,
        "nvlink_gbytes_per_s": 900.0,
        "pcie_gbytes_per_s": 128.0,
        **_FITTED_EFFICIENCY["gb300-nvl72"],
        **_LATENCIES,
    },
    # Jean Zay V100 node (BigScience): 4 x V100 SXM2 32 GB, 400 Gb/s theoretical
    # between nodes (bigscience-workshop/bigscience, experiments/README.md). The
    # source gives the node total only, so it is one 400 Gb/s pipe here. The
    # four GPUs are all-to-all on NVLink 2: 6 lanes of 25 GB/s per direction per
    # GPU, two lanes to each peer (150 GB/s per GPU, 50 GB/s per pair).
    "v100x4": {
        "gpu": "v100-sxm2-32gb",
        "gpus_per_node": 4,
        "nics_per_node": 1,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 150.0,
        "nvlink_topology": "all-to-all",
        "pcie_gbytes_per_s": 16.0,
        **_EFFICIENCY["v100"],
        **_LATENCIES,
    },
    # DGX-2: 16 x V100 SXM3 32 GB on NVSwitch (300 GB/s per GPU, both directions
    # together: 150 per direction), 8 x 100 Gb/s InfiniBand adapters (100 GB/s per
    # server); ../shared/reference/hardware.md (Shoeybi et al. 2019, Sec 5; the
    # Megatron-LM README's DGX-2 table). NVLink and NIC efficiencies: the V100's.
    "dgx-2": {
        "gpu": "v100-sxm3-32gb",
        "gpus_per_node": 16,
        "nics_per_node": 8,
        "nic_gbps": 100.0,
        "nvlink_gbytes_per_s": 150.0,
        "nvlink_topology": "nvswitch",
        "pcie_gbytes_per_s": 16.0,
        **_EFFICIENCY["v100"],
        **_LATENCIES,
    },
    # DGX-1 with V100: 8 x V100 SXM2 in the NVLink hybrid cube-mesh (6 lanes of
    # 25 GB/s per direction per GPU), 4 x 100 Gb/s EDR InfiniBand (NVIDIA DGX-1
    # with Tesla V100 system architecture white paper).
    "dgx-1-v100": {
        "gpu": "v100-sxm2-32gb",
        "gpus_per_node": 8,
        "nics_per_node": 4,
        "nic_gbps": 100.0,
        "nvlink_gbytes_per_s": 150.0,
        "nvlink_topology": "hybrid-cube-mesh",
        "pcie_gbytes_per_s": 16.0,
        **_EFFICIENCY["v100"],
        **_LATENCIES,
    },
}

# NVLink SHARP (NVLS): the NVSwitch reduces and multicasts (multimem.ld_reduce / st) on
# NVSwitch generation 3 and later (NVIDIA's Hopper architecture white paper: third-gen
# NVSwitch with SHARP; NCCL 2.17+'s NVLS algorithm, src/transport/nvls.cc). What it
# reaches of the NVLink rate is NCCL's own `nvlsEfficiency` (src/graph/tuning.cc, 2.28:
# Hopper 0.85, Blackwell 0.74), the factor its tuner puts on NVLS's intra-node bandwidth.
# Kept out of the NODES records so that their resolved scenarios stay as they were
# (`cluster.nvls_efficiency` overrides it; ClusterSpec.nvls_fraction reads both). The
# HGX H800 has the H100's third-gen NVSwitch (fewer NVLinks per GPU): assumed capable.
# DGX A100 (NVSwitch gen 2), DGX-2 and the V100 meshes have no NVLS.
NVLS_EFFICIENCY: dict[str, float] = {
    "dgx-h100": 0.85,
    "dgx-h200": 0.85,
    "hgx-h800": 0.85,
    "dgx-b200": 0.74,
    "gb200-nvl72": 0.74,
    "gb300-nvl72": 0.74,
}

# A GPU's own link to host memory where it has one besides PCIe: NVLink-C2C between each
# Blackwell GPU and its Grace CPU on the Grace Blackwell superchip (Transformer Engine's
# CPU offloading guide, docs/features/other_optimizations/cpu_offloading/
# cpu_offloading.rst: "900 GB/s per NVLink-C2C link", both directions, NVIDIA/
# TransformerEngine at d0067d0). A copy reaches less: nvbandwidth on an ND GB200 v6 VM
# measured 201 GB/s host to device and 193 device to host (Azure/AI-benchmarking-guide,
# Azure_Results/ND_GB200_v6_results.md at fa799957; ../shared/reference/kernels/
# azure_microbench_misc.csv), so the link runs at their mean, 197 per direction. (The
# same tool measured 51-52 GB/s over an ND H100 v5's PCIe, 0.8 of its Gen5 x16 64.) The
# GB300 NVL72's Grace Blackwell Ultra superchip is taken to have the same (assumed, no
# measurement read). Activation offloading (emit/offload.py) copies over it; the other
# nodes' GPUs reach host memory over their PCIe link (`pcie_gbytes_per_s`), which their
# NIC traffic shares. Kept out of the NODES records, as NVLS_EFFICIENCY, so that their
# resolved scenarios stay as they were (`cluster.host_link_gbytes_per_s` overrides it).
HOST_LINK_GBYTES_PER_S: dict[str, float] = {
    "gb200-nvl72": (201.0 + 193.0) / 2,
    "gb300-nvl72": (201.0 + 193.0) / 2,
}

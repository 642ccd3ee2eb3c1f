"""Named GPUs, nodes and models that scenario files can refer to.

Every number carries its source. Hardware figures are vendor datasheet values
(copied from the project's reference notes, docs/reference.md); latencies are
derived from published NCCL measurements as explained next to them.
"""

from __future__ import annotations

from .spec import GpuSpec, KernelConstants

# Kernel constants: the only numbers of the compute model that are not shapes or
# datasheet values (simulator.workload.compute explains each).
#
# num_sms: the datasheets (V100 80, A100 108, H100 SXM5 132, H200 132).
# tile_m x tile_n: the output tile of the fp16 tensor-core GEMM kernels cuBLAS
#   picks for large transformer shapes on Volta..Hopper (256 x 128; CUTLASS's
#   largest default threadblock tile).
# gemm_efficiency, gemm_k_half, memory_efficiency: fitted once for the A100 on
#   the calibration set (Narayanan et al. 2021 Table 1 and Korthikanti et al.
#   2022 Table 4, both measured on DGX A100 80 GB), by benchmarks/calibrate.py,
#   one set for all rows; docs/validation.md shows the fit and what remains.
#   The other GPUs carry the A100's fractions over: uncalibrated until someone
#   measures them (benchmarks/measure_kernels.py writes a file for --calibration).
_A100_FIT = {"gemm_efficiency": 0.70, "gemm_k_half": 0.0, "memory_efficiency": 0.80}
_SOURCE_FIT = "fit on the A100 calibration set (benchmarks/calibrate.py)"
_SOURCE_CARRIED = (
    "A100 fractions carried over, uncalibrated (measure: benchmarks/measure_kernels.py)"
)
CALIBRATED_GPU = "a100-sxm4-80gb"  # the GPU benchmarks/calibrate.py fits the fractions on


def _gpu(
    name: str,
    *,
    peak_tflops: float,
    peak_tflops_fp8: float | None,
    memory_gib: float,
    hbm_gbytes_per_s: float,
    num_sms: int,
    source: str,
) -> GpuSpec:
    """A GPU record whose kernel constants are the 256 x 128 tile and the A100's
    fitted fractions, with the GPU's own SM count."""
    kernels = KernelConstants(
        gpu=name, num_sms=num_sms, tile_m=256, tile_n=128, source=source, **_A100_FIT
    )
    return GpuSpec(
        name=name,
        peak_tflops=peak_tflops,
        peak_tflops_fp8=peak_tflops_fp8,
        memory_gib=memory_gib,
        hbm_gbytes_per_s=hbm_gbytes_per_s,
        kernels=kernels,
    )


# Dense FP16/BF16 tensor peak, memory and HBM bandwidth: NVIDIA datasheets for
# V100, A100 and H100 and the H200 product brief. Memory is what CUDA reports
# (rounded GiB), which is what a training run can use. V100 has no BF16: its
# peak is FP16. Dense FP8 (Hopper only): the H100 datasheet's 3,958 TFLOP/s
# with sparsity, halved (1978.9 dense in the H100 architecture white paper); the
# H200 brief quotes the same 3,958. V100 and A100 have no FP8 tensor cores.
GPUS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        _gpu(
            "v100-sxm2-32gb",
            peak_tflops=125.0,
            peak_tflops_fp8=None,
            memory_gib=32.0,
            hbm_gbytes_per_s=900.0,
            num_sms=80,
            source=_SOURCE_CARRIED,
        ),
        _gpu(
            "a100-sxm4-40gb",
            peak_tflops=312.0,
            peak_tflops_fp8=None,
            memory_gib=40.0,
            hbm_gbytes_per_s=1555.0,
            num_sms=108,
            source=_SOURCE_FIT,
        ),
        _gpu(
            "a100-sxm4-80gb",
            peak_tflops=312.0,
            peak_tflops_fp8=None,
            memory_gib=80.0,
            hbm_gbytes_per_s=2039.0,
            num_sms=108,
            source=_SOURCE_FIT,
        ),
        _gpu(
            "h100-sxm5-80gb",
            peak_tflops=989.4,
            peak_tflops_fp8=1978.9,
            memory_gib=80.0,
            hbm_gbytes_per_s=3350.0,
            num_sms=132,
            source=_SOURCE_CARRIED,
        ),
        _gpu(
            "h200-sxm-141gb",
            peak_tflops=989.4,
            peak_tflops_fp8=1978.9,
            memory_gib=140.0,
            hbm_gbytes_per_s=4800.0,
            num_sms=132,
            source=_SOURCE_CARRIED,
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
    # DGX H200: as DGX H100 with H200 GPUs.
    "dgx-h200": {
        "gpu": "h200-sxm-141gb",
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nic_gbps": 400.0,
        "nvlink_gbytes_per_s": 450.0,
        "pcie_gbytes_per_s": 64.0,
        **_EFFICIENCY["h100"],
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

# Model shapes. GPT-3 175B: Brown et al. 2020, Table 2.1 (vocabulary padded to
# 51200 as Megatron-LM does). MT-NLG 530B: Smith et al. 2022, Sec 3.
MODELS: dict[str, dict[str, int]] = {
    "gpt3-175b": {
        "num_layers": 96,
        "hidden_size": 12288,
        "num_attention_heads": 96,
        "seq_length": 2048,
        "vocab_size": 51200,
    },
    "mt-nlg-530b": {
        "num_layers": 105,
        "hidden_size": 20480,
        "num_attention_heads": 128,
        "seq_length": 2048,
        "vocab_size": 50272,
    },
}

# Model families for `stepsim plan fit`: (name, layers, hidden, heads), smallest first;
# the feed-forward width is 4 x hidden, sequence 2048 and vocabulary 51200 in both.
# "gpt3": Brown et al. 2020 (arXiv 2005.14165) Table 2.1. Two rows do not multiply
# out: XL (1.3B) prints 24 heads of 128 for d_model 2048, and 13B prints d_model 5140
# for 40 heads of 128. Kept here: the head size 128 (16 heads for XL) and d_model 5120.
# "megatron": Narayanan et al. 2021 (arXiv 2104.04473) Table 1, the weak-scaling
# models 1.7B to 1T (the same rows as scenarios/validation/megatron_2021_table1.csv).
MODEL_FAMILIES: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    "gpt3": (
        ("gpt3-125m", 12, 768, 12),
        ("gpt3-350m", 24, 1024, 16),
        ("gpt3-760m", 24, 1536, 16),
        ("gpt3-1.3b", 24, 2048, 16),
        ("gpt3-2.7b", 32, 2560, 32),
        ("gpt3-6.7b", 32, 4096, 32),
        ("gpt3-13b", 40, 5120, 40),
        ("gpt3-175b", 96, 12288, 96),
    ),
    "megatron": (
        ("gpt-1.7b", 24, 2304, 24),
        ("gpt-3.6b", 30, 3072, 32),
        ("gpt-7.5b", 36, 4096, 32),
        ("gpt-18.4b", 40, 6144, 48),
        ("gpt-39.1b", 48, 8192, 64),
        ("gpt-76.1b", 60, 10240, 80),
        ("gpt-145.6b", 80, 12288, 96),
        ("gpt-310.1b", 96, 16384, 128),
        ("gpt-529.6b", 105, 20480, 128),
        ("gpt-1008b", 128, 25600, 160),
    ),
}
FAMILY_SEQ_LENGTH = 2048
FAMILY_VOCAB_SIZE = 51200

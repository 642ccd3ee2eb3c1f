"""One GPU's record (`GpuSpec`) and the compute model's constants it carries
(`KernelConstants`, `Fp8KernelConstants` for its FP8 GEMMs and
`AttentionKernelConstants` for its flash-attention kernels), each checked when built.
The records themselves, with their sources, are in hardware.py."""

from __future__ import annotations

from dataclasses import dataclass

from . import precision
from .errors import ScenarioError

# What kernel constants may be, in Python as in a calibration file (files.py).
KERNEL_CONSTANT_RANGES: dict[str, tuple[float, float]] = {
    "num_sms": (1, 10_000),
    "tile_m": (1, 4096),
    "tile_n": (1, 4096),
    "gemm_efficiency": (0.01, 1.0),
    "gemm_k_half": (0.0, 1e6),
    "memory_efficiency": (0.01, 1.0),
}


def check_kernel_constants(constants: KernelConstants) -> None:
    """Each constant a number in its range (a calibration file's values are checked
    against the same ranges when read, with the file named)."""
    for name, (low, high) in KERNEL_CONSTANT_RANGES.items():
        value = getattr(constants, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(key=f"calibration.{name}", value=value, rule="must be a number")
        if not low <= value <= high:
            raise ScenarioError(
                key=f"calibration.{name}", value=value, rule=f"must be between {low:g} and {high:g}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelConstants:
    """What the compute model needs to know about a GPU beyond its datasheet
    (simulator.workload.compute explains each). Every GpuSpec carries its own; a
    calibration file (``--calibration``) holds one set, measured on a real GPU."""

    gpu: str
    num_sms: int
    tile_m: int  # output tile of the GEMM kernels, rows x columns
    tile_n: int
    gemm_efficiency: float  # fraction of the tensor peak a large, well-shaped GEMM reaches
    gemm_k_half: float  # inner dimension at which a GEMM reaches half of that
    memory_efficiency: float  # fraction of the HBM bandwidth element-wise kernels stream at
    source: str  # where the numbers came from: fitted, measured, or uncalibrated

    def __post_init__(self) -> None:
        check_kernel_constants(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8KernelConstants:
    """The FP8 GEMMs' own constants (simulator.workload.precision): fractions of the
    dense FP8 peak a large, well-shaped FP8 GEMM reaches with Hopper's split
    (two-level) accumulation, which Transformer Engine uses for dgrad and wgrad, and
    with fast accumulation, its default for the forward (fprop) GEMMs; and the inner
    dimension at which an FP8 GEMM reaches half of that. Tile, SM count and the wave
    model are the GPU's KernelConstants'."""

    gemm_efficiency: float
    fast_accum_gemm_efficiency: float
    gemm_k_half: float
    source: str  # kernel measurements, or uncalibrated and from where

    def __post_init__(self) -> None:
        precision.check_fp8_kernel_constants(self)


# What attention kernel constants may be (cost.attention explains each).
ATTENTION_CONSTANT_RANGES: dict[str, tuple[float, float]] = {
    "forward_efficiency": (0.01, 1.0),
    "backward_efficiency": (0.01, 1.0),
    "kv_half": (0.0, 1e6),
    "exp_exposed": (0.0, 1.0),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKernelConstants:
    """The flash-attention kernels' own constants (cost.attention): the fractions of the
    16-bit tensor peak their matmuls run at, forward and backward; the length of the
    loop a thread block runs (keys per query row forward, queries per key backward) at
    which that rate halves: a fixed cost per block of rows (loading Q, writing O, the
    final rescale), worth ``kv_half`` keys; and the share of the exponentials' time on
    the special-function units that the matmuls do not hide (1: none hidden, as in
    FlashAttention-2; 0: all). Fitted on attention kernel timings alone, not on the
    GEMMs'."""

    forward_efficiency: float
    backward_efficiency: float
    kv_half: float
    exp_exposed: float
    source: str  # the kernel timings they were fitted on, or where they were borrowed from

    def __post_init__(self) -> None:
        for name, (low, high) in ATTENTION_CONSTANT_RANGES.items():
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not low <= value <= high:
                raise ScenarioError(
                    key=f"attention_kernels.{name}",
                    value=value,
                    rule=f"must be between {low:g} and {high:g}",
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU: everything stepsim needs of it in one record, so that a GPU preset
    cannot lack a number (tests/test_presets.py checks every one is complete).

    The SM count and the provenance of the kernel constants live in ``kernels`` (a
    calibration file carries them too, for the GPU it was measured on) and are read
    here through ``num_sms`` and ``kernel_provenance``."""

    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core peak (FP16 on GPUs without BF16)
    peak_tflops_fp8: float | None  # dense FP8 tensor-core peak; None: no FP8 tensor cores
    peak_tflops_fp4: float | None  # dense FP4 tensor-core peak; None: no FP4 tensor cores
    # CUDA compute capability (major, minor): which FP8 recipes Transformer Engine runs
    # and which GEMM layouts FP8 takes (simulator.scenario.precision)
    compute_capability: tuple[int, int]
    memory_gib: float
    hbm_gbytes_per_s: float
    # tensor-core FLOPs an SM does in the time its special-function units do one
    # exponential: what flash attention's softmax costs in matmul time (cost.attention)
    tensor_flops_per_exp: float
    kernels: KernelConstants  # the compute model's constants for this GPU (gpu == name)
    fp8_kernels: Fp8KernelConstants | None  # FP8 GEMMs' constants; None without FP8
    # flash attention's constants; None: its matmuls at the score GEMM's efficiency (the
    # GEMM constants' curve, a mechanism estimate: GPUs with no attention timings)
    attention_kernels: AttentionKernelConstants | None = None

    @property
    def num_sms(self) -> int:
        return self.kernels.num_sms

    @property
    def kernel_provenance(self) -> str:
        """How the kernel constants were obtained: fitted, or uncalibrated and from where."""
        return self.kernels.source

"""What a kernel costs, as data, and the GEMM curve every kernel model builds on.

`Work` is a kernel's (or a sum of kernels') duration and FLOPs; `Kernel` names one
kernel of a layer's pass (its block, its part: forward, input or weight gradient).
`gemm_efficiency` is the fraction of the tensor peak an m x n x k GEMM reaches on a
GPU's kernel constants (tiles, waves, split-K; docs/design.md "Compute model and
calibration") and `gemm_seconds` a GEMM's time, the slower of its FLOPs and its bytes.
The kernel models (compute.py, attention.py, mla.py, fp8.py, routing.py, context.py,
moe.py) build on these; this module imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..ir.units import gbytes_per_s_to_bytes_per_s, tflops_to_flops_per_s
from ..scenario import GpuSpec, KernelConstants

BYTES_PER_ELEMENT = 2  # fp16 / bf16 activations and weights


MASK_BYTES = 1  # a dropout mask element (Megatron-LM keeps it as bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """Time and FLOPs of one kernel sequence on one GPU."""

    duration_s: float
    flops: float

    def __add__(self, other: Work) -> Work:
        return Work(duration_s=self.duration_s + other.duration_s, flops=self.flops + other.flops)

    def __sub__(self, other: Work) -> Work:
        return Work(duration_s=self.duration_s - other.duration_s, flops=self.flops - other.flops)

    def scaled(self, factor: float) -> Work:
        return Work(duration_s=self.duration_s * factor, flops=self.flops * factor)


ZERO = Work(duration_s=0.0, flops=0.0)


class Kernel(NamedTuple):
    """One kernel of a layer: which block and pass it belongs to, and its work.

    ``part`` is "forward", "input" (backward, input gradient: B) or "weight"
    (backward, weight gradient: W); ``core`` marks the attention core, which
    selective recomputation repeats."""

    block: str  # "attention" or "mlp"
    part: str
    name: str
    work: Work
    core: bool = False


# a linear layer's kernels: (forward, input gradient, weight gradient)
LinearKernels = tuple[list[Kernel], list[Kernel], list[Kernel]]


def gemm_efficiency(c: KernelConstants, m: float, n: float, k: float, batch: float = 1) -> float:
    """Fraction of the tensor peak a (batched) m x n x k GEMM reaches.

    Tiles that overhang the matrix compute padding; the last wave of tiles may leave
    SMs idle; each tile pays a fixed cost worth ``gemm_k_half`` of inner dimension.
    When there are too few tiles to fill the GPU the inner dimension is split across
    SMs (cuBLAS's split-K) as far as that helps: more tiles, each with a shorter k."""
    tiles_m, tiles_n = math.ceil(m / c.tile_m), math.ceil(n / c.tile_n)
    tile = (m * n) / (tiles_m * c.tile_m * tiles_n * c.tile_n)
    tiles = batch * tiles_m * tiles_n
    best = 0.0
    # int(): a batch given as a float (attention's heads per rank) makes tiles a float
    for splits in range(1, max(1, min(int(c.num_sms // tiles), int(k) // 16)) + 1):
        total = tiles * splits
        wave = total / (math.ceil(total / c.num_sms) * c.num_sms)
        depth = k / splits
        best = max(best, wave * depth / (depth + c.gemm_k_half))
    return c.gemm_efficiency * tile * best


def gemm_seconds(
    gpu: GpuSpec,
    c: KernelConstants,
    m: float,
    n: float,
    k: float,
    batch: int = 1,
    extra_bytes: float = 0.0,
    *,
    peak_tflops: float | None = None,
    input_bytes: float | None = None,
) -> float:
    """An m x k by k x n GEMM (``batch`` of them): the slower of its FLOPs at the
    shape's efficiency and its operands' bytes (plus ``extra_bytes``, an epilogue's)
    at the HBM streaming rate. ``peak_tflops`` and ``input_bytes`` (per element of the
    two inputs; the output stays 16-bit) are an FP8 GEMM's (cost.fp8); the
    defaults are the GPU's 16-bit peak and 2 bytes."""
    flops = 2.0 * batch * m * n * k
    peak = gpu.peak_tflops if peak_tflops is None else peak_tflops
    compute_s = flops / (tflops_to_flops_per_s(peak) * gemm_efficiency(c, m, n, k, batch))
    stream_bytes_per_s = gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * c.memory_efficiency
    if input_bytes is None:
        memory_bytes = BYTES_PER_ELEMENT * batch * (m * k + k * n + m * n) + extra_bytes
    else:
        memory_bytes = batch * (input_bytes * (m * k + k * n) + BYTES_PER_ELEMENT * m * n)
        memory_bytes += extra_bytes
    return max(compute_s, memory_bytes / stream_bytes_per_s)


def stream_seconds(gpu: GpuSpec, c: KernelConstants, num_bytes: float) -> float:
    """A memory-bound (element-wise) kernel moving ``num_bytes`` (read + written) at the
    HBM bandwidth x ``memory_efficiency``: compute.ComputeModel.memory_bound's time."""
    return num_bytes / (gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s) * c.memory_efficiency)

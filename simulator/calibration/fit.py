"""Kernel constants from kernel timings on a real GPU (benchmarks/measure_kernels.py).

The measurement script times GEMMs of transformer shapes and large element-wise
kernels, then calls ``fit_constants``: the memory efficiency is the median of
bytes / (time x HBM bandwidth); gemm_efficiency and gemm_k_half are the pair,
on a grid, whose GEMM model (compute.gemm_seconds, with the measured GPU's SM
count and the tile size of the GPU's record) has the least mean squared relative
error over the timed GEMMs. ``calibration_toml`` writes what the loader's
``read_calibration`` reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

from ..cost.kernels import gemm_seconds
from ..ir.units import gbytes_per_s_to_bytes_per_s
from ..scenario import GpuSpec, KernelConstants


class GemmTiming(NamedTuple):
    m: int
    n: int
    k: int
    batch: int
    seconds: float


class MemoryTiming(NamedTuple):
    bytes: float  # read + written
    seconds: float


def gemm_shapes(hidden_sizes: Sequence[int] = (2048, 4096, 8192, 12288)) -> list[tuple]:
    """(m, n, k, batch) of a GPT layer's GEMMs at TP 1 and 8, tokens 2048 and 8192,
    plus the attention core's batched GEMMs (head dimension 64 and 128)."""
    shapes = []
    for h, t, tokens in itertools.product(hidden_sizes, (1, 8), (2048, 8192)):
        shapes += [
            (tokens, 3 * h // t, h, 1),  # QKV
            (tokens, h, h // t, 1),  # output projection
            (tokens, 4 * h // t, h, 1),  # fc1
            (tokens, h, 4 * h // t, 1),  # fc2
            (h, 4 * h // t, tokens, 1),  # a weight gradient
        ]
    for head, heads in ((64, 32), (128, 16), (128, 64)):
        shapes += [(2048, 2048, head, heads), (2048, head, 2048, heads)]
    return sorted(set(shapes))


def fit_constants(
    gpu: GpuSpec,
    num_sms: int,
    gemms: Sequence[GemmTiming],
    memory: Sequence[MemoryTiming],
    source: str,
) -> KernelConstants:
    """The GPU record's kernel constants refitted to the timings (``num_sms``: the
    measured device's, which may differ from the preset's)."""
    if not gemms or not memory:
        raise ValueError("fit_constants needs GEMM and element-wise timings")
    hbm = gbytes_per_s_to_bytes_per_s(gpu.hbm_gbytes_per_s)
    rates = sorted(t.bytes / (t.seconds * hbm) for t in memory)
    # four decimals: a kernel timing carries no more, and the float division's last bit
    # would otherwise differ from the same fraction written by hand
    memory_efficiency = round(min(1.0, rates[len(rates) // 2]), 4)

    def candidate(e: float, k_half: float) -> KernelConstants:
        return replace(
            gpu.kernels,
            num_sms=num_sms,
            gemm_efficiency=e,
            gemm_k_half=k_half,
            memory_efficiency=memory_efficiency,
            source=source,
        )

    def loss(c: KernelConstants) -> float:
        return sum(
            (gemm_seconds(gpu, c, g.m, g.n, g.k, g.batch) / g.seconds - 1) ** 2 for g in gemms
        )

    grid = itertools.product(
        [x / 100 for x in range(30, 101)], [float(x) for x in range(0, 257, 8)]
    )
    return min((candidate(e, k) for e, k in grid), key=loss)


def calibration_toml(
    c: KernelConstants, gemms: Sequence[GemmTiming], memory: Sequence[MemoryTiming]
) -> str:
    """The calibration file: the constants, then the timings they were fitted to."""
    lines = [
        "# Kernel constants for stepsim (stepsim run SCENARIO --calibration THIS_FILE).",
        "# Written by benchmarks/measure_kernels.py; see simulator/calibration/fit.py.",
        "[constants]",
        f'gpu = "{c.gpu}"',
        f"num_sms = {c.num_sms}",
        f"tile_m = {c.tile_m}",
        f"tile_n = {c.tile_n}",
        f"gemm_efficiency = {c.gemm_efficiency!r}",
        f"gemm_k_half = {c.gemm_k_half!r}",
        f"memory_efficiency = {c.memory_efficiency!r}",
        f'source = "{c.source}"',
    ]
    for g in gemms:
        lines += ["", "[[gemm]]", f"m = {g.m}", f"n = {g.n}", f"k = {g.k}", f"batch = {g.batch}"]
        lines.append(f"seconds = {g.seconds!r}")
    for t in memory:
        lines += ["", "[[memory]]", f"bytes = {t.bytes!r}", f"seconds = {t.seconds!r}"]
    return "\n".join(lines) + "\n"

"""Kernel-level validation and fits: stepsim's kernel models against published kernel
micro-benchmarks, row by row, and the few constants fitted on them.

The tables are copied into scenarios/validation/kernels/ (its README.md cites each file,
its source commit and its caveats); the file layer reads them
(``scenario.files.read_kernel_tables``), this module reads no file. Every row becomes a
``KernelRow``: the published time of one kernel on one GPU and a function that gives
stepsim's time for that exact kernel on a GPU record, with the project's own cost
functions (``cost.kernels.gemm_seconds`` for GEMMs, ``cost.fp8.fp8_gemm_seconds`` for
FP8 GEMMs, ``cost.attention.flash_seconds`` for flash attention forward and backward,
``cost.kernels.stream_seconds`` for the memory-bound normalizations and STREAM). The
published time is the table's own (CUDA-event or profiler time), or its FLOPs (or
bytes) by the table's own convention over its TFLOP/s (or GB/s) where that column
carries more digits; each section says which.

Rows are grouped into ``Section``s (one table, one GPU, one kernel): each says where its
rows come from (vendor, third party, a secondary transcription, read from a plot) and
what it is for: ``fit`` (a constant of that GPU's record was fitted on its rows marked
``fitted``), ``check`` (a row the constants were not fitted on) or ``other kernel`` (a
kernel stepsim does not model as such, e.g. FlashAttention-2 where the H100's attention
constants are cuDNN's: shown for scale).

The fits (``fit_gemm``, ``fit_fp8_gemm``, ``fit_memory``, ``fit_attention``) are grid
searches for the least sum of squared relative time errors over a section's fitted rows,
as ``calibration.fit.fit_constants`` does for a GPU's own timings;
benchmarks/calibrate.py --kernels runs them (``KERNEL_FITS``) and prints what each gives
beside what scenario/hardware.py carries.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

from ..cost.attention import causal_fraction, flash_seconds
from ..cost.fp8 import fp8_gemm_seconds
from ..cost.kernels import gemm_seconds, stream_seconds
from ..scenario import GpuSpec
from ..scenario.gpu import AttentionKernelConstants

Row = Mapping[str, str]

# GEMMs and norms shorter than this are left out of the fits: a kernel launch and its
# tail (a few microseconds) that no kernel model here has weigh more than a tenth of
# them, and the norm tables' times carry a microsecond's resolution. Shown all the same.
MIN_FIT_SECONDS = 20e-6

H100, H200, H800 = "h100-sxm5-80gb", "h200-sxm-141gb", "h800-sxm5-80gb"
B200, GB200, GB300 = "b200-sxm-180gb", "gb200", "gb300"

FIT, CHECK, OTHER = "fit", "check", "other kernel"


class Section(NamedTuple):
    """One table's rows of one kernel on one GPU."""

    key: str
    title: str
    gpu: str  # the preset the rows are simulated on
    source: str  # the table (scenarios/validation/kernels/README.md cites it in full)
    kind: str  # vendor / third party / secondary, and "read from a plot"
    role: str  # FIT, CHECK or OTHER
    what: str  # what the rows fit or check

    @property
    def label(self) -> str:
        """The kind in a word or two: vendor, third party or secondary; "plot" when read
        from a plot."""
        who = "secondary" if "secondary" in self.kind else self.kind.split(" (")[0].split(";")[0]
        return who + (", plot" if "plot" in self.kind else "")


SECTIONS: dict[str, Section] = {
    s.key: s
    for s in (
        Section(
            "xla-h100-bf16",
            "XLA matmul, sm_90, BF16",
            H100,
            "xla_matmul_sm90_b200.csv",
            "vendor (Google); SKU not stated (sm_90)",
            CHECK,
            "the H100's GEMM constants (measured on a real H100, benchmarks/measured/)",
        ),
        Section(
            "xla-b200-bf16",
            "XLA matmul, B200, BF16",
            B200,
            "xla_matmul_sm90_b200.csv",
            "vendor (Google)",
            FIT,
            "B200 gemm_efficiency, gemm_k_half (rows of 20 us or more)",
        ),
        Section(
            "xla-b200-fp8",
            "XLA matmul, B200, FP8 e4m3 -> bf16",
            B200,
            "xla_matmul_sm90_b200.csv",
            "vendor (Google)",
            FIT,
            "B200 FP8 gemm_efficiency, gemm_k_half (rows of 20 us or more)",
        ),
        Section(
            "cublaslt-h100-fp8",
            "Azure cuBLASLt FP8, ND H100 v5",
            H100,
            "azure_cublaslt_fp8.csv",
            "third party (Microsoft)",
            CHECK,
            "the H100's FP8 constants (split accumulation)",
        ),
        Section(
            "cublaslt-h200-fp8",
            "Azure cuBLASLt FP8, ND H200 v5",
            H200,
            "azure_cublaslt_fp8.csv",
            "third party (Microsoft)",
            CHECK,
            "the H200's FP8 constants (the H100's, same die)",
        ),
        Section(
            "cublaslt-gb200-fp8",
            "Azure cuBLASLt FP8, ND GB200 v6",
            GB200,
            "azure_cublaslt_fp8.csv",
            "third party (Microsoft)",
            CHECK,
            "the GB200's FP8 constants (the B200's fit, same die)",
        ),
        Section(
            "deepgemm-h800-fp8",
            "DeepGEMM FP8 dense (block scaled), H800",
            H800,
            "deepgemm_h800_fp8_dense.csv",
            "vendor (DeepSeek)",
            CHECK,
            "the H800's FP8 constants (the H100's, same die; split accumulation)",
        ),
        Section(
            "fa3-h100-cudnn-fwd",
            "FA3 paper Fig. 5: cuDNN 9.1 fwd",
            H100,
            "fa3_h100_fwd_fig5.csv",
            "vendor (Dao-AILab), read from a plot",
            FIT,
            "H100 attention forward_efficiency, kv_half (head dim 128 rows)",
        ),
        Section(
            "fa3-h100-cudnn-bwd",
            "FA3 paper Fig. 6: cuDNN 9.1 bwd",
            H100,
            "fa3_h100_bwd_SECONDARY.csv",
            "secondary transcription of a plot; non-causal inferred",
            FIT,
            "H100 attention backward_efficiency, kv_half (head dim 128 rows)",
        ),
        Section(
            "fa3-h100-fa3-fwd",
            "FA3 paper Fig. 5: FA3 fwd",
            H100,
            "fa3_h100_fwd_fig5.csv",
            "vendor (Dao-AILab), read from a plot",
            OTHER,
            "FlashAttention-3 against the H100's cuDNN-fitted attention",
        ),
        Section(
            "fa3-h100-fa3-bwd",
            "FA3 paper Fig. 6: FA3 bwd",
            H100,
            "fa3_h100_bwd_SECONDARY.csv",
            "secondary transcription of a plot; non-causal inferred",
            OTHER,
            "FlashAttention-3 against the H100's cuDNN-fitted attention",
        ),
        Section(
            "fa3-h100-fa2-fwd",
            "FA3 paper Fig. 5: FA2 fwd",
            H100,
            "fa3_h100_fwd_fig5.csv",
            "vendor (Dao-AILab), read from a plot",
            OTHER,
            "FlashAttention-2 against the H100's cuDNN-fitted attention",
        ),
        Section(
            "fa3-h100-fa2-bwd",
            "FA3 paper Fig. 6: FA2 bwd",
            H100,
            "fa3_h100_bwd_SECONDARY.csv",
            "secondary transcription of a plot; non-causal inferred",
            OTHER,
            "FlashAttention-2 against the H100's cuDNN-fitted attention",
        ),
        Section(
            "fa2-h100-fwdbwd",
            "FA2 README: FA2 fwd + bwd",
            H100,
            "fa2_h100_fwdbwd.csv",
            "vendor (Dao-AILab), read from a plot",
            OTHER,
            "FlashAttention-2 against the H100's cuDNN-fitted attention",
        ),
        Section(
            "sdpa-h200",
            "cuDNN 9.19 SDPA training, H200",
            H200,
            "cudnn_sdpa_training.csv",
            "vendor (NVIDIA)",
            FIT,
            "H200 attention constants (llama3.1 rows); dsv3 rows a check",
        ),
        Section(
            "sdpa-gb200",
            "cuDNN 9.22 SDPA training, GB200",
            GB200,
            "cudnn_sdpa_training.csv",
            "vendor (NVIDIA)",
            FIT,
            "GB200 attention constants (llama3.1 rows); the other models a check",
        ),
        Section(
            "sdpa-gb300",
            "cuDNN 9.22 SDPA training, GB300",
            GB300,
            "cudnn_sdpa_training.csv",
            "vendor (NVIDIA)",
            FIT,
            "GB300 attention constants (llama3.1 rows); the other models a check",
        ),
        Section(
            "sdpa913-b200",
            "cuDNN 9.13 SDPA, B200",
            B200,
            "cudnn_sdpa_b200_gb300_cudnn913.csv",
            "vendor (NVIDIA)",
            FIT,
            "B200 attention constants",
        ),
        Section(
            "sdpa913-gb300",
            "cuDNN 9.13 SDPA, GB300",
            GB300,
            "cudnn_sdpa_b200_gb300_cudnn913.csv",
            "vendor (NVIDIA)",
            CHECK,
            "the GB300's attention constants (fitted on cuDNN 9.22)",
        ),
        Section(
            "norms-h200",
            "cuDNN RMSNorm / LayerNorm, H200",
            H200,
            "cudnn_norms.csv",
            "vendor (NVIDIA)",
            FIT,
            "H200 memory_efficiency (rows of 20 us or more)",
        ),
        Section(
            "norms-gb200",
            "cuDNN RMSNorm / LayerNorm, GB200",
            GB200,
            "cudnn_norms.csv",
            "vendor (NVIDIA)",
            FIT,
            "GB200 memory_efficiency (rows of 20 us or more)",
        ),
        Section(
            "norms-gb300",
            "cuDNN RMSNorm / LayerNorm, GB300",
            GB300,
            "cudnn_norms.csv",
            "vendor (NVIDIA)",
            FIT,
            "GB300 memory_efficiency (rows of 20 us or more)",
        ),
        Section(
            "stream-h100",
            "Azure HBM STREAM, ND H100 v5 (per 1 GB)",
            H100,
            "azure_hbm_stream.csv",
            "third party (Microsoft)",
            CHECK,
            "the H100's memory_efficiency (measured on a real H100)",
        ),
        Section(
            "stream-h200",
            "Azure HBM STREAM, ND H200 v5 (per 1 GB)",
            H200,
            "azure_hbm_stream.csv",
            "third party (Microsoft)",
            CHECK,
            "the H200's memory_efficiency (fitted on the cuDNN norms)",
        ),
    )
}


class KernelRow(NamedTuple):
    """One published kernel time and stepsim's model of that kernel."""

    section: str
    id: str
    shape: str  # the kernel's shape, for the tables
    measured_s: float
    simulate: Callable[[GpuSpec], float]  # stepsim's time on a GPU record
    fitted: bool = False  # one of the rows its section's constant was fitted on
    note: str = ""
    backward: bool = False  # an attention backward (fit_attention fits the passes apart)


class KernelComparison(NamedTuple):
    section: str
    id: str
    shape: str
    measured_s: float
    simulated_s: float
    fitted: bool
    note: str

    @property
    def error(self) -> float:
        """Signed relative error of the simulated time."""
        return self.simulated_s / self.measured_s - 1.0


# -- the tables' rows -----------------------------------------------------------------------


def _int(row: Row, key: str) -> int:
    value = float(row[key])
    if value != int(value):
        raise ValueError(f"row {row['id']}: {key}={row[key]!r} is not a whole number")
    return int(value)


def _gemm(m: int, n: int, k: int, batch: int) -> Callable[[GpuSpec], float]:
    return lambda gpu: gemm_seconds(gpu, gpu.kernels, m, n, k, batch)


def _fp8_gemm(m: int, n: int, k: int, batch: int) -> Callable[[GpuSpec], float]:
    return lambda gpu: fp8_gemm_seconds(gpu, gpu.kernels, m, n, k, fast=False, batch=batch)


def _stream(num_bytes: float) -> Callable[[GpuSpec], float]:
    return lambda gpu: stream_seconds(gpu, gpu.kernels, num_bytes)


def _flash(
    heads: int, kv_heads: int, s: int, d_qk: int, d_v: int, causal: bool, backward: bool
) -> Callable[[GpuSpec], float]:
    done = causal_fraction(s) if causal else 1.0

    def simulate(gpu: GpuSpec) -> float:
        return flash_seconds(
            gpu,
            gpu.kernels,
            heads=heads,
            kv_heads=kv_heads,
            q=s,
            k=s,
            d_qk=d_qk,
            d_v=d_v,
            done=done,
            backward=backward,
        )

    return simulate


def _short(seconds: float) -> str:
    """The note of a row under MIN_FIT_SECONDS."""
    return "under 20 us: launch-bound" if seconds < MIN_FIT_SECONDS else ""


def _xla(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """OpenXLA's matmul table: b batched m x k by k x n dots; TFLOP/s = 2 b m n k / time."""
    for r in rows:
        b, m, n, k = (_int(r, key) for key in ("b", "m", "n", "k"))
        flops = 2.0 * b * m * n * k
        shape = f"{b} x {m} x {n} x {k}"
        platform = r["platform_key"]
        if platform not in ("sm_90", "sm_100_B200"):
            raise ValueError(
                f"row {r['id']}: platform_key {platform!r} is not sm_90 or sm_100_B200"
            )
        gpu = "h100" if platform == "sm_90" else "b200"
        measured = flops / (float(r["tflops_bf16x_bf16_to_bf16"]) * 1e12)
        yield KernelRow(
            f"xla-{gpu}-bf16",
            r["id"],
            shape,
            measured,
            _gemm(m, n, k, b),
            fitted=gpu == "b200" and measured >= MIN_FIT_SECONDS,
            note=_short(measured),
        )
        fp8 = r["tflops_f8e4m3fnx_f8e4m3fn_to_bf16"].strip()
        if fp8 and gpu == "b200":  # the sm_90 FP8 cells were left out as suspect
            measured = flops / (float(fp8) * 1e12)
            yield KernelRow(
                "xla-b200-fp8",
                r["id"],
                shape,
                measured,
                _fp8_gemm(m, n, k, b),
                fitted=measured >= MIN_FIT_SECONDS,
                note=_short(measured),
            )


_AZURE_GPUS = {"H100 80GB HBM3": "h100", "H200 141GB": "h200", "GB200 185GB": "gb200"}


def _azure_gpu(row: Row) -> str:
    if row["gpu"] not in _AZURE_GPUS:
        raise ValueError(f"row {row['id']}: gpu {row['gpu']!r} is not one of {list(_AZURE_GPUS)}")
    return _AZURE_GPUS[row["gpu"]]


def _cublaslt(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """Azure's cuBLASLt FP8 GEMMs: m x n x k as printed, TFLOP/s = 2 m n k / time."""
    for r in rows:
        if r["dtype"] != "fp8":
            continue
        m, n, k = (_int(r, key) for key in ("m", "n", "k"))
        measured = 2.0 * m * n * k / (float(r["tflops"]) * 1e12)
        section = f"cublaslt-{_azure_gpu(r)}-fp8"
        yield KernelRow(section, r["id"], f"{m} x {n} x {k}", measured, _fp8_gemm(m, n, k, 1))


def _deepgemm(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """DeepGEMM's dense FP8 GEMMs, D[M, N] = A[M, K] B[N, K]^T, TFLOP/s = 2 M N K / time."""
    for r in rows:
        m, n, k = (_int(r, key) for key in ("M", "N", "K"))
        measured = 2.0 * m * n * k / (float(r["tflops"]) * 1e12)
        note = "DeepSeek-V3 inference shape" if m < 1024 else ""
        yield KernelRow(
            "deepgemm-h800-fp8",
            r["id"],
            f"{m} x {n} x {k}",
            measured,
            _fp8_gemm(m, n, k, 1),
            note=note,
        )


# the head dimensions of the H100's fitted rows: those of the models stepsim's H100
# scenarios train (64 and 128); head dimension 256 is a check
ATTENTION_FIT_HEAD_DIMS = (64, 128)


def _fa3_forward(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """FA3 paper Fig. 5: hidden 2048 (n_heads = 2048 / d), 16k tokens (batch = 16k / s);
    FLOPs 4 s^2 d n_heads batch, halved when causal."""
    for r in rows:
        s, d, h, b = (_int(r, key) for key in ("seqlen", "head_dim", "n_heads", "batch"))
        causal = r["causal"] == "1"
        flops = 4.0 * s * s * d * h * b / (2 if causal else 1)
        impl = r["impl"]
        if impl not in ("cudnn", "fa3", "fa2"):
            raise ValueError(f"row {r['id']}: impl {impl!r} is not cudnn, fa3 or fa2")
        yield KernelRow(
            f"fa3-h100-{impl}-fwd",
            r["id"],
            f"hd {d}, s {s}, {b} x {h} heads{', causal' if causal else ''}",
            flops / (float(r["tflops"]) * 1e12),
            _flash(b * h, b * h, s, d, d, causal, False),
            fitted=impl == "cudnn" and d in ATTENTION_FIT_HEAD_DIMS,
            note=r["note"].replace("_", " "),
        )


def _fa3_backward(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """FA3 paper Fig. 6 as transcribed (secondary): the Fig. 5 setting (hidden 2048, 16k
    tokens), non-causal (inferred), FLOPs 2.5 x 4 s^2 d n_heads batch."""
    for r in rows:
        s, d = _int(r, "seqlen_nominal"), _int(r, "head_dim")
        h, b = 2048 // d, 16384 // s
        causal = r["causal_inferred"].startswith("1")
        flops = 2.5 * 4.0 * s * s * d * h * b / (2 if causal else 1)
        impl = r["impl"]
        if impl not in ("cudnn", "fa3", "fa2"):
            raise ValueError(f"row {r['id']}: impl {impl!r} is not cudnn, fa3 or fa2")
        yield KernelRow(
            f"fa3-h100-{impl}-bwd",
            r["id"],
            f"hd {d}, s {s}, {b} x {h} heads{', causal' if causal else ''}",
            flops / (float(r["tflops"]) * 1e12),
            _flash(b * h, b * h, s, d, d, causal, True),
            fitted=impl == "cudnn" and d in ATTENTION_FIT_HEAD_DIMS,
            note="causal mask inferred",
            backward=True,
        )


def _fa2(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """FA2 README, H100: forward + backward, FLOPs 3.5 x the forward's (backward 2.5 x)."""
    for r in rows:
        s, d, h, b = (_int(r, key) for key in ("seqlen", "head_dim", "n_heads", "batch"))
        causal = r["causal"] == "1"
        flops = 3.5 * 4.0 * s * s * d * h * b / (2 if causal else 1)
        forward = _flash(b * h, b * h, s, d, d, causal, False)
        backward = _flash(b * h, b * h, s, d, d, causal, True)
        yield KernelRow(
            "fa2-h100-fwdbwd",
            r["id"],
            f"hd {d}, s {s}, {b} x {h} heads{', causal' if causal else ''}",
            flops / (float(r["tflops"]) * 1e12),
            lambda gpu, f=forward, g=backward: f(gpu) + g(gpu),  # type: ignore[misc]
            note="causal row labels inferred by the collector" if causal else "",
        )


_SDPA_GPUS = {"NVIDIA H200": "h200", "NVIDIA GB200": "gb200", "NVIDIA GB300": "gb300"}
# the models whose cuDNN rows each GPU's attention constants are fitted on: Llama 3.1's
# attention (64 query heads, 8 K/V heads, head dimension 128), the shape of most
# scenarios that run on these GPUs, and DeepSeek-V3's (128 heads, Q and K 192 wide, V
# 128), whose other ratio of matmuls to exponentials tells the exponentials' share
# apart; the other models are checks
SDPA_FIT_MODELS = ("llama3.1", "dsv3")


def _sdpa(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """cuDNN frontend's SDPA training benchmark: median CUPTI device time per pass
    (``time_ms``, as published); causal = the top_left mask."""
    for r in rows:
        if r["gpu"] not in _SDPA_GPUS:
            raise ValueError(f"row {r['id']}: gpu {r['gpu']!r} is not one of {list(_SDPA_GPUS)}")
        b, q, k = (_int(r, key) for key in ("batch", "q_seqlen", "kv_seqlen"))
        hq, hkv = _int(r, "num_q_heads"), _int(r, "num_kv_heads")
        d_qk, d_v = _int(r, "head_dim_qk"), _int(r, "head_dim_vo")
        if q != k:
            raise ValueError(f"row {r['id']}: q_seqlen {q} != kv_seqlen {k} is not modelled")
        if r["mask"] not in ("top_left", "no_mask"):
            raise ValueError(f"row {r['id']}: mask {r['mask']!r} is not top_left or no_mask")
        causal = r["mask"] == "top_left"
        backward = r["pass"] == "bwd"
        d = f"hd {d_qk}" if d_qk == d_v else f"hd {d_qk}/{d_v}"
        yield KernelRow(
            f"sdpa-{_SDPA_GPUS[r['gpu']]}",
            r["id"],
            f"{r['model']} {r['pass']}, {d}, s {q}, {b} x {hq}/{hkv} heads"
            + (", causal" if causal else ""),
            float(r["time_ms"]) / 1e3,
            _flash(b * hq, b * hkv, q, d_qk, d_v, causal, backward),
            fitted=r["model"] in SDPA_FIT_MODELS,
            backward=backward,
        )


_SDPA913_GPUS = {"NVIDIA B200": "b200", "NVIDIA GB300": "gb300"}


def _sdpa913(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """cuDNN 9.13 SDPA, frontend bf16: FLOPs 4 b s_q s_kv hq d, halved causal, backward
    2.5 x; the times from the TFLOP/s column (the ms column has as few as two digits)."""
    for r in rows:
        if r["gpu"] not in _SDPA913_GPUS:
            raise ValueError(f"row {r['id']}: gpu {r['gpu']!r} is not one of {list(_SDPA913_GPUS)}")
        b, q, k = (_int(r, key) for key in ("batch", "q_seqlen", "kv_seqlen"))
        hq, hkv, d = _int(r, "num_q_heads"), _int(r, "num_kv_heads"), _int(r, "head_dim")
        if q != k:
            raise ValueError(f"row {r['id']}: q_seqlen {q} != kv_seqlen {k} is not modelled")
        causal = r["is_causal"] == "True"
        flops = 4.0 * b * q * k * hq * d / (2 if causal else 1)
        for backward, column in ((False, "fwd_tflops"), (True, "bwd_tflops")):
            yield KernelRow(
                f"sdpa913-{_SDPA913_GPUS[r['gpu']]}",
                r["id"],
                f"{'bwd' if backward else 'fwd'}, hd {d}, s {q}, {b} x {hq}/{hkv} heads"
                + (", causal" if causal else ""),
                flops * (2.5 if backward else 1.0) / (float(r[column]) * 1e12),
                _flash(b * hq, b * hkv, q, d, d, causal, backward),
                fitted=r["gpu"] == "NVIDIA B200",  # GB300's are fitted on cuDNN 9.22's
                backward=backward,
            )


def norm_bytes(norm: str, n: int, c: int, bias: bool, backward: bool) -> float:
    """Bytes a normalization moves as cuDNN's benchmark counts them (NVIDIA/cudnn-frontend
    benchmark/norms/benchmark_single_norm.py, ``compute_bandwidth_bytes``; bf16, fp32
    statistics): RMSNorm forward reads x and the scale, writes y and an fp32 inverse
    variance per row; LayerNorm also reads the bias and writes an fp32 mean. Backward
    reads dy, x, the statistics and the scale, writes dx and the scale's (and bias's)
    gradient."""
    e, rows_bytes = 2, 4 * n * (2 if norm == "layer_norm" else 1)
    if not backward:
        return e * (2 * n * c + c + (c if bias and norm == "layer_norm" else 0)) + rows_bytes
    grads = c * (2 if norm == "layer_norm" or bias else 1)
    return e * (3 * n * c + c + grads) + rows_bytes


# The norm rows memory_efficiency is fitted on: hidden-size rows (the layernorms of a
# transformer layer; the 128-column rows are per-head Q/K norms, bound by their
# per-row work, not by the bandwidth) of 20 us or more.
NORM_FIT_MIN_COLUMNS = 1024

_NORM_GPUS = {"NVIDIA H200": "h200", "NVIDIA GB200": "gb200", "NVIDIA GB300": "gb300"}


def _norms(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """cuDNN's RMSNorm / LayerNorm, forward and backward: the time is the benchmark's
    bytes over its GB/s (the ms column is rounded to the microsecond)."""
    for r in rows:
        if r["gpu"] not in _NORM_GPUS:
            raise ValueError(f"row {r['id']}: gpu {r['gpu']!r} is not one of {list(_NORM_GPUS)}")
        if r["norm_type"] not in ("rms_norm", "layer_norm"):
            raise ValueError(f"row {r['id']}: norm_type {r['norm_type']!r} is not modelled")
        n, c = _int(r, "N_rows"), _int(r, "C_hidden")
        bias = r["has_bias"] == "True"
        for backward, column in ((False, "fwd_GBps"), (True, "bwd_GBps")):
            num_bytes = norm_bytes(r["norm_type"], n, c, bias, backward)
            measured = num_bytes / (float(r[column]) * 1e9)
            yield KernelRow(
                f"norms-{_NORM_GPUS[r['gpu']]}",
                r["id"],
                f"{r['norm_type'].replace('_', '')} {'bwd' if backward else 'fwd'}, {n} x {c}"
                f" ({r['config']})",
                measured,
                _stream(num_bytes),
                fitted=measured >= MIN_FIT_SECONDS and c >= NORM_FIT_MIN_COLUMNS,
                note=_short(measured) or ("per-head norm" if c < NORM_FIT_MIN_COLUMNS else ""),
            )


def _stream_rows(rows: Sequence[Row]) -> Iterable[KernelRow]:
    """Azure's HBM STREAM bandwidths (TB/s): the time to move 1 GB at that rate."""
    for r in rows:
        if r["unit"] != "TB/s":
            raise ValueError(f"row {r['id']}: unit {r['unit']!r} is not TB/s")
        gpu = _azure_gpu(r)
        if gpu == "gb200":
            continue
        yield KernelRow(
            f"stream-{gpu}",
            r["id"],
            f"STREAM {r['metric']}, 1 GB",
            1e9 / (float(r["value"]) * 1e12),
            _stream(1e9),
            note="a reduction (reads only)" if r["metric"] == "Dot" else "",
        )


_READERS: dict[str, Callable[[Sequence[Row]], Iterable[KernelRow]]] = {
    "xla_matmul": _xla,
    "azure_cublaslt_fp8": _cublaslt,
    "deepgemm_fp8": _deepgemm,
    "fa3_fig5": _fa3_forward,
    "fa3_bwd_secondary": _fa3_backward,
    "fa2_fwdbwd": _fa2,
    "cudnn_sdpa": _sdpa,
    "cudnn_sdpa_913": _sdpa913,
    "cudnn_norms": _norms,
    "azure_hbm": _stream_rows,
}


def kernel_rows(tables: Mapping[str, Sequence[Row]]) -> list[KernelRow]:
    """Every row of the kernel tables (scenario.files.read_kernel_tables) as KernelRows,
    in SECTIONS order; a cell the model cannot use raises ValueError naming the row."""
    rows = [row for name, reader in _READERS.items() for row in reader(tables.get(name, ()))]
    order = {key: n for n, key in enumerate(SECTIONS)}
    return sorted(rows, key=lambda r: order[r.section])


# -- comparison -----------------------------------------------------------------------------


def compare_kernels(
    rows: Iterable[KernelRow], gpus: Mapping[str, GpuSpec]
) -> dict[str, list[KernelComparison]]:
    """Each row's simulated time on its section's GPU record (``gpus``: the presets, or
    records with other constants), by section in SECTIONS order."""
    out: dict[str, list[KernelComparison]] = {}
    for row in rows:
        gpu = gpus[SECTIONS[row.section].gpu]
        out.setdefault(row.section, []).append(
            KernelComparison(
                row.section,
                row.id,
                row.shape,
                row.measured_s,
                row.simulate(gpu),
                row.fitted,
                row.note,
            )
        )
    return out


class Compared(Protocol):
    """What a summary needs of a compared row (kernel or collective)."""

    @property
    def error(self) -> float: ...

    @property
    def fitted(self) -> bool: ...


C = TypeVar("C", bound=Compared)


class Totals(NamedTuple, Generic[C]):
    rows: int
    mean_abs_error: float
    worst: C  # the row of largest |error|
    fitted_rows: int
    fitted_mean_abs_error: float | None  # over the rows the constant was fitted on


def summary(comparisons: Sequence[C]) -> Totals[C]:
    """A table's totals: its rows' mean |error|, the worst row, and the mean over the rows
    a constant was fitted on (kernels and collectives alike)."""
    errors = [abs(c.error) for c in comparisons]
    fitted = [abs(c.error) for c in comparisons if c.fitted]
    return Totals(
        rows=len(comparisons),
        mean_abs_error=sum(errors) / len(errors),
        worst=max(comparisons, key=lambda c: abs(c.error)),
        fitted_rows=len(fitted),
        fitted_mean_abs_error=sum(fitted) / len(fitted) if fitted else None,
    )


def comparison_json(comparisons: Mapping[str, Sequence[KernelComparison]]) -> dict:
    """The kernel section as JSON: per section its source, role, totals and rows."""
    out = {}
    for key, rows in comparisons.items():
        s, t = SECTIONS[key], summary(rows)
        out[key] = {
            "title": s.title,
            "gpu": s.gpu,
            "source": s.source,
            "kind": s.kind,
            "role": s.role,
            "what": s.what,
            "rows": t.rows,
            "mean_abs_error": t.mean_abs_error,
            "worst_error": t.worst.error,
            "worst_id": t.worst.id,
            "fitted_rows": t.fitted_rows,
            "fitted_mean_abs_error": t.fitted_mean_abs_error,
            "detail": [
                {
                    "id": c.id,
                    "shape": c.shape,
                    "measured_s": c.measured_s,
                    "simulated_s": c.simulated_s,
                    "error": c.error,
                    "fitted": c.fitted,
                    "note": c.note,
                }
                for c in rows
            ],
        }
    return out


# -- fits -----------------------------------------------------------------------------------

EFFICIENCY_GRID = tuple(x / 100 for x in range(30, 101))  # 0.30 .. 1.00
K_HALF_GRID = tuple(float(x) for x in range(0, 1025, 8))  # 0 .. 1024
KV_HALF_GRID = tuple(float(x) for x in range(0, 2049, 16))  # 0 .. 2048


def _loss(rows: Sequence[KernelRow], gpu: GpuSpec) -> float:
    return sum((row.simulate(gpu) / row.measured_s - 1.0) ** 2 for row in rows)


def _fitted(rows: Iterable[KernelRow], sections: Sequence[str]) -> list[KernelRow]:
    chosen = [r for r in rows if r.section in sections and r.fitted]
    if not chosen:
        raise ValueError(f"no fitted rows in {', '.join(sections)}")
    return chosen


def rms_error(rows: Sequence[KernelRow], gpu: GpuSpec) -> float:
    return math.sqrt(_loss(rows, gpu) / len(rows))


def fit_gemm(
    gpu: GpuSpec,
    rows: Sequence[KernelRow],
    efficiencies: Sequence[float] = EFFICIENCY_GRID,
    k_halves: Sequence[float] = K_HALF_GRID,
) -> GpuSpec:
    """The record with the (gemm_efficiency, gemm_k_half) of the grid that fit ``rows``
    best (BF16 GEMMs: its ``kernels``)."""

    def candidate(e: float, k_half: float) -> GpuSpec:
        kernels = dataclasses.replace(gpu.kernels, gemm_efficiency=e, gemm_k_half=k_half)
        return dataclasses.replace(gpu, kernels=kernels)

    pairs = [(e, k) for k in k_halves for e in efficiencies]
    return min((candidate(e, k) for e, k in pairs), key=lambda g: _loss(rows, g))


def fit_fp8_gemm(
    gpu: GpuSpec,
    rows: Sequence[KernelRow],
    efficiencies: Sequence[float] = EFFICIENCY_GRID,
    k_halves: Sequence[float] = K_HALF_GRID,
) -> GpuSpec:
    """The record with the FP8 (gemm_efficiency, gemm_k_half) that fit ``rows`` best;
    fast accumulation's efficiency is set to the same (Blackwell's FP8 GEMMs have one
    accumulation path; the Hopper split is TE's)."""
    fp8 = gpu.fp8_kernels
    assert fp8 is not None, f"{gpu.name} has no FP8 tensor cores"

    def candidate(e: float, k_half: float) -> GpuSpec:
        kernels = dataclasses.replace(
            fp8, gemm_efficiency=e, fast_accum_gemm_efficiency=e, gemm_k_half=k_half
        )
        return dataclasses.replace(gpu, fp8_kernels=kernels)

    pairs = [(e, k) for k in k_halves for e in efficiencies]
    return min((candidate(e, k) for e, k in pairs), key=lambda g: _loss(rows, g))


def fit_memory(gpu: GpuSpec, rows: Sequence[KernelRow]) -> GpuSpec:
    """The record with the memory_efficiency ``rows`` give: the median over them of the
    fraction of the HBM bandwidth each reached (as calibration.fit.fit_constants takes it
    from a GPU's own timings), to two decimals. A median, not a least-squares fit: a row
    that is not bound by bandwidth at all (a reduction-bound norm backward) would pull a
    mean down."""
    whole = dataclasses.replace(gpu, kernels=dataclasses.replace(gpu.kernels, memory_efficiency=1))
    fractions = sorted(row.simulate(whole) / row.measured_s for row in rows)
    middle = len(fractions) // 2
    median = (
        fractions[middle] if len(fractions) % 2 else (fractions[middle - 1] + fractions[middle]) / 2
    )
    efficiency = round(min(1.0, median), 2)
    return dataclasses.replace(
        gpu, kernels=dataclasses.replace(gpu.kernels, memory_efficiency=efficiency)
    )


EXP_EXPOSED_GRID = tuple(x / 20 for x in range(0, 21))  # 0 .. 1


def _best_efficiency(
    rows: Sequence[KernelRow], at: Callable[[float], GpuSpec], efficiencies: Sequence[float]
) -> tuple[float, float]:
    """(least loss, efficiency) over the grid for rows whose time is their compute at
    efficiency 1 over the efficiency (checked at 1 and 1/2), or else simulated."""
    whole, half = at(1.0), at(0.5)
    # per row: its time at efficiency 1 when compute-bound (then t1 / e), else None
    bound: list[float | None] = []
    for row in rows:
        t1, t_half = row.simulate(whole), row.simulate(half)
        bound.append(t1 if math.isclose(t_half, 2.0 * t1, rel_tol=1e-12) else None)

    def loss(e: float) -> float:
        total = 0.0
        for t1, row in zip(bound, rows, strict=True):
            time = t1 / e if t1 is not None else row.simulate(at(e))
            total += (time / row.measured_s - 1.0) ** 2
        return total

    return min((loss(e), e) for e in efficiencies)


def _same_efficiency(
    candidate: Callable[[float, float, float, float], GpuSpec], kv: float, x: float, e: float
) -> GpuSpec:
    """The candidate record with efficiency ``e`` forward and backward."""
    return candidate(e, e, kv, x)


def fit_attention(
    gpu: GpuSpec,
    rows: Sequence[KernelRow],
    source: str,
    efficiencies: Sequence[float] = EFFICIENCY_GRID,
    kv_halves: Sequence[float] = KV_HALF_GRID,
    exp_exposed: Sequence[float] = EXP_EXPOSED_GRID,
) -> GpuSpec:
    """The record with the attention constants of the grid that fit ``rows`` best:
    forward and backward efficiency each on the rows of its pass, one kv_half and one
    exp_exposed for both (give one value to hold it fixed)."""
    forward = [r for r in rows if not r.backward]
    backward = [r for r in rows if r.backward]
    if not forward or not backward:
        raise ValueError("fit_attention needs forward and backward rows")

    def candidate(f: float, b: float, kv: float, x: float) -> GpuSpec:
        constants = AttentionKernelConstants(
            forward_efficiency=f, backward_efficiency=b, kv_half=kv, exp_exposed=x, source=source
        )
        return dataclasses.replace(gpu, attention_kernels=constants)

    best: tuple[float, GpuSpec] | None = None
    for kv in kv_halves:
        for x in exp_exposed:
            at = functools.partial(_same_efficiency, candidate, kv, x)
            f_loss, f = _best_efficiency(forward, at, efficiencies)
            b_loss, b = _best_efficiency(backward, at, efficiencies)
            if best is None or f_loss + b_loss < best[0]:
                best = (f_loss + b_loss, candidate(f, b, kv, x))
    assert best is not None
    return best[1]


class KernelFit(NamedTuple):
    """One fit benchmarks/calibrate.py --kernels runs: which constants of which GPU
    record, on the fitted rows of which sections (``exp_exposed``: held at this value
    where the rows cannot tell it apart, all of one head dimension)."""

    gpu: str
    constants: str  # "gemm", "fp8", "memory" or "attention"
    sections: tuple[str, ...]
    exp_exposed: float | None = None


KERNEL_FITS = (
    KernelFit(B200, "gemm", ("xla-b200-bf16",)),
    KernelFit(B200, "fp8", ("xla-b200-fp8",)),
    KernelFit(H200, "memory", ("norms-h200",)),
    KernelFit(GB200, "memory", ("norms-gb200",)),
    KernelFit(GB300, "memory", ("norms-gb300",)),
    KernelFit(H100, "attention", ("fa3-h100-cudnn-fwd", "fa3-h100-cudnn-bwd")),
    KernelFit(H200, "attention", ("sdpa-h200",)),
    # head dimension 128 only: the exponentials' share held at the GB200's fit (same die)
    KernelFit(B200, "attention", ("sdpa913-b200",), exp_exposed=0.0),
    KernelFit(GB200, "attention", ("sdpa-gb200",)),
    KernelFit(GB300, "attention", ("sdpa-gb300",)),
)


def run_fit(fit: KernelFit, rows: Sequence[KernelRow], gpu: GpuSpec) -> tuple[GpuSpec, float]:
    """The record refitted as ``fit`` says, and the rms relative error over its rows."""
    chosen = _fitted(rows, fit.sections)
    if fit.constants == "gemm":
        fitted = fit_gemm(gpu, chosen)
    elif fit.constants == "fp8":
        fitted = fit_fp8_gemm(gpu, chosen)
    elif fit.constants == "memory":
        fitted = fit_memory(gpu, chosen)
    elif fit.constants == "attention":
        source = gpu.attention_kernels.source if gpu.attention_kernels else "fitted"
        grid = EXP_EXPOSED_GRID if fit.exp_exposed is None else (fit.exp_exposed,)
        fitted = fit_attention(gpu, chosen, source, exp_exposed=grid)
    else:
        raise ValueError(f"unknown constants {fit.constants!r}")
    return fitted, rms_error(chosen, fitted)

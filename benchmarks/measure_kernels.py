"""Time GEMM and element-wise kernels on this machine's GPU and write a calibration file.

    pip install torch            # any CUDA build; not a stepsim dependency
    python benchmarks/measure_kernels.py --gpu h100-sxm5-80gb --out h100.toml
    stepsim run scenarios/gpt3-175b-128nodes.toml --set cluster.node=dgx-h100 \\
        --calibration h100.toml

It times the GEMM shapes of a GPT layer (stepsim.calibration.fit.gemm_shapes: QKV,
projection, MLP and weight-gradient GEMMs for several hidden sizes at TP 1 and 8,
and the attention core's batched GEMMs) in bf16 with CUDA events (median of 20
runs after 5 warm-ups), and element-wise kernels (a bf16 add over 256 MiB to
2 GiB), then fits the three kernel constants (stepsim.calibration.fit.fit_constants)
and writes them with the raw timings.

By default each timed launch starts on an idle GPU, so the host's time to launch
it (about 20-50 us from Python) is inside the events: GEMMs under ~50 us read
slow. --queue-ahead queues each launch behind a GPU busy-wait so that only the
kernel is timed; the ~1 ms rest lets the GPU boost above the clock it holds
under sustained load, so large GEMMs then read 5-15 % fast (docs/calibration.md).

--precision fp8 times the same GEMMs (the unbatched ones: see shapes_for) as FP8
GEMMs instead: e4m3 operands, bf16 output, per-tensor scales, through
torch._scaled_mm (add --fast-accum for its fast-accumulation mode), and fits
gemm_efficiency against the GPU's dense FP8 peak (GpuSpec.peak_tflops_fp8) rather than
the preset's BF16 peak. The element-wise kernels stay bf16 adds.

--synthetic GPU writes the file from the built-in model's own times instead of
measuring (no GPU or PyTorch needed): the tests use it to check the path from
this script to `stepsim run --calibration`, and it shows the file format.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.calibration.fit import (  # noqa: E402
    GemmTiming,
    MemoryTiming,
    calibration_toml,
    fit_constants,
    gemm_shapes,
)
from stepsim.cost.kernels import gemm_seconds  # noqa: E402
from stepsim.scenario.presets import GPUS  # noqa: E402

ELEMENTWISE_BYTES = [2**28, 2**29, 2**30, 2**31]  # one operand; an add reads two, writes one


class Unavailable(Exception):
    """What this machine or GPU preset lacks for the measurement asked for."""


# --queue-ahead: a GPU busy-wait of this many clock cycles (about 1 ms on an H100)
# runs before each timed launch, so the start event, the kernel and the end event
# are all queued before the GPU reaches them.
QUEUE_AHEAD_CYCLES = 2_000_000


def _median_seconds(fn, repeats: int = 20, warmup: int = 5, queue_ahead: bool = False) -> float:
    """Median time between CUDA events around one launch of ``fn``. By default the
    GPU is idle when the start event is recorded, so the host's time to launch the
    kernel (tens of microseconds from Python) is timed too; with ``queue_ahead`` it
    is not (a busy-wait kernel keeps the GPU occupied while the host launches)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queue_ahead:
            torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def shapes_for(precision: str) -> list[tuple]:
    """The GEMM shapes timed. FP8 drops the attention core's batched GEMMs:
    torch._scaled_mm has no batched form (a loop of launches would time the
    launches), and FP8 training recipes (Transformer Engine) run the attention
    core in bf16 anyway; FP8 is for the linear layers."""
    shapes = gemm_shapes()
    if precision == "fp8":
        shapes = [s for s in shapes if s[3] == 1]
        bad = [s for s in shapes if any(d % 16 for d in s[:3])]
        if bad:  # torch._scaled_mm needs every dimension a multiple of 16
            raise ValueError(f"FP8 GEMM shapes must be multiples of 16: {bad}")
    return shapes


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def _fp8_gemm(torch, device, m: int, n: int, k: int, fast_accum: bool):
    """An m x k by k x n FP8 GEMM: e4m3 operands, the second column-major (as
    torch._scaled_mm requires), per-tensor float32 scales, bf16 output."""
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # k x n, column-major
    scale_a = torch.tensor(1.0, device=device)
    scale_b = torch.tensor(1.0, device=device)

    def fn():
        return torch._scaled_mm(
            a,
            b,
            scale_a=scale_a,
            scale_b=scale_b,
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
        )

    return fn


def measure(
    precision: str = "bf16", fast_accum: bool = False, queue_ahead: bool = False
) -> tuple[list[GemmTiming], list[MemoryTiming], str, int]:
    import torch

    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU visible to PyTorch (try --synthetic)")
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    if precision == "fp8" and (props.major, props.minor) < (8, 9):
        raise Unavailable(f"{props.name} has no FP8 tensor cores (compute capability 8.9+)")
    gemms = []
    for m, n, k, batch in shapes_for(precision):
        if precision == "fp8":
            fn = _fp8_gemm(torch, device, m, n, k, fast_accum)
        else:
            a = torch.randn(batch, m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(batch, k, n, device=device, dtype=torch.bfloat16)
            fn = (lambda a=a, b=b: torch.bmm(a, b)) if batch > 1 else (lambda a=a, b=b: a[0] @ b[0])
        gemms.append(GemmTiming(m, n, k, batch, _median_seconds(fn, queue_ahead=queue_ahead)))
        del fn
    memory = []
    for size in ELEMENTWISE_BYTES:
        x = torch.empty(size // 2, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        out = torch.empty_like(x)
        seconds = _median_seconds(
            lambda x=x, y=y, out=out: torch.add(x, y, out=out), queue_ahead=queue_ahead
        )
        memory.append(MemoryTiming(3.0 * size, seconds))
        del x, y, out
    what = {"bf16": "bf16", "fp8": "fp8 e4m3 torch._scaled_mm"}[precision]
    if precision == "fp8":
        what += ", fast accumulation" if fast_accum else ", no fast accumulation"
    if queue_ahead:
        what += ", launches queued ahead (host launch time not timed)"
    return (
        gemms,
        memory,
        f"{what} GEMMs measured on {props.name} ({props.multi_processor_count} SMs) "
        f"with torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"driver {_driver_version()}, {datetime.date.today().isoformat()}",
        props.multi_processor_count,
    )


def fit_gpu(gpu_name: str, precision: str):
    """The GpuSpec the fit uses: the preset, with the dense FP8 peak for fp8."""
    gpu = GPUS[gpu_name]
    if precision == "fp8":
        if gpu.peak_tflops_fp8 is None:
            fp8 = sorted(name for name, g in GPUS.items() if g.peak_tflops_fp8)
            raise Unavailable(f"{gpu_name} has no FP8 tensor cores (FP8 GPUs: {', '.join(fp8)})")
        gpu = dataclasses.replace(gpu, peak_tflops=gpu.peak_tflops_fp8)
    return gpu


def synthetic(
    gpu_name: str, precision: str = "bf16"
) -> tuple[list[GemmTiming], list[MemoryTiming], str, int]:
    """The built-in model's times for the same kernels (no GPU); with fp8, the
    model run at the FP8 peak."""
    gpu = fit_gpu(gpu_name, precision)
    c = gpu.kernels
    gemms = [GemmTiming(*s, gemm_seconds(gpu, c, *s)) for s in shapes_for(precision)]
    stream = gpu.hbm_gbytes_per_s * 1e9 * c.memory_efficiency
    memory = [MemoryTiming(3.0 * size, 3.0 * size / stream) for size in ELEMENTWISE_BYTES]
    return gemms, memory, "synthetic: the built-in model's own times", c.num_sms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", choices=sorted(GPUS), help="the stepsim GPU preset measured")
    parser.add_argument(
        "--synthetic", metavar="GPU", choices=sorted(GPUS), help="no GPU: model times"
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="calibration file to write")
    parser.add_argument(
        "--precision",
        choices=("bf16", "fp8"),
        default="bf16",
        help="GEMM operands: bf16 (default) or fp8 e4m3 with bf16 output (torch._scaled_mm)",
    )
    parser.add_argument(
        "--fast-accum", action="store_true", help="fp8: torch._scaled_mm's use_fast_accum"
    )
    parser.add_argument(
        "--queue-ahead",
        action="store_true",
        help="queue each timed launch behind a GPU busy-wait, so that the host's launch "
        "time (which dominates GEMMs under ~50 us) is not timed",
    )
    args = parser.parse_args(argv)
    if bool(args.gpu) == bool(args.synthetic):
        parser.error("give exactly one of --gpu (measure) and --synthetic")
    if args.fast_accum and args.precision != "fp8":
        parser.error("--fast-accum applies to --precision fp8 only")
    name = args.gpu or args.synthetic
    if args.gpu:
        try:
            import torch  # noqa: F401
        except ImportError:
            print(
                "measure_kernels: --gpu needs PyTorch with CUDA (pip install torch); "
                "--synthetic GPU needs neither",
                file=sys.stderr,
            )
            return 2
    try:
        gpu = fit_gpu(name, args.precision)
        if args.synthetic:
            gemms, memory, source, sms = synthetic(name, args.precision)
        else:
            gemms, memory, source, sms = measure(args.precision, args.fast_accum, args.queue_ahead)
    except Unavailable as e:
        print(f"measure_kernels: {e}", file=sys.stderr)
        return 2
    constants = fit_constants(gpu, sms, gemms, memory, source)
    text = calibration_toml(constants, gemms, memory)
    if args.precision == "fp8":
        text = (
            f"# FP8: gemm_efficiency is a fraction of the dense FP8 peak, "
            f"{gpu.peak_tflops:g} TFLOP/s,\n"
            f"# not of the preset's BF16 peak ({GPUS[name].peak_tflops:g}): stepsim's model "
            "is BF16, so this file\n"
            "# is a record of FP8 kernel timings, not a --calibration file for BF16 runs.\n" + text
        )
    Path(args.out).write_text(text, encoding="utf-8")
    print(
        f"{name} ({args.precision}{', fast accum' if args.fast_accum else ''}"
        f"{', queued ahead' if args.queue_ahead else ''}): "
        f"gemm_efficiency {constants.gemm_efficiency:g}, gemm_k_half "
        f"{constants.gemm_k_half:g}, memory_efficiency {constants.memory_efficiency:.3f} "
        f"({len(gemms)} GEMMs, {len(memory)} element-wise kernels) -> {args.out}"
    )
    print(summary(gpu, gemms, memory))
    return 0


def summary(gpu, gemms: list[GemmTiming], memory: list[MemoryTiming]) -> str:
    """The largest GEMMs' rates and the element-wise bandwidths, as lines of text."""
    lines = []
    by_flops = sorted(gemms, key=lambda g: g.batch * g.m * g.n * g.k, reverse=True)
    for g in by_flops[:5]:
        rate = 2.0 * g.batch * g.m * g.n * g.k / g.seconds / 1e12
        lines.append(
            f"  gemm {g.m}x{g.n}x{g.k}"
            + (f" x{g.batch}" if g.batch > 1 else "")
            + f": {g.seconds * 1e3:.3f} ms, {rate:.0f} TFLOP/s "
            f"({rate / gpu.peak_tflops:.1%} of {gpu.peak_tflops:g})"
        )
    best = max(gemms, key=lambda g: g.batch * g.m * g.n * g.k / g.seconds)
    rate = 2.0 * best.batch * best.m * best.n * best.k / best.seconds / 1e12
    lines.append(f"  fastest gemm {best.m}x{best.n}x{best.k}: {rate:.0f} TFLOP/s")
    for t in memory:
        lines.append(
            f"  add over {t.bytes / 3 / 2**20:.0f} MiB operands: {t.seconds * 1e3:.3f} ms, "
            f"{t.bytes / t.seconds / 1e9:.0f} GB/s "
            f"({t.bytes / t.seconds / 1e9 / gpu.hbm_gbytes_per_s:.1%} of {gpu.hbm_gbytes_per_s:g})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

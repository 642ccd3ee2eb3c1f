"""Time GEMM and element-wise kernels on this machine's GPU and write a calibration file.

    pip install torch            # any CUDA build; not a stepsim dependency
    python benchmarks/measure_kernels.py --gpu h100-sxm5-80gb --out h100.toml
    stepsim run scenarios/gpt3-175b-128nodes.toml --set cluster.node=dgx-h100 \\
        --calibration h100.toml

It times the GEMM shapes of a GPT layer (simulator.calibration.fit.gemm_shapes: QKV,
projection, MLP and weight-gradient GEMMs for several hidden sizes at TP 1 and 8,
and the attention core's batched GEMMs) in bf16 with CUDA events (median of 20
runs after 5 warm-ups), and element-wise kernels (a bf16 add over 256 MiB to
2 GiB), then fits the three kernel constants (simulator.calibration.fit.fit_constants)
and writes them with the raw timings.

--synthetic GPU writes the file from the built-in model's own times instead of
measuring (no GPU or PyTorch needed): the tests use it to check the path from
this script to `stepsim run --calibration`, and it shows the file format.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.calibration.fit import (  # noqa: E402
    GemmTiming,
    MemoryTiming,
    calibration_toml,
    fit_constants,
    gemm_shapes,
)
from simulator.scenario.presets import GPUS  # noqa: E402
from simulator.workload.compute import gemm_seconds  # noqa: E402

ELEMENTWISE_BYTES = [2**28, 2**29, 2**30, 2**31]  # one operand; an add reads two, writes one


def _median_seconds(fn, repeats: int = 20, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure() -> tuple[list[GemmTiming], list[MemoryTiming], str, int]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("measure_kernels: no CUDA GPU visible to PyTorch (try --synthetic)")
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    gemms = []
    for m, n, k, batch in gemm_shapes():
        a = torch.randn(batch, m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device=device, dtype=torch.bfloat16)
        fn = (lambda a=a, b=b: torch.bmm(a, b)) if batch > 1 else (lambda a=a, b=b: a[0] @ b[0])
        gemms.append(GemmTiming(m, n, k, batch, _median_seconds(fn)))
        del a, b
    memory = []
    for size in ELEMENTWISE_BYTES:
        x = torch.empty(size // 2, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        out = torch.empty_like(x)
        seconds = _median_seconds(lambda x=x, y=y, out=out: torch.add(x, y, out=out))
        memory.append(MemoryTiming(3.0 * size, seconds))
        del x, y, out
    return (
        gemms,
        memory,
        f"measured on {props.name} with torch {torch.__version__}",
        props.multi_processor_count,
    )


def synthetic(gpu_name: str) -> tuple[list[GemmTiming], list[MemoryTiming], str, int]:
    """The built-in model's times for the same kernels (no GPU)."""
    gpu = GPUS[gpu_name]
    c = gpu.kernels
    gemms = [GemmTiming(*s, gemm_seconds(gpu, c, *s)) for s in gemm_shapes()]
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
    args = parser.parse_args(argv)
    if bool(args.gpu) == bool(args.synthetic):
        parser.error("give exactly one of --gpu (measure) and --synthetic")
    name = args.gpu or args.synthetic
    gemms, memory, source, sms = synthetic(name) if args.synthetic else measure()
    constants = fit_constants(GPUS[name], sms, gemms, memory, source)
    Path(args.out).write_text(calibration_toml(constants, gemms, memory), encoding="utf-8")
    print(
        f"{name}: gemm_efficiency {constants.gemm_efficiency:g}, gemm_k_half "
        f"{constants.gemm_k_half:g}, memory_efficiency {constants.memory_efficiency:.3f} "
        f"({len(gemms)} GEMMs, {len(memory)} element-wise kernels) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

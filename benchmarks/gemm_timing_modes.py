"""How the way a GEMM is timed changes its time (needs a CUDA GPU and PyTorch).

    python benchmarks/gemm_timing_modes.py

measure_kernels.py times one launch between two CUDA events. This script times a
few GEMM shapes (bf16, and fp8 through torch._scaled_mm) four ways, median of 20
after 5 warm-ups:

- default: one launch from an idle GPU (measure_kernels.py's default): the
  host's launch time is inside the events;
- queued: one launch queued behind a ~1 ms GPU busy-wait (--queue-ahead): only
  the kernel is timed, but the GPU has rested before it;
- burst: ten launches back to back between the events, per launch;
- burst-queued: the same, queued behind the busy-wait;

then runs 8192^3 GEMMs back to back for 3 s and reads the SM clock, the power and
the clock-throttle reasons (NVML) during that sustained load.
docs/calibration.md ("Kernel measurements on a real H100") has one run's output.
"""

from __future__ import annotations

import statistics
import sys
import time

SHAPES = ((8192, 8192, 8192), (8192, 49152, 12288), (2048, 2048, 2048), (8192, 2048, 256),
          (2048, 4096, 16384))  # fmt: skip
SLEEP_CYCLES = 2_000_000  # about 1 ms at the H100's 1980 MHz


def main() -> int:
    try:
        import torch
    except ImportError:
        print("gemm_timing_modes: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gemm_timing_modes: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as e:  # noqa: BLE001 - NVML is optional
        handle = None
        print(f"(no NVML readings: {e})")

    def clocks() -> str:
        if handle is None:
            return "n/a"
        sm = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        watts = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        return f"SM {sm} MHz, {watts:.0f} W, throttle reasons 0x{reasons:x}"

    def event():
        return torch.cuda.Event(enable_timing=True)

    def timed(fn, mode: str, repeats: int = 20) -> float:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        launches = 10 if mode.startswith("burst") else 1
        times = []
        for _ in range(repeats):
            start, end = event(), event()
            if mode in ("queued", "burst-queued"):
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            for _ in range(launches):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / launches)
        return statistics.median(times)

    device = torch.device("cuda")
    one = torch.tensor(1.0, device=device)

    def gemm(precision: str, m: int, n: int, k: int):
        if precision == "bf16":
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            return lambda: a @ b
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    for precision in ("bf16", "fp8"):
        for m, n, k in SHAPES:
            fn = gemm(precision, m, n, k)
            row = []
            for mode in ("default", "queued", "burst", "burst-queued"):
                t = timed(fn, mode)
                row.append(f"{mode} {t * 1e6:8.1f} us {2 * m * n * k / t / 1e12:5.0f} TF")
            print(f"{precision} {m}x{n}x{k}: " + " | ".join(row))
            del fn
        fn = gemm(precision, 8192, 8192, 8192)
        fn()
        torch.cuda.synchronize()
        during, count = "n/a", 0
        start = event()
        start.record()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 3.0:
            for _ in range(20):
                fn()
            count += 20
            if count % 200 == 0:
                during = clocks()
            if count % 400 == 0:
                torch.cuda.synchronize()
        end = event()
        end.record()
        torch.cuda.synchronize()
        per = start.elapsed_time(end) / 1e3 / count
        print(
            f"{precision} sustained 8192^3 for 3 s: {per * 1e6:.1f} us, "
            f"{2 * 8192**3 / per / 1e12:.0f} TF; during: {during}; after: {clocks()}"
        )
        del fn
    return 0


if __name__ == "__main__":
    sys.exit(main())

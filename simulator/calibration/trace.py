"""What a PyTorch profiler trace of a real training job measured (`stepsim compare`):
its kernels classified, per iteration, with the exposed communication and the idle time.

The trace is the Kineto / Chrome JSON that ``torch.profiler`` writes for one rank (read
by scenario.files.read_profiler_trace; this module reads no file). Its events:

- **iterations**: the ``ProfilerStep#N`` annotations (``cat`` user_annotation) the
  profiler's schedule records on the host. A GPU event belongs to the iteration whose
  window holds the host call that launched it (``cuda_runtime`` events share its
  ``correlation``): the GPU runs behind the host, so its own timestamps would put an
  iteration's last kernels into the next. A trace without launch events falls back to
  the GPU timestamps; one without steps is one iteration.
- **GPU events**: ``cat`` kernel, gpu_memcpy, gpu_memset. Each is put into one class by
  its name (``kernel_class``, first match): NCCL kernels by their collective (NCCL's
  kernel names carry it: ``ncclKernel_AllReduce_RING_LL_Sum_float``,
  ``ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL``); attention kernels (flash, fmha,
  cuDNN's SDPA); the optimizer's fused kernels (``multi_tensor_apply``, Adam, SGD);
  GEMMs and convolutions (cuBLAS, cuBLASLt, CUTLASS, xmma, nvjet kernel names); copies
  and sets (the memcpy and memset events); everything else is memory-bound
  (element-wise, reductions, norms, softmax, casts).

Per iteration, in stepsim's categories: its time (the host step's duration, what the
training loop measures), the compute (the union of every event but NCCL's and the
optimizer's), the optimizer (the union of its events outside the compute), the exposed
communication (NCCL time when neither runs: what the compute stream could not hide) and
the idle time (the iteration's time the GPU was busy with none: time - busy), which add
up to the iteration's time; and each class's kernel time (a sum: kernels on two streams
at once count twice)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..scenario import ScenarioError

GEMM, ATTENTION, MEMORY, OPTIMIZER, COPY = "gemm", "attention", "memory", "optimizer", "copy"
COMPUTE_CLASSES = (GEMM, ATTENTION, MEMORY, OPTIMIZER, COPY)
# NCCL's collectives as its kernel names spell them, and the class each becomes
COLLECTIVES = {
    "allreduce": "nccl all-reduce",
    "reducescatter": "nccl reduce-scatter",
    "allgather": "nccl all-gather",
    "alltoall": "nccl all-to-all",
    "sendrecv": "nccl send/receive",
    "send": "nccl send/receive",
    "recv": "nccl send/receive",
    "broadcast": "nccl broadcast",
    "reduce": "nccl reduce",
}
NCCL_OTHER = "nccl other"
CLASS_LABELS = {
    GEMM: "GEMM and convolution",
    ATTENTION: "attention",
    MEMORY: "memory-bound",
    OPTIMIZER: "optimizer",
    COPY: "copies and sets",
}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
_NCCL = re.compile(r"nccl(?:dev)?kernel_([a-z]+)|^nccl", re.IGNORECASE)
_ATTENTION = re.compile(r"flash|fmha|_mha|sdpa|attention|attn", re.IGNORECASE)
_OPTIMIZER = re.compile(r"multi_tensor_apply|adam|_sgd|sgd_|lamb", re.IGNORECASE)
_GEMM = re.compile(
    r"gemm|xmma|nvjet|cutlass|cublas|s1688|h1688|s884|h884|s16816|h16816|implicit_convolve"
    r"|wgrad|dgrad|fprop|winograd|conv2d",
    re.IGNORECASE,
)


def kernel_class(name: str, category: str = "kernel") -> str:
    """The class of one GPU event by its name and category (module docstring)."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return COPY
    nccl = _NCCL.search(name)
    if nccl:
        kind = (nccl.group(1) or "").lower()
        return COLLECTIVES.get(kind, NCCL_OTHER)
    if _ATTENTION.search(name):
        return ATTENTION
    if _OPTIMIZER.search(name):
        return OPTIMIZER
    if _GEMM.search(name):
        return GEMM
    return MEMORY


_GPU_FAMILY = re.compile(r"\b([A-Z]{1,2}\d{2,3})\b")


def other_gpu(device_names: Iterable[str], gpu: str) -> bool:
    """Whether devices printed as ``device_names`` ("NVIDIA H100 80GB HBM3") are of
    another GPU family (H100, B200, ...) than the one a scenario's ``gpu`` names; False
    when the names say no family."""
    families = {m for n in device_names for m in _GPU_FAMILY.findall(n.upper())}
    families -= {"HBM", "PCIE", "SXM"}
    return bool(families) and not any(f.lower() in gpu.lower() for f in families)


def stage_of(
    stage: int | None, scenario: Any, rank: int | None, flag: str = "--stage"
) -> tuple[int, list[str]]:
    """The pipeline stage a traced rank ran, and a note on how it was chosen: ``stage``
    as given (``flag`` names it in the error when it is not a stage), else the trace's
    rank placed in Megatron-Core's default order (tp-cp-ep-dp-pp), else stage 0."""
    par = scenario.parallel
    stages = par.pipeline_model_parallel_size
    if stage is not None:
        if not 0 <= stage < stages:
            raise ScenarioError(f"{flag} {stage}: the scenario has stages 0 to {stages - 1}")
        return stage, []
    if rank is None:
        return 0, [f"the trace names no rank: stage 0 compared ({flag} sets it)"]
    per_stage = par.tensor_model_parallel_size * par.cp_size * par.data_parallel_size
    found = rank // per_stage
    if found >= stages:
        return 0, [
            f"the trace's rank {rank} is not a rank of the scenario ({stages * per_stage} "
            f"GPUs): stage 0 compared ({flag} sets it)"
        ]
    return found, [f"stage {found}: rank {rank} in Megatron-Core's order (tp-cp-ep-dp-pp)"]


def is_communication(cls: str) -> bool:
    return cls.startswith("nccl")


class GpuEvent(NamedTuple):
    start_s: float
    end_s: float
    stream: int
    name: str
    cls: str


class Iteration(NamedTuple):
    """One iteration as the trace measured it (seconds)."""

    step: str
    time_s: float
    start_s: float  # its first GPU event's start (trace clock)
    end_s: float  # its last GPU event's end
    kernel_s: dict[str, float]  # per class, summed
    busy_s: float  # the union of every GPU event
    compute_s: float  # the union of the compute events (not NCCL, not the optimizer's)
    optimizer_s: float  # the union of the optimizer's events outside the compute's
    communication_s: float  # the union of the NCCL events
    exposed_communication_s: float  # NCCL time when neither compute nor optimizer runs
    idle_s: float  # the iteration's time not busy (time_s - busy_s, at least 0)
    events: tuple[GpuEvent, ...]


class TraceMeasurement(NamedTuple):
    """A trace's iterations and what it says about itself."""

    rank: int | None
    world_size: int | None
    device: str
    iterations: tuple[Iteration, ...]
    notes: tuple[str, ...]

    def mean(self, field: str) -> float:
        return sum(getattr(i, field) for i in self.iterations) / len(self.iterations)

    def mean_kernel_s(self) -> dict[str, float]:
        classes = {c for i in self.iterations for c in i.kernel_s}
        n = len(self.iterations)
        return {
            c: sum(i.kernel_s.get(c, 0.0) for i in self.iterations) / n for c in sorted(classes)
        }


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """The length of the union ``a`` outside the union ``b`` (both sorted, disjoint)."""
    total, j = 0.0, 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                total += b[k][0] - cursor
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            total += end - cursor
    return total


def _number(event: Mapping[str, Any], key: str, where: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(f"{where}: {key}={value!r} must be a number")
    return float(value)


def iteration_of(events: Sequence[GpuEvent], step: str, time_s: float) -> Iteration:
    """The totals of one iteration's GPU events."""
    kernel_s: dict[str, float] = {}
    for e in events:
        kernel_s[e.cls] = kernel_s.get(e.cls, 0.0) + (e.end_s - e.start_s)
    every = _union((e.start_s, e.end_s) for e in events)
    compute = _union(
        (e.start_s, e.end_s) for e in events if not is_communication(e.cls) and e.cls != OPTIMIZER
    )
    working = _union((e.start_s, e.end_s) for e in events if not is_communication(e.cls))
    comm = _union((e.start_s, e.end_s) for e in events if is_communication(e.cls))
    start = min((e.start_s for e in events), default=0.0)
    end = max((e.end_s for e in events), default=0.0)
    busy = _length(every)
    return Iteration(
        step,
        time_s,
        start,
        end,
        kernel_s,
        busy,
        _length(compute),
        _length(working) - _length(compute),
        _length(comm),
        _minus(comm, working),
        max(0.0, time_s - busy),
        tuple(events),
    )


def measure(trace: Mapping[str, Any], what: str = "trace") -> TraceMeasurement:
    """The iterations of a parsed trace (module docstring); a trace with no GPU event
    is a one-line error, as is an event whose times are not numbers."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise ScenarioError(f"{what} has no traceEvents list (a PyTorch profiler trace has one)")
    notes: list[str] = []
    steps = []
    launches: dict[Any, float] = {}
    gpu: list[tuple[Mapping[str, Any], Any]] = []
    for n, event in enumerate(events):
        if not isinstance(event, Mapping) or event.get("ph") != "X":
            continue
        category = event.get("cat")
        name = str(event.get("name", ""))
        given = event.get("args")
        args: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        where = f"{what}, traceEvents[{n}] ({name[:40]!r})"
        if category == "user_annotation" and name.startswith("ProfilerStep#"):
            steps.append((_number(event, "ts", where), _number(event, "dur", where), name))
        elif category == "cuda_runtime" and "correlation" in args:
            launches[args["correlation"]] = _number(event, "ts", where)
        elif category in GPU_CATEGORIES:
            _number(event, "ts", where)
            _number(event, "dur", where)
            gpu.append((event, args.get("correlation")))
    if not gpu:
        raise ScenarioError(
            f"{what} holds no GPU event (cat kernel, gpu_memcpy or gpu_memset): profile with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
        )
    steps.sort()
    by_step: dict[int, list[GpuEvent]] = {}
    matched = 0
    for event, correlation in gpu:
        given = event.get("args")
        args = given if isinstance(given, Mapping) else {}
        start_us, dur_us = float(event["ts"]), float(event["dur"])
        item = GpuEvent(
            start_us * 1e-6,
            (start_us + dur_us) * 1e-6,
            int(args.get("stream", event.get("tid", 0)) or 0),
            str(event.get("name", "")),
            kernel_class(str(event.get("name", "")), str(event.get("cat"))),
        )
        if not steps:
            by_step.setdefault(0, []).append(item)
            continue
        when = launches.get(correlation)
        if when is not None:
            matched += 1
        else:
            when = start_us
        index = _step_index(steps, when)
        if index is not None:
            by_step.setdefault(index, []).append(item)
    if not steps:
        notes.append("no ProfilerStep annotations: the whole trace is taken as one iteration")
        events_all = by_step.get(0, [])
        span = max(e.end_s for e in events_all) - min(e.start_s for e in events_all)
        iterations = [iteration_of(events_all, "whole trace", span)]
    else:
        if matched < len(gpu):
            notes.append(
                f"{len(gpu) - matched} of {len(gpu)} GPU events have no launch event in the "
                "trace: placed in iterations by their own start"
            )
        iterations = [
            iteration_of(by_step[i], steps[i][2], steps[i][1] * 1e-6)
            for i in range(len(steps))
            if by_step.get(i)
        ]
        empty = [steps[i][2] for i in range(len(steps)) if not by_step.get(i)]
        if empty:
            notes.append(f"no GPU event in {', '.join(empty)}: left out")
    distributed = trace.get("distributedInfo")
    rank = world = None
    if isinstance(distributed, Mapping):
        rank = distributed.get("rank") if isinstance(distributed.get("rank"), int) else None
        world = (
            distributed.get("world_size")
            if isinstance(distributed.get("world_size"), int)
            else None
        )
    device = ""
    properties = trace.get("deviceProperties")
    if isinstance(properties, list) and properties and isinstance(properties[0], Mapping):
        device = str(properties[0].get("name", ""))
    return TraceMeasurement(rank, world, device, tuple(iterations), tuple(notes))


def _step_index(steps: Sequence[tuple[float, float, str]], when_us: float) -> int | None:
    """The step whose window [start, next start) holds ``when_us``; None before the first
    or after the last one's end."""
    index = None
    for i, (start, _, _) in enumerate(steps):
        if when_us < start:
            break
        index = i
    if index is None:
        return None
    last_start, last_dur, _ = steps[index]
    if index == len(steps) - 1 and when_us > last_start + last_dur:
        return None
    return index


# -- the kernel classes as calibration targets (`stepsim calibrate --trace`) ------------------

# a trace's compute kernel classes and the fitted parameter (scenario/fitted.py) each sets
TRACE_PARAMETERS = {GEMM: "gemm", ATTENTION: "attention", MEMORY: "memory"}
MIN_SHARE = 0.01  # a class under this share of the kernel time (either side) is not fitted
TRACE_ROUNDS = 30
TRACE_TOLERANCE = 1e-9

Simulate = Callable[[Mapping[str, float]], Mapping[str, float]]


class TraceFit(NamedTuple):
    """The GEMM, attention and memory-bound multipliers set from a trace: the values,
    the measured kernel seconds per iteration by class, the simulated ones at the
    built-in values and at the fit, what was freed, what ended on a bound, notes."""

    values: dict[str, float]
    measured_s: dict[str, float]
    builtin_s: dict[str, float]
    fitted_s: dict[str, float]
    freed: tuple[str, ...]
    at_bound: tuple[str, ...]
    notes: tuple[str, ...]
    iterations: int


def fit_trace(
    measured: TraceMeasurement,
    simulate: Simulate,
    bounds: Mapping[str, tuple[float, float]],
) -> TraceFit:
    """Multipliers of the GEMM, attention and memory-bound efficiencies that make the
    simulated kernel time of each class (``simulate(values)``: seconds per iteration by
    class for the traced rank's stage) equal the trace's mean: each multiplier is
    updated by simulated / measured (a kernel's time is its work over the efficiency
    times the multiplier) until no class moves by more than 1e-9, within ``bounds`` (by
    parameter). A class with under 1 % of the kernel time on either side is not fitted
    (said in a note)."""
    kernels = measured.mean_kernel_s()
    target = {c: kernels.get(c, 0.0) for c in TRACE_PARAMETERS}
    builtin = dict(simulate({}))
    notes = []
    freed = []
    for cls, name in TRACE_PARAMETERS.items():
        share_measured = target[cls] / (sum(target.values()) or 1.0)
        share_simulated = builtin.get(cls, 0.0) / (sum(builtin.values()) or 1.0)
        if share_measured < MIN_SHARE or share_simulated < MIN_SHARE:
            notes.append(
                f"{name}: {100 * share_measured:.1f} % of the trace's compute kernel time, "
                f"{100 * share_simulated:.1f} % of the simulated; too little to fit, kept"
            )
        else:
            freed.append(cls)
    values = {TRACE_PARAMETERS[c]: 1.0 for c in freed}
    simulated = builtin
    for _ in range(TRACE_ROUNDS if freed else 0):
        moved = 0.0
        for cls in freed:
            name = TRACE_PARAMETERS[cls]
            low, high = bounds[name]
            ratio = simulated[cls] / target[cls]
            value = min(max(values[name] * ratio, low), high)
            moved = max(moved, abs(value / values[name] - 1.0))
            values[name] = value
        simulated = dict(simulate(values))
        if moved < TRACE_TOLERANCE:
            break
    at_bound = tuple(
        TRACE_PARAMETERS[c]
        for c in freed
        if values[TRACE_PARAMETERS[c]] in bounds[TRACE_PARAMETERS[c]]
    )
    for name in at_bound:
        notes.append(
            f"{name} ended on a bound ({values[name]:.3g}): the trace asks for more than it "
            "may give; what it stands for does not explain the kernel time alone"
        )
    return TraceFit(
        values,
        target,
        builtin,
        simulated,
        tuple(TRACE_PARAMETERS[c] for c in freed),
        at_bound,
        tuple(notes),
        len(measured.iterations),
    )


def trace_fit_text(fit: TraceFit, trace: str, stage: int) -> str:
    lines = [
        f"stepsim calibrate · kernel classes fitted on {trace} (stage {stage}; mean of "
        f"{fit.iterations} iteration{'s' if fit.iterations > 1 else ''})",
        f"  {'class':<24}{'measured':>12}{'built-in':>12}{'fitted':>12}  parameter",
    ]
    for cls, name in TRACE_PARAMETERS.items():
        value = f"x{fit.values[name]:.4g}" if name in fit.values else "kept"
        lines.append(
            f"  {CLASS_LABELS[cls]:<24}{1e3 * fit.measured_s[cls]:>10.2f}ms"
            f"{1e3 * fit.builtin_s.get(cls, 0.0):>10.2f}ms"
            f"{1e3 * fit.fitted_s.get(cls, 0.0):>10.2f}ms  {name} {value}"
        )
    lines += [f"  note: {n}" for n in fit.notes]
    return "\n".join(lines)

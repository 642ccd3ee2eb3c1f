"""What a fit on measured iterations (`stepsim calibrate --measured`) may change, and
the record of one fit: the schema of a calibration file's ``[fit]`` table.

Each parameter stands for one mechanism of the model and is a multiplier of a built-in
constant (1: the built-in), but the host overhead, which is seconds (0: none):

- ``gemm``: the GEMMs' efficiency (``gemm_efficiency``, and the FP8 GEMMs' efficiencies
  of an FP8 run): every linear layer, the logits, and the unfused attention's score
  and context GEMMs;
- ``attention``: the attention core's matmul rate on top of that: a flash kernel's
  matmuls and exponentials (its fitted ``forward_efficiency`` and
  ``backward_efficiency``, or the score GEMM's shape efficiency where a GPU has no
  attention constants), or the unfused path's score and context GEMM kernels (their
  time divided by it);
- ``memory``: element-wise kernels' share of HBM bandwidth (``memory_efficiency``:
  norms, dropout, activations, softmax, the loss, optimizer);
- ``nvlink`` and ``nic``: the fraction of line rate transfers reach inside a node
  (``cluster.nvlink_efficiency``) and between nodes (``cluster.nic_efficiency``);
- ``overhead``: host time (kernel launches, Python, the framework's bookkeeping) before
  each pipeline instruction's compute: every forward, backward and weight pass of each
  micro-batch and chunk waits this long after its input has arrived
  (emit/lowering.py).

Bounds are physical where physics gives one (no efficiency above 1; GEMMs below 0.95
of the peak) and otherwise wide ones stated here. The fit itself is
stepsim.calibration.measured; the loader applies a fit to a scenario
(loader.apply_fit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import ScenarioError


class Parameter(NamedTuple):
    """One fitted parameter: its name (the CLI's and the report's), the key the
    calibration file writes, what it scales, the mechanism it stands for, and its
    bounds: a multiplier between ``low`` and ``high`` (and such that the scaled constant
    stays at most ``ceiling``), or seconds between them for the overhead; ``prior`` is
    the spread the fit allows it without evidence (log-space for a multiplier)."""

    name: str
    key: str
    scales: str
    mechanism: str
    low: float
    high: float
    ceiling: float | None
    prior: float

    @property
    def seconds(self) -> bool:
        return self.name == OVERHEAD


OVERHEAD = "overhead"
# the fit's spread allowed without evidence: kernel fractions +-25 % (one sigma, log-space);
# network fractions +-50 % (clusters differ most there); host time 1 ms per instruction
PARAMETERS: dict[str, Parameter] = {
    p.name: p
    for p in (
        Parameter(
            "gemm",
            "gemm_scale",
            "gemm_efficiency (and FP8 GEMMs' efficiencies)",
            "GEMM efficiency: every linear layer's, the logits' and the unfused score GEMMs'",
            0.5,
            2.0,
            0.95,
            0.25,
        ),
        Parameter(
            "attention",
            "attention_scale",
            "the attention core's matmul rate",
            "attention efficiency: the flash kernels' forward/backward efficiency, or the "
            "unfused score and context GEMMs",
            0.25,
            4.0,
            1.0,
            0.25,
        ),
        Parameter(
            "memory",
            "memory_scale",
            "memory_efficiency",
            "memory-bound kernels' share of HBM bandwidth (norms, dropout, softmax, loss)",
            0.3,
            2.0,
            1.0,
            0.25,
        ),
        Parameter(
            "nvlink",
            "nvlink_scale",
            "cluster.nvlink_efficiency",
            "network efficiency inside a node (NVLink / NVSwitch)",
            0.2,
            2.0,
            1.0,
            0.5,
        ),
        Parameter(
            "nic",
            "nic_scale",
            "cluster.nic_efficiency",
            "network efficiency between nodes (NICs, InfiniBand / RoCE)",
            0.1,
            2.0,
            1.0,
            0.5,
        ),
        Parameter(
            OVERHEAD,
            "instruction_overhead_s",
            "host seconds per pipeline instruction",
            "framework overhead: host time before each forward, backward and weight pass of "
            "each micro-batch",
            0.0,
            0.01,
            None,
            0.001,
        ),
    )
}


class Latency(NamedTuple):
    """A latency a fit on nccl-tests logs (`stepsim calibrate --nccl-tests`) may set, in
    microseconds, in place of the cluster's: its name, the calibration file's key, the
    cluster key it replaces, the mechanism, its bounds and its prior spread (linear,
    around the cluster's own value)."""

    name: str
    key: str
    replaces: str
    mechanism: str
    low_us: float
    high_us: float
    prior_us: float


# nccl-tests' smallest messages take 10-150 us across 2-16 nodes (the logs under
# scenarios/validation/collectives/nccl_logs/); the bounds are wide of that, the priors
# about a built-in value's size
LATENCIES: dict[str, Latency] = {
    la.name: la
    for la in (
        Latency(
            "base_latency",
            "collective_base_latency_us",
            "cluster.collective_base_latency_us",
            "a collective's fixed software cost: launch, NCCL's proxy and protocol set-up",
            0.0,
            1000.0,
            20.0,
        ),
        Latency(
            "nvlink_latency",
            "nvlink_latency_us",
            "cluster.nvlink_latency_us",
            "one NVLink hop's latency (each ring or tree step inside a node)",
            0.0,
            50.0,
            2.0,
        ),
        Latency(
            "ib_latency",
            "ib_latency_us",
            "cluster.ib_latency_us",
            "one InfiniBand / RoCE hop's latency (each step between nodes)",
            0.0,
            100.0,
            5.0,
        ),
    )
}
# what a fit on nccl-tests logs may free: the network's multipliers and the latencies
NETWORK_PARAMETERS: tuple[str, ...] = ("nvlink", "nic", *LATENCIES)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredFit:
    """A fit on measured iterations: the parameters (multipliers, 1 the built-in;
    ``overhead_s`` seconds, 0 none) and what the fit says of itself, which every output
    that uses it repeats: the GPU and node it holds for, how many measurements it rests
    on, their leave-one-out error (mean absolute relative error of each run predicted
    from a fit on the others; None with one run), the fit's own rms error, which
    parameters were freed and which ended on a bound, how it was made, and the file."""

    gemm: float = 1.0
    attention: float = 1.0
    memory: float = 1.0
    nvlink: float = 1.0
    nic: float = 1.0
    overhead_s: float = 0.0
    # latencies fitted on nccl-tests logs (LATENCIES), microseconds; None: the cluster's
    collective_base_latency_us: float | None = None
    nvlink_latency_us: float | None = None
    ib_latency_us: float | None = None
    gpu: str = ""
    node: str = ""
    measurements: int = 0
    loo_error: float | None = None
    fit_error: float | None = None
    freed: tuple[str, ...] = ()
    at_bound: tuple[str, ...] = ()
    # the nccl-tests evidence: logs, message sizes, the rms of ln(simulated / measured)
    # over the sizes at the fit, the same of each log predicted from a fit on the others
    # (None: one log), and what that fit freed and left on a bound (NETWORK_PARAMETERS)
    collective_logs: int = 0
    collective_sizes: int = 0
    collective_error: float | None = None
    collective_loo_error: float | None = None
    collective_freed: tuple[str, ...] = ()
    collective_at_bound: tuple[str, ...] = ()
    # the profiler-trace evidence (`stepsim calibrate --trace`): its iterations, and the
    # kernel classes it set (gemm, attention, memory) and left on a bound
    trace_iterations: int = 0
    trace_freed: tuple[str, ...] = ()
    trace_at_bound: tuple[str, ...] = ()
    source: str = ""
    file: str = ""

    def __post_init__(self) -> None:
        for name, p in PARAMETERS.items():
            value = self.value(name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or not p.low <= value <= p.high:
                raise ScenarioError(
                    key=f"fit.{p.key}",
                    value=value,
                    rule=f"must be between {p.low:g} and {p.high:g}",
                )
        for la in LATENCIES.values():
            latency = self.latency_us(la.name)
            ok = latency is None or (
                isinstance(latency, int | float)
                and not isinstance(latency, bool)
                and math.isfinite(latency)
                and la.low_us <= latency <= la.high_us
            )
            if not ok:
                raise ScenarioError(
                    key=f"fit.{la.key}",
                    value=latency,
                    rule=f"must be between {la.low_us:g} and {la.high_us:g} microseconds",
                )
        for name in (*self.freed, *self.at_bound, *self.trace_freed, *self.trace_at_bound):
            if name not in PARAMETERS:
                raise ScenarioError(
                    key="fit.freed", value=name, rule=f"must be one of {', '.join(PARAMETERS)}"
                )
        for name in (*self.collective_freed, *self.collective_at_bound):
            if name not in NETWORK_PARAMETERS:
                raise ScenarioError(
                    key="fit.collective_freed",
                    value=name,
                    rule=f"must be one of {', '.join(NETWORK_PARAMETERS)}",
                )
        if self.measurements < 0 or self.collective_sizes < 0 or self.collective_logs < 0:
            raise ScenarioError(
                key="fit.measurements",
                value=min(self.measurements, self.collective_sizes, self.collective_logs),
                rule="counts must be >= 0",
            )

    def then(self, top: MeasuredFit) -> MeasuredFit:
        """This fit with ``top``, a fit made on scenarios this one was applied to, on top:
        the multipliers multiplied, ``top``'s overhead, this fit's latencies unless
        ``top`` sets its own, each fit's evidence and errors kept (``top``'s measured
        runs, this fit's collectives and trace unless ``top`` has its own)."""
        values: dict[str, Any] = {
            name: self.value(name) * top.value(name) for name in PARAMETERS if name != OVERHEAD
        }
        latencies: dict[str, Any] = {
            la.key: top.latency_us(n) if top.latency_us(n) is not None else self.latency_us(n)
            for n, la in LATENCIES.items()
        }
        mine = self if not top.collective_logs else top
        traced = self if not top.trace_iterations else top
        runs = top if top.measurements else self
        return MeasuredFit(
            **values,
            overhead_s=top.overhead_s or self.overhead_s,
            **latencies,
            gpu=top.gpu or self.gpu,
            node=top.node or self.node,
            measurements=runs.measurements,
            loo_error=runs.loo_error,
            fit_error=runs.fit_error,
            freed=runs.freed,
            at_bound=runs.at_bound,
            collective_logs=mine.collective_logs,
            collective_sizes=mine.collective_sizes,
            collective_error=mine.collective_error,
            collective_loo_error=mine.collective_loo_error,
            collective_freed=mine.collective_freed,
            collective_at_bound=mine.collective_at_bound,
            trace_iterations=traced.trace_iterations,
            trace_freed=traced.trace_freed,
            trace_at_bound=traced.trace_at_bound,
            source="; ".join(x for x in (self.source, top.source) if x),
        )

    def latency_us(self, name: str) -> float | None:
        """A fitted latency by its name (LATENCIES), microseconds; None: the cluster's."""
        value: float | None = getattr(self, LATENCIES[name].key)
        return value

    def value(self, name: str) -> float:
        """A parameter's value by its name (PARAMETERS)."""
        return self.overhead_s if name == OVERHEAD else getattr(self, name)

    def values(self) -> dict[str, float]:
        return {name: self.value(name) for name in PARAMETERS}

    def describe(self) -> str:
        """What the fit moved, in a few words: ``gemm x0.93, overhead 120 us``."""
        parts = []
        for name in PARAMETERS:
            value = self.value(name)
            if name == OVERHEAD and value:
                parts.append(f"overhead {value * 1e6:.4g} us")
            elif name != OVERHEAD and value != 1.0:
                parts.append(f"{name} x{value:.3g}")
        for name in LATENCIES:
            latency = self.latency_us(name)
            if latency is not None:
                parts.append(f"{name.replace('_', ' ')} {latency:.3g} us")
        return ", ".join(parts) or "no parameter moved"

    def evidence(self) -> str:
        """What the fit rests on: ``2 nccl-tests logs (62 sizes) and 3 measured runs``."""
        parts = []
        if self.collective_logs:
            logs = "log" if self.collective_logs == 1 else "logs"
            parts.append(
                f"{self.collective_logs} nccl-tests {logs} ({self.collective_sizes} sizes)"
            )
        if self.trace_iterations:
            its = "iteration" if self.trace_iterations == 1 else "iterations"
            parts.append(f"a profiler trace ({self.trace_iterations} {its})")
        if self.measurements:
            runs = "run" if self.measurements == 1 else "runs"
            parts.append(f"{self.measurements} measured {runs}")
        return " and ".join(parts) or "nothing measured"

    def label(self) -> str:
        """One line for the run summary and metrics.json: the evidence and its error."""
        return (
            f"fitted on {self.evidence()} ({self.gpu}, {self.node}): "
            f"{self.describe()}; {self.errors()}"
        )

    def errors(self) -> str:
        """How well the fit predicts: the measured runs' leave-one-out error, the
        collectives' rms error (and from the other logs)."""
        errors = []
        if self.measurements:
            errors.append(
                f"leave-one-out error {100 * self.loo_error:.1f} %"
                if self.loo_error is not None
                else "no leave-one-out error (one run)"
            )
        if self.collective_logs:
            error = self.collective_error or 0.0
            text = f"collectives within {100 * error:.1f} % rms"
            if self.collective_loo_error is not None:
                text += f" ({100 * self.collective_loo_error:.1f} % from the other logs)"
            errors.append(text)
        return ", ".join(errors) or "no error measured"

    def record(self) -> dict[str, object]:
        """The fit as metrics.json and the --json documents carry it."""
        return {
            "file": self.file,
            "gpu": self.gpu,
            "node": self.node,
            "measurements": self.measurements,
            "loo_error": self.loo_error,
            "fit_error": self.fit_error,
            "parameters": {
                **{PARAMETERS[n].key: v for n, v in self.values().items()},
                **{la.key: self.latency_us(n) for n, la in LATENCIES.items()},
            },
            "freed": list(self.freed),
            "at_bound": list(self.at_bound),
            "collective_logs": self.collective_logs,
            "collective_sizes": self.collective_sizes,
            "collective_error": self.collective_error,
            "collective_loo_error": self.collective_loo_error,
            "collective_freed": list(self.collective_freed),
            "collective_at_bound": list(self.collective_at_bound),
            "trace_iterations": self.trace_iterations,
            "trace_freed": list(self.trace_freed),
            "trace_at_bound": list(self.trace_at_bound),
        }

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
from typing import NamedTuple

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
    gpu: str = ""
    node: str = ""
    measurements: int = 0
    loo_error: float | None = None
    fit_error: float | None = None
    freed: tuple[str, ...] = ()
    at_bound: tuple[str, ...] = ()
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
        for name in (*self.freed, *self.at_bound):
            if name not in PARAMETERS:
                raise ScenarioError(
                    key="fit.freed", value=name, rule=f"must be one of {', '.join(PARAMETERS)}"
                )

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
        return ", ".join(parts) or "no parameter moved"

    def label(self) -> str:
        """One line for the run summary and metrics.json: the evidence and its error."""
        loo = (
            f"leave-one-out error {100 * self.loo_error:.1f} %"
            if self.loo_error is not None
            else "no leave-one-out error (one measurement)"
        )
        runs = "run" if self.measurements == 1 else "runs"
        return (
            f"fitted on {self.measurements} measured {runs} ({self.gpu}, {self.node}): "
            f"{self.describe()}; {loo}"
        )

    def record(self) -> dict[str, object]:
        """The fit as metrics.json and the --json documents carry it."""
        return {
            "file": self.file,
            "gpu": self.gpu,
            "node": self.node,
            "measurements": self.measurements,
            "loo_error": self.loo_error,
            "fit_error": self.fit_error,
            "parameters": {PARAMETERS[n].key: v for n, v in self.values().items()},
            "freed": list(self.freed),
            "at_bound": list(self.at_bound),
        }

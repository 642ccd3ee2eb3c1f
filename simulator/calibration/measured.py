"""A few interpretable parameters fitted on measured iteration times (`stepsim calibrate
--measured`), and how well they predict runs they were not fitted on.

The parameters are scenario/fitted.py's: multipliers of the built-in GEMM, attention,
memory-bound, NVLink and NIC efficiencies, and a host overhead in seconds per pipeline
instruction. Each is moved in a normalized coordinate u: ln(multiplier) / prior for a
multiplier, seconds / prior for the overhead (``Parameter.prior``: how far it may plausibly
be from the built-in without evidence). The fit minimizes

    sum_i ((ln T_i(u) - ln M_i) / DATA_SIGMA)^2 + sum_j u_j^2

over the freed parameters, each within its bounds: the squared log error of the simulated
(T) against the measured (M) iteration times, plus a log-space penalty toward the built-in
values. DATA_SIGMA, 2 %, is how closely a measured iteration time is taken to be known;
with it a parameter that the runs move by s per unit u is pulled back toward its built-in
by the factor 1 / (1 + (DATA_SIGMA / s)^2) of the full correction, which is small for
any parameter the runs are sensitive to.

Which parameters are freed: fewer than there are runs (one run: one parameter), chosen
greedily on the linearized problem at the built-in point: first the one that alone best
explains the runs' errors, then the one that best explains what is left, as long as
each lowers the objective by at least a tenth and the runs' rms error is still above
0.1 %. Sensitivities are one-sided finite differences (the simulator is deterministic);
the fit is Gauss-Newton on those sensitivities (refreshed at the current point when a
step gains less than a quarter of what they predict) with the bounds held by an active
set. Leave-one-out: each run predicted from the whole procedure (choice included) run on
the others. Nothing here simulates: ``evaluate`` (given by the caller: the CLI's runs
through `run(..., spans=False)`, a worker pool, or a test's closed form) turns scenarios
into iteration times; every evaluation is kept, so a point is simulated once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..scenario import Scenario
from ..scenario.fitted import OVERHEAD, PARAMETERS, MeasuredFit, Parameter
from ..scenario.loader import apply_fit, node_kind

DATA_SIGMA = 0.02  # a measured iteration time's relative uncertainty (one sigma)
FD_LOG_STEP = 0.05  # a multiplier's finite-difference step: 5 % (downward)
FD_OVERHEAD_S = 2e-4  # the overhead's: 0.2 ms per instruction
SMALL_RMS = 1e-3  # runs within 0.1 % rms need nothing freed
MIN_GAIN = 0.1  # a parameter is freed only if it lowers the objective by a tenth
MAX_STEPS = 30
TOLERANCE_U = 1e-6  # the fit stops when no coordinate moves more than this (in priors)
TOLERANCE_GAIN = 1e-6  # or when a step would lower the objective by less than this

Evaluate = Callable[[Sequence[Scenario]], Sequence[float]]


class MeasuredRun(NamedTuple):
    """One measured run: its name, its scenario (loaded, uncalibrated by the fit) and the
    measured iteration time."""

    id: str
    scenario: Scenario
    measured_s: float


@dataclass
class Fit:
    """One fit on a set of runs: the freed parameters' values, what it predicts, and what
    it says of itself (notes: under-determined, at a bound)."""

    fit: MeasuredFit
    point: dict[str, float]  # the freed parameters' normalized coordinates (u)
    runs: list[int]  # indices into the evaluator's runs
    freed: tuple[str, ...]
    simulated_s: list[float]  # at the fitted values, per run of ``runs``
    spread: dict[str, float]  # each freed parameter's one-sigma uncertainty (its units)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything `stepsim calibrate` prints and writes."""

    runs: list[MeasuredRun]
    builtin_s: list[float]  # simulated at the built-in values
    sensitivity: dict[str, list[float]]  # per parameter, per run: d ln T / d ln x (or / d s)
    bounds: dict[str, tuple[float, float]]
    full: Fit
    loo_predicted_s: list[float] | None  # each run from a fit on the others; None: one run
    loo_freed: list[tuple[str, ...]] | None
    simulations: int = 0  # points simulated (each run at each parameter values once)

    @property
    def loo_error(self) -> float | None:
        if self.loo_predicted_s is None:
            return None
        return mean_abs_error(self.loo_predicted_s, [r.measured_s for r in self.runs])

    @property
    def builtin_error(self) -> float:
        return mean_abs_error(self.builtin_s, [r.measured_s for r in self.runs])

    @property
    def fit_error(self) -> float:
        """The fitted model's rms relative error over the runs it was fitted on."""
        errors = [
            s / r.measured_s - 1 for s, r in zip(self.full.simulated_s, self.runs, strict=True)
        ]
        return math.sqrt(sum(e * e for e in errors) / len(errors))


def mean_abs_error(simulated: Sequence[float], measured: Sequence[float]) -> float:
    return sum(abs(s / m - 1) for s, m in zip(simulated, measured, strict=True)) / len(measured)


def bounds_of(runs: Sequence[MeasuredRun]) -> dict[str, tuple[float, float]]:
    """Each parameter's bounds on these runs: its own (PARAMETERS), and for a multiplier
    no higher than keeps the constant it scales at most its ceiling on every run."""
    scenarios = [run.scenario for run in runs]
    largest = {
        "gemm": max(s.kernel_constants.gemm_efficiency for s in scenarios),
        "memory": max(s.kernel_constants.memory_efficiency for s in scenarios),
        "nvlink": max(s.cluster.nvlink_efficiency for s in scenarios),
        "nic": max(s.cluster.nic_efficiency for s in scenarios),
    }
    attention = [s.cluster.gpu.attention_kernels for s in scenarios]
    flash = [max(a.forward_efficiency, a.backward_efficiency) for a in attention if a]
    if flash:
        largest["attention"] = max(flash)
    out = {}
    for name, p in PARAMETERS.items():
        high = p.high
        if p.ceiling is not None and name in largest:
            high = min(high, p.ceiling / largest[name])
        out[name] = (p.low, max(high, 1.0 if not p.seconds else p.low))
    return out


def to_value(p: Parameter, u: float, bounds: tuple[float, float]) -> float:
    value = u * p.prior if p.seconds else math.exp(u * p.prior)
    return min(max(value, bounds[0]), bounds[1])


def to_u(p: Parameter, value: float) -> float:
    return value / p.prior if p.seconds else math.log(value) / p.prior


class Evaluator:
    """The runs' simulated iteration times at parameter values, each point simulated
    once (kept by run and values)."""

    def __init__(
        self,
        runs: Sequence[MeasuredRun],
        evaluate: Evaluate,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.runs = list(runs)
        self.evaluate = evaluate
        self.progress = progress
        self.known: dict[tuple[int, tuple[float, ...]], float] = {}
        self.bounds = bounds_of(runs)
        self.simulations = 0

    def values(self, u: dict[str, float]) -> tuple[float, ...]:
        return tuple(
            to_value(p, u.get(name, 0.0), self.bounds[name]) for name, p in PARAMETERS.items()
        )

    def times(self, points: Sequence[tuple[int, dict[str, float]]]) -> list[float]:
        """Simulated seconds of run i at u, for each (i, u); what is not known yet is
        simulated in one batch."""
        keys = [(i, self.values(u)) for i, u in points]
        todo = list(dict.fromkeys(k for k in keys if k not in self.known))
        if todo:
            scenarios = [
                apply_fit(self.runs[i].scenario, fit_of(dict(zip(PARAMETERS, values, strict=True))))
                for i, values in todo
            ]
            for key, seconds in zip(todo, self.evaluate(scenarios), strict=True):
                self.known[key] = float(seconds)
            self.simulations += len(todo)
            if self.progress is not None:
                self.progress(self.simulations)
        return [self.known[k] for k in keys]

    def residuals(self, runs: Sequence[int], u: dict[str, float]) -> np.ndarray:
        """ln(simulated / measured) of each run at u."""
        times = self.times([(i, u) for i in runs])
        return np.array(
            [math.log(t / self.runs[i].measured_s) for t, i in zip(times, runs, strict=True)]
        )

    def jacobian(
        self, runs: Sequence[int], names: Sequence[str], u: dict[str, float]
    ) -> np.ndarray:
        """d residual / d u of each run (rows) for each parameter (columns) at u: one-sided
        differences, stepping inward from the nearer bound."""
        base = self.residuals(runs, u)
        steps = {}
        points = []
        for name in names:
            p = PARAMETERS[name]
            h = FD_OVERHEAD_S / p.prior if p.seconds else -FD_LOG_STEP / p.prior
            low, high = self.u_bounds(name)
            here = u.get(name, 0.0)
            if not low <= here + h <= high:
                h = -h
            steps[name] = h
            points += [(i, {**u, name: here + h}) for i in runs]
        times = self.times(points)
        out = np.zeros((len(runs), len(names)))
        for j, name in enumerate(names):
            moved = times[j * len(runs) : (j + 1) * len(runs)]
            for k, (t, i) in enumerate(zip(moved, runs, strict=True)):
                out[k, j] = (math.log(t / self.runs[i].measured_s) - base[k]) / steps[name]
        return out

    def u_bounds(self, name: str) -> tuple[float, float]:
        p = PARAMETERS[name]
        low, high = self.bounds[name]
        return to_u(p, low), to_u(p, high)


def fit_of(values: dict[str, float]) -> MeasuredFit:
    """The parameters' values (by PARAMETERS' names) as a MeasuredFit, no label."""
    return MeasuredFit(
        gemm=values["gemm"],
        attention=values["attention"],
        memory=values["memory"],
        nvlink=values["nvlink"],
        nic=values["nic"],
        overhead_s=values[OVERHEAD],
    )


def objective(r: np.ndarray, u: np.ndarray) -> float:
    return float(np.sum((r / DATA_SIGMA) ** 2) + np.sum(u**2))


def bounded_solution(
    J: np.ndarray, r: np.ndarray, lows: np.ndarray, highs: np.ndarray
) -> tuple[np.ndarray, float]:
    """The regularized linear least squares min |(r + J u) / sigma|^2 + |u|^2 with each
    u_j within [lows_j, highs_j] (an active set: a coordinate that leaves its bounds is
    held on the bound and the others solved again), and its objective."""
    n = J.shape[1]
    u, held = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(n + 1):
        free = ~held
        if np.any(free):
            Jf = J[:, free]
            rest = r + J[:, held] @ u[held]
            A = Jf.T @ Jf / DATA_SIGMA**2 + np.eye(int(free.sum()))
            u[free] = -np.linalg.solve(A, Jf.T @ rest / DATA_SIGMA**2)
        out = free & ((u < lows) | (u > highs))
        u = np.clip(u, lows, highs)
        if not np.any(out):
            break
        held |= out
    return u, objective(r + J @ u, u)


def choose(
    J: np.ndarray,
    r: np.ndarray,
    names: Sequence[str],
    most: int,
    lows: np.ndarray,
    highs: np.ndarray,
) -> list[str]:
    """The parameters to free, greedily on the linearized problem within the bounds
    (module docstring)."""
    chosen: list[int] = []
    current = objective(r, np.zeros(0))
    left = r  # the runs' log errors the chosen parameters leave, linearized
    while len(chosen) < most:
        if math.sqrt(float(np.mean(left**2))) < SMALL_RMS:
            break
        best, best_objective = -1, current
        for j in range(len(names)):
            if j in chosen or not np.any(J[:, j]):
                continue
            columns = [*chosen, j]
            _, value = bounded_solution(J[:, columns], r, lows[columns], highs[columns])
            if value < best_objective - 1e-12:
                best, best_objective = j, value
        if best < 0 or best_objective > (1 - MIN_GAIN) * current:
            break
        chosen.append(best)
        current = best_objective
        u, _ = bounded_solution(J[:, chosen], r, lows[chosen], highs[chosen])
        left = r + J[:, chosen] @ u
    return [names[j] for j in sorted(chosen)]


def fit_runs(
    ev: Evaluator,
    runs: Sequence[int],
    sensitivity: np.ndarray,
    free: Sequence[str] | None = None,
) -> Fit:
    """Fit on ``runs`` (indices): the freed parameters (``free``, or `choose`'s from
    ``sensitivity``, those runs' d residual / d u at the built-in point for every
    parameter) by Gauss-Newton within their bounds."""
    names = list(PARAMETERS)
    r0 = ev.residuals(runs, {})
    notes: list[str] = []
    if free is None:
        most = 1 if len(runs) == 1 else min(len(runs) - 1, len(names))
        lows = np.array([ev.u_bounds(n)[0] for n in names])
        highs = np.array([ev.u_bounds(n)[1] for n in names])
        freed = choose(sensitivity, r0, names, most, lows, highs)
    else:
        freed = list(free)
    columns = [names.index(n) for n in freed]
    J = sensitivity[:, columns]
    u = np.zeros(len(freed))
    lows = np.array([ev.u_bounds(n)[0] for n in freed])
    highs = np.array([ev.u_bounds(n)[1] for n in freed])

    def point(v: np.ndarray) -> dict[str, float]:
        return dict(zip(freed, map(float, v), strict=True))

    r = r0
    value = objective(r, u)
    refreshed = 0
    for _ in range(MAX_STEPS if freed else 0):
        step = bounded_solution(J, r - J @ u, lows, highs)[0] - u
        if not np.any(np.abs(step) > TOLERANCE_U):
            break
        predicted = value - objective(r + J @ step, u + step)
        if predicted < TOLERANCE_GAIN:
            break
        trial = np.clip(u + step, lows, highs)
        r_trial = ev.residuals(runs, point(trial))
        gained = value - objective(r_trial, trial)
        if gained > 0 and (gained >= 0.25 * predicted or refreshed >= 3):
            u, r, value = trial, r_trial, objective(r_trial, trial)
            continue
        if refreshed < 3:  # the sensitivities are off here: measure them again
            J = ev.jacobian(runs, freed, point(u))
            refreshed += 1
            if gained > 0:
                u, r, value = trial, r_trial, objective(r_trial, trial)
            continue
        break
    values = {name: to_value(p, 0.0, ev.bounds[name]) for name, p in PARAMETERS.items()}
    for name, x in zip(freed, u, strict=True):
        values[name] = to_value(PARAMETERS[name], float(x), ev.bounds[name])
    at_bound = tuple(
        name
        for name, x, lo, hi in zip(freed, u, lows, highs, strict=True)
        if min(abs(x - lo), abs(x - hi)) < 1e-6
    )
    # each freed parameter's one-sigma spread: the inverse of the objective's curvature
    spread = {}
    if freed:
        covariance = np.linalg.inv(J.T @ J / DATA_SIGMA**2 + np.eye(len(freed)))
        for j, name in enumerate(freed):
            sigma_u = math.sqrt(covariance[j, j])
            p = PARAMETERS[name]
            spread[name] = sigma_u * p.prior * (1 if p.seconds else values[name])
            if sigma_u > 0.5:
                notes.append(
                    f"{name} is under-determined: the runs narrow it to only "
                    f"{100 * sigma_u:.0f} % of its prior spread; the penalty toward the "
                    "built-in decides the rest"
                )
        if len(freed) > 1:
            singular = np.linalg.svd(J / DATA_SIGMA, compute_uv=False)
            if singular[-1] < 1.0:
                notes.append(
                    f"under-determined: the runs move {', '.join(freed)} together (they "
                    "cannot tell them apart); the penalty toward the built-ins chose the mix"
                )
    for name in at_bound:
        low, high = ev.bounds[name]
        side = "lower" if abs(values[name] - low) <= abs(values[name] - high) else "upper"
        notes.append(
            f"{name} ended on its {side} bound ({values[name]:.4g}): the runs ask for more "
            "than the bound allows; what it stands for does not explain them alone"
        )
    fit = replace(fit_of(values), freed=tuple(freed), at_bound=at_bound)
    simulated = ev.times([(i, point(u)) for i in runs])
    return Fit(fit, point(u), list(runs), tuple(freed), simulated, spread, notes)


def calibrate(
    runs: Sequence[MeasuredRun],
    evaluate: Evaluate,
    free: Sequence[str] | None = None,
    *,
    leave_one_out: bool = True,
    progress: Callable[[int], None] | None = None,
    fixed: Sequence[str] = (),
) -> Report:
    """Fit on every run; then, with two runs or more and ``leave_one_out``, each run from
    a fit on the others. ``free``: the parameters to free instead of the greedy choice
    (the same for the leave-one-out fits); ``fixed``: parameters the choice may not
    free (what a fit on nccl-tests logs set already)."""
    return calibrate_on(
        Evaluator(runs, evaluate, progress), free, leave_one_out=leave_one_out, fixed=fixed
    )


def calibrate_on(
    ev: Evaluator,
    free: Sequence[str] | None = None,
    *,
    leave_one_out: bool = True,
    fixed: Sequence[str] = (),
) -> Report:
    """`calibrate` with an evaluator of the runs given (its points kept for more fits)."""
    runs = ev.runs
    every = list(range(len(runs)))
    builtin = ev.times([(i, {}) for i in every])
    sensitivities = ev.jacobian(every, list(PARAMETERS), {})
    J = sensitivities.copy()  # what the choice sees: a fixed parameter moves nothing
    for name in fixed:
        J[:, list(PARAMETERS).index(name)] = 0.0
    full = fit_runs(ev, every, J, free)
    if len(runs) == 1 and full.freed and free is None:
        alike_names: list[str] = []  # what else would explain the one run within its bounds
        r0 = ev.residuals(every, {})
        for j, name in enumerate(PARAMETERS):
            if name in full.freed or not np.any(J[:, j]):
                continue
            low, high = ev.u_bounds(name)
            u, _ = bounded_solution(J[:, [j]], r0, np.array([low]), np.array([high]))
            if abs(float((r0 + J[:, [j]] @ u)[0])) < 0.01:
                alike_names.append(name)
        alike = (
            f"{', '.join(alike_names)} would explain it as well (within 1 %)"
            if alike_names
            else "no other parameter would explain it within its bounds"
        )
        full.notes.insert(
            0,
            f"under-determined: one run, so one parameter; {full.freed[0]} was chosen as "
            f"the one that explains it with the smallest move; {alike}",
        )
    elif free is not None and len(free) >= len(runs):
        full.notes.insert(
            0,
            f"under-determined: {len(free)} parameters freed on {len(runs)} runs; the "
            "penalty toward the built-ins decides what the runs cannot",
        )
    predicted = freed_loo = None
    if leave_one_out and len(runs) > 1:
        predicted, freed_loo = [], []
        for i in every:
            others = [k for k in every if k != i]
            loo = fit_runs(ev, others, J[others], free)
            predicted.append(ev.times([(i, loo.point)])[0])
            freed_loo.append(loo.freed)
    sensitivity = {}
    for j, (name, p) in enumerate(PARAMETERS.items()):
        per_u = sensitivities[:, j]
        sensitivity[name] = [float(x / p.prior) for x in per_u]  # per ln x, or per second
    return Report(
        list(runs), builtin, sensitivity, ev.bounds, full, predicted, freed_loo, ev.simulations
    )


def measured_fit(report: Report, source: str) -> MeasuredFit:
    """The fit as the calibration file records it."""
    scenario = report.runs[0].scenario
    fit = report.full.fit
    return replace(
        fit,
        gpu=scenario.cluster.gpu.name,
        node=node_kind(scenario.cluster),
        measurements=len(report.runs),
        loo_error=report.loo_error,
        fit_error=report.fit_error,
        freed=fit.freed,
        at_bound=fit.at_bound,
        source=source,
    )


# -- text -------------------------------------------------------------------------------


def _value_text(name: str, value: float) -> str:
    return f"{value * 1e6:.4g} us" if PARAMETERS[name].seconds else f"x{value:.4g}"


def _bound_text(name: str, bounds: tuple[float, float]) -> str:
    low, high = bounds
    if PARAMETERS[name].seconds:
        return f"{low * 1e6:g}..{high * 1e6:g} us"
    return f"x{low:.3g}..x{high:.3g}"


def report_text(report: Report, out: str | None = None) -> str:
    """What `stepsim calibrate` prints: the runs before and after, each parameter's
    sensitivity per run, the fitted values with their spread, built-in and bounds, the
    notes (under-determined, at a bound) and the leave-one-out table."""
    runs = report.runs
    scenario = runs[0].scenario
    full = report.full
    measured = [r.measured_s for r in runs]
    width = max(12, *(len(r.id) for r in runs)) + 2
    widths = [max(10, len(r.id) + 2) for r in runs]  # the sensitivity table's columns

    def error(simulated: float, run: MeasuredRun) -> str:
        return f"{100 * (simulated / run.measured_s - 1):+7.1f} %"

    lines = [
        f"stepsim calibrate · {len(runs)} measured run{'s' if len(runs) > 1 else ''} on "
        f"{scenario.cluster.gpu.name} ({node_kind(scenario.cluster)} nodes)",
        "",
        f"  {'run':<{width}}{'measured s':>12}{'built-in s':>12}{'error':>9}"
        f"{'fitted s':>12}{'error':>9}",
    ]
    for run, builtin, fitted in zip(runs, report.builtin_s, full.simulated_s, strict=True):
        lines.append(
            f"  {run.id:<{width}}{run.measured_s:>12.5g}{builtin:>12.5g}{error(builtin, run)}"
            f"{fitted:>12.5g}{error(fitted, run)}"
        )
    fitted_error = mean_abs_error(full.simulated_s, measured)
    lines += [
        f"  {'mean abs error':<{width + 24}}{100 * report.builtin_error:>7.1f} %"
        f"{'':>12}{100 * fitted_error:>7.1f} %",
        "",
        "  sensitivity of each run at the built-in values: d ln T / d ln x "
        "(overhead: % per 100 us)",
        f"    {'':<12}" + "".join(f"{r.id:>{w}}" for r, w in zip(runs, widths, strict=True)),
    ]
    for name, p in PARAMETERS.items():
        values = report.sensitivity[name]
        shown = [100 * v * 1e-4 for v in values] if p.seconds else values
        lines.append(
            f"    {name:<12}" + "".join(f"{v:>+{w}.3f}" for v, w in zip(shown, widths, strict=True))
        )
    lines += [
        "",
        f"  {'fitted':<14}{'value':>11}{'+-1 sigma':>11}{'built-in':>10}   {'bounds':<18}"
        "what it stands for",
    ]
    for name, p in PARAMETERS.items():
        if name not in full.freed:
            continue
        value, spread = full.fit.value(name), full.spread.get(name, 0.0)
        spread_text = f"{spread * 1e6:.3g} us" if p.seconds else f"{spread:.3g}"
        lines.append(
            f"    {name:<12}{_value_text(name, value):>11}{spread_text:>11}"
            f"{'0 us' if p.seconds else 'x1':>10}   {_bound_text(name, report.bounds[name]):<18}"
            f"{p.mechanism}"
        )
    if not full.freed:
        lines.append("    none: the built-in model meets the runs (within 0.1 % rms)")
    kept = [n for n in PARAMETERS if n not in full.freed]
    lines.append(f"    kept at the built-in: {', '.join(kept) or 'none'}")
    lines += [f"  note: {note}" for note in full.notes]
    lines.append("")
    if report.loo_predicted_s is None:
        lines.append(
            "  leave-one-out: not available with one run (nothing to predict it from); "
            "measure a second layout to learn how far the fit carries"
        )
    else:
        assert report.loo_freed is not None and report.loo_error is not None
        lines += [
            "  leave-one-out: each run predicted from a fit on the others",
            f"  {'run':<{width}}{'measured s':>12}{'predicted s':>13}{'error':>9}   freed",
        ]
        for run, predicted, freed in zip(
            runs, report.loo_predicted_s, report.loo_freed, strict=True
        ):
            lines.append(
                f"  {run.id:<{width}}{run.measured_s:>12.5g}{predicted:>13.5g}"
                f"{error(predicted, run)}   {', '.join(freed) or 'none'}"
            )
        lines.append(
            f"  {'mean abs error':<{width + 25}}{100 * report.loo_error:>7.1f} %   "
            f"(the built-in model: {100 * report.builtin_error:.1f} %)"
        )
    lines += ["", f"  {report.simulations} points simulated"]
    if out:
        lines.append(f"  wrote {out}: pass --calibration {out} to run, sweep, plan, search or jobs")
    return "\n".join(lines)

"""The network's constants fitted on nccl-tests logs (`stepsim calibrate --nccl-tests`),
and the residual of each message size.

A log is one nccl-tests run (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`,
`alltoall_perf`, `sendrecv_perf`) as it printed itself (scenario.files.parse_nccl_tests):
its ranks, each on a host and a device, and per message size the out-of-place and
in-place times. Each size is one point: the geometric mean of the two times (the same
collective, timed twice). stepsim runs the same collective over the same GPUs: rank r on
host h's device d is GPU h x gpus_per_node + d of a cluster of the scenario's node, fabric
and constants, with as many nodes as the log has hosts; the collective is what stepsim's
communication model runs for it (``comm.collectives``: NCCL's algorithm as `auto` picks
it, the all-to-all and the send/receive ring as exchanges), alone on the fair-share
network (``calibration.collectives.alone_s``, as `stepsim validate` runs its collective
tables). Sizes follow nccl-tests: the whole buffer for the all-reduce, all-gather (its
output), reduce-scatter (its input) and all-to-all (each rank's), each rank's message
for the send/receive.

The parameters (scenario/fitted.py ``NETWORK_PARAMETERS``): the multipliers of the
cluster's NVLink and NIC efficiencies, and three latencies set in its place (a
collective's fixed cost, an NVLink hop's, an InfiniBand hop's), each bounded. Each is
moved in a normalized coordinate u: ln(multiplier) / 0.5 (the prior spread of
scenario/fitted.py's nvlink and nic) or (latency - the cluster's) / its prior spread
(``LATENCIES``). The residual of a size is ln(simulated / measured).

Which are freed: ``measured.choose`` on the sensitivities at the cluster's own values
(the same greedy rule as a fit on measured iterations: first what alone best explains
the sizes' errors, each freed parameter lowering the penalized objective by a tenth, fewer
than there are sizes). A parameter no size moves (the NIC when every rank is on one
host) is never freed; one the sizes cannot tell from another freed one is said to be so.
The freed are then fitted without the penalty, within their bounds (Gauss-Newton with
Levenberg damping and an active set), so that a curve stepsim produced itself is
recovered exactly: the pull toward the built-in values is the choice of what to free and
the bounds, not a bias of the values. With two logs or more, each is predicted from the
same procedure run on the others (held-out error). Nothing here reads a file; the cluster
builder is passed in (calibration/ imports no run/).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from ..comm import collectives
from ..comm.collectives import Fabric
from ..ir.units import us_to_s
from ..ir.vocabulary import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, AUTO, REDUCE_SCATTER
from ..scenario import ClusterSpec, ScenarioError
from ..scenario.files import NCCL_TESTS_BINARIES, NcclTestsLog
from ..scenario.fitted import LATENCIES, NETWORK_PARAMETERS, PARAMETERS, MeasuredFit
from ..scenario.loader import fitted_network
from .collectives import LARGE_SHARE_BYTES, alone_s
from .measured import choose
from .trace import other_gpu

SENDRECV = "sendrecv"
# nccl-tests' binaries and the collective each times
KINDS: dict[str, str] = dict(
    zip(
        NCCL_TESTS_BINARIES,
        (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SENDRECV),
        strict=True,
    )
)
KIND_NAMES: dict[str, str] = {kind: b.removesuffix("_perf") for b, kind in KINDS.items()}

MAX_STEPS = 40  # Levenberg-Marquardt steps of one part
MAX_ROUNDS = 30  # rounds of the two parts in turn
TOLERANCE_U = 1e-7  # a fit stops when no coordinate moves more than this (in priors)
FD_STEP_U = 0.01  # the finite-difference step, in prior spreads
DISTINCT = 0.3  # sensitivities scaled to one with a singular value under this: alike (cos > 0.91)
BUS_RATIO_TOLERANCE = 0.03  # busbw / algbw may differ this much from the kind's factor
BUS_RATIO_MIN_GBYTES_PER_S = 1.0  # rows printed with less have too few digits to check


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw (its PERFORMANCE.md): 2(n-1)/n for an all-reduce,
    (n-1)/n for the all-gather, reduce-scatter and all-to-all, 1 for send/receive."""
    if kind == SENDRECV:
        return 1.0
    share = (ranks - 1) / ranks
    return 2.0 * share if kind == ALL_REDUCE else share


class LogPoint(NamedTuple):
    """One message size of a log: its line, size and measured seconds."""

    line: int
    size_bytes: float
    measured_s: float


class CollectiveLog(NamedTuple):
    """A log ready to simulate: its name, collective kind, the GPUs of its ranks (in rank
    order, numbered as on a cluster of ``nodes`` nodes of the scenario's node), and its
    sizes."""

    name: str
    kind: str
    gpus: tuple[int, ...]
    nodes: int
    points: tuple[LogPoint, ...]

    @property
    def ranks(self) -> int:
        return len(self.gpus)


def log_kind(log: NcclTestsLog, name: str, given: str | None = None) -> str:
    """The collective a log timed: ``given`` (the CLI's --collective), else the binary the
    log names (an echoed command line), else one its file name holds; then checked
    against its columns (busbw / algbw is the kind's bus factor). A log that says
    nothing is read from its columns where only one kind has its bus factor and
    reduction operator (a reduction prints one, the all-gather and the all-to-all
    "none"); the all-gather and the all-to-all print the same columns, so those need a
    name."""
    ranks = len(log.hosts)
    ratios = [
        float(r["busbw"]) / float(r["algbw"])
        for r in log.rows
        if float(r["algbw"]) >= BUS_RATIO_MIN_GBYTES_PER_S
    ]
    ratio = float(np.median(ratios)) if ratios else None
    reduces = any(r["redop"] not in ("none", "-") for r in log.rows)
    stated = None
    if given is not None:
        stated, where = given, "--collective"
    elif len(log.binaries) > 1:
        raise ScenarioError(
            f"{name} names {' and '.join(log.binaries)}: one nccl-tests run per log "
            "(split it, or give --collective)"
        )
    elif log.binaries:
        stated, where = KINDS[log.binaries[0]], f"the log's {log.binaries[0]}"
    else:
        found = [kind for binary, kind in KINDS.items() if binary.removesuffix("_perf") in name]
        if len(found) == 1:
            stated, where = found[0], "its file name"
    if stated is not None:
        if ratio is not None and not math.isclose(
            ratio, bus_factor(stated, ranks), rel_tol=BUS_RATIO_TOLERANCE
        ):
            raise ScenarioError(
                f"{name}: {where} says {KIND_NAMES[stated]}, but its busbw / algbw is "
                f"{ratio:.3f}, not {bus_factor(stated, ranks):.3f} ({KIND_NAMES[stated]} over "
                f"{ranks} ranks); give the right --collective"
            )
        return stated
    if ratio is not None:  # the kinds its ratio and reduction operator allow
        fits = [
            kind
            for kind in KINDS.values()
            if math.isclose(ratio, bus_factor(kind, ranks), rel_tol=BUS_RATIO_TOLERANCE)
            and (kind == SENDRECV or reduces == (kind in (ALL_REDUCE, REDUCE_SCATTER)))
        ]
        if len(fits) == 1:
            return fits[0]
    raise ScenarioError(
        f"{name}: which collective it timed is not said (no {'/'.join(NCCL_TESTS_BINARIES)} "
        "in the log or its name) and its columns do not tell; give --collective "
        f"({', '.join(KIND_NAMES.values())})"
    )


def check_device(log: NcclTestsLog, name: str, gpu: str) -> None:
    """A log whose ranks ran on another GPU than the scenario's is refused: the GPU
    family its device names print (H100, B200, ...) must be in the scenario's GPU name."""
    if other_gpu(log.device_names, gpu):
        printed = next(n for n in log.device_names if n)
        raise ScenarioError(
            f"{name} ran on {printed!r} but the scenario's cluster.gpu is {gpu!r}; a "
            "network fit holds for the cluster it was measured on (give that cluster's "
            "scenario)"
        )


def collective_log(log: NcclTestsLog, name: str, kind: str, gpus_per_node: int) -> CollectiveLog:
    """The log's ranks as GPUs of a cluster of its hosts (host-major, each host's device
    index) and its sizes; a rank on a device the node does not have, or two ranks on
    one GPU, is a one-line error."""
    hosts = list(dict.fromkeys(log.hosts))
    devices = log.devices or tuple(log.hosts[:r].count(h) for r, h in enumerate(log.hosts))
    gpus = []
    for rank, (host, device) in enumerate(zip(log.hosts, devices, strict=True)):
        if device >= gpus_per_node:
            raise ScenarioError(
                f"{name}: rank {rank} runs on device {device} of {host}, but the scenario's "
                f"node has {gpus_per_node} GPUs"
            )
        gpus.append(hosts.index(host) * gpus_per_node + device)
    if len(set(gpus)) != len(gpus):
        raise ScenarioError(f"{name}: two ranks on one GPU (a host's device index repeats)")
    if len(gpus) < 2:
        raise ScenarioError(f"{name}: one rank; a collective needs two GPUs at least")
    points = []
    for row in log.rows:
        times = [float(row["time"]), float(row["time (in-place)"])]
        points.append(
            LogPoint(int(row["line"]), float(row["size"]), 1e-6 * math.sqrt(times[0] * times[1]))
        )
    return CollectiveLog(name, kind, tuple(gpus), len(hosts), tuple(points))


# -- stepsim's time -------------------------------------------------------------------------


def build(
    kind: str, gpus: Sequence[int], size_bytes: float, fabric: Fabric
) -> tuple[collectives.Collective, str]:
    """The collective stepsim runs for one size of a log, and its algorithm's name."""
    group = list(gpus)
    n = len(group)
    if kind == ALL_TO_ALL:
        edges = [[(a, b) for a in group for b in group if a != b]]
        return (collectives.exchange(edges, size_bytes / n, fabric, True),), "all-to-all"
    if kind == SENDRECV:
        edges = [[(group[i], group[(i + 1) % n]) for i in range(n)]]
        return (collectives.exchange(edges, size_bytes, fabric, True),), "send/receive"
    pick = collectives.chosen(AUTO, kind, [group], size_bytes, fabric)
    assert pick is not None  # two GPUs at least (collective_log)
    return pick[1], pick[0]


class Network:
    """The logs' sizes simulated on the scenario's cluster with a fit's network
    parameters: clusters built once per (nodes, values) by ``build_cluster`` (the run's
    builder, passed in), each size's time kept per values."""

    def __init__(self, cluster: ClusterSpec, build_cluster: Callable[[ClusterSpec], Any]) -> None:
        self.cluster = cluster
        self.build_cluster = build_cluster
        self._fabrics: dict[tuple, tuple[Fabric, list[float]]] = {}
        self._times: dict[tuple, tuple[float, str]] = {}
        self.simulations = 0

    def _fabric(self, nodes: int, fit: MeasuredFit) -> tuple[Fabric, list[float]]:
        key = (nodes, fit.nvlink, fit.nic, *(fit.latency_us(n) for n in LATENCIES))
        if key not in self._fabrics:
            spec = fitted_network(replace(self.cluster, num_nodes=nodes), fit)
            cluster = self.build_cluster(spec)
            fabric = Fabric.of(
                cluster, us_to_s(spec.collective_base_latency_us), spec.nvls_fraction
            )
            self._fabrics[key] = (fabric, [link.bandwidth_bytes_per_s for link in cluster.links])
        return self._fabrics[key]

    def run(self, log: CollectiveLog, point: LogPoint, fit: MeasuredFit) -> tuple[float, str]:
        """(stepsim's seconds, the algorithm) of one size of a log under ``fit``."""
        key = (log.name, point.line, fit.nvlink, fit.nic, *(fit.latency_us(n) for n in LATENCIES))
        if key not in self._times:
            fabric, capacities = self._fabric(log.nodes, fit)
            collective, runs = build(log.kind, log.gpus, point.size_bytes, fabric)
            self._times[key] = (alone_s(collective, capacities), runs)
            self.simulations += 1
        return self._times[key]


# -- the fit --------------------------------------------------------------------------------

_MULTIPLIER_PRIOR = {name: PARAMETERS[name].prior for name in ("nvlink", "nic")}
BANDWIDTH = ("nvlink", "nic")

Item = tuple[int, LogPoint]  # a size of a log: the log's index and the point


def is_large(log: CollectiveLog, point: LogPoint) -> bool:
    """A size bandwidth, not latency, decides: each rank's share of the buffer (its
    message for the send/receive) is LARGE_SHARE_BYTES or more, as `stepsim validate`
    calls its collective rows large (calibration/collectives.py)."""
    share = point.size_bytes if log.kind == SENDRECV else point.size_bytes / log.ranks
    return share >= LARGE_SHARE_BYTES


class Fitter:
    """Residuals and sensitivities of sizes of the logs at points u (by parameter)."""

    def __init__(self, network: Network, logs: Sequence[CollectiveLog]) -> None:
        self.network = network
        self.logs = list(logs)
        cluster = network.cluster
        self.own_us = {
            name: float(getattr(cluster, la.replaces.removeprefix("cluster.")))
            for name, la in LATENCIES.items()
        }
        self.bounds: dict[str, tuple[float, float]] = {}
        for name in BANDWIDTH:
            p = PARAMETERS[name]
            efficiency = float(getattr(cluster, p.scales.removeprefix("cluster.")))
            high = min(p.high, (p.ceiling or p.high) / efficiency)
            self.bounds[name] = (math.log(p.low) / p.prior, math.log(max(high, 1.0)) / p.prior)
        for name, la in LATENCIES.items():
            own = self.own_us[name]
            self.bounds[name] = ((la.low_us - own) / la.prior_us, (la.high_us - own) / la.prior_us)

    def fit_at(self, u: Mapping[str, float]) -> MeasuredFit:
        """The MeasuredFit holding the network parameters at u (the rest built-in)."""
        values: dict[str, Any] = {}
        for name in BANDWIDTH:
            values[name] = math.exp(u.get(name, 0.0) * _MULTIPLIER_PRIOR[name])
        for name, la in LATENCIES.items():
            if name in u:
                value = self.own_us[name] + u[name] * la.prior_us
                values[la.key] = max(la.low_us, min(la.high_us, value))
        return MeasuredFit(**values)

    def items(self, logs: Sequence[int]) -> list[Item]:
        return [(i, p) for i in logs for p in self.logs[i].points]

    def simulated(self, items: Sequence[Item], u: Mapping[str, float]) -> list[tuple[float, str]]:
        fit = self.fit_at(u)
        return [self.network.run(self.logs[i], p, fit) for i, p in items]

    def residuals(self, items: Sequence[Item], u: Mapping[str, float]) -> np.ndarray:
        """ln(simulated / measured) of each size at u."""
        times = self.simulated(items, u)
        return np.array(
            [math.log(t / p.measured_s) for (t, _), (_, p) in zip(times, items, strict=True)]
        )

    def jacobian(
        self, items: Sequence[Item], names: Sequence[str], u: Mapping[str, float], base: np.ndarray
    ) -> np.ndarray:
        """d residual / d u: one-sided differences, stepping inward from a bound."""
        out = np.zeros((len(base), len(names)))
        for j, name in enumerate(names):
            low, high = self.bounds[name]
            here = u.get(name, 0.0)
            h = FD_STEP_U if here + FD_STEP_U <= high else -FD_STEP_U
            if not low <= here + h <= high:
                continue  # bounds closer than a step: nothing to move
            out[:, j] = (self.residuals(items, {**u, name: here + h}) - base) / h
        return out


def _bounded_step(
    J: np.ndarray, r: np.ndarray, u: np.ndarray, lows: np.ndarray, highs: np.ndarray, damping: float
) -> np.ndarray:
    """The damped Gauss-Newton step from u within the bounds (an active set: a
    coordinate that would leave them is held on its bound, the others solved again)."""
    n = len(u)
    step, held = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(n + 1):
        free = ~held
        if np.any(free):
            Jf = J[:, free]
            rest = r + J[:, held] @ step[held]
            A = Jf.T @ Jf
            A = A + damping * np.diag(np.diag(A) + 1e-12)
            step[free] = -np.linalg.solve(A, Jf.T @ rest)
        target = u + step
        out = free & ((target < lows) | (target > highs))
        step = np.clip(target, lows, highs) - u
        if not np.any(out):
            break
        held |= out
    return step


def least_squares(
    fitter: Fitter, items: Sequence[Item], names: Sequence[str], u: Mapping[str, float]
) -> tuple[dict[str, float], np.ndarray]:
    """``names`` fitted on ``items`` (least squares of the residuals, no penalty, within
    the bounds; Levenberg-Marquardt) from u, every other parameter held at u; the new
    point and the jacobian there."""
    point = dict(u)
    lows = np.array([fitter.bounds[n][0] for n in names])
    highs = np.array([fitter.bounds[n][1] for n in names])
    x = np.array([point.get(n, 0.0) for n in names])
    r = fitter.residuals(items, point)
    value = float(r @ r)
    damping = 1e-3
    J = np.zeros((len(r), len(names)))
    for _ in range(MAX_STEPS if names else 0):
        J = fitter.jacobian(items, names, point, r)
        step = _bounded_step(J, r, x, lows, highs, damping)
        if not np.any(np.abs(step) > TOLERANCE_U):
            break
        trial = {**point, **dict(zip(names, map(float, x + step), strict=True))}
        r_trial = fitter.residuals(items, trial)
        trial_value = float(r_trial @ r_trial)
        if trial_value < value:
            x, point, r, value = x + step, trial, r_trial, trial_value
            damping = max(damping / 10, 1e-12)
        else:
            damping *= 10
            if damping > 1e6:
                break
        if value < 1e-24:
            break
    return point, J


class NetworkFit(NamedTuple):
    """A fit on some logs: the parameters freed and the point u, the fit as a
    MeasuredFit, the rms residual before and after, what ended on a bound, notes."""

    freed: tuple[str, ...]
    u: dict[str, float]
    fit: MeasuredFit
    builtin_error: float
    error: float
    at_bound: tuple[str, ...]
    notes: list[str]


def _rms(r: np.ndarray) -> float:
    return math.sqrt(float(np.mean(r**2))) if len(r) else 0.0


def _chosen(
    fitter: Fitter, items: Sequence[Item], names: Sequence[str], notes: list[str]
) -> list[str]:
    """What to free of ``names`` on ``items`` (measured.choose at the cluster's own
    values); a parameter no size moves is noted."""
    if not items:
        return []
    r0 = fitter.residuals(items, {})
    J0 = fitter.jacobian(items, names, {}, r0)
    for j, name in enumerate(names):
        if not np.any(J0[:, j]):
            notes.append(f"{name}: no size of the logs moves it; kept as the cluster's")
    most = min(len(items) - 1, len(names))
    if most < 1:
        most = 1 if len(items) == 1 else 0
    lows = np.array([fitter.bounds[n][0] for n in names])
    highs = np.array([fitter.bounds[n][1] for n in names])
    picked = choose(J0, r0, names, most, lows, highs)
    # what the sizes cannot tell apart is not freed: each parameter in the order chosen,
    # dropped when with those kept its sensitivities (scaled to one) have a singular
    # value under DISTINCT (one log of one group moves a collective's fixed cost and its
    # hops' almost alike)
    kept: list[str] = []
    for name in sorted(picked, key=lambda n: -float(np.linalg.norm(J0[:, names.index(n)]))):
        columns = np.array([J0[:, names.index(n)] for n in (*kept, name)]).T
        columns = columns / np.linalg.norm(columns, axis=0)
        if np.linalg.svd(columns, compute_uv=False)[-1] < DISTINCT:
            notes.append(
                f"{name}: the sizes move it almost as they move {', '.join(kept)}; kept as "
                "the cluster's (logs of other rank counts or collectives tell them apart)"
            )
        else:
            kept.append(name)
    return [n for n in names if n in kept]


def fit_logs(fitter: Fitter, logs: Sequence[int], free: Sequence[str] | None = None) -> NetworkFit:
    """Fit the network parameters on ``logs`` (indices): the NVLink and NIC multipliers
    on the bandwidth-bound sizes (`is_large`), the latencies on the others, each with
    the other held, in turn until neither moves (module docstring); what is freed
    chosen on each part (or taken from ``free``)."""
    items = fitter.items(logs)
    large = [(i, p) for i, p in items if is_large(fitter.logs[i], p)]
    small = [(i, p) for i, p in items if not is_large(fitter.logs[i], p)]
    notes: list[str] = []
    latencies = list(LATENCIES)
    if free is None:
        bandwidth = _chosen(fitter, large, BANDWIDTH, notes)
        latency = _chosen(fitter, small, latencies, notes)
    else:
        bandwidth = [n for n in BANDWIDTH if n in free and large]
        latency = [n for n in latencies if n in free and small]
        for name in free:
            if name not in bandwidth and name not in latency:
                regime = "bandwidth-bound" if name in BANDWIDTH else "latency-bound"
                notes.append(f"{name}: no {regime} size in the logs; kept as the cluster's")
    if not large:
        notes.append(
            f"no size is bandwidth-bound ({LARGE_SHARE_BYTES // 2**20} MiB a rank or more): "
            "the NVLink and NIC efficiencies are kept as the cluster's"
        )
    u: dict[str, float] = {}
    jacobians: list[tuple[np.ndarray, list[str]]] = []
    for _ in range(MAX_ROUNDS):
        before = dict(u)
        jacobians = []
        for part, names in ((large, bandwidth), (small, latency)):
            if part and names:
                u, J = least_squares(fitter, part, names, u)
                jacobians.append((J, names))
        if all(abs(u[n] - before.get(n, 0.0)) <= TOLERANCE_U for n in u):
            break
    freed = tuple(n for n in NETWORK_PARAMETERS if n in u)
    at_bound = tuple(
        n
        for n in freed
        if min(abs(u[n] - fitter.bounds[n][0]), abs(u[n] - fitter.bounds[n][1])) < 1e-6
    )
    for name in at_bound:
        notes.append(
            f"{name} ended on a bound: the logs ask for more than it may give; what it "
            "stands for does not explain them alone"
        )
    for J, names in jacobians:
        if len(names) > 1 and J.shape[1] == len(names):
            singular = np.linalg.svd(J, compute_uv=False)
            if singular[-1] < 1e-3 * singular[0]:
                notes.append(
                    f"under-determined: the sizes move {', '.join(names)} together (they "
                    "cannot tell them apart); the values are one of many that fit as well"
                )
    r0, r = fitter.residuals(items, {}), fitter.residuals(items, u)
    return NetworkFit(freed, u, fitter.fit_at(u), _rms(r0), _rms(r), at_bound, notes)


class NcclReport(NamedTuple):
    """A fit on every log, the held-out error of each log (None with one log), and
    each size's simulated time at the cluster's values and at the fit."""

    logs: list[CollectiveLog]
    full: NetworkFit
    builtin: list[list[tuple[float, str]]]  # per log, per size: (seconds, algorithm)
    fitted: list[list[tuple[float, str]]]
    held_out_error: list[float] | None
    gpu: str
    node: str

    @property
    def sizes(self) -> int:
        return sum(len(log.points) for log in self.logs)

    @property
    def loo_error(self) -> float | None:
        """The rms, over every size, of each log's residuals predicted from the others."""
        if self.held_out_error is None:
            return None
        squares = sum(
            e * e * len(log.points) for e, log in zip(self.held_out_error, self.logs, strict=True)
        )
        return math.sqrt(squares / self.sizes)

    def measured_fit(self, source: str) -> MeasuredFit:
        """The fit as a calibration file's [fit] holds it (network parameters only)."""
        return replace(
            self.full.fit,
            gpu=self.gpu,
            node=self.node,
            collective_logs=len(self.logs),
            collective_sizes=self.sizes,
            collective_error=self.full.error,
            collective_loo_error=self.loo_error,
            collective_freed=self.full.freed,
            collective_at_bound=self.full.at_bound,
            source=source,
        )


def calibrate_network(
    network: Network,
    logs: Sequence[CollectiveLog],
    gpu: str,
    node: str,
    free: Sequence[str] | None = None,
    *,
    held_out: bool = True,
) -> NcclReport:
    """Fit on every log; with two logs or more and ``held_out``, each log predicted from
    a fit on the others."""
    fitter = Fitter(network, logs)
    everything = list(range(len(logs)))
    full = fit_logs(fitter, everything, free)
    builtin = [fitter.simulated(fitter.items([i]), {}) for i in everything]
    fitted = [fitter.simulated(fitter.items([i]), full.u) for i in everything]
    errors = None
    if held_out and len(logs) > 1:
        errors = []
        for i in everything:
            others = fit_logs(fitter, [j for j in everything if j != i], free)
            errors.append(_rms(fitter.residuals(fitter.items([i]), others.u)))
    return NcclReport(list(logs), full, builtin, fitted, errors, gpu, node)


# -- what the report says -------------------------------------------------------------------


def _size_text(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size:g} B"


def _value_text(fit: MeasuredFit, name: str) -> str:
    if name in LATENCIES:
        value = fit.latency_us(name)
        return "as the cluster" if value is None else f"{value:.4g} us"
    return f"x{fit.value(name):.4g}"


def report_text(report: NcclReport) -> str:
    """The fit, then each log's sizes: measured and simulated bus bandwidth (built-in
    and fitted) and the fitted residual."""
    full = report.full
    fit = full.fit
    lines = [
        f"stepsim calibrate · network fitted on {len(report.logs)} nccl-tests "
        f"log{'s' if len(report.logs) > 1 else ''} ({report.sizes} sizes; "
        f"{report.gpu}, {report.node})",
        f"  rms error of ln(simulated / measured) over the sizes: built-in "
        f"{100 * full.builtin_error:.1f} %, fitted {100 * full.error:.1f} %"
        + (
            f", each log from the others {100 * report.loo_error:.1f} %"
            if report.loo_error is not None
            else " (one log: no held-out error)"
        ),
    ]
    for name in NETWORK_PARAMETERS:
        state = "freed" if name in full.freed else "kept"
        lines.append(f"  {name:<16}{_value_text(fit, name):>16}  {state}")
    lines += [f"  note: {n}" for n in full.notes]
    for log, builtin, fitted in zip(report.logs, report.builtin, report.fitted, strict=True):
        factor = bus_factor(log.kind, log.ranks)
        lines += [
            "",
            f"  {log.name}: {KIND_NAMES[log.kind]} over {log.ranks} ranks on {log.nodes} "
            f"node{'s' if log.nodes > 1 else ''}",
            f"  {'line':>6} {'size':>10}   busbw GB/s: {'measured':>9} {'built-in':>9} "
            f"{'fitted':>9}   {'error':>8}  runs",
        ]
        for p, (b, _), (f, runs) in zip(log.points, builtin, fitted, strict=True):
            bus = [p.size_bytes / t * factor / 1e9 for t in (p.measured_s, b, f)]
            lines.append(
                f"  {p.line:>6} {_size_text(p.size_bytes):>10}   {'':>11} {bus[0]:>9.2f} "
                f"{bus[1]:>9.2f} {bus[2]:>9.2f}   {100 * (f / p.measured_s - 1):>+7.1f} %  {runs}"
            )
    return "\n".join(lines)


def report_json(report: NcclReport) -> dict[str, Any]:
    """The network fit as --json documents carry it."""
    fit = report.full.fit
    return {
        "logs": [
            {
                "name": log.name,
                "collective": KIND_NAMES[log.kind],
                "ranks": log.ranks,
                "nodes": log.nodes,
                "held_out_error": None
                if report.held_out_error is None
                else report.held_out_error[i],
                "sizes": [
                    {
                        "line": p.line,
                        "size_bytes": p.size_bytes,
                        "measured_s": p.measured_s,
                        "builtin_s": b,
                        "fitted_s": f,
                        "runs": runs,
                    }
                    for p, (b, _), (f, runs) in zip(
                        log.points, report.builtin[i], report.fitted[i], strict=True
                    )
                ],
            }
            for i, log in enumerate(report.logs)
        ],
        "parameters": {
            name: {
                "value": fit.latency_us(name) if name in LATENCIES else fit.value(name),
                "unit": "us" if name in LATENCIES else "multiplier",
                "freed": name in report.full.freed,
                "at_bound": name in report.full.at_bound,
            }
            for name in NETWORK_PARAMETERS
        },
        "builtin_error": report.full.builtin_error,
        "fit_error": report.full.error,
        "loo_error": report.loo_error,
        "notes": report.full.notes,
    }


def collective_rows(report: NcclReport) -> list[dict[str, Any]]:
    """The [[collective]] tables a calibration file records: one per size."""
    return [
        {
            "log": log.name,
            "collective": KIND_NAMES[log.kind],
            "line": p.line,
            "size_bytes": p.size_bytes,
            "measured_s": p.measured_s,
            "builtin_s": b,
            "fitted_s": f,
        }
        for log, builtin, fitted in zip(report.logs, report.builtin, report.fitted, strict=True)
        for p, (b, _), (f, _) in zip(log.points, builtin, fitted, strict=True)
    ]

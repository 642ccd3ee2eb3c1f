"""Goodput over a whole run: the share of wall time spent on useful iterations when
GPUs fail, the job restarts from its last checkpoint and checkpoints cost time; the
checkpoint interval that maximises it, searched in whole iterations, beside Young's
and Daly's closed-form optima. Pure arithmetic on an iteration time (docs/what-if.md
"Goodput" derives every formula; docs/design.md "Planning and search" says why).

Failures are exponential and independent: N GPUs of per-GPU MTBF m fail as one job
of MTBF M = m / N. A run is a sequence of segments, each tau of useful work (k
iterations) followed by a checkpoint that blocks training for C. A failure loses the
segment in progress (the work since the last checkpoint and a partial checkpoint) and
costs a restart R (re-queue, initialisation and loading the checkpoint), during which
failures may strike too. Daly 2006 ("A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22(3)) gives the
expected wall time of one segment:

    E = M e^(R/M) (e^((tau + C)/M) - 1)

of which tau is useful, C the checkpoint that succeeded, M (e^(s/M) - 1) - s the work
lost in failed attempts (s = tau + C) and (e^(s/M) - 1) M (e^(R/M) - 1) restarts
(e^(s/M) - 1 failures per segment, each restart taking M (e^(R/M) - 1) on average).
Goodput = tau / E; with no failures (M infinite) it is tau / (tau + C).

Asynchronous checkpointing (Megatron's --async-save): only the copy of each GPU's
shard to host memory blocks (C = shard bytes / PCIe); the write to storage, W, runs
behind the next iterations, and a failure within W of a snapshot falls back one
checkpoint further. To first order (failure phase uniform) that costs W more lost
work per failure; it is counted as lost work redone after the restart (exact for
synchronous saves, where W = 0 here; first-order for asynchronous ones). A snapshot
cannot start before the previous write has finished: a segment lasts at least W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..scenario import ScenarioError

# Meta's research clusters (Kokolis et al. 2024, "Revisiting Reliability in
# Large-Scale Machine Learning Research Clusters", arXiv 2410.21680, HPCA 2025): the
# failure rate fitted on RSC-1's 11 months (16k A100 in nodes of 8), 6.50 job-
# interrupting failures per 1,000 node-days, the rate behind their projected MTTF of
# about 1.8 hours for a 16,384-GPU job. Per GPU: 1,000 node-days x 24 h x 8 GPUs / 6.50.
# Not fitted to the Llama 3 paper's interruption count (docs/what-if.md compares).
FLEET_FAILURES_PER_1000_NODE_DAYS = 6.50
FLEET_GPUS_PER_NODE = 8
DEFAULT_MTBF_GPU_HOURS = 1000 * 24 * FLEET_GPUS_PER_NODE / FLEET_FAILURES_PER_1000_NODE_DAYS
# Round figures, not measurements: set them for the storage and scheduler at hand.
DEFAULT_STORAGE_GBYTES_PER_S = 100.0
DEFAULT_RESTART_MINUTES = 10.0
# What Megatron's distributed checkpoint saves per parameter: 16-bit weights, and the
# fp32 master weights, Adam momentum and variance of the optimizer state (ZeRO Sec 3.1
# counts the same 2 + 12 bytes; gradients are not saved).
CHECKPOINT_BYTES_PER_PARAM = 2 + 12
# past this many job MTBFs of work between checkpoints, goodput is below 50 e^-50
MAX_INTERVAL_MTBFS = 50.0
# the flags' ranges: wide, but keeping the search's intervals well inside a float
MAX_MTBF_GPU_HOURS = 1e9
ITERATION_S_RANGE = (1e-6, 1e6)
MAX_GBYTES_PER_S = 1e9
MAX_RESTART_MINUTES = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class Reliability:
    """The reliability inputs (CLI flags of `plan goodput` and `plan time-to-train`)."""

    mtbf_gpu_hours: float = DEFAULT_MTBF_GPU_HOURS  # math.inf: no failures
    storage_write_gbytes_per_s: float = DEFAULT_STORAGE_GBYTES_PER_S  # aggregate
    storage_read_gbytes_per_s: float = DEFAULT_STORAGE_GBYTES_PER_S  # aggregate
    restart_s: float = DEFAULT_RESTART_MINUTES * 60  # re-queue and initialisation
    async_save: bool = False

    def __post_init__(self) -> None:
        checks = (
            ("--mtbf-gpu-hours", self.mtbf_gpu_hours, MAX_MTBF_GPU_HOURS, " (or inf: none)"),
            ("--storage-gbytes-per-s", self.storage_write_gbytes_per_s, MAX_GBYTES_PER_S, ""),
            ("--read-gbytes-per-s", self.storage_read_gbytes_per_s, MAX_GBYTES_PER_S, ""),
        )
        for flag, value, high, inf in checks:
            if not (0 < value <= high or (inf and value == math.inf)):
                raise ScenarioError(
                    f"{flag}={value:g} must be a positive number up to {high:g}{inf}"
                )
        if not 0 <= self.restart_s <= MAX_RESTART_MINUTES * 60:
            raise ScenarioError(
                f"--restart-minutes={self.restart_s / 60:g} must be >= 0 and at most "
                f"{MAX_RESTART_MINUTES:g}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """What one job pays per checkpoint and per failure, in seconds."""

    iteration_s: float
    num_gpus: int
    checkpoint_bytes: float
    job_mtbf_s: float  # math.inf: no failures
    write_s: float  # the whole checkpoint to storage at the aggregate write bandwidth
    blocking_s: float  # what training waits for: write_s (sync) or the host copy (async)
    lag_s: float  # async: write_s, the time a snapshot takes to become durable; sync: 0
    restart_s: float  # re-queue and initialisation, then loading the checkpoint
    load_s: float


def costs_of(
    rel: Reliability, iteration_s: float, num_gpus: int, params: float, pcie_gbytes_per_s: float
) -> Costs:
    """Checkpoint, load and restart times of a job of ``num_gpus`` GPUs training a model
    of ``params`` parameters; the async snapshot copies each GPU's 1/N of the state over
    its PCIe link (Megatron's fully parallel save splits the shards over every rank)."""
    low, high = ITERATION_S_RANGE
    if not low <= iteration_s <= high:
        raise ScenarioError(f"--iteration-s={iteration_s:g} must lie in [{low:g}, {high:g}]")
    total = params * CHECKPOINT_BYTES_PER_PARAM
    write_s = total / (rel.storage_write_gbytes_per_s * 1e9)
    snapshot_s = total / num_gpus / (pcie_gbytes_per_s * 1e9)
    return Costs(
        iteration_s=iteration_s,
        num_gpus=num_gpus,
        checkpoint_bytes=total,
        job_mtbf_s=rel.mtbf_gpu_hours * 3600 / num_gpus,
        write_s=write_s,
        blocking_s=snapshot_s if rel.async_save else write_s,
        lag_s=write_s if rel.async_save else 0.0,
        restart_s=rel.restart_s,
        load_s=total / (rel.storage_read_gbytes_per_s * 1e9),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Shares:
    """Where the wall time goes at one checkpoint interval (fractions summing to 1)."""

    interval_iterations: int
    segment_s: float  # useful work + the blocking checkpoint (+ waiting for the last write)
    useful: float  # = goodput
    checkpoint: float
    lost: float  # work redone after failures, partial checkpoints included
    restart: float  # re-queue, initialisation and checkpoint load

    @property
    def goodput(self) -> float:
        return self.useful

    def row(self) -> dict[str, float | int]:
        return {
            "interval_iterations": self.interval_iterations,
            "goodput": self.useful,
            "checkpoint_share": self.checkpoint,
            "lost_share": self.lost,
            "restart_share": self.restart,
        }


def shares_at(costs: Costs, iterations: int) -> Shares:
    """Daly's expected wall time of a segment of ``iterations`` iterations, split into
    useful work, checkpoint, lost work and restarts (module docstring)."""
    tau = iterations * costs.iteration_s
    checkpoint = costs.blocking_s + max(0.0, costs.lag_s - tau - costs.blocking_s)
    s = tau + checkpoint
    m = costs.job_mtbf_s
    if m == math.inf:
        lost = restart = 0.0
    elif s / m > 700 or (costs.restart_s + costs.load_s + costs.lag_s) / m > 700:
        return Shares(
            interval_iterations=iterations,
            segment_s=s,
            useful=0.0,
            checkpoint=0.0,
            lost=1.0,
            restart=0.0,
        )
    else:
        failures = math.expm1(s / m)  # per segment
        lost = m * _expm1_minus_x(s / m) + failures * costs.lag_s
        redo = costs.restart_s + costs.load_s + costs.lag_s
        restart = failures * m * math.expm1(redo / m) - failures * costs.lag_s
    wall = s + lost + restart
    return Shares(
        interval_iterations=iterations,
        segment_s=s,
        useful=tau / wall,
        checkpoint=checkpoint / wall,
        lost=lost / wall,
        restart=restart / wall,
    )


def _expm1_minus_x(x: float) -> float:
    """e^x - 1 - x without the cancellation of expm1(x) - x for small x (its series)."""
    if x < 1e-3:
        return x * x / 2 * (1 + x / 3 * (1 + x / 4 * (1 + x / 5)))
    return math.expm1(x) - x


def best_interval(costs: Costs) -> Shares | None:
    """The interval in whole iterations of the highest goodput, the smallest on a tie;
    None with no failures (checkpointing never pays then). Goodput is unimodal in the
    interval (docs/what-if.md), so a ternary search over iterations finds it, and a scan
    of its neighbourhood settles rounding."""
    if costs.job_mtbf_s == math.inf:
        return None
    hi = max(1, math.ceil(MAX_INTERVAL_MTBFS * costs.job_mtbf_s / costs.iteration_s))
    lo = 1

    def goodput(k: int) -> float:
        return shares_at(costs, k).useful

    while hi - lo > 8:
        third = (hi - lo) // 3
        m1, m2 = lo + third, hi - third
        if goodput(m1) < goodput(m2):
            lo = m1 + 1
        else:
            hi = m2
    candidates = range(max(1, lo - 8), hi + 9)
    return shares_at(costs, max(candidates, key=lambda k: (goodput(k), -k)))


def young_interval_s(costs: Costs) -> float:
    """Young 1974 (Comm. ACM 17(9), "A first order approximation to the optimum
    checkpoint interval"): tau = sqrt(2 C M), work between checkpoints."""
    return math.sqrt(2 * costs.blocking_s * costs.job_mtbf_s)


def daly_interval_s(costs: Costs) -> float:
    """Daly 2006's higher-order estimate: sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C for
    C < 2M, otherwise M."""
    c, m = costs.blocking_s, costs.job_mtbf_s
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def nearest_iterations(interval_s: float, iteration_s: float) -> int:
    """A closed-form interval in whole iterations (at least one)."""
    return max(1, round(interval_s / iteration_s))


def failures_per_day(costs: Costs) -> float:
    return 0.0 if costs.job_mtbf_s == math.inf else 86_400 / costs.job_mtbf_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """One row of `plan goodput`: how the interval was chosen, the closed form's
    interval in (fractional) iterations when it is one, and the shares there."""

    name: str
    exact_iterations: float | None
    shares: Shares

    def row(self) -> dict[str, object]:
        return {"interval": self.name, "exact_iterations": self.exact_iterations}


GIVEN, SEARCHED, YOUNG, DALY = "given", "searched best", "Young 1974", "Daly 2006"


def intervals(costs: Costs, given: int | None) -> list[Interval]:
    """The given interval (iterations), the searched best and the two closed forms
    (rounded to whole iterations); only the given one with no failures."""
    rows = []
    if given is not None:
        if not 1 <= given <= 1e12:
            raise ScenarioError(
                f"--checkpoint-interval={given} must be >= 1 iteration and at most 1e12"
            )
        rows.append(Interval(name=GIVEN, exact_iterations=None, shares=shares_at(costs, given)))
    best = best_interval(costs)
    if best is None:
        return rows
    rows.append(Interval(name=SEARCHED, exact_iterations=None, shares=best))
    # async: the closed forms know only the blocking copy; an interval shorter than the
    # write would wait for it, so they are taken no shorter than the write
    shortest = max(1, math.ceil((costs.lag_s - costs.blocking_s) / costs.iteration_s))
    for name, interval_s in ((YOUNG, young_interval_s(costs)), (DALY, daly_interval_s(costs))):
        k = max(shortest, nearest_iterations(interval_s, costs.iteration_s))
        exact = interval_s / costs.iteration_s
        rows.append(Interval(name=name, exact_iterations=exact, shares=shares_at(costs, k)))
    return rows


def run_goodput(rows: list[Interval]) -> float:
    """The goodput a run gets: at the given interval, else at the best; 1 with neither
    (no failures and no interval: nothing to checkpoint for)."""
    return rows[0].shares.useful if rows else 1.0

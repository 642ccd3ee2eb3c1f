"""Planning questions asked before renting a cluster: which models of a family fit on N
nodes, the fewest nodes a model needs, how long training takes, and how throughput
scales with the nodes (data parallelism taking up the change)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..cost.memory import out_of_memory
from ..ir.results import MetricsRow
from ..ir.vocabulary import RECOMPUTE_FULL
from ..scenario import Scenario, ScenarioError
from ..scenario.presets import MODEL_FAMILIES
from .planning import (
    KEEP_MICROBATCHES,
    SCALE_KEEPS,
    model_params,
    with_model,
    with_nodes,
)
from .search import Candidate, fits
from .space import SearchSpace

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FitRow:
    name: str
    params: float
    scenario: Scenario
    num_fitting: int  # layouts of the space that fit
    leanest: Candidate | None  # the fitting layout with the least memory on its fullest GPU


def leanest_of(fitting: Sequence[Candidate]) -> Candidate | None:
    return min(fitting, key=lambda c: (c.memory_gib, c.layout.key), default=None)


def fit_family(base: Scenario, family: str, space: SearchSpace) -> list[FitRow]:
    """Which members of a model family fit on the base scenario's cluster."""
    rows = []
    for name, layers, hidden, heads in MODEL_FAMILIES[family]:
        scenario = with_model(base, name, layers, hidden, heads)
        fitting = fits(scenario, space)
        rows.append(
            FitRow(
                name=name,
                params=model_params(scenario),
                scenario=scenario,
                num_fitting=len(fitting),
                leanest=leanest_of(fitting),
            )
        )
    return rows


def check_family(family: str) -> None:
    if family not in MODEL_FAMILIES:
        raise ScenarioError(f"--family={family!r} is not one of: {', '.join(MODEL_FAMILIES)}")


def largest_fitting(rows: Sequence[FitRow]) -> FitRow | None:
    """The largest member of the family (the last of the rows) that fits."""
    return next((r for r in reversed(rows) if r.leanest is not None), None)


def min_nodes(base: Scenario, space: SearchSpace, max_nodes: int) -> tuple[int, list[Candidate]]:
    """The fewest nodes (1 .. max_nodes) on which some layout of the space fits the base
    scenario's model, and the layouts that fit there; (0, []) when none does."""
    if max_nodes < 1:
        raise ScenarioError(f"--max-nodes={max_nodes} must be >= 1")
    for n in range(1, max_nodes + 1):
        fitting = fits(with_nodes(base, n), space)
        if fitting:
            return n, fitting
    return 0, []


def scale_scenarios(
    base: Scenario, nodes: Sequence[int], keep: str
) -> list[tuple[int, Scenario | None, str]]:
    """The base layout on each node count, data parallelism taking up the change:
    (nodes, scenario or None, why not). ``keep`` = "global-batch" (strong scaling: the
    same global batch, fewer micro-batches per pipeline as DP grows) or "microbatches"
    (weak scaling: the global batch grows with DP)."""
    if keep not in SCALE_KEEPS:
        raise ScenarioError(f"--keep={keep!r} must be 'global-batch' or 'microbatches'")
    par, tr = base.parallel, base.training
    model_gpus = par.tensor_model_parallel_size * par.pipeline_model_parallel_size
    out: list[tuple[int, Scenario | None, str]] = []
    for n in nodes:
        if n < 1:
            raise ScenarioError(f"--nodes value {n} must be >= 1")
        gpus = n * base.cluster.gpus_per_node
        if gpus % model_gpus:
            out.append((n, None, f"{gpus} GPUs are not a multiple of TP x PP = {model_gpus}"))
            continue
        dp = gpus // model_gpus
        training = tr
        if keep == KEEP_MICROBATCHES:
            gbs = base.num_microbatches * tr.micro_batch_size * dp
            training = replace(tr, global_batch_size=gbs)
        try:
            scenario = replace(
                base,
                cluster=replace(base.cluster, num_nodes=n),
                parallel=replace(par, data_parallel_size=dp),
                training=training,
            )
        except ScenarioError as exc:
            out.append((n, None, str(exc)))
            continue
        out.append((n, scenario, ""))
    return out


class TrainingTime(NamedTuple):
    days: float
    gpu_hours: float


def training_time(metrics: MetricsRow, tokens: float) -> TrainingTime:
    """Days and GPU-hours to train on ``tokens`` at the simulated throughput."""
    seconds = tokens / metrics.tokens_per_s
    return TrainingTime(
        days=seconds / SECONDS_PER_DAY, gpu_hours=seconds / 3600.0 * metrics.num_gpus
    )


def narayanan_days(
    params: float, tokens: float, num_gpus: int, tflops_per_gpu: float, factor: int = 8
) -> float:
    """Narayanan et al. 2021 Sec 5.1's estimate of end-to-end training time in days,
    8 T P / (n X) with full recomputation (``factor`` 6 without), X in FLOP/s per GPU."""
    return factor * tokens * params / (num_gpus * tflops_per_gpu * 1e12) / SECONDS_PER_DAY


def flops_factor(scenario: Scenario) -> int:
    """FLOPs per parameter and token in Narayanan et al.'s estimate: 8 with full
    recomputation (a second forward), 6 without."""
    return 8 if scenario.training.recompute_granularity == RECOMPUTE_FULL else 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaled:
    """A simulated node count: its layout's data parallelism and global batch, its
    speedup and scaling efficiency against the fewest nodes simulated."""

    dp: int
    global_batch: int
    speedup: float
    efficiency: float
    time: TrainingTime | None  # with --tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalePoint:
    nodes: int
    why: str  # why this node count was not simulated; "" when it was
    metrics: MetricsRow | None
    scaled: Scaled | None

    def row(self) -> dict[str, Any]:
        """The point's row of scale.csv (simulated points only)."""
        assert self.metrics is not None and self.scaled is not None
        scaled = self.scaled
        time = scaled.time._asdict() if scaled.time is not None else {}
        return {
            "nodes": self.nodes,
            "data_parallel_size": scaled.dp,
            "global_batch_size": scaled.global_batch,
            **self.metrics.row(),
            "speedup": scaled.speedup,
            "scaling_efficiency": scaled.efficiency,
            **time,
        }


def scale_points(
    entries: Sequence[tuple[int, Scenario | None, str]],
    results: Sequence[MetricsRow | None],
    tokens: float | None,
) -> list[ScalePoint]:
    """One point per node count: its metrics, speedup and scaling efficiency against the
    fewest nodes simulated, and with ``tokens`` the days and GPU-hours."""
    done = [(n, m) for (n, _, _), m in zip(entries, results, strict=True) if m is not None]
    first = min(done, key=lambda d: d[0]) if done else None
    points = []
    for (nodes, scenario, why), metrics in zip(entries, results, strict=True):
        scaled = None
        if metrics is not None and first is not None and scenario is not None:
            speedup = metrics.tokens_per_s / first[1].tokens_per_s
            scaled = Scaled(
                dp=scenario.parallel.data_parallel_size,
                global_batch=scenario.training.global_batch_size,
                speedup=speedup,
                efficiency=speedup / (nodes / first[0]),
                time=training_time(metrics, tokens) if tokens is not None else None,
            )
        points.append(ScalePoint(nodes=nodes, why=why, metrics=metrics, scaled=scaled))
    return points


def check_fits(scenario: Scenario) -> None:
    """A one-line ScenarioError when the scenario does not fit in GPU memory: the
    memory model's problem without the --allow-oom hint, which plan does not take."""
    from ..run.iteration import memory_per_stage

    problem = out_of_memory(scenario, memory_per_stage(scenario))
    if problem:
        raise ScenarioError(problem.problem)


def check_tokens(tokens: float | None) -> None:
    if tokens is not None and not 0 < tokens < float("inf"):
        raise ScenarioError(f"--tokens={tokens} must be a positive number")

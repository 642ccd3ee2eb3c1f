"""`--json` documents of `stepsim search` and `stepsim plan`: what their tables show, as
plain JSON types, each with the schema version (results.SCHEMA_VERSION)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..ir.results import SCHEMA_VERSION, MetricsRow
from ..scenario import Scenario
from .goodput import Costs, Interval, Reliability, run_goodput
from .questions import FitRow, ScalePoint, TrainingTime, leanest_of
from .search import (
    OUT_OF_MEMORY,
    PRUNED,
    SIMULATED,
    Candidate,
    RuleOfThumb,
    SearchResult,
    result_rows,
)


def _head(command: str, base: Scenario) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "command": command, "scenario": base.name}


def candidate_record(c: Candidate | None) -> dict[str, Any] | None:
    """A layout with its memory and, when simulated, its metrics row."""
    if c is None:
        return None
    out: dict[str, Any] = {"layout": c.layout.key, **c.layout.as_dict(), "memory_gib": c.memory_gib}
    if c.metrics is not None:
        out["metrics"] = c.metrics.row()
    return out


def search_record(
    base: Scenario, result: SearchResult, rule: RuleOfThumb | None, command: str
) -> dict[str, Any]:
    return {
        **_head("search", base),
        "enumerated": result.enumerated,
        "break_a_rule": dict(result.invalid),
        "out_of_memory": result.count(OUT_OF_MEMORY),
        "memory_headroom": None if result.space is None else result.space.memory_headroom,
        "simulated": result.count(SIMULATED),
        "pruned": result.count(PRUNED),
        "layouts": result_rows(result),
        "rule_of_thumb": None
        if rule is None
        else {"layout": rule.layout.key, "rank": rule.rank, "metrics": rule.metrics.row()},
        "run_best": command if result.ranked else None,
    }


def fit_record(base: Scenario, rows: Sequence[FitRow], nodes: int, best: Candidate | None):
    return {
        **_head("plan fit", base),
        "nodes": nodes,
        "models": [
            {
                "name": r.name,
                "params": r.params,
                "fitting_layouts": r.num_fitting,
                "leanest": candidate_record(r.leanest),
            }
            for r in rows
        ],
        "fastest_of_largest": candidate_record(best),
    }


def min_nodes_record(
    base: Scenario, nodes: int, fitting: Sequence[Candidate], best: Candidate | None, max_nodes: int
) -> dict[str, Any]:
    return {
        **_head("plan fit --min-nodes", base),
        "max_nodes": max_nodes,
        "min_nodes": nodes or None,
        "fitting_layouts": len(fitting),
        "leanest": candidate_record(leanest_of(fitting)),
        "fastest": candidate_record(best),
    }


def throughput_record(
    base: Scenario,
    params: float,
    metrics: MetricsRow,
    tokens: float | None,
    time: TrainingTime | None,
    estimate_days: float | None,
) -> dict[str, Any]:
    return {
        **_head("plan throughput" if tokens is None else "plan time-to-train", base),
        "params": params,
        "metrics": metrics.row(),
        "tokens": tokens,
        "days": None if time is None else time.days,
        "gpu_hours": None if time is None else time.gpu_hours,
        "narayanan_estimate_days": estimate_days,
    }


def scale_record(base: Scenario, points: Sequence[ScalePoint], keep: str) -> dict[str, Any]:
    return {
        **_head("plan scale", base),
        "keep": keep,
        "points": [
            p.row()
            if p.metrics is not None and p.scaled is not None
            else {"nodes": p.nodes, "not_simulated": p.why}
            for p in points
        ],
    }


def goodput_record(
    scenario: Scenario,
    params: float,
    rel: Reliability,
    costs: Costs,
    rows: Sequence[Interval],
    simulated: bool,
    tokens: float | None,
) -> dict[str, Any]:
    """`plan goodput --json`: the inputs (JSON has no infinity: an infinite MTBF is
    null), the costs in seconds and bytes, and the shares at each interval."""

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {
        **_head("plan goodput", scenario),
        "params": params,
        "num_gpus": costs.num_gpus,
        "iteration_time_s": costs.iteration_s,
        "iteration_simulated": simulated,
        "mtbf_gpu_hours": finite(rel.mtbf_gpu_hours),
        "job_mtbf_s": finite(costs.job_mtbf_s),
        "storage_write_gbytes_per_s": rel.storage_write_gbytes_per_s,
        "storage_read_gbytes_per_s": rel.storage_read_gbytes_per_s,
        "async_checkpoint": rel.async_save,
        "checkpoint_bytes": costs.checkpoint_bytes,
        "checkpoint_write_s": costs.write_s,
        "checkpoint_blocking_s": costs.blocking_s,
        "checkpoint_load_s": costs.load_s,
        "restart_s": costs.restart_s,
        "intervals": [{**r.row(), **r.shares.row()} for r in rows],
        "tokens": tokens,
        "goodput": run_goodput(list(rows)),
    }


def run_goodput_record(
    costs: Costs, rows: Sequence[Interval], time: TrainingTime | None
) -> dict[str, Any]:
    """`plan time-to-train --goodput --json`'s "goodput": the run's goodput, its
    interval, and the days and GPU-hours divided by it."""
    goodput = run_goodput(list(rows))
    return {
        "goodput": goodput,
        "interval": rows[0].name if rows else None,
        "interval_iterations": rows[0].shares.interval_iterations if rows else None,
        "job_mtbf_s": None if math.isinf(costs.job_mtbf_s) else costs.job_mtbf_s,
        "days": None if time is None or goodput == 0 else time.days / goodput,
        "gpu_hours": None if time is None or goodput == 0 else time.gpu_hours / goodput,
    }

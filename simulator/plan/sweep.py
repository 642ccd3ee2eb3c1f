"""Run one scenario at many settings: a grid over one or more keys.

``--set cluster.nic_gbps=135,400 --set parallel.pipeline_model_parallel_size=8,16``
is a 2 x 2 grid, the first key varying slowest. Every point is loaded and
validated before any is simulated; a point that is not valid is set aside with its
reason and the others run (the command marks it and exits non-zero).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..ir.results import Metrics, SweepPoint
from ..scenario import Scenario, ScenarioError, parse_override


def split_axes(overrides: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Separate fixed overrides from swept ones (a comma-separated list of values).

    Returns (fixed ``key=value`` strings, [(key, [value texts])] for swept keys).
    """
    fixed: list[str] = []
    axes: list[tuple[str, list[str]]] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        parse_override(item)  # same errors as `run` for a malformed key
        values = [v.strip() for v in text.split(",")] if sep else []
        if len(values) > 1:
            if any(not v for v in values):
                raise ScenarioError(f"--set {item!r}: empty value in the list")
            if any(k == key.strip() for k, _ in axes):
                raise ScenarioError(f"--set {key.strip()} is swept twice")
            axes.append((key.strip(), values))
        else:
            fixed.append(item)
    swept = {key for key, _ in axes}
    for item in fixed:
        key = item.partition("=")[0].strip()
        if key in swept:
            raise ScenarioError(f"--set {key} is both swept and fixed; give it once")
    return fixed, axes


def grid(axes: Sequence[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
    """Every combination of the swept values, as (key, value text) pairs."""
    keys = [key for key, _ in axes]
    return [
        list(zip(keys, combo, strict=True))
        for combo in itertools.product(*(values for _, values in axes))
    ]


class Sweep(NamedTuple):
    """What a sweep did: the swept keys, the simulated points in grid order, the points
    refused with their reason, and whether Ctrl-C stopped it before the end."""

    keys: list[str]
    points: list[SweepPoint]
    rejected: list[tuple[dict[str, Any], str]]
    interrupted: bool = False
    stopped_by: BaseException | None = None  # what interrupted it


def run_sweep(
    load: Callable[[Sequence[str]], Scenario],
    simulate: Callable[[Scenario], Metrics],
    overrides: Sequence[str],
    on_point: Callable[[int, int, str], None] | None = None,
) -> Sweep:
    """Load every point, then simulate the valid ones. A point that does not load is
    kept with its reason (``rejected``) and the others still run; Ctrl-C returns the
    points finished so far. ``on_point(i, n, description)`` is told before point i of
    the n valid ones is simulated."""
    fixed, axes = split_axes(overrides)
    if not axes:
        raise ScenarioError(
            "stepsim sweep needs at least one --set KEY=V1,V2,... with two or more values"
        )
    keys = [key for key, _ in axes]
    valid, rejected = [], []
    for point in grid(axes):
        settings = {k: parse_override(f"{k}={v}")[2] for k, v in point}
        try:
            valid.append((settings, load([*fixed, *(f"{k}={v}" for k, v in point)])))
        except ScenarioError as exc:
            rejected.append((settings, str(exc)))
    done = []
    try:
        for i, (settings, scenario) in enumerate(valid):
            if on_point is not None:
                on_point(i, len(valid), " ".join(f"{k}={v}" for k, v in settings.items()))
            metrics = simulate(scenario)
            done.append(
                SweepPoint(
                    settings,
                    metrics.summary_row(),
                    scenario.kernel_constants.source,
                    metrics.assumptions,
                )
            )
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (cli.common.Terminated)
        return Sweep(keys, done, rejected, interrupted=True, stopped_by=exc)
    return Sweep(keys, done, rejected)

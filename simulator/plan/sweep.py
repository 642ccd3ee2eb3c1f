"""Run one scenario at many settings: a grid over one or more keys.

``--set cluster.nic_gbps=135,400 --set parallel.pipeline_model_parallel_size=8,16``
is a 2 x 2 grid, the first key varying slowest. Every point is loaded and
validated before any is simulated, so a bad point fails at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from ..results import Metrics, SweepPoint
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


def run_sweep(
    load: Callable[[Sequence[str]], Scenario],
    simulate: Callable[[Scenario], Metrics],
    overrides: Sequence[str],
    on_point: Callable[[int, int, str], None] | None = None,
) -> tuple[list[str], list[SweepPoint]]:
    """Load every point, then simulate each; returns (swept keys, the points).
    ``on_point(i, n, description)`` is told before point i of n is simulated."""
    fixed, axes = split_axes(overrides)
    if not axes:
        raise ScenarioError(
            "stepsim sweep needs at least one --set KEY=V1,V2,... with two or more values"
        )
    points = grid(axes)
    scenarios = []
    for point in points:
        try:
            scenarios.append(load([*fixed, *(f"{k}={v}" for k, v in point)]))
        except ScenarioError as exc:
            where = ", ".join(f"{k}={v}" for k, v in point)
            raise ScenarioError(f"sweep point {where}: {exc}") from None
    done = []
    for i, (point, scenario) in enumerate(zip(points, scenarios, strict=True)):
        if on_point is not None:
            on_point(i, len(points), " ".join(f"{k}={v}" for k, v in point))
        settings = {k: parse_override(f"{k}={v}")[2] for k, v in point}
        done.append(SweepPoint(settings, simulate(scenario).summary_row()))
    return [key for key, _ in axes], done

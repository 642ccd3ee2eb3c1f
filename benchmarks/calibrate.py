"""Fit the A100's kernel constants on the calibration set, and show how.

    python benchmarks/calibrate.py                # ~5 minutes on 2 cores
    python benchmarks/calibrate.py --sensitivity  # what the unpublished choices do

Three constants are fitted (the kernel constants of the GPU records in
simulator/scenario/presets.py): gemm_efficiency, gemm_k_half and memory_efficiency;
tile size and SM count are hardware facts.
The data are the two tables in scenarios/validation/ (Narayanan et al. 2021
Table 1, Korthikanti et al. 2022 Table 4) and nothing else.

The objective is the mean squared relative error over every measured number:
the ten Table 1 iteration times and Table 4's five forward and five backward
layer times (both tables weigh the same). Simulating Table 1 takes about a minute,
too slow for a grid search, so the search uses a linearisation around a full
simulation and is repeated until the constants stop moving:

- a Table 1 row's iteration time is split, from its simulated breakdown, into
  the part that scales with compute (compute, pipeline bubble, optimizer) and
  the rest (exposed communication); the first is scaled by the ratio of one
  layer's forward + backward + recomputation under the candidate constants;
- a Table 4 layer time changes by exactly the change of its compute, because
  its communication does not depend on the compute constants.

The last full simulation is what docs/validation.md reports (stepsim validate).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.calibration.validation import (  # noqa: E402
    chunks_for,
    layer_scenario,
    layer_times,
    megatron_measured_s,
    megatron_scenario,
)
from simulator.run import run  # noqa: E402
from simulator.scenario.loader import read_validation_set  # noqa: E402
from simulator.scenario.presets import CALIBRATED_GPU, GPUS  # noqa: E402
from simulator.workload.compute import ComputeModel  # noqa: E402

GRID = {
    "gemm_efficiency": [x / 100 for x in range(60, 96)],
    "gemm_k_half": [0.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0],
    "memory_efficiency": [x / 100 for x in range(60, 96, 5)],
}


def layer_compute(scenario, constants, recompute: str) -> tuple[float, float]:
    """Forward and backward (with recomputation) compute of one layer."""
    layer = ComputeModel(replace(scenario, calibration=constants)).layer()
    forward = (layer.attention_forward + layer.mlp_forward).duration_s
    backward = (layer.attention_backward + layer.mlp_backward).duration_s
    if recompute == "full":
        backward += forward
    elif recompute == "selective":
        backward += layer.attention_core_forward.duration_s
    return forward, backward


def linearise(rows, constants):
    """Full simulations at ``constants``; per measured number a function of new ones."""
    models = []
    for row in rows["megatron"]:
        scenario = megatron_scenario(row, constants)
        metrics = run(scenario).metrics
        total = metrics.iteration_time_s
        bd = metrics.breakdown_s
        scaling = (bd["compute"] + bd["idle"] + bd["optimizer"]) / total
        f0, b0 = layer_compute(scenario, constants, "full")
        models.append(
            (
                f"{row['id']} iteration",
                megatron_measured_s(row),
                total,
                lambda c, s=scenario, t=total, k=scaling, w=f0 + b0: (
                    t * (1 - k + k * sum(layer_compute(s, c, "full")) / w)
                ),
            )
        )
    for row in rows["layers"]:
        scenario = layer_scenario(row, constants)
        forward_s, backward_s = layer_times(run(scenario).trace)
        f0, b0 = layer_compute(scenario, constants, row["recompute"])
        for index, (what, measured_ms, simulated_s, base) in enumerate(
            (
                ("forward", row["forward_ms"], forward_s, f0),
                ("backward", row["backward_ms"], backward_s, b0),
            )
        ):
            models.append(
                (
                    f"{row['id']} layer {what}",
                    float(measured_ms) / 1e3,
                    simulated_s,
                    lambda c, s=scenario, r=row["recompute"], x=simulated_s, y=base, i=index: (
                        x + layer_compute(s, c, r)[i] - y
                    ),
                )
            )
    return models


def loss(models, constants) -> float:
    return sum(
        (predict(constants) / measured - 1) ** 2 for _, measured, _, predict in models
    ) / len(models)


def main() -> None:
    rows = read_validation_set(ROOT / "scenarios" / "validation")
    constants = GPUS[CALIBRATED_GPU].kernels
    for round_ in range(1, 4):
        models = linearise(rows, constants)
        errors = [simulated / measured - 1 for _, measured, simulated, _ in models]
        print(
            f"round {round_}: simulated at {constants.gemm_efficiency:.2f} / "
            f"{constants.gemm_k_half:g} / {constants.memory_efficiency:.2f}: mean |error| "
            f"{sum(map(abs, errors)) / len(errors):.1%}, worst {max(map(abs, errors)):.1%}",
            flush=True,
        )
        best = min(
            (
                replace(constants, gemm_efficiency=e, gemm_k_half=k, memory_efficiency=m)
                for e, k, m in itertools.product(*GRID.values())
            ),
            key=lambda c: loss(models, c),
        )
        print(
            f"  best on the linearisation: gemm_efficiency={best.gemm_efficiency:.2f} "
            f"gemm_k_half={best.gemm_k_half:g} memory_efficiency={best.memory_efficiency:.2f} "
            f"(rms {loss(models, best) ** 0.5:.1%})",
            flush=True,
        )
        if best == constants:
            break
        constants = best
    for name, measured, simulated, _ in linearise(rows, constants):
        error = simulated / measured - 1
        print(f"  {name:22} measured {measured:9.4f} s  simulated {simulated:9.4f} s  {error:+.1%}")


def sensitivity() -> None:
    """The assumptions the calibration set does not fix, varied at the fitted constants:
    Table 1's chunks per stage (none, or one layer per chunk) and Table 4 without
    the async TP all-reduce."""
    rows = read_validation_set(ROOT / "scenarios" / "validation")
    for row in rows["megatron"]:
        layers, p = int(row["num_layers"]), int(row["pipeline_parallel"])
        if p == 1:
            continue
        cells = []
        for chunks in dict.fromkeys((1, chunks_for(layers // p), layers // p)):
            scenario = megatron_scenario(row, chunks=chunks)
            v = scenario.parallel.virtual_pipeline_model_parallel_size
            error = run(scenario).metrics.iteration_time_s / megatron_measured_s(row) - 1
            cells.append(f"v={v}: {error:+.1%}")
        print(f"  {row['id']:4} " + "   ".join(cells), flush=True)
    for row in rows["layers"]:
        cells = []
        for on in (True, False):
            forward_s, backward_s = layer_times(run(layer_scenario(row, async_allreduce=on)).trace)
            measured = float(row["total_ms"]) / 1e3
            cells.append(
                f"async {'on' if on else 'off'}: {(forward_s + backward_s) / measured - 1:+.1%}"
            )
        print(f"  {row['id']:4} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--sensitivity"]:
        sensitivity()
    else:
        main()

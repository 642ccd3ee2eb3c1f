"""Fit the A100's kernel constants on the calibration set, and show how.

    python benchmarks/calibrate.py --gpu a100               # ~5 minutes on 2 cores
    python benchmarks/calibrate.py --gpu v100               # seconds
    python benchmarks/calibrate.py --gpu h100 --fix gemm_efficiency=0.69 \
        --fix memory_efficiency=0.91                         # seconds
    python benchmarks/calibrate.py --gpu a100|h100 --sensitivity  # the unpublished choices
    python benchmarks/calibrate.py --kernels [--rows]      # the kernel-table fits, ~20 s

Three constants are fitted per GPU (the kernel constants of the GPU records in
simulator/scenario/presets.py): gemm_efficiency, gemm_k_half and memory_efficiency;
tile size and SM count are hardware facts; ``--fix`` holds one at a value measured
elsewhere (docs/calibration.md says which and why). Each GPU is fitted on its own set
in scenarios/validation/ and nothing else: the A100 on Narayanan et al. 2021 Table 1
and Korthikanti et al. 2022 Table 4, the V100 on the Megatron-LM README's DGX-2 table,
the H100 on Megatron-Core r0.8.0's weak-scaling table.

The objective is the mean squared relative error over every measured number of the
set (for the A100: the ten Table 1 iteration times and Table 4's five forward and
five backward layer times). Simulating Table 1 takes about a minute,
too slow for a grid search, so the search uses a linearisation around a full
simulation and is repeated until the constants stop moving:

- a Table 1 row's iteration time is split, from its simulated breakdown, into
  the part that scales with compute (compute, pipeline bubble, optimizer) and
  the rest (exposed communication); the first is scaled by the ratio of one
  layer's forward + backward + recomputation under the candidate constants;
- a Table 4 layer time changes by exactly the change of its compute, because
  its communication does not depend on the compute constants.

The last full simulation is what docs/validation.md reports (stepsim validate).

``--kernels`` runs the kernel-table fits instead (stepsim.calibration.kernels.KERNEL_FITS:
the Hopper and Blackwell GPUs' constants fitted on published kernel micro-benchmarks in
scenarios/validation/kernels/, no end-to-end run): per fit, the rows it used, what the
fit gives and what the GPU's record in simulator/scenario/hardware.py carries.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.calibration.validation import (  # noqa: E402
    H100Choices,
    chunks_of,
    dgx2_scenario,
    h100_measured_s,
    h100_rows,
    h100_scenario,
    layer_scenario,
    layer_times,
    megatron_measured_s,
    megatron_scenario,
)
from stepsim.cost.compute import ComputeModel  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import read_validation_set  # noqa: E402
from stepsim.scenario.presets import CALIBRATED_GPUS, GPUS  # noqa: E402

GRID = {
    "gemm_efficiency": [x / 100 for x in range(60, 96)],
    "gemm_k_half": [0.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0],
    "memory_efficiency": [x / 100 for x in range(60, 96, 5)],
}


def kernel_fits(show_rows: bool) -> int:
    """Run every kernel-table fit; 1 if a record differs from its fit."""
    from stepsim.calibration.kernels import KERNEL_FITS, kernel_rows, run_fit
    from stepsim.scenario.files import read_kernel_tables, shipped_dir

    rows = kernel_rows(read_kernel_tables(shipped_dir() / "validation" / "kernels"))
    differ = 0
    for fit in KERNEL_FITS:
        record = GPUS[fit.gpu]
        fitted, rms = run_fit(fit, rows, record)
        used = [r.id for r in rows if r.section in fit.sections and r.fitted]
        pick = {
            "gemm": lambda g: (g.kernels.gemm_efficiency, g.kernels.gemm_k_half),
            "fp8": lambda g: (g.fp8_kernels.gemm_efficiency, g.fp8_kernels.gemm_k_half),
            "memory": lambda g: (g.kernels.memory_efficiency,),
            "attention": lambda g: (
                (
                    g.attention_kernels.forward_efficiency,
                    g.attention_kernels.backward_efficiency,
                    g.attention_kernels.kv_half,
                    g.attention_kernels.exp_exposed,
                )
                if g.attention_kernels
                else None
            ),
        }[fit.constants]
        got, has = pick(fitted), pick(record)
        same = "same" if got == has else "DIFFERENT"
        differ += got != has
        print(
            f"{fit.gpu:15} {fit.constants:9} on {', '.join(fit.sections)}: {len(used)} rows, "
            f"fit {got} (rms {rms:.1%}); record {has}: {same}",
            flush=True,
        )
        if show_rows:
            print("    rows: " + " ".join(used))
    return 1 if differ else 0


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


def iteration_rows(gpu: str, rows, constants):
    """(name, measured s, scenario, recompute, to simulated s) per iteration row of the set."""
    if gpu == "a100":
        for row in rows["megatron"]:
            yield row["id"], megatron_measured_s(row), megatron_scenario(row, constants), "full"
    elif gpu == "v100":
        for row in rows["dgx2"]:
            measured = float(row["measured_iteration_ms"]) / 1e3
            yield row["id"], measured, dgx2_scenario(row, constants), "full"
    else:
        for row in h100_rows(rows["h100"]):
            yield (
                row["id"],
                h100_measured_s(row),
                h100_scenario(row, constants),
                H100Choices().recompute,
            )


def linearise(gpu: str, rows, constants):
    """Full simulations at ``constants``; per measured number a function of new ones."""
    models = []
    for name, measured, scenario, recompute in iteration_rows(gpu, rows, constants):
        metrics = run(scenario).metrics
        total = metrics.iteration_time_s
        bd = metrics.breakdown_s
        scaling = (bd["compute"] + bd["idle"] + bd["optimizer"]) / total
        f0, b0 = layer_compute(scenario, constants, recompute)
        models.append(
            (
                f"{name} iteration",
                measured,
                total,
                lambda c, s=scenario, t=total, k=scaling, w=f0 + b0, r=recompute: (
                    t * (1 - k + k * sum(layer_compute(s, c, r)) / w)
                ),
            )
        )
    for row in rows["layers"] if gpu == "a100" else ():
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


def main(gpu: str, fixed: dict[str, float]) -> None:
    """Fit on ``gpu``'s set; ``fixed`` holds constants taken from elsewhere (kernel
    measurements) and left out of the search."""
    rows = read_validation_set(ROOT / "scenarios" / "validation")
    constants = replace(GPUS[CALIBRATED_GPUS[gpu]].kernels, **fixed)
    grid = {key: [fixed[key]] if key in fixed else values for key, values in GRID.items()}
    for round_ in range(1, 5):
        models = linearise(gpu, rows, constants)
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
                for e, k, m in itertools.product(*grid.values())
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
    for name, measured, simulated, _ in linearise(gpu, rows, constants):
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
        for chunks in dict.fromkeys((1, chunks_of(row), layers // p)):
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


def h100_sensitivity() -> None:
    """The H100 table's unpublished choices varied at the fitted constants: model TFLOP/s
    error per row (memory that would not fit is marked)."""
    rows = h100_rows(read_validation_set(ROOT / "scenarios" / "validation")["h100"])
    variants = {
        "assumed": H100Choices(),
        "no --tp-comm-overlap": H100Choices(tp_comm_overlap=False),
        "unfused attention": H100Choices(attention_kernel="unfused", masked_softmax_fusion=False),
        "recompute full": H100Choices(recompute="full"),
        "micro-batch 2": H100Choices(micro_batch_size=2),
    }
    for row in rows:
        cells = []
        extra = dict(variants)
        layers, p = int(row["num_layers"]), int(row["pipeline_parallel"])
        if p > 1:
            per_stage = layers // p
            chunks = min(c for c in range(2, per_stage + 1) if per_stage % c == 0)
            extra[f"v={chunks}"] = H100Choices(chunks=chunks)
        for label, choices in extra.items():
            metrics = run(h100_scenario(row, choices=choices)).metrics
            error = float(row["measured_value"]) / metrics.model_tflops_per_gpu - 1
            oom = " OOM" if metrics.out_of_memory else ""
            cells.append(f"{label}: {error:+.1%}{oom}")
        print(f"  {row['id']:4} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", choices=tuple(CALIBRATED_GPUS), default="a100")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="run the kernel-table fits (scenarios/validation/kernels/) instead",
    )
    parser.add_argument("--rows", action="store_true", help="with --kernels: list each fit's rows")
    parser.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hold a constant at a value measured elsewhere (e.g. memory_efficiency=0.91)",
    )
    args = parser.parse_args()
    fixed = {}
    for item in args.fix:
        key, _, value = item.partition("=")
        if key not in GRID:
            parser.error(f"--fix {item!r}: the key must be one of {', '.join(GRID)}")
        fixed[key] = float(value)
    if args.kernels:
        sys.exit(kernel_fits(args.rows))
    if args.sensitivity:
        {"a100": sensitivity, "h100": h100_sensitivity, "v100": lambda: None}[args.gpu]()
    else:
        main(args.gpu, fixed)

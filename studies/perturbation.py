"""Perturbations on large scenarios: what they do to the iteration (docs/what-if.md) and
what the fast path costs (docs/performance.md).

    python studies/perturbation.py --what-if SCENARIO   # the what-if table (docs.py)
    python studies/perturbation.py --speed [--repeat 3] [--write]  # wall times

The perturbations (`CASES`): a 5 % straggler (one GPU of data-parallel replica 5, stage 0,
its compute ops 1.05 x as long), the same straggler on the last stage (same tensor rank and
replica: where 1F1B's steady state is set when the last stage also runs the output layer and
the loss), the NIC of that GPU at half rate, the cable from that
NIC to its leaf switch failed (the job after its restart without the NIC: GPU 43 uses
NIC 2), and a switch uplink failed. The first three touch replica 5 only, so symmetric
mode simulates that replica besides the representatives (simulator/run/perturb.py); a
failed uplink reroutes many replicas' traffic, which symmetric mode runs in class mode
(simulator/comm/classes.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))

from stepsim.ir.vocabulary import CATEGORIES  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import ScenarioError, load_scenario  # noqa: E402
from stepsim.scenario.perturbation import PerturbationSpec  # noqa: E402

# GPU 43: tensor rank 3 of data-parallel replica 5 on pipeline stage 0 (TP 8: node 5)
STRAGGLER_GPU, NODE, NIC = 43, 5, 3
CASES = {
    "clean": (),
    "5 % straggler (GPU 43)": (PerturbationSpec(kind="slow_gpu", gpu=STRAGGLER_GPU, factor=1.05),),
    # filled in per scenario: GPU 43's tensor rank and replica on the last stage
    "5 % straggler, last stage": (),
    "NIC 3 of node 5 at half rate": (
        PerturbationSpec(kind="slow_nic", node=NODE, nic=NIC, bandwidth_factor=0.5),
    ),
    "NIC 3 of node 5's cable failed, after the restart": (
        PerturbationSpec(kind="slow_nic", node=NODE, nic=NIC, down=True),
    ),
    # filled in per scenario: its first switch-to-switch link, if it has one
    "a switch uplink failed": (),
}
UPLINK = "a switch uplink failed"
LAST_STAGE = "5 % straggler, last stage"
SPEED_SCENARIOS = ("dense-16k-h100", "llama3.1-405b-16k-h100")
SPEED_BLOCK = "perturbation-speed"  # docs/performance.md's block
SPEED_CASES = ("clean", "5 % straggler (GPU 43)", "NIC 3 of node 5 at half rate")


def perturbed(scenario, perturbations):
    return dataclasses.replace(scenario, perturbations=perturbations)


def last_stage_gpu(scenario) -> int:
    """GPU 43's tensor rank and data-parallel replica on the last pipeline stage: the
    pipeline dimension is the outermost of the rank order (tp-cp-ep-dp-pp), so it is GPU 43
    plus (stages - 1) stages' worth of GPUs."""
    stages = scenario.parallel.pipeline_model_parallel_size
    per_stage = scenario.parallel.num_gpus // stages
    return STRAGGLER_GPU + (stages - 1) * per_stage


def first_uplink(scenario) -> int | None:
    """The first link between two switches of the scenario's cluster, if any."""
    from stepsim.run.iteration import build_cluster

    cluster = build_cluster(scenario.cluster, pattern=scenario.network.symmetry)
    for link in cluster.links:
        if link.src[0] == "switch" and link.dst[0] == "switch":
            return link.index
    return None


def what_if_table(path: str) -> str:
    """One row per case: iteration time, change, the mean breakdown's categories that
    moved, and the top cause of waiting (or the one-line error)."""
    base = load_scenario(path)
    rows = [
        "| case | iteration s | vs clean | compute | dp sync | idle | waits at collectives, "
        "top cause |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    clean = None
    labels = {c.key: c for c in CATEGORIES}
    for name, perturbations in CASES.items():
        if name == UPLINK:
            link = first_uplink(base)
            if link is None:
                rows.append(f"| {name} | | | | | | none in this fabric (one switch) |")
                continue
            perturbations = (PerturbationSpec(kind="slow_link", link=link, down=True),)
        if name == LAST_STAGE:
            gpu = last_stage_gpu(base)
            name = f"{name} (GPU {gpu})"
            perturbations = (PerturbationSpec(kind="slow_gpu", gpu=gpu, factor=1.05),)
        try:
            m = run(perturbed(base, perturbations)).metrics
        except ScenarioError as exc:
            rows.append(f"| {name} | refused | | | | | {exc} |")
            continue
        clean = clean or m
        b = m.breakdown_s
        change = 100 * (m.iteration_time_s / clean.iteration_time_s - 1)
        waits = (
            ""
            if not m.waits
            else (
                f"{sum(w.gpu_seconds for w in m.waits):,.1f} GPU-s; {m.waits[0].cause} "
                f"({m.waits[0].gpu_seconds:,.1f} GPU-s)"
            )
        )
        cells = [b[k] for k in ("compute", "dp_sync", "idle") if k in labels]
        rows.append(
            f"| {name} | {m.iteration_time_s:.3f} | {change:+.2f} % | "
            + " | ".join(f"{c:.3f}" for c in cells)
            + f" | {waits} |"
        )
    return "\n".join(rows)


def speed(repeat: int) -> str:
    """Median wall time of `run` (cluster, lowering, simulation, metrics) per case."""
    rows = [
        f"| scenario | case | wall s (median of {repeat}) | x clean | iteration s |",
        "|---|---|---:|---:|---:|",
    ]
    for name in SPEED_SCENARIOS:
        scenario = load_scenario(name)
        clean_s = None
        for case in SPEED_CASES:
            s = perturbed(scenario, CASES[case])
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                m = run(s).metrics
                times.append(time.perf_counter() - started)
            wall = statistics.median(times)
            clean_s = clean_s or wall
            rows.append(
                f"| {name} | {case} | {wall:.2f} | {wall / clean_s:.2f} | "
                f"{m.iteration_time_s:.4f} |"
            )
            print(rows[-1], file=sys.stderr)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what-if", metavar="SCENARIO", help="print the what-if table")
    parser.add_argument("--speed", action="store_true", help="time clean vs perturbed runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--write", action="store_true", help="with --speed: into docs/performance.md"
    )
    args = parser.parse_args(argv)
    if args.what_if:
        print(what_if_table(args.what_if))
    if args.speed:
        table = speed(args.repeat)
        print(table)
        if args.write:
            from docs import splice

            path = ROOT / "docs" / "performance.md"
            path.write_text(splice(path.read_text(), SPEED_BLOCK, table, str(path)))
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The BigScience question: what 135 vs 400 Gb/s between nodes does to a 175B model
on 4 x V100 nodes, under three parallel layouts.

    python studies/bandwidth_study.py        # table to stdout, plot to docs/images/

Each layout is the shipped scenario with a few keys changed, run at both
bandwidths exactly as `stepsim sweep scenarios/bigscience-175b-v100.toml
--set cluster.nic_gbps=135,400 --set ...` would. docs/bandwidth-study.md
explains the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matplotlib.figure import Figure  # noqa: E402

from stepsim.ir.results import Metrics, SweepPoint  # noqa: E402
from stepsim.ir.vocabulary import BREAKDOWN_KEYS  # noqa: E402
from stepsim.plan.sweep import run_sweep  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import load_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios" / "bigscience-175b-v100.toml"
NIC_KEY = "cluster.nic_gbps"
BANDWIDTHS = f"{NIC_KEY}=135,400"
LAYOUTS = {
    "A: PP across nodes (TP 4, PP 48, DP 2)": [],
    "B: PP + distributed optimizer (TP 4, PP 12, DP 8, ZeRO-1)": [
        "parallel.pipeline_model_parallel_size=12",
        "parallel.data_parallel_size=8",
        "training.data_parallel_sharding=optimizer",
        "training.overlap_grad_reduce=true",
    ],
    "C: fully sharded DP between nodes (TP 4, DP 96, FSDP, micro-batch 2)": [
        "parallel.pipeline_model_parallel_size=1",
        "parallel.data_parallel_size=96",
        "training.data_parallel_sharding=full",
        "training.micro_batch_size=2",
    ],
}


def study(full: dict[str, list[Metrics]] | None = None) -> dict[str, list[SweepPoint]]:
    """Every layout at both bandwidths; ``full``, if given, gets each layout's complete
    metrics (per stage too) in the points' order."""
    results = {}
    for name, overrides in LAYOUTS.items():
        kept = full.setdefault(name, []) if full is not None else []

        def simulate(scenario, kept=kept):
            metrics = run(scenario).metrics
            kept.append(metrics)
            return metrics

        sweep = run_sweep(lambda o: load_scenario(SCENARIO, o), simulate, [*overrides, BANDWIDTHS])
        if sweep.rejected:
            raise SystemExit(f"{name}: {sweep.rejected[0][1]}")
        results[name] = sweep.points
        print(f"done: {name}", file=sys.stderr)
    return results


def table(results: dict[str, list[SweepPoint]]) -> str:
    head = (
        "| layout | Gb/s | iteration s | TFLOP/s per GPU | MFU | memory GiB | "
        + " | ".join(f"{c} s" for c in BREAKDOWN_KEYS)
        + " |"
    )
    lines = [head, "|---|---:|" + "---:|" * (4 + len(BREAKDOWN_KEYS))]
    for name, points in results.items():
        for settings, m, *_ in points:
            cells = [
                name.split(":")[0],
                f"{settings[NIC_KEY]:g}",
                f"{m.iteration_time_s:.2f}",
                f"{m.hardware_tflops_per_gpu:.1f}",
                f"{100 * m.mfu:.1f} %",
                f"{m.memory_per_gpu_gib:.1f}",
                *(f"{m.breakdown_s[c]:.2f}" for c in BREAKDOWN_KEYS),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(results: dict[str, list[SweepPoint]]) -> Figure:
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for name, points in results.items():
        x = [p.settings[NIC_KEY] for p in points]
        metrics = [p.metrics for p in points]
        short = name.split(":")[0]
        axes[0].plot(x, [m.iteration_time_s for m in metrics], marker="o", label=name)
        axes[1].plot(x, [m.hardware_tflops_per_gpu for m in metrics], marker="o", label=short)
        axes[2].plot(x, [100 * m.exposed_comm_fraction for m in metrics], marker="o", label=short)
    for ax, label in zip(
        axes,
        (
            "iteration time (s)",
            "hardware TFLOP/s per GPU",
            "exposed communication (% of iteration)",
        ),
        strict=True,
    ):
        ax.set_xlabel("bandwidth between nodes (Gb/s)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.set_xticks([135, 400])
        ax.grid(alpha=0.3)
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle("GPT-3 175B on 96 nodes of 4 x V100 32 GB, global batch 768")
    return fig


def main() -> None:
    results = study()
    print(table(results))
    figure(results).savefig(ROOT / "docs" / "images" / "bandwidth-study.png", dpi=110)
    print("wrote docs/images/bandwidth-study.png", file=sys.stderr)


if __name__ == "__main__":
    main()

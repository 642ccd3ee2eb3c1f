"""Every pipeline schedule on GPT-3 175B (128 DGX A100 nodes), in the full simulator.

    python studies/schedule_study.py        # markdown table to stdout, pictures to docs/images/

The shipped scenario scenarios/gpt3-175b-128nodes.toml with selective recomputation
and sequence parallelism, at pipeline size 8 (DP 16) and 16 (DP 8), and several
micro-batch counts per pipeline (the global batch is set to m x DP). Each row is
`stepsim run scenarios/gpt3-175b-128nodes.toml --set ...` with the keys printed in
the table. docs/schedules.md explains the result.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.cost.compute import ComputeModel  # noqa: E402
from stepsim.report.timeline import pipeline_figure, timeline_figure  # noqa: E402
from stepsim.run.bubble import OpTimes, run_schedule  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import load_scenario  # noqa: E402
from stepsim.schedules import SCHEDULES as ALL_SCHEDULES  # noqa: E402

SCENARIO = ROOT / "scenarios" / "gpt3-175b-128nodes.toml"
IMAGES = ROOT / "docs" / "images"
COMMON = ["training.recompute_granularity=selective", "parallel.sequence_parallel=true"]
LAYOUTS = {8: 16, 16: 8}  # pipeline size -> data-parallel size (TP 8, 1024 GPUs)
MICROBATCHES = (16, 32, 64)
PICTURED = ("1f1b", "interleaved", "zbh1", "zbv")
# DualPipe's two need m >= 2p (not at p = 16, m = 16), and dualpipe's two model copies
# run in `stepsim schedule` only: docs/schedules.md treats them in a section of their own
SCHEDULES = {name: info for name, info in ALL_SCHEDULES.items() if not name.startswith("dualpipe")}


def overrides(schedule: str, p: int, m: int) -> list[str]:
    d = LAYOUTS[p]
    return COMMON + [
        f"training.schedule={schedule}",
        f"parallel.pipeline_model_parallel_size={p}",
        f"parallel.data_parallel_size={d}",
        f"training.global_batch_size={m * d}",
    ]


class Row(NamedTuple):
    p: int
    m: int
    schedule: str
    chunks: int
    iteration_s: float
    bubble: float
    mfu: float
    memory_gib: float


def full_runs(images: Path | None = IMAGES, log=print) -> list[Row]:
    """Every schedule at every (p, m), simulated in full; the p = 8, m = 16 timelines of
    PICTURED drawn into ``images`` (None: no pictures)."""
    rows = []
    for p in LAYOUTS:
        for m in MICROBATCHES:
            for name in SCHEDULES:
                scenario = load_scenario(SCENARIO, overrides(name, p, m))
                result = run(scenario)
                r = result.metrics
                memory = max(stage.as_gib()["total"] for stage in result.memory)
                row = Row(
                    p,
                    m,
                    name,
                    scenario.parallel.virtual_pipeline_model_parallel_size,
                    r.iteration_time_s,
                    r.bubble_fraction,
                    r.mfu,
                    memory,
                )
                rows.append(row)
                log(
                    f"| {p} | {m} | {name} | {row.chunks} | {row.iteration_s:.2f} | "
                    f"{row.bubble:.1%} | {row.mfu:.1%} | {memory:.1f} |"
                )
                if images is not None and p == 8 and m == 16 and name in PICTURED:
                    figure = timeline_figure(result)
                    figure.savefig(images / f"schedules-gpt3-p8-m16-{name}.png", dpi=90)
    return rows


def abstract(images: Path | None = IMAGES) -> tuple[OpTimes, list]:
    """The p = 8, m = 16 setting on abstract op times (ms per micro-batch and stage)
    taken from the compute model, every schedule; the stacked picture into ``images``."""
    scenario = load_scenario(SCENARIO, overrides("zbh1", 8, 16))
    layer = ComputeModel(scenario).layer()
    per_stage = scenario.model.num_layers // 8
    weight = (layer.attention_weight + layer.mlp_weight).duration_s * per_stage * 1e3
    forward = (layer.attention_forward + layer.mlp_forward).duration_s * per_stage * 1e3
    backward = (layer.attention_backward + layer.mlp_backward).duration_s * per_stage * 1e3
    times = OpTimes(forward=forward, backward=backward - weight, weight=weight)
    studies = [
        run_schedule(name, 8, 16, times, 2 if SCHEDULES[name].chunked else 1) for name in SCHEDULES
    ]
    if images is not None:
        pipeline_figure(studies).savefig(images / "schedules-abstract-p8-m16.png", dpi=90)
    return times, studies


def main() -> None:
    print("| p | m | schedule | chunks | iteration (s) | bubble | MFU | peak memory (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    full_runs(log=lambda line: print(line, flush=True))
    times, studies = abstract()
    print(
        f"\nabstract op times per micro-batch and stage (ms): F {times.forward:.1f}, "
        f"B {times.backward:.1f}, W {times.weight:.1f}"
    )
    for study in studies:
        d = study.as_dict()
        share = d["bubble_fraction"]
        print(f"  {study.name:<15} makespan {d['makespan']:.0f} ms, bubble {share:.1%} of it")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

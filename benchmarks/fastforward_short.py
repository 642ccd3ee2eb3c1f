"""How short the fast-forward's short run can be: its proof and cost at two lengths.

    .venv/bin/python benchmarks/fastforward_short.py          # 31 layouts, about 4 min

For each layout, in one process (CPU time, `time.process_time`, `run(spans=False)` as
`stepsim run --json` runs it): the full run (`network.fast_forward = false`), then the
fast-forward as a user gets it (tried where `fastforward.worth_it` says so) with the
short run at the lengths of before (m' = 2 p v + 4 q: `WARM_PERIODS` 2,
`STEADY_PERIODS` 4) and now (m' = p v + 2 q: 1 and 2; schedules that split the
backward keep 2 and 4 either way). It prints, per layout and length, m', whether the
fast-forward was used (its proof held), the CPU seconds, and the iteration's relative
difference from the full run's. docs/performance.md, "The short run shortened", has a
sitting's table.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.run import fastforward  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import load_scenario  # noqa: E402

GPT3 = str(ROOT / "scenarios" / "gpt3-175b-128nodes.toml")
LENGTHS = {"before": (2, 4), "now": (1, 2)}  # (WARM_PERIODS, STEADY_PERIODS)


def layouts() -> list[tuple[str, str, list[str]]]:
    """(name, scenario, --set overrides): GPT-3 175B's layout varied, and the shipped
    scenarios that run a pipeline of many micro-batches."""
    cases = []
    for p in (4, 8, 16, 32):
        for m in (24, 48, 96, 192):
            if m >= p:
                sets = [f"parallel.pipeline_model_parallel_size={p}", f"cluster.num_nodes={8 * p}"]
                cases.append(
                    (f"GPT-3, 1F1B, PP {p}", GPT3, [*sets, f"training.global_batch_size={8 * m}"])
                )
    for p, v in ((8, 2), (16, 2), (8, 4)):
        for m in (64, 128, 256):
            sets = [
                f"parallel.pipeline_model_parallel_size={p}",
                f"cluster.num_nodes={8 * p}",
                f"training.global_batch_size={8 * m}",
                "training.schedule=interleaved",
                f"parallel.virtual_pipeline_model_parallel_size={v}",
                "model.num_layers=96",
            ]
            cases.append((f"GPT-3, interleaved, PP {p}, v {v}", GPT3, sets))
    for m in (96, 192):
        sets = [f"training.global_batch_size={8 * m}", "training.schedule=zbh1"]
        cases.append(("GPT-3, zbh1, PP 16", GPT3, sets))
    for name in (
        "mt-nlg-530b-280nodes",
        "mt-nlg-530b-350nodes",
        "mt-nlg-530b-420nodes",
        "bigscience-175b-v100",
        "llama3-70b-4racks-gb200",
        "qwen3-235b-a22b-64-b200",
    ):
        cases.append((name, name, []))
    return cases


def timed(scenario):
    gc.collect()
    start = time.process_time()
    result = run(scenario, spans=False)
    return result, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run only layouts whose name contains this")
    args = parser.parse_args()
    print(
        "| layout | m | m' before | m' now | used before | used now | CPU before | CPU now | "
        "iteration vs full (before, now) |"
    )
    print("|---|---:|---:|---:|:---:|:---:|---:|---:|---:|")
    for name, path, sets in layouts():
        if args.only and args.only not in name:
            continue
        scenario = load_scenario(path, sets)
        full, _ = timed(replace(scenario, network=replace(scenario.network, fast_forward=False)))
        row = {}
        for label, (warm, steady) in LENGTHS.items():
            fastforward.WARM_PERIODS, fastforward.STEADY_PERIODS = warm, steady
            q = fastforward.periods(scenario)[0]
            result, cpu = timed(scenario)
            used = result.metrics.fast_forward is not None
            rel = result.metrics.iteration_time_s / full.metrics.iteration_time_s - 1
            row[label] = (fastforward.short_microbatches(scenario, q), used, cpu, rel)
        (m_before, used_before, cpu_before, rel_before) = row["before"]
        (m_now, used_now, cpu_now, rel_now) = row["now"]
        print(
            f"| {name} | {scenario.num_microbatches} | {m_before} | {m_now} | "
            f"{'yes' if used_before else 'no'} | {'yes' if used_now else 'no'} | "
            f"{cpu_before:.2f} s | {cpu_now:.2f} s | {rel_before:.1e}, {rel_now:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

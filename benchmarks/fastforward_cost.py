"""What the steady-state fast-forward costs against the full run it replaces.

    .venv/bin/python benchmarks/fastforward_cost.py              # every layout, median of 3
    .venv/bin/python benchmarks/fastforward_cost.py --repeat 1 --only gpt3-p16

For each layout, in one process (CPU time, `time.process_time`, the collector run
between runs and paused inside them as `run()` does), alternating, median of
``--repeat``:

- ``full(m)``: the full run as a search simulates it (`run(spans=False,
  idle_split=False)`, `network.fast_forward = false`);
- ``full(m')``: the same with the short run's m' micro-batches;
- ``ff(m)``: the fast-forward, tried whatever m is (`fastforward.worth_it` forced),
  with its phases: the two lowerings (m' and m' + q), the insertion check, the observed
  simulation of m' (of which the snapshots), the proof, the schedule checks (the orders
  of m' + q, then of m) and the metrics; where the proof fails (GPipe, the zero-bubble
  layouts here), ff(m) also holds the full run that follows, as a user pays it.

A full run costs ``fixed + per_mb x m`` (its two sizes give both); the fast-forward
costs ``fixed + per_mb x (short x m' + orders x m)``: ``short`` (per micro-batch of the
short run: its two lowerings, the insertion check, the observed simulation with its
snapshots, the proof, the metrics) and ``orders`` (per micro-batch of m: the schedule
check builds m's orders) in micro-batches of the full run. It pays when
``short x m' + orders x m < m``, that is ``m / m' > even = short / (1 - orders)``:
`fastforward.SHORT_COST` and `ORDERS_COST` are the medians of the two columns over the
layouts where the proof holds (docs/performance.md, "The fast-forward's threshold,
measured").
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.engine import steady  # noqa: E402
from stepsim.run import fastforward, iteration  # noqa: E402
from stepsim.scenario import Scenario, load_scenario  # noqa: E402

GPT3 = "scenarios/gpt3-175b-128nodes.toml"
MT_NLG = "scenarios/mt-nlg-530b-420nodes.toml"


def _gpt3(tp: int, pp: int, batch: int = 1536, *more: str) -> list[str]:
    """GPT-3 175B on its 128 DGX A100s with TP x PP x DP = 1,024 (a layout of the search)."""
    dp = 1024 // (tp * pp)
    return [
        GPT3,
        f"parallel.tensor_model_parallel_size={tp}",
        f"parallel.pipeline_model_parallel_size={pp}",
        f"parallel.data_parallel_size={dp}",
        f"training.global_batch_size={batch}",
        *more,
    ]


# name: (scenario file, --set overrides); m / m' between about 1.5 and 6
LAYOUTS: dict[str, list[str]] = {
    "gpt3-p4": _gpt3(8, 4),  # m = 48, m' = 12
    "gpt3-p8": _gpt3(8, 8),  # m = 96, m' = 20
    "gpt3-p16": _gpt3(8, 16),  # m = 192, m' = 36
    "gpt3-p32": _gpt3(8, 32),  # m = 384, m' = 68
    "gpt3-p16-tp4-sel": _gpt3(
        4, 16, 1536, "training.recompute_granularity='selective'"
    ),  # m = 96, m' = 36
    "gpt3-p8-interleaved": _gpt3(
        8,
        8,
        3072,
        "training.schedule='interleaved'",
        "parallel.virtual_pipeline_model_parallel_size=2",
    ),  # m = 192, m' = 64, q = 8
    "gpt3-p16-zero1-overlap": _gpt3(
        8,
        16,
        1536,
        "training.data_parallel_sharding='optimizer'",
        "training.overlap_grad_reduce=true",
    ),
    # the zero-bubble schedules: the proof is tried; where it fails the full run follows
    "gpt3-p8-zbh1": _gpt3(8, 8, 1536, "training.schedule='zbh1'"),  # m = 96, m' = 20
    "gpt3-p16-zbh1": _gpt3(8, 16, 1536, "training.schedule='zbh1'"),  # m = 192, m' = 36
    "gpt3-p16-zbv": _gpt3(
        8,
        16,
        1536,
        "training.schedule='zbv'",
        "parallel.virtual_pipeline_model_parallel_size=2",
    ),  # m = 192, m' = 68
    # no period inserted: the insertion check fails
    "gpt3-p16-gpipe": _gpt3(8, 16, 1536, "training.schedule='gpipe'"),  # m = 192, m' = 36
    "mt-nlg": [MT_NLG],  # DeepSpeed's blocking p2p; m = 160, m' = 74
    "qwen3-moe": ["scenarios/qwen3-235b-a22b-64-b200.toml"],  # EP 8; m = 32, m' = 12
    "llama3-gb200-interleaved": ["scenarios/llama3-70b-4racks-gb200.toml"],  # v = 5, q = 4
}


def scenario_of(name: str) -> Scenario:
    path, *sets = LAYOUTS[name]
    return load_scenario(path, sets)


class Phases:
    """CPU seconds spent in wrapped functions (a nested one is subtracted from its caller
    where the caller's name says so)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def wrap(self, owner, attribute: str, name: str) -> None:
        fn = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.process_time() - started
                self.counts[name] += 1

        setattr(owner, attribute, timed)


def _cpu(fn) -> tuple[float, object]:
    gc.collect()
    started = time.process_time()
    out = fn()
    return time.process_time() - started, out


def measure(name: str, repeat: int) -> dict:
    scenario = scenario_of(name)
    off = replace(scenario, network=replace(scenario.network, fast_forward=False))
    q = fastforward.periods(scenario)[0]
    m, m_short = scenario.num_microbatches, fastforward.short_microbatches(scenario, q)
    short_off = fastforward.with_microbatches(off, m_short)

    def full(s: Scenario):
        return iteration.run(s, spans=False, idle_split=False)

    walls: dict[str, list[float]] = defaultdict(list)
    phases_runs: list[dict[str, float]] = []
    shape: dict = {}
    for _ in range(repeat):
        t, full_result = _cpu(lambda: full(off))
        walls["full_m"].append(t)
        t, _ = _cpu(lambda: full(short_off))
        walls["full_short"].append(t)
        phases = Phases()
        patched = (
            (fastforward, "worth_it"),
            (iteration, "lower"),
            (fastforward, "_insertion"),
            (fastforward, "_prove"),
            (fastforward, "_orders_insert"),
            (fastforward, "simulate_observed"),
            (steady._Describer, "__call__"),
            (iteration, "_fast_forwarded"),
        )
        saved = [(where, name, getattr(where, name)) for where, name in patched]
        fastforward.worth_it = lambda *args, **kwargs: True
        phases.wrap(iteration, "lower", "lowering")
        phases.wrap(fastforward, "_insertion", "insertion check")
        phases.wrap(fastforward, "_prove", "prove")
        phases.wrap(fastforward, "_orders_insert", "schedule check")
        phases.wrap(fastforward, "simulate_observed", "observed simulation")
        phases.wrap(steady._Describer, "__call__", "snapshots")
        phases.wrap(iteration, "_fast_forwarded", "metrics")
        try:
            t, fast = _cpu(lambda: full(scenario))
        finally:
            for where, name, value in saved:
                setattr(where, name, value)
        walls["ff_m"].append(t)
        seconds = dict(phases.seconds)
        # nested: the snapshots inside the observed simulation, both inside the proof
        if "observed simulation" in seconds:
            seconds["observed simulation"] -= seconds.get("snapshots", 0.0)
            seconds["prove"] -= seconds["observed simulation"] + seconds.get("snapshots", 0.0)
        phases_runs.append(seconds)
        ff = fast.metrics.fast_forward
        shape = {
            "proved": ff is not None,
            "snapshots": phases.counts.get("snapshots", 0),
            "ops_short": len(fast.workload.ops) if ff is not None else None,
            "lanes": len(fast.workload.lanes),
            "rel_diff": abs(fast.metrics.iteration_time_s - full_result.metrics.iteration_time_s)
            / full_result.metrics.iteration_time_s,
        }
    med = {key: statistics.median(values) for key, values in walls.items()}
    keys = sorted({k for run in phases_runs for k in run})
    phase_med = {k: statistics.median(run.get(k, 0.0) for run in phases_runs) for k in keys}
    # a full run: fixed + per_mb x micro-batches, from its two sizes
    per_mb = (med["full_m"] - med["full_short"]) / (m - m_short)
    fixed = med["full_short"] - per_mb * m_short
    orders = phase_med.get("schedule check", 0.0)  # builds m's orders: counted per m
    return {
        "name": name,
        "m": m,
        "m_short": m_short,
        "q": q,
        **shape,
        **med,
        "phases": phase_med,
        "per_mb": per_mb,
        "fixed": fixed,
        # the fast-forward's cost in micro-batches of the full run: per m' and per m
        "short_cost": (med["ff_m"] - fixed - orders) / (per_mb * m_short),
        "orders_cost": orders / (per_mb * m),
        "speedup": med["ff_m"] / med["full_m"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="comma-separated layout names: " + ", ".join(LAYOUTS))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(LAYOUTS)
    rows = []
    print(
        f"{'layout':<24} {'m':>4} {'m_':>4} {'q':>2} {'lanes':>5} {'ops(m_)':>8} "
        f"{'full(m)':>8} {'full(m_)':>8} {'ff(m)':>7} {'fixed':>6} {'short':>6} "
        f"{'orders':>6} {'even':>5} {'m/m_':>5} {'ff/full':>7} {'iter rel':>8}"
    )
    for name in names:
        row = measure(name, args.repeat)
        rows.append(row)
        even = row["short_cost"] / (1 - row["orders_cost"])
        print(
            f"{name:<24} {row['m']:>4} {row['m_short']:>4} {row['q']:>2} {row['lanes']:>5} "
            f"{row['ops_short'] or 0:>8,} {row['full_m']:>7.2f}s {row['full_short']:>7.2f}s "
            f"{row['ff_m']:>6.2f}s {row['fixed']:>5.2f}s {row['short_cost']:>6.2f} "
            f"{row['orders_cost']:>6.3f} {even:>5.2f} {row['m'] / row['m_short']:>5.2f} "
            f"{row['speedup']:>7.2f} "
            + (f"{row['rel_diff']:>8.1e}" if row["proved"] else "not proved"),
            flush=True,
        )
    print()
    print("ff(m) by phase, CPU s (median):")
    for row in rows:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in row["phases"].items())
        print(f"  {row['name']:<24} {parts}; {row['snapshots']} snapshots")
    proved = [row for row in rows if row["proved"]]
    if proved:
        print()
        for key, constant in (
            ("short_cost", fastforward.SHORT_COST),
            ("orders_cost", fastforward.ORDERS_COST),
        ):
            values = [row[key] for row in proved]
            print(
                f"{key} over {len(values)} proved layouts: median "
                f"{statistics.median(values):.3f}, min {min(values):.3f}, "
                f"max {max(values):.3f} (fastforward.{key.upper()} = {constant})"
            )


if __name__ == "__main__":
    main()

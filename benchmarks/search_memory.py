"""A search's memory and time in one process: the peak resident memory of simulating
every fitting layout of a part of the GPT-3 175B / 1,024-GPU space (TP 8, PP 8 and 16,
micro-batch 1 and 2, 1F1B and interleaved: 67 layouts, unpruned), as a search worker
does. ``--as-before`` runs each layout as the search did before issue 34 (full spans,
no collection after a layout) to show what the totals path and the collection save.
Each variant is a fresh process; the best layout and its time are printed so that the
two can be seen to agree bit for bit.

    .venv/bin/python benchmarks/search_memory.py
    .venv/bin/python benchmarks/search_memory.py --as-before
"""

from __future__ import annotations

import argparse
import resource
import time

from stepsim.plan import search as S
from stepsim.plan.space import SearchSpace
from stepsim.scenario import load_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--as-before", action="store_true", help="full spans, no collection")
    args = parser.parse_args()
    if args.as_before:
        from stepsim.run.iteration import run

        def before(scenario):
            return run(scenario, idle_split=False).metrics.summary_row()

        S.simulate_row = before

    def serial(batch, done):
        for i, scenario in enumerate(batch):
            done(i, S.simulate_row(scenario))

    base = load_scenario("gpt3-175b-128nodes")
    space = SearchSpace(tp=(8,), pp=(8, 16), micro_batch=(1, 2), schedules=("1f1b", "interleaved"))
    started = time.perf_counter()
    result = S.search(base, space, executor=serial, prune=False)
    best = result.ranked[0]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{'as before' if args.as_before else 'now'}: {result.count(S.SIMULATED)} layouts "
        f"in {time.perf_counter() - started:.1f} s, peak {peak_mib:,.0f} MiB; best "
        f"{best.layout.key} {best.simulated_metrics.iteration_time_s!r} s"
    )


if __name__ == "__main__":
    main()

"""Wall time of whole `stepsim run` processes, median of several runs.

    python benchmarks/time_scenarios.py [--repeat 3] SCENARIO [SCENARIO ...]

Times the command a user types (start-up, loading, simulation, metrics), not a
function inside it, so the figure is what a person waits for; the timing loop is
performance.py's `measure` (a fresh process per run, peak memory reported). Results go in
benchmarks/README.md with the machine they were taken on.
"""

from __future__ import annotations

import argparse
import json

from performance import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'scenario':<50} {'median s':>9} {'min s':>7} {'max s':>7} {'peak GiB':>9}")
    for path in args.scenarios:
        row = measure(json.dumps([path]), args.repeat, 3600)  # performance.py's timing
        print(
            f"{path:<50} {row['median_s']:>9.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f}"
            f" {row['peak_gib']:>9.2f}"
        )


if __name__ == "__main__":
    main()

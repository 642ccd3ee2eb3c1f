"""Wall time of whole `stepsim run` processes, median of several runs.

    python benchmarks/time_scenarios.py [--repeat 3] SCENARIO [SCENARIO ...]

Times the command a user types (start-up, loading, simulation, metrics), not a
function inside it, so the figure is what a person waits for. Results go in
benchmarks/README.md with the machine they were taken on.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'scenario':<50} {'median s':>9} {'min s':>7} {'max s':>7}")
    for path in args.scenarios:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "simulator.cli", "run", path, "--json"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            times.append(time.perf_counter() - start)
        print(f"{path:<50} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}")


if __name__ == "__main__":
    main()

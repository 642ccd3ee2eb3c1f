"""How fast `stepsim search` is, and what its pruning bound saves (issue 34).

    .venv/bin/python benchmarks/search_speed.py                     # the 175B search, 2 workers
    .venv/bin/python benchmarks/search_speed.py --bound compute     # as before the schedule bound
    .venv/bin/python benchmarks/search_speed.py --bound both        # both, in one sitting
    .venv/bin/python benchmarks/search_speed.py --bound schedule,no-tp   # with and without TP time
    .venv/bin/python benchmarks/search_speed.py --pp 8,16 --micro-batch 1,2 --jobs 1

Each variant is `stepsim search SCENARIO --jobs N --json --quiet` in a fresh process,
timed from outside: its wall time, the CPU seconds of it and of the workers it joined,
and the peak resident memory of the largest of those processes (os.wait4's rusage, as
/usr/bin/time -v gives it). Wall time is also given as a multiple of the reference loop
(as benchmarks/performance.py times it: a bare simpy loop of one million events, median of 3, timed
before and after the variants), so that sittings on machines or at loads that differ
compare. ``--bound compute`` prunes by the compute bound alone (`plan.bound.compute_bound_s`,
the search's bound before the schedule bound); ``--bound no-tp`` by the schedule bound
without the tensor-parallel collectives on the compute path (`plan.bound.tp_collectives_s`
giving zeros: the bound before they were counted); the variants' top-k must agree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = "gpt3-175b-128nodes"
BOUNDS = ("schedule", "no-tp", "compute")
REFERENCE_EVENTS = 1_000_000  # as benchmarks/performance.py's reference loop


def reference_loop_s(events: int = REFERENCE_EVENTS) -> float:
    """Wall time of a bare simpy loop: one process, ``events`` x ``yield env.timeout(1)``."""
    import simpy

    env = simpy.Environment()

    def ticks():
        for _ in range(events):
            yield env.timeout(1)

    env.process(ticks())
    started = time.perf_counter()
    env.run()
    return time.perf_counter() - started


def reference(repeat: int = 3) -> list[float]:
    return [reference_loop_s() for _ in range(repeat)]


def child(bound: str, argv: list[str]) -> None:
    """In the child: the search with ``bound``, one JSON line of what it found."""
    from stepsim.cli import program
    from stepsim.plan import bound as bounds
    from stepsim.plan import search

    # the bound is computed in this process only (search.candidates)
    if bound == "compute":
        search.iteration_lower_bound_s = lambda s, shape=None: bounds.compute_bound_s(
            s, None, shape
        )
    elif bound == "no-tp":
        p = lambda s: s.parallel.pipeline_model_parallel_size  # noqa: E731
        bounds.tp_collectives_s = lambda s, model: ([0.0] * p(s), [0.0] * p(s))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = program(["search", *argv, "--json", "--quiet"])
    if code != 0:
        raise SystemExit(code)
    doc = json.loads(out.getvalue())
    ranked = [row for row in doc["layouts"] if row["rank"] is not None]
    ranked.sort(key=lambda row: row["rank"])
    print(
        json.dumps(
            {
                "simulated": doc["simulated"],
                "pruned": doc["pruned"],
                "top": [(row["layout"], row["iteration_time_s"]) for row in ranked[:10]],
            }
        )
    )


def measure(bound: str, options: list[str]) -> dict:
    """One variant in a fresh process: wall, CPU (with its joined workers), peak RSS."""
    command = [sys.executable, __file__, "--child", bound, *options]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{bound}: exit {proc.returncode}")
    found = json.loads(output.strip().splitlines()[-1])
    found.update(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_mib=usage.ru_maxrss / 1024,  # KiB on Linux: the largest process waited for
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=SCENARIO)
    parser.add_argument("--jobs", default="2")
    parser.add_argument(
        "--bound",
        default="schedule",
        help=f"comma-separated, of {', '.join(BOUNDS)}; both: schedule,compute",
    )
    parser.add_argument("--child", choices=BOUNDS, help=argparse.SUPPRESS)
    args, space = parser.parse_known_args()
    argv = [args.scenario, "--jobs", args.jobs, *space]
    if args.child:
        child(args.child, argv)
        return
    before = reference()
    bounds = ("schedule", "compute") if args.bound == "both" else tuple(args.bound.split(","))
    if not set(bounds) <= set(BOUNDS):
        parser.error(f"--bound {args.bound}: each of {', '.join(BOUNDS)}, or both")
    options = ["--scenario", args.scenario, "--jobs", args.jobs, *space]
    results = {bound: measure(bound, options) for bound in bounds}
    after = reference()
    ref_s = statistics.median(before + after)
    print(f"stepsim search {' '.join(argv)}")
    print(
        f"reference loop: {ref_s:.3f} s (median; before "
        f"{', '.join(f'{t:.3f}' for t in before)}, after {', '.join(f'{t:.3f}' for t in after)})"
    )
    print("| bound | simulated | pruned | wall | x reference | CPU | peak process |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for bound, r in results.items():
        print(
            f"| {bound} | {r['simulated']} | {r['pruned']} | {r['wall_s']:.1f} s | "
            f"{r['wall_s'] / ref_s:.1f} | {r['cpu_s']:.1f} s | {r['peak_mib']:,.0f} MiB |"
        )
    tops = {bound: [(key, t) for key, t in r["top"]] for bound, r in results.items()}
    if len(tops) > 1:
        same = len({tuple(t) for t in tops.values()}) == 1
        print(f"top 10 {'the same (layouts and times)' if same else 'DIFFERENT'} under every bound")
    for bound, r in results.items():
        print(f"top 10 ({bound} bound):")
        for i, (key, seconds) in enumerate(r["top"], 1):
            print(f"  {i:2d}. {key}  {seconds!r} s")
        if len(tops) > 1 and same:
            break


if __name__ == "__main__":
    main()

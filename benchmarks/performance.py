"""How fast stepsim is at scale: the speed targets, and how wall time grows.

    python benchmarks/performance.py                 # the target cases, median of 3
    python benchmarks/performance.py --exact         # also MT-NLG in exact mode (minutes)
    python benchmarks/performance.py --long          # also GPT-3 at p = 16, m = 192 and 3,072
    python benchmarks/performance.py --scaling       # growth with micro-batches x stages, DP
    python benchmarks/performance.py --scaling --write   # and update docs/performance.md
    python benchmarks/performance.py --only search,out-json,mt-nlg   # ratios to the reference loop

`--write` merges what this run measured into docs/performance.json (the last
figure of every case, with the machine and date) and regenerates the marked block of
docs/performance.md and docs/images/performance-scaling.png from it; the prose
around the block (profiles, what bounds a missed target) is written by hand.

`--only ITEM[,ITEM]` runs only the items named: `targets` and `flat` (the default
run's two tables), and three measured as ratios to a fixed reference loop (a bare simpy
loop of one million events, one process doing ``yield env.timeout(1)``, timed in this
process, median of 3, at the start and again at the end of the sitting), so that
figures taken on machines or at loads that differ compare: `search` (the 175B /
1,024-GPU search, `stepsim search gpt3-175b-128nodes --jobs 2`, wall, and the peak
resident memory of any process in it), `out-json` (`stepsim run --out DIR` against
`stepsim run --json` on MT-NLG 530B and on the 16,384-GPU dense run), `mt-nlg`
(MT-NLG symmetric `stepsim run --json`, the whole process) and `what-if` (the
16,384-GPU dense run with a leaf's uplink failed, which class mode simulates,
comm/classes.py, and with one GPU 5 % slow: `stepsim run --json` of a scenario file with
the `[[perturbation]]` table, written in the child's temporary folder).

`--instructions` counts instead of timing (valgrind's callgrind, one run each, about
50x slower): each case's whole process, and the reference loop's own instructions (its
process less one that only starts), so that the ratios do not move with the host's
speed, which drifted by 2x within minutes on 2026-11-28. `search` and `what-if` are
left out there (their processes would take most of an hour under valgrind).

    python benchmarks/performance.py --only out-json --instructions   # ~15 min

Every measurement is a whole process, as a user waits for it: the runner starts
`python benchmarks/performance.py --case NAME` (which for a scenario runs exactly what
`stepsim run FILE --quiet` runs) and times it from outside; the child reports its own
peak resident memory. Speed is measured here and written down, never asserted in
tests (CI stays fast and free of timing flakiness).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MT_NLG = "scenarios/mt-nlg-530b-420nodes.toml"
DENSE_16K = "scenarios/dense-16k-h100.toml"
GPT3 = "scenarios/gpt3-175b-128nodes.toml"

# name: (what, stepsim run arguments or None for the all-reduce, target s, target GiB)
TARGETS = {
    "mt-nlg-3360": (
        "MT-NLG 530B, 3,360 GPUs (TP 8, PP 35, DP 12, 160 micro-batches), fair share",
        [MT_NLG],
        1.71,  # issue 18: at most half of the 3.43 s measured before its work
        1.0,
    ),
    "dense-16384": (
        "dense 412B, 16,384 H100s (TP 8, PP 16, DP 128, 8 x 400 Gb/s per node)",
        [DENSE_16K],
        10.0,
        1.0,
    ),
    "allreduce-1024": (
        "one ring all-reduce of 64 MiB over 1,024 A100s on one switch",
        None,
        1.0,
        1.0,
    ),
}


def _gpt3_dp(dp: int) -> list[str]:
    """GPT-3 175B's layout (TP 8, PP 16, 192 micro-batches per pipeline on DGX A100s on
    one switch) with ``dp`` replicas: only the replicas, nodes and global batch change."""
    return [
        GPT3,
        "--set",
        f"parallel.data_parallel_size={dp}",
        "--set",
        f"cluster.num_nodes={16 * dp}",
        "--set",
        f"training.global_batch_size={192 * dp}",
    ]


# Symmetric mode's wall time and memory should not depend on the data-parallel size:
# the 131,072-GPU case is held to FLAT_RATIO times the 1,024-GPU one, measured in the
# same run (interleaved); the H100 job is issue 18's 100k-GPU case, timed alongside.
FLAT_RATIO = 1.5
FLAT_PAIRS = {"gpt3-dp-131072": "gpt3-dp-1024"}  # case: the case it is held to
FLAT = {
    "gpt3-dp-1024": ("GPT-3 175B, 1,024 A100s (TP 8, PP 16, DP 8) on one switch", _gpt3_dp(8)),
    "gpt3-dp-131072": (
        "the same with DP 1,024: 131,072 A100s on one switch",
        _gpt3_dp(1024),
    ),
    "dense-dp-800": (
        "dense 412B, 102,400 H100s (TP 8, PP 16, DP 800) on one switch",
        [
            DENSE_16K,
            "--set",
            "parallel.data_parallel_size=800",
            "--set",
            "cluster.num_nodes=12800",
            "--set",
            "cluster.fabric='switch'",
            "--set",
            "training.global_batch_size=12800",
        ],
    ),
}
# issue 18: long pipelines, GPT-3 175B (TP 8, PP 16, DP 8) with m micro-batches per
# pipeline (global batch 8 m); the target is m = 3,072 within 10x of m = 192
LONG = {
    f"gpt3-p16-m{m}": (
        f"GPT-3 175B, PP 16, m = {m:,} micro-batches",
        [GPT3, "--set", f"training.global_batch_size={8 * m}", "--allow-oom"],
        None,
        None,
    )
    for m in (192, 3072)
}
EXACT = {
    "mt-nlg-3360-exact": (
        "the MT-NLG run in exact mode (every GPU simulated)",
        [MT_NLG, "--set", "network.symmetry=false"],
        None,  # RELATIVE: a multiple of the symmetric run's time in the same run
        3.0,
    ),
}
# issue 18: exact-mode MT-NLG within 20x the symmetric run (measured alongside)
RELATIVE = {"mt-nlg-3360-exact": (20.0, "mt-nlg-3360")}

# issue 34: wall times as ratios to the reference loop (REFERENCE_EVENTS simpy events)
REFERENCE_EVENTS = 1_000_000
SEARCH_JOBS = 2
# item: {case: what}; a case is a `stepsim` command line (``{out}``: a fresh folder)
RATIO_ITEMS: dict[str, dict[str, str]] = {
    "search": {
        "search-175b": f"stepsim search gpt3-175b-128nodes --jobs {SEARCH_JOBS} (1,024 GPUs)",
    },
    "out-json": {
        "mt-nlg-json": "stepsim run mt-nlg-530b-420nodes --json",
        "mt-nlg-out": "stepsim run mt-nlg-530b-420nodes --out DIR",
        "dense-16k-json": "stepsim run dense-16k-h100 --json",
        "dense-16k-out": "stepsim run dense-16k-h100 --out DIR",
    },
    "mt-nlg": {"mt-nlg-json": "stepsim run mt-nlg-530b-420nodes --json (symmetric)"},
    "what-if": {
        "dense-16k-uplink": "stepsim run dense-16k-h100 + leaf 0's uplink to spine 0 failed --json",
        "dense-16k-straggler": "stepsim run dense-16k-h100 + GPU 43 at 1.05x --json",
    },
}
# what-if cases: dense-16k-h100 with a [[perturbation]] table, written to a scenario file
# in the child's temporary folder ("{what-if}" in RATIO_CASES). Link 81952 is leaf 0's
# first uplink, to spine 0 (studies/perturbation.py `first_uplink`, the what-if table's).
WHAT_IFS = {
    "dense-16k-uplink": '[[perturbation]]\nkind = "slow_link"\nlink = 81952\ndown = true\n',
    "dense-16k-straggler": '[[perturbation]]\nkind = "slow_gpu"\ngpu = 43\nfactor = 1.05\n',
}
RATIO_CASES: dict[str, list[str]] = {
    "search-175b": ["search", GPT3, "--jobs", str(SEARCH_JOBS), "--json", "--quiet"],
    "mt-nlg-json": ["run", MT_NLG, "--json", "--quiet"],
    "mt-nlg-out": ["run", MT_NLG, "--out", "{out}", "--quiet"],
    "dense-16k-json": ["run", DENSE_16K, "--json", "--quiet"],
    "dense-16k-out": ["run", DENSE_16K, "--out", "{out}", "--quiet"],
    "dense-16k-uplink": ["run", "{what-if}", "--json", "--quiet"],
    "dense-16k-straggler": ["run", "{what-if}", "--json", "--quiet"],
}
ITEMS = ("targets", "flat", *RATIO_ITEMS)
# items left out of `--instructions` (their processes would take most of an hour there)
NOT_COUNTED = ("search", "what-if")
# `--instructions`: the reference loop's process, and one that only starts (its cost)
REFERENCE_CASE, EMPTY_CASE = "reference-loop", "nothing"


def _case_arguments(name: str) -> list[str] | None:
    if name in TARGETS:
        return TARGETS[name][1]
    if name in EXACT:
        return EXACT[name][1]
    if name in FLAT:
        return FLAT[name][1]
    if name in LONG:
        return LONG[name][1]
    # the run arguments themselves (scaling points, time_scenarios.py); some layouts of
    # the sweep would not fit in memory, and the speed of simulating them is what counts
    return [*json.loads(name), "--allow-oom"]


def run_case(name: str) -> None:
    """In the child: run one case, print one JSON line (simulated figure, peak memory)."""
    if name in (REFERENCE_CASE, EMPTY_CASE):  # `--instructions`: the loop, or nothing
        if name == REFERENCE_CASE:
            reference_loop_s()
        print(json.dumps({"simulated_s": None, "peak_gib": 0.0}))
        return
    if name in RATIO_CASES:
        run_ratio_case(name)
        return
    arguments = _case_arguments(name)
    if arguments is None:
        result = {"simulated_s": _allreduce_1024()}
    else:
        from stepsim.cli import program  # what the stepsim executable runs

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = program(["run", *arguments, "--json", "--quiet"])
        if code != 0:
            raise SystemExit(code)
        metrics = json.loads(out.getvalue())
        result = {"simulated_s": metrics["iteration_time_s"]}
        if "fast_forward" in metrics:  # simulator/run/fastforward.py: m' simulated, k periods added
            result["fast_forward"] = metrics["fast_forward"]
    # ru_maxrss is KiB on Linux
    result["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps(result))


def run_ratio_case(name: str) -> None:
    """In the child: one `stepsim` command of RATIO_CASES, its stdout swallowed; the
    peak resident memory of this process and of every process it waited for (a search's
    workers are joined when it ends), the largest."""
    import tempfile

    from stepsim.cli import program  # what the stepsim executable runs

    with tempfile.TemporaryDirectory() as folder:
        what_if = Path(folder) / "what-if.toml"
        if name in WHAT_IFS:
            text = (ROOT / DENSE_16K).read_text(encoding="utf-8")
            what_if.write_text(f"{text}\n{WHAT_IFS[name]}", encoding="utf-8")
        paths = {"{out}": folder, "{what-if}": str(what_if)}
        argv = [paths.get(a, a) for a in RATIO_CASES[name]]
        with contextlib.redirect_stdout(io.StringIO()):
            code = program(argv)
    if code != 0:
        raise SystemExit(code)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"simulated_s": None, "peak_gib": max(own, children) / 2**20}))


def reference_loop_s(events: int = REFERENCE_EVENTS) -> tuple[float, float]:
    """Wall and CPU time of a bare simpy loop: one process, ``events`` x
    ``yield env.timeout(1)``."""
    import simpy

    env = simpy.Environment()

    def ticks():
        for _ in range(events):
            yield env.timeout(1)

    env.process(ticks())
    started, cpu = time.perf_counter(), time.process_time()
    env.run()
    return time.perf_counter() - started, time.process_time() - cpu


def reference(repeat: int = 3) -> list[tuple[float, float]]:
    """The reference loop ``repeat`` times in this process (the collector as usual)."""
    return [reference_loop_s() for _ in range(repeat)]


def run_ratios(items: list[str], repeat: int) -> None:
    """The RATIO_ITEMS named, each case median of ``repeat`` fresh processes, as ratios
    to the reference loop (median of its runs before and after them)."""
    before = reference()
    print(f"  reference loop ({REFERENCE_EVENTS:,} simpy events): {_spread(before)}")
    cases: dict[str, str] = {}
    for item in items:
        cases.update(RATIO_ITEMS[item])
    rows = {}
    for case in cases:  # each case once, though two items name it
        rows[case] = measure(case, repeat, 3600)
        row = rows[case]
        print(
            f"  {case:<16} {row['median_s']:7.2f} s wall  {row['cpu_s']:7.2f} s CPU  "
            f"{row['peak_gib']:5.2f} GiB"
        )
    after = reference()
    print(f"  reference loop again: {_spread(after)}")
    ref_s = statistics.median(wall for wall, _ in before + after)
    ref_cpu_s = statistics.median(cpu for _, cpu in before + after)
    print()
    print(ratio_table(items, rows, (ref_s, ref_cpu_s), repeat))


def instructions(name: str, timeout_s: float = 3600) -> int:
    """The instructions a fresh ``--case NAME`` process executes, every process it
    starts included (valgrind's callgrind: the sum of its "Collected" lines)."""
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--trace-children=yes",
            sys.executable,
            __file__,
            "--case",
            name,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"case {name} failed: {proc.stderr.strip()[-400:]}")
    counts = [int(n) for n in re.findall(r"Collected : (\d+)", proc.stderr)]
    if not counts:
        raise RuntimeError(f"case {name}: no instruction count from valgrind")
    return sum(counts)


def run_instructions(items: list[str]) -> None:
    """The RATIO_ITEMS named but the search, each case's instructions as a multiple of
    the reference loop's (`instructions`; one run each: the counts hardly move)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (callgrind) on the PATH")
    start = instructions(EMPTY_CASE)
    loop = instructions(REFERENCE_CASE) - start
    print(f"  reference loop ({REFERENCE_EVENTS:,} simpy events): {loop / 1e9:.2f} G")
    cases: dict[str, str] = {}
    for item in items:
        if item not in NOT_COUNTED:
            cases.update(RATIO_ITEMS[item])
    counted = {}
    for case in cases:
        counted[case] = instructions(case)
        print(f"  {case:<16} {counted[case] / 1e9:7.2f} G")
    lines = [
        "",
        f"Reference loop: {loop / 1e9:.2f} G instructions (its process less one that only "
        f"starts, {start / 1e9:.2f} G). Each case one fresh process, counted whole.",
        "",
        "| item | command | instructions | x reference |",
        "|---|---|---:|---:|",
    ]
    for item in items:
        for case, what in RATIO_ITEMS[item].items():
            if case in counted:
                n = counted[case]
                lines.append(f"| {item} | {what} | {n / 1e9:.2f} G | {n / loop:.2f} |")
    if "out-json" in items:
        lines.append("")
        for run in ("mt-nlg", "dense-16k"):
            out, js = counted[f"{run}-out"], counted[f"{run}-json"]
            lines.append(f"{run}: --out / --json {out / js:.2f}x instructions")
    print("\n".join(lines))


def _spread(runs: list[tuple[float, float]]) -> str:
    walls = [wall for wall, _ in runs]
    return (
        f"wall median {statistics.median(walls):.3f} s "
        f"({', '.join(f'{w:.3f}' for w in walls)}), "
        f"CPU median {statistics.median(cpu for _, cpu in runs):.3f} s"
    )


def ratio_table(
    items: list[str], rows: dict[str, dict], ref: tuple[float, float], repeat: int
) -> str:
    """Each case's wall (and CPU: the process and every process it waited for) as a
    multiple of the reference loop's wall (CPU), both medians."""
    ref_s, ref_cpu_s = ref
    lines = [
        f"Reference loop: wall {ref_s:.3f} s, CPU {ref_cpu_s:.3f} s (medians of its runs "
        f"before and after). Each case median of {repeat} fresh process(es).",
        "",
        "| item | command | wall (median) | min - max | x reference | CPU (median) "
        "| x reference CPU | peak memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for item in items:
        for case, what in RATIO_ITEMS[item].items():
            row = rows[case]
            lines.append(
                f"| {item} | {what} | {row['median_s']:.2f} s | {row['min_s']:.2f} - "
                f"{row['max_s']:.2f} s | {row['median_s'] / ref_s:.1f} | "
                f"{row['cpu_s']:.2f} s | {row['cpu_s'] / ref_cpu_s:.1f} | "
                f"{row['peak_gib'] * 1024:,.0f} MiB |"
            )
    if "out-json" in items:
        lines.append("")
        for run in ("mt-nlg", "dense-16k"):
            out, js = rows[f"{run}-out"], rows[f"{run}-json"]
            lines.append(
                f"{run}: --out / --json {out['median_s'] / js['median_s']:.2f}x wall, "
                f"{out['cpu_s'] / js['cpu_s']:.2f}x CPU"
            )
    return "\n".join(lines)


def _allreduce_1024() -> float:
    """Cluster of 128 DGX A100 on one switch, one ring all-reduce over its 1,024 GPUs."""
    from stepsim.comm import collectives
    from stepsim.comm.collectives import Fabric
    from stepsim.engine.core import simulate
    from stepsim.engine.network import FairShareNetwork
    from stepsim.ir.ops import WorkloadBuilder
    from stepsim.ir.units import us_to_s
    from stepsim.ir.vocabulary import TP_COMM
    from stepsim.run.iteration import build_cluster
    from stepsim.scenario import scenario_from_dict

    spec = scenario_from_dict(
        {
            "name": "allreduce-1024",
            "model": {"preset": "gpt3-175b"},
            "cluster": {"node": "dgx-a100", "num_nodes": 128, "fabric": "switch"},
            "parallel": {
                "tensor_model_parallel_size": 8,
                "pipeline_model_parallel_size": 1,
                "data_parallel_size": 128,
            },
            "training": {"micro_batch_size": 1, "global_batch_size": 128},
        }
    ).cluster
    cluster = build_cluster(spec)
    fabric = Fabric.of(cluster, us_to_s(spec.collective_base_latency_us))
    group = list(range(cluster.num_gpus))
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    transfer = collectives.all_reduce("ring", [group], 64 * 2**20, fabric)
    builder.add(lane, TP_COMM, "all-reduce 64 MiB", transfer=transfer)
    capacities = [link.bandwidth_bytes_per_s for link in cluster.links]
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


def measure(name: str, repeat: int, timeout_s: float) -> dict:
    """Run the case ``repeat`` times in fresh processes: median, min, max wall time, and
    the median CPU time (user + system) of the child and every process it waited for."""
    walls, cpus, last = [], [], {}
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--case", name],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            check=False,
        )
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and what it reaped
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"case {name} failed: {proc.stderr.strip()[-400:]}")
        last = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "cpu_s": statistics.median(cpus),
        "peak_gib": last["peak_gib"],
        "simulated_s": last["simulated_s"],
        "fast_forward": last.get("fast_forward"),
        "runs": repeat,
    }


def scaling_points() -> dict[str, list[tuple[int, list[str]]]]:
    """GPT-3 175B's layout (TP 8, PP 16, DP 8 on 128 DGX A100) varied along one axis."""
    points: dict[str, list[tuple[int, list[str]]]] = {"microbatches": [], "stages": [], "dp": []}
    for m in (24, 48, 96, 192, 384, 768):  # micro-batches per pipeline, p = 16
        points["microbatches"].append(
            (m * 16, [GPT3, "--set", f"training.global_batch_size={m * 8}"])
        )
    for p in (4, 8, 16, 32):  # stages, m = 96, DP 8: 8 p nodes
        args = [GPT3, "--set", f"parallel.pipeline_model_parallel_size={p}"]
        args += ["--set", f"cluster.num_nodes={8 * p}", "--set", "training.global_batch_size=768"]
        points["stages"].append((96 * p, args))
    for dp in (1, 4, 16, 64, 256):  # DP replicas, p = 16, m = 96: 16 dp nodes
        args = [GPT3, "--set", f"parallel.data_parallel_size={dp}"]
        args += ["--set", f"cluster.num_nodes={16 * dp}"]
        args += ["--set", f"training.global_batch_size={96 * dp}"]
        points["dp"].append((dp, args))
    return points


def run_flat(repeat: int) -> dict[str, dict]:
    """The FLAT cases, each median of ``repeat``, interleaved so that drift in the
    machine's speed hits them alike."""
    walls: dict[str, list[float]] = {name: [] for name in FLAT}
    last: dict[str, dict] = {}
    for _ in range(repeat):
        for name in FLAT:
            row = measure(name, 1, 600)
            walls[name].append(row["median_s"])
            last[name] = row
    out = {}
    for name in FLAT:
        out[name] = {
            **last[name],
            "median_s": statistics.median(walls[name]),
            "min_s": min(walls[name]),
            "max_s": max(walls[name]),
            "runs": repeat,
        }
        print(f"  {name:<20} {out[name]['median_s']:7.2f} s  {out[name]['peak_gib']:5.2f} GiB")
    return out


def flat_table(flat: dict[str, dict]) -> str:
    """The growth cases, the large GPT-3 layout against the small one (FLAT_PAIRS)."""
    lines = [
        "| case | wall time (median) | min - max | peak memory | time, memory vs 1,024 GPUs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in flat.items():
        ratio = ""
        base = flat.get(FLAT_PAIRS.get(name, ""))
        if base is not None:
            t, m = row["median_s"] / base["median_s"], row["peak_gib"] / base["peak_gib"]
            met = "ok" if max(t, m) <= FLAT_RATIO else "**over**"
            ratio = f"{t:.2f}x, {m:.2f}x ({met})"
        lines.append(
            f"| {FLAT[name][0]} | {row['median_s']:.2f} s | {row['min_s']:.2f} - "
            f"{row['max_s']:.2f} s | {row['peak_gib']:.2f} GiB | {ratio} |"
        )
    lines.append("")
    lines.append(
        f"Target: 131,072 GPUs within {FLAT_RATIO}x of 1,024 in time and memory (same run)."
    )
    return "\n".join(lines)


def run_scaling(repeat: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for axis, points in scaling_points().items():
        out[axis] = []
        for x, args in points:
            row = measure(json.dumps(args), repeat, 600)
            row["x"] = x
            out[axis].append(row)
            print(f"  {axis:<13} {x:>7}  {row['median_s']:6.2f} s  {row['peak_gib']:5.2f} GiB")
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"
    )


def table(results: dict[str, dict], cases: dict) -> str:
    lines = [
        "| case | target | wall time (median) | min - max | peak memory | met |",
        "|---|---:|---:|---:|---:|:---:|",
    ]
    for name, row in results.items():
        what, _, target_s, target_gib = cases[name]
        if name in RELATIVE:  # a multiple of another case's median in the same run
            times, of = RELATIVE[name]
            target_s = times * results[of]["median_s"]
            target = f"{times:g}x the symmetric run ({target_s:.1f} s)"
        else:
            target = f"{target_s:g} s"
        met = row["median_s"] <= target_s and row["peak_gib"] <= target_gib
        lines.append(
            f"| {what} | <= {target}, <= {target_gib:g} GiB | {row['median_s']:.2f} s | "
            f"{row['min_s']:.2f} - {row['max_s']:.2f} s | {row['peak_gib']:.2f} GiB | "
            f"{'yes' if met else '**no**'} |"
        )
    return "\n".join(lines)


def scaling_figure(scaling: dict[str, list[dict]], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.0))
    axes = fig.subplots(1, 2)
    ax = axes[0]
    for axis, label in (("microbatches", "m x p, p = 16"), ("stages", "m x p, m = 96")):
        rows = scaling[axis]
        (line,) = ax.plot([r["x"] for r in rows], [r["median_s"] for r in rows], "o-", label=label)
        ff = [r for r in rows if r.get("fast_forward")]
        if ff:  # hollow: simulated m' micro-batches and added the proved periods
            ax.plot(
                [r["x"] for r in ff],
                [r["median_s"] for r in ff],
                "o",
                markersize=9,
                markerfacecolor="white",
                color=line.get_color(),
                label=f"{label}, fast-forwarded",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("micro-batches x stages")
    ax.set_ylabel("wall time of stepsim run (s)")
    ax.set_title(
        "linear in m x p until the fast-forward\n(where its expected cost is below the full run's)"
    )
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    ax = axes[1]
    rows = scaling["dp"]
    ax.plot([r["x"] for r in rows], [r["median_s"] for r in rows], "o-", label="wall time")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("data-parallel size (GPUs = 128 x DP)")
    ax.set_ylabel("wall time (s)")
    ax.set_title("DP: near flat\n(pattern set-up; the rings' routes grow with DP)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exact", action="store_true", help="also time exact mode (minutes)")
    parser.add_argument(
        "--no-flat", action="store_true", help="skip the data-parallel growth cases"
    )
    parser.add_argument(
        "--long", action="store_true", help="also time m = 192 and 3,072 at p = 16 (~2 min)"
    )
    parser.add_argument("--scaling", action="store_true", help="time the growth sweeps")
    parser.add_argument("--write", action="store_true", help="update docs/performance.md")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions (valgrind) instead of timing the ratio items",
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated items to run, of {', '.join(ITEMS)} (default: targets, flat)",
    )
    args = parser.parse_args()
    if args.case:
        run_case(args.case)
        return
    if args.only:
        only = args.only.split(",")
        unknown = [item for item in only if item not in ITEMS]
        if unknown:
            parser.error(f"--only: unknown item {unknown[0]!r} (known: {', '.join(ITEMS)})")
        ratios = [item for item in only if item in RATIO_ITEMS]
        if ratios and args.instructions:
            run_instructions(ratios)
        elif ratios:
            run_ratios(ratios, args.repeat)
        if "targets" not in only and "flat" not in only:
            return
        args.no_flat = args.no_flat or "flat" not in only
        if "targets" not in only:
            flat = run_flat(args.repeat)
            print()
            print(flat_table(flat))
            return
    cases = dict(TARGETS)
    if args.exact:
        cases.update(EXACT)
    results = {}
    for name in cases:
        repeat = 1 if name in EXACT else args.repeat
        results[name] = measure(name, repeat, 3600)
        print(
            f"  {name:<20} {results[name]['median_s']:7.2f} s  {results[name]['peak_gib']:5.2f} GiB"
        )
    flat = {} if args.no_flat else run_flat(args.repeat)
    print()
    print(table(results, cases))
    if flat:
        print()
        print(flat_table(flat))
    if args.long:
        long = {name: measure(name, args.repeat, 3600) for name in LONG}
        for name, row in long.items():
            ff = row["fast_forward"]
            used = (
                f"  fast-forward: {ff['simulated_microbatches']} simulated, "
                f"{ff['periods_skipped']:,} periods added"
                if ff
                else "  simulated in full"
            )
            print(f"  {name:<20} {row['median_s']:7.2f} s  {row['peak_gib']:5.2f} GiB{used}")
        ratio = long["gpt3-p16-m3072"]["median_s"] / long["gpt3-p16-m192"]["median_s"]
        print(f"  m = 3,072 / m = 192: {ratio:.1f}x (target: at most 10x)")
    scaling = run_scaling(1) if args.scaling else None
    if args.write:
        write_docs(results, scaling, flat)


def write_docs(results: dict[str, dict], scaling: dict | None, flat: dict | None = None) -> None:
    json_path = ROOT / "docs" / "performance.json"
    data = json.loads(json_path.read_text()) if json_path.exists() else {"targets": {}}
    stamp = {"machine": machine(), "date": time.strftime("%Y-%m-%d")}
    for name, row in results.items():
        data["targets"][name] = {**row, **stamp}
    if scaling is not None:
        data["scaling"] = {"rows": scaling, **stamp}
    if flat:
        data["flat"] = {"rows": flat, **stamp}
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    cases = {**TARGETS, **EXACT}
    measured = {name: data["targets"][name] for name in cases if name in data["targets"]}
    machines = sorted({row["machine"] for row in measured.values()})
    block = [
        BEGIN,
        "",
        table(measured, cases),
        "",
        "Measured on: "
        + "; ".join(machines)
        + ", "
        + ", ".join(sorted({row["date"] for row in measured.values()}))
        + ".",
    ]
    if "flat" in data:
        block += ["", flat_table(data["flat"]["rows"])]
    if "scaling" in data:
        block += ["", scaling_table(data["scaling"]["rows"]), ""]
        block += ["![wall time against m x p and DP](images/performance-scaling.png)"]
        scaling_figure(
            data["scaling"]["rows"], ROOT / "docs" / "images" / "performance-scaling.png"
        )
    block += ["", END]
    md_path = ROOT / "docs" / "performance.md"
    text = md_path.read_text() if md_path.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    md_path.write_text(head + "\n".join(block) + tail)
    print(
        "\n  wrote docs/performance.md, docs/performance.json, docs/images/performance-scaling.png"
    )


BEGIN = "<!-- begin: generated by benchmarks/performance.py --write -->"
END = "<!-- end: generated -->"


def scaling_table(scaling: dict[str, list[dict]]) -> str:
    what = {
        "microbatches": "micro-batches x stages (p = 16, m varies)",
        "stages": "micro-batches x stages (m = 96, p varies)",
        "dp": "data-parallel size (p = 16, m = 96)",
    }
    lines = [
        "| axis | value | wall time | per 1,000 of m x p | peak memory |",
        "|---|---:|---:|---:|---:|",
    ]
    for axis, rows in scaling.items():
        for row in rows:
            per = f"{1000 * row['median_s'] / row['x']:.3f} s" if axis != "dp" else ""
            lines.append(
                f"| {what[axis]} | {row['x']:,} | {row['median_s']:.2f} s | {per} | "
                f"{row['peak_gib']:.2f} GiB |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

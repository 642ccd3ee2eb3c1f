"""Malformed inputs of every class found so far, each run as `python -m stepsim`
in a subprocess under a time and memory bound; every case must exit 2 (bad input) with
one line on stderr naming the key or file at fault, and no traceback.

    python tools/fuzz.py                 # 3 seeds per class, small sizes (as in CI)
    python tools/fuzz.py --many          # 30 seeds per class, up to the issue's sizes
    python tools/fuzz.py --class fifo    # one class

tests/test_fuzz.py runs the small mode. A case is a command line, the files it needs
(written into a fresh folder, named in the command as {dir}) and the text its error
line must contain. The generators are deterministic in their seed.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
VALIDATION = ROOT / "scenarios" / "validation"
TIMEOUT_S = 20.0  # per case; the refusals take well under a second past the imports
MEMORY_BYTES = 3 * 2**30  # RLIMIT_AS of a case (numpy and matplotlib map ~1 GB at import)
SCHED = ("--forward", "1", "--backward", "2")  # op times every `stepsim schedule` case gives


@dataclass(frozen=True)
class Case:
    klass: str
    argv: tuple[str, ...]  # after `python -m stepsim`; {dir} is the case's folder
    expect: str  # what the one error line must contain (the key, flag or file)
    files: dict[str, bytes | int] = field(default_factory=dict)  # int: a sparse file's size
    fifos: tuple[str, ...] = ()


def _tiny_with(extra: str) -> bytes:
    return (Path(TINY).read_text(encoding="utf-8") + "\n" + extra + "\n").encode()


def _nested(depth: int, rng: random.Random) -> str:
    """An array / inline table nested ``depth`` deep, the kinds mixed at random."""
    opens = [rng.choice(("[", "{x = ")) for _ in range(depth)]
    closes = ["]" if o == "[" else "}" for o in reversed(opens)]
    return "".join(opens) + "1" + "".join(closes)


def _depth(rng: random.Random, big: bool, most: int = 100_000) -> int:
    """A nesting depth over the limit of 32; ``most`` keeps a command-line argument
    under Linux's 128 kB per argument."""
    return rng.choice((33, 400, 1000, 3000)) if not big else rng.randint(33, most)


# -- the classes: each a function of (seed's random, big) -> Case ----------------------


def deep_toml_file(rng: random.Random, big: bool) -> Case:
    return Case(
        "deep_toml_file",
        ("run", "{dir}/s.toml"),
        "s.toml",
        {"s.toml": _tiny_with(f"[network.x]\nv = {_nested(_depth(rng, big), rng)}")},
    )


def deep_toml_set(rng: random.Random, big: bool) -> Case:
    value = _nested(_depth(rng, big, 15_000), rng)
    return Case("deep_toml_set", ("run", TINY, "--set", f"model.num_layers={value}"), "--set")


def dotted_key_file(rng: random.Random, big: bool) -> Case:
    key = ".".join(rng.choice("ab") for _ in range(_depth(rng, big)))
    return Case(
        "dotted_key_file", ("run", "{dir}/s.toml"), "s.toml", {"s.toml": f"{key} = 1\n".encode()}
    )


def dotted_key_set(rng: random.Random, big: bool) -> Case:
    key = ".".join(rng.choice("ab") for _ in range(_depth(rng, big, 50_000)))
    return Case("dotted_key_set", ("run", TINY, "--set", f"model.{key}=1"), "--set model.")


def huge_integer(rng: random.Random, big: bool) -> Case:
    digits = "9" * rng.randint(4301, 100_000 if big else 20_000)
    if rng.random() < 0.5:
        return Case("huge_integer", ("run", TINY, "--set", f"model.num_layers={digits}"), "--set")
    body = _tiny_with(f"[network.x]\nv = {digits}")
    return Case("huge_integer", ("run", "{dir}/s.toml"), "s.toml", {"s.toml": body})


def empty_schedule(rng: random.Random, big: bool) -> Case:
    flag = rng.choice(("--schedule", "--compare", "--schedule-file"))
    argv = ("schedule", f"{flag}=", "--stages", "2", "--microbatches", "2", *SCHED)
    return Case("empty_schedule", argv, "schedule")


def png_extension(rng: random.Random, big: bool) -> Case:
    ext = rng.choice(("foo", "PNGX", "jpeg2", "txt", "p"))
    return Case("png_extension", ("topology", TINY, "--png", f"{{dir}}/t.{ext}"), "--png")


def binary_journal(rng: random.Random, big: bool) -> Case:
    data = bytes(rng.randrange(128, 256) for _ in range(rng.randint(1, 4096)))
    return Case(
        "binary_journal",
        ("search", TINY, "--out", "{dir}/out", "--jobs", "1"),
        "search.jsonl",
        {"out/search.jsonl": data},
    )


def validation_table(rng: random.Random, big: bool) -> Case:
    """The calibration tables with a column renamed or a cell that is not a number
    (in the first row, so that nothing is simulated before it is read)."""
    files = {f"v/{p.name}": p.read_bytes() for p in VALIDATION.glob("*.csv")}
    name = "v/megatron_2021_table1.csv"
    head, first, *rest = files[name].decode().split("\n")
    cells = first.split(",")
    if rng.random() < 0.5:
        column = rng.choice(head.split(",")[2:8])
        head = head.replace(column, column.upper(), 1)
    else:
        cells[rng.choice((2, 3, 9, 11))] = rng.choice(("x", "1e", "", "--", "0x10"))
    files[name] = "\n".join([head, ",".join(cells), *rest]).encode()
    return Case("validation_table", ("validate", "--quick", "--data", "{dir}/v"), "v", files)


def endless_file(rng: random.Random, big: bool) -> Case:
    """/dev/zero where a file is read: the scenario, a calibration, a schedule file."""
    argv = rng.choice(
        (
            ("run", "/dev/zero"),
            ("run", TINY, "--calibration", "/dev/zero"),
            ("schedule", "--schedule-file", "/dev/zero", *SCHED),
            (
                "run",
                TINY,
                "--set",
                "training.schedule=custom",
                "--set",
                "training.schedule_file='/dev/zero'",
            ),
        )
    )
    return Case("endless_file", argv, "/dev/zero")


def fifo(rng: random.Random, big: bool) -> Case:
    """A FIFO that nobody writes to, where a file is read."""
    argv = rng.choice(
        (
            ("run", "{dir}/f"),
            ("topology", TINY, "--calibration", "{dir}/f"),
            ("schedule", "--schedule-file", "{dir}/f", *SCHED),
            ("validate", "--data", "{dir}"),
        )
    )
    fifos = ("megatron_2021_table1.csv",) if argv[0] == "validate" else ("f",)
    return Case("fifo", argv, fifos[0], fifos=fifos)


def oversized_file(rng: random.Random, big: bool) -> Case:
    size = rng.randint(16 * 2**20 + 1, 2**34)
    return Case("oversized_file", ("run", "{dir}/s.toml"), "s.toml", {"s.toml": size})


def schedule_size(rng: random.Random, big: bool) -> Case:
    """`stepsim schedule --compare` of many schedules, each within the size limit."""
    from stepsim.schedules import SCHEDULES

    names = ",".join(rng.choice(list(SCHEDULES)) for _ in range(rng.randint(2, 60)))
    argv = ("schedule", "--compare", names, "--stages", "400", "--microbatches", "400")
    return Case("schedule_size", (*argv, *SCHED, "--weight", "1"), "--stages=400")


def cluster_size(rng: random.Random, big: bool) -> Case:
    """Clusters, batches and fabrics too large to build or simulate in minutes."""
    sets = rng.choice(
        (
            ("cluster.num_nodes=100000", "cluster.gpus_per_node=8", "cluster.nics_per_node=8"),
            ("cluster.gpus_per_node=100000000",),
            ("training.global_batch_size=2000000",),
            (
                "cluster.num_nodes=20000",
                "cluster.fabric='fat-tree'",
                "cluster.fabric_levels=3",
                "cluster.nodes_per_leaf=1024",
                "cluster.leaves_per_pod=1",
                "cluster.spine_switches=1024",
                "cluster.gpus_per_node=1",
                "cluster.nics_per_node=1",
            ),
        )
    )
    key = sets[0].split("=")[0]
    argv = ("run", TINY, *(x for s in sets for x in ("--set", s)))
    return Case(
        "cluster_size", argv, "training.global_batch_size" if "batch" in key else "cluster."
    )


def _junk(rng: random.Random, big: bool) -> bytes:
    """Bytes a damaged file may hold: random binary, or text cut at a random place."""
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 5000 if big else 300)))


JOBS = ROOT / "scenarios" / "jobs" / "two-jobs-packed.toml"
MIXTRAL = str(ROOT / "scenarios" / "mixtral-8x7b-16-h100.toml")
_FIT_HEAD = '[fit]\ngpu = "a100-sxm4-80gb"\nnode = "dgx-a100"\nmeasurements = 2\nsource = "x"\n'


def calibration_file(rng: random.Random, big: bool) -> Case:
    """A damaged calibration file: binary, a wrong type, a value out of bounds, an
    unknown key, a fit without measurements, a cut table."""
    text = rng.choice(
        (
            _junk(rng, big),
            (_FIT_HEAD + 'gemm_scale = "fast"\n').encode(),
            (_FIT_HEAD + f"nic_scale = {rng.choice((0.0, 99.0, -1.0))}\n").encode(),
            (_FIT_HEAD + f"ib_latency_us = {rng.choice((1e9, -3.0))}\n").encode(),
            (_FIT_HEAD + "speedup = 2\n").encode(),
            _FIT_HEAD.replace("measurements = 2", "measurements = 0").encode(),
            _FIT_HEAD.encode()[: rng.randint(1, len(_FIT_HEAD) - 1)],
        )
    )
    return Case(
        "calibration_file",
        ("run", TINY, "--calibration", "{dir}/c.toml"),
        "c.toml",
        {"c.toml": text},
    )


def jobs_file(rng: random.Random, big: bool) -> Case:
    """A damaged jobs file: the shipped one cut, a job's key of the wrong type or
    unknown, a job without a scenario, binary."""
    shipped = JOBS.read_text(encoding="utf-8")
    text = rng.choice(
        (
            shipped[: rng.randint(1, len(shipped) - 1)] + "\n[[job]]\nname = 3\n",
            shipped.replace('placement = "packed"', "placement = 7", 1),
            shipped.replace('placement = "packed"', 'placing = "packed"', 1),
            shipped.replace('scenario = "gpt-1.3b-64gpu.toml"', "", 1),
            _junk(rng, big).decode("latin-1"),
        )
    )
    files = {"j.toml": text.encode("utf-8", "surrogateescape")}
    files["gpt-1.3b-64gpu.toml"] = (JOBS.parent / "gpt-1.3b-64gpu.toml").read_bytes()
    return Case("jobs_file", ("jobs", "{dir}/j.toml"), "j", files)


def set_value(rng: random.Random, big: bool) -> Case:
    """--set values with a line break, or huge (a 100 kB string where a name goes)."""
    key = rng.choice(("training.schedule", "training.micro_batch_size", "cluster.node"))
    value = rng.choice(
        (
            "1\n2",
            f"'{'x' * rng.randint(10_000, 100_000)}'",
            f"'a{chr(10)}b'",
            "[" * 5 + "1",
        )
    )
    return Case("set_value", ("run", TINY, "--set", f"{key}={value}"), key)


def shares_file(rng: random.Random, big: bool) -> Case:
    """A routing-shares file that is not one share per line (never echoed back)."""
    text = rng.choice(
        (
            b"root:x:0:0:root:/root:/bin/bash\n",
            _junk(rng, big),
            b"0.5\n-1\n",
            b"nan\n1\n",
            b"",
        )
    )
    sets = ("--set", "model.moe_routing_shares_file='{dir}/s.txt'")
    return Case("shares_file", ("run", MIXTRAL, *sets), "moe_routing_shares_file", {"s.txt": text})


def nccl_log(rng: random.Random, big: bool) -> Case:
    """A damaged nccl-tests log: a data line cut, a time that is not a number, junk."""
    good = (
        "#  Rank  0 Group  0 Pid 1 on h0 device  0 [0000:01:00] NVIDIA A100-SXM4-80GB\n"
        "#  Rank  1 Group  0 Pid 2 on h0 device  1 [0000:02:00] NVIDIA A100-SXM4-80GB\n"
        "     1048576    262144  float  sum  -1  100.0  10.49  10.49  0  100.0  10.49  10.49  0\n"
    )
    text = rng.choice(
        (
            good[: rng.randint(1, len(good) - 2)] + "\n",
            good.replace("100.0  10.49", "fast  10.49", 1),
            good.replace("100.0", "-3", 1),
            _junk(rng, big).decode("latin-1"),
        )
    )
    argv = ("calibrate", "--nccl-tests", "{dir}/all_reduce.txt", "--scenario", TINY)
    return Case("nccl_log", argv, "all_reduce.txt", {"all_reduce.txt": text.encode("latin-1")})


def profiler_trace(rng: random.Random, big: bool) -> Case:
    """A damaged profiler trace: not JSON, cut gzip, not an object, no GPU events."""
    import gzip

    data = rng.choice(
        (
            b'{"traceEvents": [\n {"ph": "X",, }]}',
            gzip.compress(b'{"traceEvents": []}')[: rng.randint(1, 20)],
            b"[1, 2, 3]",
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]}',
            b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "x", "dur": 1}]}',
            _junk(rng, big),
        )
    )
    return Case("profiler_trace", ("compare", TINY, "{dir}/t.json"), "t.json", {"t.json": data})


CLASSES: dict[str, Callable[[random.Random, bool], Case]] = {
    f.__name__: f
    for f in (
        deep_toml_file,
        deep_toml_set,
        dotted_key_file,
        dotted_key_set,
        huge_integer,
        empty_schedule,
        png_extension,
        binary_journal,
        validation_table,
        endless_file,
        fifo,
        oversized_file,
        schedule_size,
        cluster_size,
        calibration_file,
        jobs_file,
        set_value,
        shares_file,
        nccl_log,
        profiler_trace,
    )
}


def cases(seeds: int, big: bool = False, only: str | None = None) -> Iterator[Case]:
    for name, make in CLASSES.items():
        if only is None or name == only:
            for seed in range(seeds):
                yield make(random.Random(f"{name}:{seed}"), big)


# -- running one ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: killed at the time limit
    stderr: str
    seconds: float

    def problem(self, case: Case) -> str | None:
        """What is wrong with how the case ended, or None."""
        lines = self.stderr.strip().splitlines()
        if self.code is None:
            return f"no exit within {TIMEOUT_S:g} s"
        if "Traceback" in self.stderr or "Error:" in self.stderr.replace("error:", ""):
            return f"a traceback: {lines[-1] if lines else ''}"
        if self.code != 2:
            return f"exit {self.code}, not 2: {lines[-1] if lines else ''}"
        if len(lines) != 1:
            return f"{len(lines)} lines on stderr, not 1"
        if case.expect not in lines[0]:
            return f"the line does not name {case.expect!r}: {lines[0][:200]}"
        return None


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_case(case: Case) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix="stepsim-fuzz-"))
    try:
        for name, content in case.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, int):
                with path.open("wb") as f:
                    f.truncate(content)
            else:
                path.write_bytes(content)
        for name in case.fifos:
            os.mkfifo(folder / name)
        argv = [a.replace("{dir}", str(folder)) for a in case.argv]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "stepsim", *argv],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=TIMEOUT_S,
                preexec_fn=_limit_memory,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
            return Outcome(None, stderr, time.monotonic() - started)
        return Outcome(done.returncode, done.stderr, time.monotonic() - started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--many", action="store_true", help="30 seeds per class, larger sizes")
    parser.add_argument("--seeds", type=int, help="seeds per class (default 3, 30 with --many)")
    parser.add_argument("--class", dest="only", choices=list(CLASSES), help="one class only")
    args = parser.parse_args()
    seeds = args.seeds or (30 if args.many else 3)
    failed = 0
    for case in cases(seeds, args.many, args.only):
        outcome = run_case(case)
        problem = outcome.problem(case)
        failed += problem is not None
        shown = " ".join(case.argv)[:90]
        print(f"{'FAIL' if problem else 'ok  '} {outcome.seconds:5.2f} s  {case.klass:18} {shown}")
        if problem:
            print(f"      {problem}")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

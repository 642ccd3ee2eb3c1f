"""Record what stepsim prints and writes, and compare two recordings byte for byte.

A refactoring that must not change a number (the house issue: "every number stepsim
prints today stays bit-identical") is checked by recording before and after:

    python tools/golden.py record /tmp/golden-before      # on the old commit (a worktree)
    python tools/golden.py record /tmp/golden-after       # on the new one
    python tools/golden.py compare /tmp/golden-before /tmp/golden-after

The recording runs ``python -m stepsim`` in this checkout (the ``stepsim``
command) on: every
shipped scenario (summary text, metrics.json, trace.json, scenario.resolved.toml), every
case of the reference pipeline vectors through ``stepsim schedule --json`` plus one
picture's trace, ``stepsim validate --quick`` (``--full`` adds the whole table), a
two-key sweep (sweep.csv), a small search (search.csv), the ``plan`` commands and
``topology``. Pictures (PNG) are left out: their bytes depend on matplotlib's version,
not on stepsim. About two minutes on a 2-core machine (five with ``--full``).
``--exact`` records exact mode instead (``network.symmetry = false``, every GPU
simulated): tools/exact_cases.py's shipped scenarios cut down and small
perturbed ones (a few minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
VECTORS = ROOT / "tests" / "data" / "pipeline_vectors.json"
KEPT = (".json", ".csv", ".toml", ".txt")


def _stepsim() -> list[str]:
    # the checkout this file is in (run from ROOT), whichever copy is installed
    return [sys.executable, "-m", "stepsim"]


def _run(out: Path, name: str, args: list[str]) -> None:
    """Run one command; keep its stdout, stderr and exit status as ``name.txt``."""
    done = subprocess.run(
        [*_stepsim(), *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    text = f"$ stepsim {' '.join(args)}\nexit {done.returncode}\n{done.stdout}\n--stderr--\n"
    # the checkout's own path (its scenarios in the commands) is left out, so that two
    # checkouts side by side (git worktrees: before and after) compare
    text = (text + done.stderr).replace(str(ROOT), "<checkout>")
    (out / f"{name}.txt").write_text(text, encoding="utf-8")


def _check_installed() -> None:
    """Refuse to record another checkout's code: ``python -m stepsim`` runs whatever
    this interpreter has installed (an editable install points at one checkout; a
    worktree beside it needs a virtual environment of its own)."""
    found = subprocess.run(
        [sys.executable, "-c", "import stepsim; print(stepsim.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not found or not Path(found).resolve().is_relative_to(ROOT):
        sys.exit(
            f"golden.py: this interpreter's stepsim is {found or 'not installed'}, not "
            f"{ROOT}'s; install this checkout in its own venv (pip install -e {ROOT})"
        )


def record(out: Path, full: bool) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in sorted(SCENARIOS.glob("*.toml")):
        folder = out / f"run-{path.stem}"
        _run(out, f"run-{path.stem}", ["run", str(path), "--out", str(folder), "--quiet"])
    for case in json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]:
        args = [
            "schedule", "--schedule", case["schedule"], "--stages", str(case["p"]),
            "--microbatches", str(case["m"]), "--chunks", str(case["v"]),
            "--forward", str(case["F"]), "--backward", str(case["B"]),
            "--weight", str(case["W"]), "--p2p-latency", str(case["c"]), "--json",
        ]  # fmt: skip
        _run(out, f"schedule-{case['id']}", args)
    _run(out, "schedule-compare", [
        "schedule", "--compare", "1f1b,interleaved,zbh1,zbv", "--stages", "4",
        "--microbatches", "8", "--forward", "1", "--backward", "2", "--weight", "1",
        "--out", str(out / "schedule-compare"),
    ])  # fmt: skip
    _run(out, "validate", ["validate"] if full else ["validate", "--quick"])
    tiny = str(SCENARIOS / "tiny-2gpu.toml")
    _run(out, "sweep", [
        "sweep", tiny, "--set", "cluster.nic_gbps=100,400",
        "--set", "training.schedule=gpipe,1f1b", "--out", str(out / "sweep"), "--quiet",
    ])  # fmt: skip
    _run(out, "search", [
        "search", str(SCENARIOS / "gpt3-175b-128nodes.toml"), "--tp", "8", "--pp", "8,16",
        "--micro-batch", "1,2", "--jobs", "1", "--quiet", "--out", str(out / "search"),
    ])  # fmt: skip
    bigscience = str(SCENARIOS / "bigscience-175b-v100.toml")
    _run(out, "plan-fit", ["plan", "fit", tiny, "--nodes", "1", "--no-simulate"])
    _run(out, "plan-min-nodes", ["plan", "fit", bigscience, "--min-nodes", "--no-simulate"])
    _run(out, "plan-time", ["plan", "time-to-train", bigscience, "--tokens", "300e9"])
    _run(out, "plan-scale", [
        "plan", "scale", str(SCENARIOS / "gpt3-175b-128nodes.toml"), "--nodes", "64,128",
        "--out", str(out / "scale"),
    ])  # fmt: skip
    _run(out, "topology", ["topology", bigscience])
    _finish(out)


def record_exact(out: Path) -> None:
    """Exact mode's outputs (tools/exact_cases.py)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import exact_cases

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for stem, extra in exact_cases.SHIPPED.items():
        path = str(SCENARIOS / f"{stem}.toml")
        args = ["run", path, *exact_cases.EXACT, *extra, "--out", str(out / f"exact-{stem}")]
        _run(out, f"exact-{stem}", [*args, "--quiet"])
    for name, path in exact_cases.write_generated(out / "cases").items():
        _run(out, f"case-{name}", ["run", str(path), "--out", str(out / f"case-{name}"), "--quiet"])
    _finish(out)


def _finish(out: Path) -> None:
    for png in out.rglob("*.png"):
        png.unlink()
    print(f"recorded {sum(1 for _ in files(out))} files in {out}")


def files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in KEPT:
            yield path.relative_to(folder)


def _digest(path: Path, root: Path) -> str:
    data = path.read_bytes()
    # the recording folder appears in commands and paths; compare without it
    return hashlib.sha256(data.replace(str(root).encode(), b"<out>")).hexdigest()


def compare(before: Path, after: Path) -> int:
    old, new = set(files(before)), set(files(after))
    differ = [
        p for p in sorted(old & new) if _digest(before / p, before) != _digest(after / p, after)
    ]
    for p in sorted(old - new):
        print(f"only before: {p}")
    for p in sorted(new - old):
        print(f"only after:  {p}")
    for p in differ:
        print(f"differs:     {p}")
    same = len(old & new) - len(differ)
    print(f"{same} of {len(old | new)} files byte-identical")
    return 0 if same == len(old | new) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run everything and keep the outputs in DIR")
    rec.add_argument("dir", type=Path)
    rec.add_argument("--full", action="store_true", help="the whole validation table")
    rec.add_argument(
        "--exact", action="store_true", help="exact mode's cases instead (exact_cases.py)"
    )
    cmp_ = sub.add_parser("compare", help="compare two recordings file by file")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        _check_installed()
    if args.command == "record" and args.exact:
        record_exact(args.dir.resolve())
        return 0
    if args.command == "record":
        record(args.dir.resolve(), args.full)
        return 0
    return compare(args.before.resolve(), args.after.resolve())


if __name__ == "__main__":
    sys.exit(main())

"""What every command shares: the parser class, exit codes, the progress line, the
argument groups several commands take (the scenario's, --json and --quiet, token
counts), the executor their flags ask for, the --out folder's checks, and writing rows
as CSV (and Parquet)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

# What is imported here is what `stepsim --help` needs: the rest (the scenario, the
# search space, the worker pools, csv) where a command first uses it.
if TYPE_CHECKING:
    from ..scenario import Scenario
    from .outfolder import OutFolder

EXIT_USAGE = 2  # bad input: one line naming the key, the value and the rule
EXIT_FAILED = 1  # a deadlock or a file that cannot be read or written
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what schedulers, `timeout` and a closed terminal send), raised
    where SIGINT raises KeyboardInterrupt, so that every command keeps its finished work
    as it does on Ctrl-C; the exit status is 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def on_terminate(signum: int, frame: object) -> None:
    """The handler `stepsim` (cli.program) installs for SIGTERM and SIGHUP."""
    raise Terminated(signum)


def interrupted_status(exc: BaseException | None) -> int:
    """The exit status of a command stopped by ``exc``: 128 + N for signal N."""
    return 128 + exc.signum if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def interrupted_word(exc: BaseException | None) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated by SIGTERM``."""
    if isinstance(exc, Terminated):
        import signal

        return f"terminated by {signal.Signals(exc.signum).name}"
    return "interrupted"


EXIT_BROKEN_PIPE = 141  # stdout's reader went away (128 + SIGPIPE, as Unix tools exit)


def failure(exc: Exception) -> tuple[int, str] | None:
    """The exit status and the one line for an error a user can cause: a scenario's
    rule broken (EXIT_USAGE), a file that cannot be read or written, a deadlock
    (EXIT_FAILED); None for any other exception (a bug: raised as it is)."""
    from ..scenario.errors import ScenarioError, elided

    if isinstance(exc, ScenarioError):
        return EXIT_USAGE, f"stepsim: error: {exc}"
    if isinstance(exc, OSError):
        # a sentence and a cut-down file name, not Python's "[Errno N] ...: '<100 kB>'"
        where = f": {elided(str(exc.filename), 200)}" if exc.filename is not None else ""
        return EXIT_FAILED, f"stepsim: error: {exc.strerror or exc}{where}"
    # the engine's DeadlockError: if the engine was never imported, nothing raised is one
    core = sys.modules.get(f"{__name__.split('.')[0]}.engine.core")
    if core is not None and isinstance(exc, core.DeadlockError):
        return EXIT_FAILED, f"stepsim: error: {exc}"
    return None


# argparse's message for a value not among an argument's choices (a command's name too)
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>.*)' \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, as for scenario errors
        found = _INVALID_CHOICE.search(message)
        if found:  # argparse lists the choices as 'a', 'b'
            from ..scenario.suggest import did_you_mean

            hint = did_you_mean(found["given"], re.findall(r"'([^']*)'", found["choices"]))
            message += f"; {hint}" if hint else ""
        self.exit(EXIT_USAGE, f"stepsim: error: {message} (see stepsim {self._sub()}--help)\n")

    def _sub(self) -> str:
        parts = self.prog.split()[1:]
        return " ".join(parts) + " " if parts else ""


class Progress:
    """One self-overwriting line on stderr while a long simulation or sweep runs: the
    task, the fraction done, the time so far and, once a tenth is done and a second has
    passed, the time left at the pace so far (``~12 s left``; a sweep's over all its
    points: ``part`` says which of how many the current fraction belongs to). Silent
    unless ``enabled`` (stderr is a terminal and no --quiet); redrawn at most ten times
    a second, so it costs nothing measurable."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.task = ""
        self.started = time.monotonic()
        self.drawn_at = -1.0
        self.shown = False
        self.part: tuple[int, int] | None = None  # (index, count) of a sweep's points

    def begin(self, task: str) -> None:
        self.task = task
        self.update(0.0, force=True)

    def stage(self, task: str) -> None:
        """A step with no fraction (writing the outputs): its name and the time so far."""
        self.part = None
        self.task = task
        if not self.enabled:
            return
        self.stream.write(f"\r\x1b[K  {task}  {time.monotonic() - self.started:5.1f} s")
        self.stream.flush()
        self.shown = True

    def update(self, fraction: float, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.drawn_at < 0.1:
            return
        self.drawn_at = now
        elapsed = now - self.started
        line = f"  {self.task} {fraction:4.0%}  {elapsed:5.1f} s"
        done = fraction if self.part is None else (self.part[0] + fraction) / self.part[1]
        if done >= 0.1 and elapsed >= 1.0:
            line += f", ~{elapsed * (1.0 - done) / done:.0f} s left"
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def progress_for(args: argparse.Namespace) -> Progress:
    return Progress(sys.stderr.isatty() and not args.quiet)


# -- argument groups -------------------------------------------------------------------


def scenario_arguments(parser: argparse.ArgumentParser, metavar: str, help_text: str) -> None:
    parser.add_argument(
        "scenario", help="scenario file (TOML), or the name of a shipped one (stepsim list)"
    )
    calibration_argument(parser)
    parser.add_argument(
        "--hf-config",
        metavar="FILE",
        help="take the model from a Hugging Face config.json (model.hf_config) instead of "
        "the scenario's preset or model keys; the scenario's seq_length and --set still apply",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar=metavar,
        help=f"{help_text} (repeatable)",
    )


def calibration_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="a calibration file for the scenario's GPU: kernel constants "
        "(benchmarks/measure_kernels.py) and/or a fit on measured iterations (stepsim calibrate)",
    )


def calibration_record(scenario: Scenario) -> dict[str, Any]:
    """What a --json document says of what its numbers rest on (report/labels.py): the
    kernel constants' label, whether they are uncalibrated, the assumptions that may
    flatter the result, and a calibration file's fit record (file, measurements,
    leave-one-out error, parameters) when one was used."""
    from ..report.labels import labels

    out = labels(scenario)
    if scenario.measured is not None:
        return {**scenario.measured.record(), **out}
    return out


def calibration_columns(scenario: Scenario) -> dict[str, Any]:
    """The columns every CSV row (sweep.csv, search.csv, scale.csv) adds: the kernel
    constants' label and the assumptions (report/labels.py); with a calibration file's
    fit, its measurements and errors."""
    from ..report.labels import assumptions

    out: dict[str, Any] = {
        "calibration": scenario.kernel_constants.source,
        "assumptions": "; ".join(assumptions(scenario)),
    }
    if scenario.measured is not None:
        loo = scenario.measured.loo_error
        out["calibration_measurements"] = scenario.measured.measurements
        out["calibration_loo_error"] = "" if loo is None else loo
        if scenario.measured.collective_logs:
            out["calibration_collective_sizes"] = scenario.measured.collective_sizes
            out["calibration_collective_error"] = scenario.measured.collective_error
    return out


def label_lines(scenario: Scenario) -> list[str]:
    """The lines a text header adds: the calibration and the assumptions."""
    from ..report.labels import label_lines as lines

    return lines(scenario)


def load(args: argparse.Namespace, overrides: Sequence[str] | None = None) -> Scenario:
    """The scenario of the command's SCENARIO, --hf-config, --set (or ``overrides``)
    and --calibration."""
    from ..scenario import load_scenario

    return load_scenario(
        args.scenario,
        args.overrides if overrides is None else overrides,
        calibration=args.calibration,
        hf_config=args.hf_config,
    )


def json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the results as one JSON document instead"
    )


def print_json(document: Any) -> None:
    """A command's --json output: one document on stdout (json.dumps, indent 2)."""
    print(json.dumps(document, indent=2))


def quiet_argument(parser: argparse.ArgumentParser, help_text: str = "no progress line") -> None:
    parser.add_argument("--quiet", action="store_true", help=help_text)


# --tokens: a count with an optional SI-style suffix (300B, 15T), or any float literal
_TOKENS = re.compile(
    r"(?P<number>[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9]+)?)(?P<unit>[kKmMbBtT]?)"
)
TOKEN_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
MAX_TOKENS = 1e18  # a thousand times the largest training run's: a typo beyond it


def token_count(text: str) -> float:
    """A token count as --tokens takes it: ``300B``, ``15T``, ``1.5M``, ``2.5e12``,
    ``300e9``, ``300_000_000_000`` (K, M, B, T: 10^3, 10^6, 10^9, 10^12, either case),
    positive and at most 10^18; an argparse error naming the value otherwise."""
    found = _TOKENS.fullmatch(text.strip())
    value = math.nan
    if found and "__" not in text and not found["number"].endswith("_"):
        try:
            value = float(found["number"]) * TOKEN_UNITS[found["unit"].lower()]
        except ValueError:  # an underscore where float() takes none (1_.5)
            value = math.nan
    if not 1 <= value <= MAX_TOKENS:
        why = "must be at least 1" if value < 1 else f"must be at most {MAX_TOKENS:.0e}"
        if math.isnan(value):
            why = "is not a token count (write 300B, 15T, 2.5e12 or 300_000_000_000)"
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return value


def tokens_argument(parser: argparse.ArgumentParser, help_text: str, required: bool = False):
    parser.add_argument(
        "--tokens",
        type=token_count,
        required=required,
        metavar="T",
        help=f"{help_text}: 300B, 15T, 2.5e12 or 300_000_000_000",
    )


# -- --out: a folder the command writes to ----------------------------------------------


def check_out(option: str, text: str | None, folder: bool = True) -> Path | None:
    """The folder (``folder``) or file an output option names, checked before any work
    is done: an existing path of the other kind, a file in the way of the folders to
    create, or an ancestor that cannot be written is a one-line error naming the
    option, the path and why (exit 2). Nothing is created here (`out_errors` turns a
    failure when writing into the same line)."""
    from ..scenario import ScenarioError

    if text is None:
        return None
    path = Path(text)
    if path.exists():
        if folder and not path.is_dir():
            raise ScenarioError(f"{option} {text!r}: is a file, not a folder")
        if not folder and path.is_dir():
            raise ScenarioError(f"{option} {text!r}: is a folder, not a file")
        target = path if folder else path.parent
        if not os.access(target, os.W_OK | os.X_OK):
            raise ScenarioError(f"{option} {text!r}: cannot write there: permission denied")
        return path
    parent = path.parent  # as the user wrote it (".", the working folder, exists)
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not folder and parent != path.parent:
        raise ScenarioError(f"{option} {text!r}: its folder {str(path.parent)!r} does not exist")
    if not parent.is_dir():
        raise ScenarioError(f"{option} {text!r}: cannot create it: {str(parent)!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ScenarioError(
            f"{option} {text!r}: cannot create it in {str(parent)!r}: permission denied"
        )
    return path


@contextlib.contextmanager
def out_errors(option: str, text: str) -> Iterator[None]:
    """Writing an output option's files: an OSError (no space, a permission, a file in
    the way) becomes one line naming the option, the path and the reason (exit 2)."""
    from ..scenario import ScenarioError

    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != text else ""
        reason = exc.strerror or str(exc)
        raise ScenarioError(f"{option} {text!r}: cannot write{where}: {reason}") from None


def _listed(values: tuple) -> str:
    """A search-space default as its flag takes it: comma-separated."""
    return ",".join(str(value) for value in values)


def space_arguments(parser: argparse.ArgumentParser) -> None:
    """The search-space flags; their defaults are plan.space's, the names vocabulary's."""
    from ..ir.vocabulary import (
        DATA_PARALLEL_SHARDING,
        NO_SHARDING,
        RECOMPUTE_GRANULARITIES,
        SHARDING_NAMES,
    )
    from ..plan.space import (
        DEFAULT_CHUNKS,
        DEFAULT_MEMORY_HEADROOM,
        DEFAULT_MICRO_BATCHES,
        DEFAULT_SCHEDULES,
        DEFAULT_SHARDING,
    )

    space = parser.add_argument_group("search space (comma-separated values)")
    space.add_argument(
        "--memory-headroom",
        type=float,
        default=DEFAULT_MEMORY_HEADROOM,
        metavar="FRACTION",
        help="the fraction of each GPU's memory a layout must leave free to count as fitting "
        f"(default {DEFAULT_MEMORY_HEADROOM:g}: allocator fragmentation, CUDA context and "
        "NCCL buffers the memory model leaves out; 0: the bare capacity); layouts within "
        "twice it are marked '!'",
    )
    space.add_argument("--tp", metavar="LIST", help="tensor parallel (default: divisors of a node)")
    space.add_argument("--pp", metavar="LIST", help="pipeline parallel (default: layer divisors)")
    micro_batches, schedules = _listed(DEFAULT_MICRO_BATCHES), _listed(DEFAULT_SCHEDULES)
    space.add_argument(
        "--micro-batch", metavar="LIST", default=micro_batches, help=f"default {micro_batches}"
    )
    space.add_argument(
        "--schedules", metavar="LIST", default=schedules, help=f"default {schedules}"
    )
    chunks = _listed(DEFAULT_CHUNKS)
    space.add_argument(
        "--chunks",
        metavar="LIST",
        default=chunks,
        help=f"chunks per rank of chunked schedules ({chunks})",
    )
    space.add_argument(
        "--recompute",
        metavar="LIST",
        default=_listed(RECOMPUTE_GRANULARITIES),
        help="default all three",
    )
    named = ", ".join(
        f"{mode} ({SHARDING_NAMES[mode]})" if mode != NO_SHARDING else mode
        for mode in DATA_PARALLEL_SHARDING
    )
    space.add_argument(
        "--sharding",
        metavar="LIST",
        default=_listed(DEFAULT_SHARDING),
        help=f"data-parallel sharding: {named}; default the first two",
    )
    space.add_argument(
        "--sequence-parallel",
        choices=["both", "on", "off"],
        default="both",
        help="with TP > 1 (default both)",
    )


def space_of(args: argparse.Namespace):
    """The search space the flags of space_arguments give."""
    from ..plan.space import space_from_flags

    return space_from_flags(
        memory_headroom=args.memory_headroom,
        tp=args.tp,
        pp=args.pp,
        micro_batch=args.micro_batch,
        schedules=args.schedules,
        chunks=args.chunks,
        recompute=args.recompute,
        sharding=args.sharding,
        sequence_parallel=args.sequence_parallel,
    )


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="local worker processes (default: the CPUs)"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="simulate on a Ray cluster at ADDRESS, or on Ray started here when no address "
        "is given (pip install 'stepsim[ray]')",
    )
    quiet_argument(parser)


class Workers:
    """The executor the command's flags ask for, closed when done."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ..plan.executors import LocalPool, RayPool, default_jobs
        from ..scenario import ScenarioError

        jobs = args.jobs if args.jobs is not None else default_jobs()
        if jobs < 1:
            raise ScenarioError(f"--jobs={jobs} must be >= 1")
        if args.ray is not None:
            package = None
            if args.ray:  # a cluster elsewhere: the package travels with the tasks
                import tempfile

                self.staging = tempfile.TemporaryDirectory(prefix="stepsim-ray-")
                package = ray_package_dir(Path(self.staging.name))
            self.executor: LocalPool | RayPool = RayPool(args.ray or None, jobs, package)
            self.where = f"on Ray at {args.ray}" if args.ray else f"on Ray here, {jobs} CPUs"
        else:
            self.executor = LocalPool(jobs)
            self.where = f"{jobs} local process" + ("es" if jobs > 1 else "")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.close()
        if getattr(self, "staging", None) is not None:
            self.staging.cleanup()


def ray_package_dir(tmp: Path) -> str:
    """A folder named stepsim holding the whole package, for a Ray cluster's tasks to
    import: the installed package itself when installed from a wheel; from a checkout
    (an editable install maps simulator/, schedules/ and topologies/ into one namespace)
    a copy in ``tmp`` laid out as the wheel lays it out."""
    import shutil

    import stepsim
    import stepsim.schedules
    import stepsim.topologies

    here = Path(stepsim.__file__).parent
    if here.name == "stepsim":
        return str(here)
    skip = shutil.ignore_patterns("__pycache__")
    staged = tmp / "stepsim"
    shutil.copytree(here, staged, ignore=skip)
    for sub in (stepsim.schedules, stepsim.topologies):
        assert sub.__file__ is not None  # a package with an __init__.py has one
        shutil.copytree(
            Path(sub.__file__).parent, staged / sub.__name__.split(".")[-1], ignore=skip
        )
    return str(staged)


def csv_text(rows: list[dict[str, Any]], empty_head: str = "layout") -> str:
    """rows under a header of every row's keys in the order they first appear (a row
    without a column leaves it empty; ``empty_head`` alone when there are no rows)."""
    import csv
    import io

    fieldnames = list(dict.fromkeys(key for row in rows for key in row)) or [empty_head]
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_rows(folder: OutFolder, stem: str, rows: list[dict[str, Any]]) -> list[str]:
    """rows as STEM.csv, and STEM.parquet when pyarrow is installed, into an output
    folder (cli/outfolder.py); the names written."""
    folder.text(f"{stem}.csv", csv_text(rows))
    written = [f"{stem}.csv"]
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return written
    buffer = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), buffer)
    folder.bytes(f"{stem}.parquet", buffer.getvalue().to_pybytes())
    return [*written, f"{stem}.parquet"]

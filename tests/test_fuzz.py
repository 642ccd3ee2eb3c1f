"""Malformed inputs of every class tools/fuzz.py generates, one case each: exit 2,
one line naming the key or file, no traceback. Those that read endless, blocking or huge
input or build large clusters run as the command a user types, under the fuzz's time and
memory bound; the others call main in this process (one of them as a command as well).
`python tools/fuzz.py --many` runs many more, each as a command."""

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import fuzz  # noqa: E402

from tests.helpers import main_in_process  # noqa: E402


def test_every_class_has_a_case_and_the_cases_are_deterministic():
    first = list(fuzz.cases(1))
    assert [c.klass for c in first] == list(fuzz.CLASSES)
    assert first == list(fuzz.cases(1))


def test_the_check_can_fail():
    """A traceback, two lines, another exit or a line not naming the file all fail."""
    case = fuzz.Case("x", ("run",), "s.toml")
    assert fuzz.Outcome(2, "stepsim: error: s.toml is bad\n", 0.1).problem(case) is None
    assert "traceback" in fuzz.Outcome(1, "Traceback (most recent call last):\n", 0.1).problem(case)
    assert "2 lines" in fuzz.Outcome(2, "stepsim: error: s.toml\nmore\n", 0.1).problem(case)
    assert "exit 0" in fuzz.Outcome(0, "stepsim: error: s.toml\n", 0.1).problem(case)
    assert "does not name" in fuzz.Outcome(2, "stepsim: error: x\n", 0.1).problem(case)
    assert "no exit" in fuzz.Outcome(None, "", 20.0).problem(case)


# the classes whose refusal reads no endless stream, FIFO or huge file and builds nothing
# large: a regression there ends in a traceback or a wrong line, which main in this
# process shows as a subprocess would, without ~0.6 s of imports per case. The others
# (and a few of these, below) run as the real command under the time and memory bound.
IN_PROCESS = {
    "deep_toml_file",
    "deep_toml_set",
    "dotted_key_file",
    "dotted_key_set",
    "huge_integer",
    "empty_schedule",
    "png_extension",
    "binary_journal",
    "validation_table",
    "calibration_file",
    "jobs_file",
    "set_value",
    "shares_file",
    "nccl_log",
    "profiler_trace",
}


def _in_process(case: fuzz.Case, folder: Path) -> fuzz.Outcome:
    """fuzz.run_case's files and command, run by cli.main in this process."""
    folder.mkdir()
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)  # only bytes: the sparse oversized file runs in a process
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    started = time.monotonic()
    code, _, stderr = main_in_process(*argv, cwd=fuzz.ROOT)
    return fuzz.Outcome(code, stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    cases = list(fuzz.cases(1))
    assert {c.klass for c in cases} > IN_PROCESS
    here = [c for c in cases if c.klass in IN_PROCESS]
    # a real process for the rest, and for the deepest nesting of a file (a fresh
    # interpreter's stack; tests/test_cli.py runs a --set refusal as a real process)
    real = [c for c in cases if c.klass not in IN_PROCESS]
    real += [c for c in here if c.klass == "deep_toml_file"]
    folder = tmp_path_factory.mktemp("fuzz")
    found = [(c, _in_process(c, folder / str(i))) for i, c in enumerate(here)]
    with ThreadPoolExecutor(2) as pool:  # the subprocesses wait mostly on imports
        found += zip(real, pool.map(fuzz.run_case, real), strict=True)
    return found


@pytest.mark.parametrize("klass", list(fuzz.CLASSES))
def test_malformed_input_is_one_line_and_exit_2(outcomes, klass):
    for case, outcome in outcomes:
        if case.klass == klass:
            assert outcome.problem(case) is None, (case.argv[:4], outcome.stderr[-500:])

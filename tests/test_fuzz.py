"""Malformed inputs of every class benchmarks/fuzz.py generates, one case each, run as
the command a user types: exit 2, one line naming the key or file, no traceback, under
the fuzz's time and memory bound. `python benchmarks/fuzz.py --many` runs many more."""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fuzz  # noqa: E402


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


@pytest.fixture(scope="module")
def outcomes():
    cases = list(fuzz.cases(1))
    with ThreadPoolExecutor(2) as pool:  # the subprocesses wait mostly on imports
        return list(zip(cases, pool.map(fuzz.run_case, cases), strict=True))


@pytest.mark.parametrize("klass", list(fuzz.CLASSES))
def test_malformed_input_is_one_line_and_exit_2(outcomes, klass):
    for case, outcome in outcomes:
        if case.klass == klass:
            assert outcome.problem(case) is None, (case.argv[:4], outcome.stderr[-500:])

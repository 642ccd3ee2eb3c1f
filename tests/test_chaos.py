"""Chaos: `run` and `sweep` stopped at random moments, by Ctrl-C or by SIGTERM/SIGHUP
(as the stepsim program turns them into cli.common.Terminated), and `run` killed with
SIGKILL while it writes. After each, the --out folder is complete (its manifest lists
exactly its files, each with its hash) or incomplete (no manifest, and none of the
previous run's files), never a mix; a rerun writes byte-identical files."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import unittest.mock

from hypothesis import given, settings
from hypothesis import strategies as st

from stepsim.cli import main, outfolder
from stepsim.cli.common import Terminated
from stepsim.cli.outfolder import MANIFEST
from tests.helpers import ROOT

TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
STOPS = {
    "ctrl-c": (KeyboardInterrupt, 130),
    "sigterm": (lambda: Terminated(signal.SIGTERM), 128 + signal.SIGTERM),
    "sighup": (lambda: Terminated(signal.SIGHUP), 128 + signal.SIGHUP),
}


def files_of(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def check_folder(folder, previous_only):
    """Complete (the manifest lists exactly the files, hashes right: the earlier run's
    or the new one's) or incomplete (no manifest, and none of ``previous_only``, the
    earlier run's files the new one does not write)."""
    found = files_of(folder)
    if MANIFEST in found:
        listed = json.loads((folder / MANIFEST).read_text())["files"]
        del found[MANIFEST]
        assert {n: e["sha256"] for n, e in listed.items()} == found
    else:
        assert not any(name in found for name in previous_only), sorted(found)


def stopping(after, make):
    """atomic_write_bytes that raises ``make()`` at its ``after``-th call."""
    real = outfolder.atomic_write_bytes
    calls = []

    def write(path, data):
        calls.append(path)
        if len(calls) == after:
            raise make()
        real(path, data)

    return write


CLEAN: dict[str, str] = {}  # a clean run's files, made once


@settings(max_examples=4, deadline=None, derandomize=True)
@given(after=st.integers(1, 7), stop=st.sampled_from(sorted(STOPS)))
def test_run_stopped_while_writing_leaves_a_complete_or_an_incomplete_folder(
    tmp_path_factory, after, stop
):
    folder = tmp_path_factory.mktemp("run")
    if not CLEAN:
        clean = tmp_path_factory.mktemp("clean")
        assert main(["run", TINY, "--out", str(clean), "--quiet"]) == 0
        CLEAN.update(files_of(clean))
    assert main(["run", TINY, "--out", str(folder), "--trace", "gz", "--quiet"]) == 0
    make, status = STOPS[stop]
    with unittest.mock.patch.object(outfolder, "atomic_write_bytes", stopping(after, make)):
        code = main(["run", TINY, "--out", str(folder), "--quiet"])
    assert code in (0, status)  # 0: it had written everything before the stop came
    check_folder(folder, previous_only={"trace.json.gz"})
    assert main(["run", TINY, "--out", str(folder), "--quiet"]) == 0
    assert files_of(folder) == CLEAN  # the rerun: byte for byte


@settings(max_examples=3, deadline=None, derandomize=True)
@given(point=st.integers(1, 3), stop=st.sampled_from(sorted(STOPS)))
def test_sweep_stopped_at_any_point_keeps_the_finished_ones_and_a_consistent_folder(
    tmp_path_factory, point, stop
):
    from stepsim.run import iteration as run_module

    folder = tmp_path_factory.mktemp("sweep")
    argv = ["sweep", TINY, "--set", "cluster.nic_gbps=100,200,300", "--out", str(folder)]
    real_run = run_module.run
    calls = []
    make, status = STOPS[stop]

    def run_or_stop(scenario, progress=None, **options):
        calls.append(1)
        if len(calls) == point:
            raise make()
        return real_run(scenario, **options)

    with unittest.mock.patch.object(run_module, "run", run_or_stop):
        assert main([*argv, "--quiet"]) == status
    check_folder(folder, previous_only=set())
    rows = (folder / "sweep.csv").read_text().splitlines()
    assert len(rows) == point  # the header and the points finished before the stop
    assert main([*argv, "--quiet"]) == 0
    again = files_of(folder)
    assert main([*argv, "--quiet"]) == 0
    assert files_of(folder) == again


def test_run_killed_with_sigkill_while_writing_is_never_mixed(tmp_path):
    """A real process killed at a few moments of writing its outputs (no handler can
    run): the folder is complete or incomplete, never mixed; a rerun is whole."""
    folder = tmp_path / "out"
    assert main(["run", TINY, "--out", str(folder), "--trace", "gz", "--quiet"]) == 0
    command = [sys.executable, "-m", "stepsim", "run", TINY, "--out", str(folder), "--quiet"]
    for delay in (0.9, 1.5):  # import, simulate, write: about 1-2 s in all
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        check_folder(folder, previous_only={"trace.json.gz"})
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    assert MANIFEST in os.listdir(folder)
    check_folder(folder, previous_only={"trace.json.gz"})

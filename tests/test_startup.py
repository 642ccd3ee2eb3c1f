"""Start-up (docs/performance.md, "Start-up and lowering"): `stepsim NAME ...` builds and
imports NAME's parser alone, which parses and reads as it does among every command's,
and importing the command line loads no simulator."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from stepsim.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")

ARGVS = [
    ["run", TINY, "--json", "--set", "cluster.nic_gbps=100"],
    ["sweep", TINY, "--set", "cluster.nic_gbps=100,200", "--json"],
    ["plan", "fit", TINY, "--nodes", "1", "--no-simulate"],
    ["search", TINY, "--tp", "1", "--jobs", "1"],
    [
        "schedule",
        "--schedule",
        "1f1b",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--forward",
        "1",
        "--backward",
        "2",
    ],
    ["list", "--json"],
]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices[name]


@pytest.mark.parametrize("argv", ARGVS, ids=lambda argv: argv[0])
def test_a_command_alone_parses_and_reads_as_among_all(argv):
    alone, every = build_parser(argv), build_parser()
    assert list(_subparser(alone, argv[0])._option_string_actions) == list(
        _subparser(every, argv[0])._option_string_actions
    )
    assert vars(alone.parse_args(argv)) == vars(every.parse_args(argv))
    assert _subparser(alone, argv[0]).format_help() == _subparser(every, argv[0]).format_help()


def test_every_command_is_listed_once_in_order():
    names = [name for name, _, _ in COMMANDS]
    every = _subparser_names(build_parser())
    assert names == every and len(set(names)) == len(names)
    assert _subparser_names(build_parser(["--help"])) == every  # not a command: all
    assert _subparser_names(build_parser(["jobs", "x"])) == ["jobs"]


def _subparser_names(parser: argparse.ArgumentParser) -> list[str]:
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(subs.choices)


def test_the_command_line_imports_no_simulator():
    """`import stepsim.cli` (what the console script does first) loads neither the
    scenario layer nor the engine (simpy) nor numpy; `stepsim run X --json` loads no
    other command's module, no planning and no networkx (its cluster is a
    topologies.drawing.Drawing; only `stepsim topology` needs networkx)."""
    code = (
        "import sys, io, contextlib; import stepsim.cli as cli\n"
        "heavy = ('networkx', 'numpy', 'simpy', 'stepsim.scenario', 'stepsim.engine.core')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    cli.main(['run', {TINY!r}, '--json', '--quiet'])\n"
        "loaded = ('stepsim.cli.cmd_', 'stepsim.plan')\n"
        "print(sorted(m for m in sys.modules if m.startswith(loaded)))\n"
        "print('networkx' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "['stepsim.cli.cmd_run']", "False"]

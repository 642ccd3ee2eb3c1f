"""The ``stepsim`` command. With scenario/'s file layer, the only code that touches files.

One module per command (cmd_run.py for `stepsim run`, and so on; cmd_run.py also holds
`stepsim jobs`, which runs several), each adding its parser and holding its handler:
argument parsing and printing only, the work done by the layers below. common.py has
what they share. Errors a user can cause print one line and exit with status 2; no
traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from .. import __version__
from .common import (
    EXIT_BROKEN_PIPE,
    EXIT_USAGE,
    Parser,
    Progress,
    failure,
    interrupted_status,
    interrupted_word,
    on_terminate,
)

__all__ = ["EXIT_USAGE", "Progress", "build_parser", "main", "program"]

# (name, module, the function adding its parser), in the order `stepsim --help` lists
# them; a command's module is imported only when its parser is built (`build_parser`)
COMMANDS = (
    ("run", "cmd_run", "add_command"),
    ("sweep", "cmd_sweep", "add_command"),
    ("jobs", "cmd_run", "add_jobs_command"),
    ("validate", "cmd_validate", "add_command"),
    ("calibrate", "cmd_calibrate", "add_command"),
    ("compare", "cmd_compare", "add_command"),
    ("search", "cmd_search", "add_command"),
    ("plan", "cmd_plan", "add_command"),
    ("topology", "cmd_topology", "add_command"),
    ("schedule", "cmd_schedule", "add_command"),
    ("list", "cmd_listing", "add_command"),
    ("docs", "cmd_docs", "add_command"),
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, when ``argv`` starts with a command's name, of
    that command alone: the same parse of ``argv`` and the same messages (a command's
    parser is named "stepsim NAME" either way), without importing the other commands'
    modules. ``stepsim --help``, a missing or unknown command get every command."""
    parser = Parser(
        prog="stepsim",
        description="Simulate one training iteration of a Megatron-style transformer on a "
        "GPU cluster.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    named = [entry for entry in COMMANDS if argv and entry[0] == argv[0]]
    for _, module, function in named or COMMANDS:
        getattr(importlib.import_module(f"{__name__}.{module}"), function)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return dispatch(parse(argv))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line ``argv`` (default: the process's) parsed; argparse exits on
    --help, --version and usage errors."""
    argv = sys.argv[1:] if argv is None else argv
    return build_parser(argv).parse_args(argv)


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command; errors a user can cause are one line and an exit status."""
    try:
        return args.handler(args)
    except BrokenPipeError:
        # the reader went away (`stepsim run X | head`): stop quietly, as Unix tools do
        # on SIGPIPE, and keep Python from complaining when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:  # commands that keep finished work catch it themselves
        print(f"stepsim: {interrupted_word(exc)}", file=sys.stderr)
        return interrupted_status(exc)
    except Exception as exc:
        failed = failure(exc)
        if failed is None:
            raise
        code, line = failed
        print(line, file=sys.stderr)
        return code


def program(argv: list[str] | None = None) -> int:
    """The ``stepsim`` program (its console script, ``python -m stepsim``): `main`, then
    freeze what the collector tracks before the interpreter exits. A run's ops, spans
    and intervals are still held by cyclic structures (the engine's callbacks, the
    lowering's stages) when the command returns, and the interpreter's last collection
    would walk and free every one of them for nothing: a fifth of a large run's whole
    process (docs/performance.md). Frozen, they are left to the operating system; exit
    handlers still run. In-process callers of `main` (tests, sweeps) keep collecting."""
    for name in ("SIGTERM", "SIGHUP"):  # as SIGINT: finished work kept, one line
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), on_terminate)
    # Start-up (imports, parsing, reading the scenario) allocates hundreds of thousands
    # of objects and makes no cyclic garbage worth a pass: a tenth of `stepsim run
    # tiny-2gpu --json` went to collections finding nothing. The collector comes back
    # before the command's handler runs, but for a run that writes no files: one
    # simulation, whose lowering and engine pause it anyway, and its result printed
    # (with --out, the pictures' figures are cyclic garbage worth collecting).
    gc.disable()
    try:
        args = parse(argv)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while it starts: the same line
        print(f"stepsim: {interrupted_word(exc)}", file=sys.stderr)
        return interrupted_status(exc)
    finally:
        gc.enable()
    if args.command == "run" and args.out is None:
        gc.disable()
    code = dispatch(args)
    gc.freeze()
    return code

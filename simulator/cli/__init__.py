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
import os
import signal
import sys

from .. import __version__
from ..engine.core import DeadlockError
from ..scenario import ScenarioError
from ..scenario.errors import elided
from . import (
    cmd_calibrate,
    cmd_compare,
    cmd_docs,
    cmd_listing,
    cmd_plan,
    cmd_run,
    cmd_schedule,
    cmd_search,
    cmd_sweep,
    cmd_topology,
    cmd_validate,
)
from .common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_USAGE,
    Parser,
    Progress,
    interrupted_status,
    interrupted_word,
    on_terminate,
)

__all__ = ["EXIT_USAGE", "Progress", "build_parser", "main", "program"]

# in the order `stepsim --help` lists them
COMMANDS = (
    cmd_run.add_command,
    cmd_sweep.add_command,
    cmd_run.add_jobs_command,
    cmd_validate.add_command,
    cmd_calibrate.add_command,
    cmd_compare.add_command,
    cmd_search.add_command,
    cmd_plan.add_command,
    cmd_topology.add_command,
    cmd_schedule.add_command,
    cmd_listing.add_command,
    cmd_docs.add_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stepsim",
        description="Simulate one training iteration of a Megatron-style transformer on a "
        "GPU cluster.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add_command in COMMANDS:
        add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # the reader went away (`stepsim run X | head`): stop quietly, as Unix tools do
        # on SIGPIPE, and keep Python from complaining when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ScenarioError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        # a sentence and a cut-down file name, not Python's "[Errno N] ...: '<100 kB>'"
        where = f": {elided(str(exc.filename), 200)}" if exc.filename is not None else ""
        print(f"stepsim: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILED
    except DeadlockError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:  # commands that keep finished work catch it themselves
        print(f"stepsim: {interrupted_word(exc)}", file=sys.stderr)
        return interrupted_status(exc)


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
    code = main(argv)
    gc.freeze()
    return code

"""`stepsim docs`: the documentation that ships with stepsim (docs/*.md), listed or
printed, so that help texts pointing at `docs/...` work from a wheel outside the
checkout too."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..ir.results import SCHEMA_VERSION
from ..scenario import ScenarioError
from ..scenario.suggest import did_you_mean
from .common import json_argument, print_json, quiet_argument


def add_command(sub) -> None:
    docs = sub.add_parser(
        "docs",
        help="list the documents that ship with stepsim, or print one (docs/NAME.md)",
        description="Without NAME, list the documents (docs/*.md: design, calibration, "
        "memory, moe, ...) with their titles; with NAME, print that document. Help texts "
        "that point at docs/NAME.md mean `stepsim docs NAME`.",
    )
    docs.add_argument("name", nargs="?", help="a document: memory, docs/memory.md, ...")
    json_argument(docs)
    quiet_argument(docs, "accepted as every command takes it (docs shows no progress line)")
    docs.set_defaults(handler=command)


def docs_dir() -> Path:
    """The shipped documents: the checkout's docs/ in an editable install, the installed
    package's data from a wheel."""
    from importlib.resources import files

    return Path(str(files("stepsim.docs")))


def documents() -> dict[str, Path]:
    return {path.stem: path for path in sorted(docs_dir().glob("*.md"))}


def title(path: Path) -> str:
    """A document's first heading."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def command(args: argparse.Namespace) -> int:
    found = documents()
    if args.name is None:
        if args.json:
            listing = {name: title(path) for name, path in found.items()}
            print_json({"schema_version": SCHEMA_VERSION, "command": "docs", "docs": listing})
            return 0
        width = max(len(name) for name in found)
        print("documents (stepsim docs NAME prints one):")
        for name, path in found.items():
            print(f"  {name:<{width}}  {title(path)}")
        return 0
    name = Path(args.name).name.removesuffix(".md")
    if name not in found:
        hint = did_you_mean(name, found)
        raise ScenarioError(
            f"no document {args.name!r} ships with stepsim; `stepsim docs` lists them"
            + (f" ({hint})" if hint else "")
        )
    text = found[name].read_text(encoding="utf-8")
    if args.json:
        print_json(
            {"schema_version": SCHEMA_VERSION, "command": "docs", "name": name, "text": text}
        )
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0

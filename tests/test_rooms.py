"""The house's plan (docs/design.md, "The house: one room per trade") held by its imports.

Every module of simulator/, schedules/ and topologies/ is read with ast (nothing is
imported) and its imports resolved to stepsim module names: those at module level, those
inside functions, and those under ``if TYPE_CHECKING:`` (for the type checker only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "simulator": "stepsim",
    "schedules": "stepsim.schedules",
    "topologies": "stepsim.topologies",
}

# Function-local imports kept for start-up time, by (importing module, imported module):
# a command imports the rooms it drives in its handler, so `stepsim --help` and
# `stepsim list` load no simulator; plan's search and questions import run/ where
# they first simulate; report/trace.py reads linkstats (numpy) only for link counters,
# report/tables.py the calibration sets only for validation's tables.
STARTUP_PREFIXES = ("stepsim.cli.",)
STARTUP = {
    ("stepsim.plan.search", "stepsim.run.iteration"),
    ("stepsim.plan.questions", "stepsim.run.iteration"),
    ("stepsim.report.trace", "stepsim.report.linkstats"),
    ("stepsim.report.tables", "stepsim.calibration.validation"),
    ("stepsim.run", "stepsim.run.iteration"),  # the entry point `run`, when asked for
}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out[".".join([package, *parts])] = (path, is_package)
    return out


MODULES = _modules()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str | None:
    """The stepsim module ``name`` is, or is in (a name imported from a module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports() -> list[tuple[str, str, str]]:
    """(importer, imported stepsim module, where: "top", "local" or "typing")."""
    found = []
    for module, (path, is_package) in MODULES.items():

        def visit(node: ast.AST, where: str, module: str = module, pkg: bool = is_package):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    visit(child, "local")
                    continue
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    visit(child, "typing")
                    continue
                names = []
                if isinstance(child, ast.ImportFrom):
                    target = _resolve(module, pkg, child)
                    names = [f"{target}.{alias.name}" for alias in child.names]
                elif isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                for name in names:
                    if name.split(".")[0] == "simpy":
                        found.append((module, "simpy", where))
                    known = _known(name) if name.startswith("stepsim") else None
                    if known is not None and known != module:
                        found.append((module, known, where))
                visit(child, where)

        visit(ast.parse(path.read_text(encoding="utf-8")), "top")
    return found


IMPORTS = _imports()


def room(module: str) -> str:
    """The package a module lives in (a package's __init__ is its own room; a __main__,
    which nothing imports, too)."""
    if module == "simpy" or module.endswith(".__main__"):
        return module
    path, is_package = MODULES[module]
    return module if is_package else module.rpartition(".")[0]


def test_every_module_is_read():
    assert "stepsim.ir.ops" in MODULES and "stepsim.schedules.pipeline" in MODULES
    assert any(imported == "stepsim.ir.ops" for _, imported, _ in IMPORTS)


def test_no_import_circle_crosses_two_packages():
    graph = nx.DiGraph()
    for importer, imported, where in IMPORTS:
        if where != "typing" and imported != "simpy" and room(importer) != room(imported):
            graph.add_edge(room(importer), room(imported))
    assert list(nx.simple_cycles(graph)) == []


def test_no_import_circle_inside_a_package():
    graph = nx.DiGraph(
        (importer, imported)
        for importer, imported, where in IMPORTS
        if where == "top" and imported != "simpy"
    )
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == []


@pytest.mark.parametrize(
    ("rooms", "allowed"),
    [
        (("stepsim.ir",), ()),  # the leaf imports nothing of ours at run time
        (("stepsim.engine",), ("stepsim.ir", "stepsim.engine", "simpy")),
        (
            ("stepsim.cost",),
            ("stepsim.ir", "stepsim.scenario", "stepsim.schedules", "stepsim.cost"),
        ),
        (("stepsim.comm",), ("stepsim.ir", "stepsim.scenario", "stepsim.cost", "stepsim.comm")),
        (("stepsim.topologies",), ("stepsim.topologies",)),
        (("stepsim.schedules",), ("stepsim.schedules",)),
    ],
)
def test_rooms_import_only_what_is_below_them(rooms, allowed):
    wrong = sorted(
        (importer, imported)
        for importer, imported, where in IMPORTS
        if where != "typing"
        and room(importer).startswith(rooms)
        and not any(room(imported) == a or room(imported).startswith(a + ".") for a in allowed)
        and room(imported) != room(importer)
    )
    assert wrong == []


def test_simpy_only_in_the_engine():
    users = {room(importer) for importer, imported, _ in IMPORTS if imported == "simpy"}
    assert users == {"stepsim.engine"}


def test_function_local_imports_serve_start_up_time_only():
    local = sorted(
        (importer, imported)
        for importer, imported, where in IMPORTS
        if where == "local"
        and not importer.startswith(STARTUP_PREFIXES)
        and (importer, imported) not in STARTUP
    )
    assert local == []

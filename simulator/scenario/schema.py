"""The scenario file's keys, read from the specs' field metadata (`fields.key`).

One `Key` per scenario key (fields.py reads them, `keys_of`): its section and name, its
type in the file, unit, range, choices, default and help line. The loader checks what a
file holds against these (`fields.check_value`), fills defaults and names required keys
from them; the resolved-TOML writer (`scenario_to_dict`) lists them; and ``python -m
stepsim.scenario`` prints the key tables of scenarios/README.md (a test keeps the two
equal).
"""

from __future__ import annotations

import math
from dataclasses import MISSING
from functools import cache
from typing import Any

from . import frameworks
from .fields import MAX_NUMBER, Key, keys_of
from .fields import check_value as check_value  # importable from here too (tests/test_schema.py)
from .perturbation import SECTION as PERTURBATION
from .perturbation import PerturbationSpec
from .spec import ClusterSpec, ModelSpec, NetworkConfig, ParallelConfig, Scenario, TrainingConfig

# Each section's spec; the top level is the Scenario itself (its `name`).
SECTIONS: dict[str, type] = {
    "model": ModelSpec,
    "cluster": ClusterSpec,
    "parallel": ParallelConfig,
    "training": TrainingConfig,
    "network": NetworkConfig,
}
TOP_LEVEL = ""
# Arrays of tables ([[perturbation]]): each table one spec, the scenario a tuple of them.
ARRAYS: dict[str, type] = {PERTURBATION: PerturbationSpec}
# The key in a section that names a preset filling the others, and how a missing
# key's error points to it.
PRESET_KEYS = {"model": "preset", "cluster": "node"}
PRESET_HINTS = {"model": " (or set model.preset)", "cluster": " (or set cluster.node to a preset)"}
TYPE_NAMES = {int: "int", float: "float", bool: "bool", str: "str"}


@cache
def keys() -> dict[str, dict[str, Key]]:
    """Every key by section (the top level as ``""``), in the specs' field order."""
    return {
        TOP_LEVEL: keys_of(Scenario, TOP_LEVEL),
        **{section: keys_of(cls, section) for section, cls in SECTIONS.items()},
        **{section: keys_of(cls, section) for section, cls in ARRAYS.items()},
    }


# -- the README's key tables -------------------------------------------------------------


def _code(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return str(value)


def _default_text(key: Key) -> str:
    if key.derived is not None:
        text = key.derived
    elif key.default is MISSING:
        text = "required"
    elif key.default is None:
        text = "none"
    else:
        text = _code(key.default)
    if key.preset:
        return f"from `{PRESET_KEYS[key.section]}`, else {text}"
    return text


def _number(value: float) -> str:
    if value >= 1e6 and math.log10(value).is_integer():
        return f"10^{int(math.log10(value))}"
    return f"{value:,g}" if value != int(value) else f"{int(value):,}"


def _values_text(key: Key) -> str:
    if key.choices is not None:
        return ", ".join(f"`{c}`" for c in key.choices)
    if key.low is None or key.high is None:  # both are, or neither (fields.keys_of)
        return ""
    if key.low == 0 and key.high == MAX_NUMBER:
        return ">= 0" if key.may_be_zero else "> 0"
    return f"{_number(key.low)} to {_number(key.high)}"


def markdown_table(section: str, table: dict[str, Key] | None = None) -> str:
    """One section's keys as the README shows them (``table``: keys of a spec outside
    the scenario, such as a jobs file's [[job]])."""
    lines = [
        "| Key | Type | Unit | Default | Values | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for key in (keys()[section] if table is None else table).values():
        cells = (
            f"`{key.name}`",
            TYPE_NAMES[key.type],
            key.unit or "",
            _default_text(key),
            _values_text(key),
            key.help,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_tables() -> str:
    """Every section's table under its heading, as in scenarios/README.md."""
    parts = []
    for section in keys():
        title = f"[{section}]" if section else "Top level"
        if section in ARRAYS:
            title = f"[[{section}]] (any number of tables)"
        parts.append(f"#### {title} keys\n\n{markdown_table(section)}\n")
    parts.append(f"#### Framework defaults\n\n{frameworks.markdown_table()}\n")
    return "\n".join(parts)

"""The scenario file's keys, read from the specs' field metadata (`spec.key`).

One `Key` per scenario key: its section and name, its type in the file, unit, range,
choices, default and help line. The loader checks what a file holds against these
(`check_value`), fills defaults and names required keys from them; the resolved-TOML
writer (`scenario_to_dict`) lists them; and ``python -m stepsim.scenario``
prints the key tables of scenarios/README.md (a test keeps the two equal).
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

from . import frameworks
from .errors import ScenarioError
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
MAX_NUMBER = 10**9  # the range of a number whose key gives none
TYPE_NAMES = {int: "int", float: "float", bool: "bool", str: "str"}
_TYPE_RULES = {
    int: "must be an integer",
    float: "must be a number",
    bool: "must be true or false",
    str: "must be a string",
}


@dataclass(frozen=True, slots=True)
class Key:
    section: str  # "" for the top level
    name: str
    type: type  # int, float, bool or str: what the file holds
    help: str
    unit: str | None
    low: float | None  # None: not a number
    high: float | None
    may_be_zero: bool
    choices: tuple[str, ...] | None
    default: Any  # dataclasses.MISSING: required (unless preset or derived)
    preset: bool  # the section's preset may fill it
    derived: str | None  # how the loader fills it when the file does not
    by_name: bool  # the file names a preset that the spec holds as an object (cluster.gpu)

    @property
    def full_name(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name

    @property
    def required(self) -> bool:
        """The file (or the section's preset) must give it."""
        return self.default is MISSING and self.derived is None


def _file_type(hint: Any, metadata: typing.Mapping[str, Any]) -> type:
    """int, float, bool or str from a field's annotation: ``X | None`` is X, a
    ``Literal`` of strings is str; ``toml_type`` overrides (cluster.gpu)."""
    if metadata["toml_type"] is not None:
        return metadata["toml_type"]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return type(args[0])
    if args:
        return _file_type(args[0], metadata)
    return hint


def _keys_of(cls: type, section: str) -> dict[str, Key]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        m = f.metadata
        kind = _file_type(hints[f.name], m)
        number = kind in (int, float)
        choices = m["choices"]() if callable(m["choices"]) else m["choices"]
        out[f.name] = Key(
            section=section,
            name=f.name,
            type=kind,
            help=m["help"],
            unit=m["unit"],
            low=(m["low"] if m["low"] is not None else 0) if number else None,
            high=(m["high"] if m["high"] is not None else MAX_NUMBER) if number else None,
            may_be_zero=m["may_be_zero"],
            choices=choices,
            default=f.default,
            preset=m["preset"],
            derived=m["derived"],
            by_name=m["toml_type"] is not None,
        )
    return out


@cache
def keys() -> dict[str, dict[str, Key]]:
    """Every key by section (the top level as ``""``), in the specs' field order."""
    return {
        TOP_LEVEL: _keys_of(Scenario, TOP_LEVEL),
        **{section: _keys_of(cls, section) for section, cls in SECTIONS.items()},
        **{section: _keys_of(cls, section) for section, cls in ARRAYS.items()},
    }


def check_value(key: Key, value: Any) -> Any:
    """The value as the spec holds it (an int given for a float key becomes a float),
    or a one-line ScenarioError naming the key, the value and the rule."""
    full = key.full_name
    if key.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    wrong = isinstance(value, bool) != (key.type is bool) or not isinstance(value, key.type)
    if wrong:
        raise ScenarioError(key=full, value=value, rule=_TYPE_RULES[key.type])
    if key.low is not None:
        if value < 0 or (value == 0 and not key.may_be_zero):
            rule = "must be >= 0" if key.may_be_zero else "must be positive"
            raise ScenarioError(key=full, value=value, rule=rule)
        if math.isnan(value) or value == math.inf:
            raise ScenarioError(key=full, value=value, rule="must be a finite number")
        if not key.low <= value <= key.high:
            rule = f"must be between {key.low:g} and {key.high:g}"
            raise ScenarioError(key=full, value=value, rule=rule)
    if key.choices is not None and value not in key.choices:
        raise ScenarioError(key=full, value=value, rule=f"must be one of: {', '.join(key.choices)}")
    return value


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
    if key.low is None or key.high is None:  # both are, or neither (_keys_of)
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


def keys_of(cls: type, section: str) -> dict[str, Key]:
    """The keys a spec class declares, by name, for its section (other modules' tables,
    e.g. a jobs file's ``[[job]]``, use the same machinery)."""
    return _keys_of(cls, section)

"""How a scenario key is declared and read back: `key(...)` puts its help line, unit,
range and choices on a dataclass field as metadata; `keys_of` reads a spec's fields back
as `Key`s, `check_value` checks a value against one (a mistyped choice gets its close
matches, suggest.py) and `check_values` a whole spec (each spec runs it when built).
`mechanism_key` declares a framework mechanism (None: the framework's default,
frameworks.py). schema.py gathers the scenario's sections."""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, TypedDict

from .errors import ScenarioError
from .suggest import did_you_mean


class KeyRange(TypedDict, total=False):
    """Some of `key`'s keyword arguments, shared by several keys as ``**range``."""

    low: float
    high: float
    may_be_zero: bool
    preset: bool


class KeyUnitRange(KeyRange, total=False):
    """A `KeyRange` with the keys' unit too."""

    unit: str


def key(
    help: str,
    *,
    default: Any = MISSING,
    unit: str | None = None,
    low: float | None = None,
    high: float | None = None,
    may_be_zero: bool = False,
    choices: tuple[str, ...] | None = None,
    preset: bool = False,
    derived: str | None = None,
    toml_type: type | None = None,
    compare: bool = True,
) -> Any:
    """A scenario key: a dataclass field whose metadata `keys_of` reads.

    ``help`` is one line for the README table. ``unit`` is shown beside it (the name
    carries it too). Numbers must be positive, or >= 0 with ``may_be_zero``, and lie
    in [``low``, ``high``] (default: 0 to 10^9). ``choices`` is the tuple of allowed
    strings. ``preset``: the section's preset (model.preset, cluster.node) may fill
    the key. ``derived``: how the loader fills a key the file leaves out although the
    spec requires it (README wording). ``toml_type``: the key's type in the file when
    it differs from the field's (cluster.gpu is a preset name that the loader turns
    into a GpuSpec). A field without ``key`` metadata is not a scenario key
    (TrainingConfig.custom_orders, Scenario.calibration). ``compare=False``: equality
    ignores the key as given (the framework's mechanism keys compare by their resolved
    values, `TrainingConfig.resolved`).
    """
    metadata = {
        "help": help,
        "unit": unit,
        "low": low,
        "high": high,
        "may_be_zero": may_be_zero,
        "choices": choices,
        "preset": preset,
        "derived": derived,
        "toml_type": toml_type,
    }
    return field(default=default, metadata=metadata, compare=compare)


def mechanism_key(help: str, **metadata: Any) -> Any:
    """A framework mechanism key (frameworks.py): None means the framework's default;
    scenarios compare by the resolved value (`TrainingConfig.resolved`)."""
    return key(help, default=None, compare=False, **{"derived": "the framework's", **metadata})


# -- reading the keys back ----------------------------------------------------------------

MAX_NUMBER = 10**9  # the range of a number whose key gives none
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


@cache
def keys_of(cls: type, section: str) -> dict[str, Key]:
    """The keys a spec class declares, by name, for its section, read once: the
    scenario's sections (schema.keys) and other files' tables (a jobs file's
    ``[[job]]``) alike."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        m = f.metadata
        kind = _file_type(hints[f.name], m)
        number = kind in (int, float)
        out[f.name] = Key(
            section=section,
            name=f.name,
            type=kind,
            help=m["help"],
            unit=m["unit"],
            low=(m["low"] if m["low"] is not None else 0) if number else None,
            high=(m["high"] if m["high"] is not None else MAX_NUMBER) if number else None,
            may_be_zero=m["may_be_zero"],
            choices=m["choices"],
            default=f.default,
            preset=m["preset"],
            derived=m["derived"],
            by_name=m["toml_type"] is not None,
        )
    return out


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
        rule = f"must be one of: {', '.join(key.choices)}"
        raise ScenarioError(
            key=full, value=value, rule=rule, fix=did_you_mean(value, key.choices) or None
        )
    return value


def check_values(spec: object, section: str) -> None:
    """Each key's type, range and choices (`check_value`), as the loader checks a
    file's: a spec built in Python cannot hold what a file could not. (The loader
    checks what the user typed before it looks up presets and derives defaults, so a
    loaded value passes this check twice; it is cheap.)"""
    cls: type = type(spec)  # annotated: mypy reads type[object] as not Hashable (a cache key)
    for key in keys_of(cls, section).values():
        value = getattr(spec, key.name)
        if key.by_name or (value is None and key.default is None):
            continue
        check_value(key, value)

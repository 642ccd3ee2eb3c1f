"""How a scenario key is declared: `key(...)` puts its help line, unit, range and
choices on a dataclass field as metadata, which `schema.py` reads back; `mechanism_key`
declares a framework mechanism (None: the framework's default, frameworks.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any, TypedDict


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
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
    preset: bool = False,
    derived: str | None = None,
    toml_type: type | None = None,
    compare: bool = True,
) -> Any:
    """A scenario key: a dataclass field whose metadata the schema reads.

    ``help`` is one line for the README table. ``unit`` is shown beside it (the name
    carries it too). Numbers must be positive, or >= 0 with ``may_be_zero``, and lie
    in [``low``, ``high``] (default: 0 to 10^9). ``choices`` is the tuple of allowed
    strings, or a function giving it when the tuple lives in a module that imports
    this one (the presets). ``preset``: the section's preset (model.preset,
    cluster.node) may fill the key. ``derived``: how the loader fills a key the file
    leaves out although the spec requires it (README wording). ``toml_type``: the
    key's type in the file when it differs from the field's (cluster.gpu is a preset
    name that the loader turns into a GpuSpec). A field without ``key`` metadata is
    not a scenario key (TrainingConfig.custom_orders, Scenario.calibration).
    ``compare=False``: equality ignores the key as given (the framework's mechanism
    keys compare by their resolved values, `TrainingConfig.resolved`).
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


def presets_of(table: str) -> Callable[[], tuple[str, ...]]:
    """The names of a preset table, looked up when the schema asks (presets imports
    this module, so the names cannot be read at import time)."""

    def names() -> tuple[str, ...]:
        from . import presets

        return tuple(getattr(presets, table))

    return names

"""The files a scenario refers to besides its own TOML: calibration files, custom
schedule files, the validation tables and a search's journal. Each reader turns what
it cannot use into a one-line ScenarioError (this layer and the CLI alone touch files).
"""

from __future__ import annotations

import csv
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from schedules import Step
from schedules.custom import check_orders, parse_orders

from . import presets
from .errors import ScenarioError
from .rules import KERNEL_CONSTANT_RANGES
from .spec import KernelConstants


def _known(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def _read_text(path: Path, named: str, cannot_read: str) -> str:
    """The file's text, or a one-line ScenarioError: ``cannot_read`` and the system's
    reason, or ``named`` is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{cannot_read}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{named} is not UTF-8 text") from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    named = f"{what} {str(path)!r}"
    text = _read_text(path, named, f"cannot read {named}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None


# Calibration files (benchmarks/measure_kernels.py writes them): a [constants] table
# with KernelConstants' fields; [[gemm]] and [[memory]] rows keep the measurements.
_CALIBRATION_KEYS: dict[str, type] = {
    "gpu": str,
    "num_sms": int,
    "tile_m": int,
    "tile_n": int,
    "gemm_efficiency": float,
    "gemm_k_half": float,
    "memory_efficiency": float,
    "source": str,
}


def read_calibration(path: str | Path) -> KernelConstants:
    """A calibration file's kernel constants, checked key by key."""
    path = Path(path)
    raw = read_toml(path, "calibration file")
    table = raw.get("constants")
    if not isinstance(table, Mapping):
        raise ScenarioError(f"calibration file {str(path)!r} needs a [constants] table")
    values: dict[str, Any] = {}
    for key, wanted in _CALIBRATION_KEYS.items():
        if key not in table:
            raise ScenarioError(f"calibration file {str(path)!r}: constants.{key} is missing")
        value = table[key]
        ok = isinstance(value, wanted) or (wanted is float and type(value) is int)
        if not ok or isinstance(value, bool):
            raise ScenarioError(
                f"constants.{key}={value!r} must be {wanted.__name__} (in {str(path)!r})"
            )
        low, high = KERNEL_CONSTANT_RANGES.get(key, (None, None))
        if low is not None and not low <= value <= high:
            raise ScenarioError(
                f"constants.{key}={value!r} must be between {low:g} and {high:g} (in {str(path)!r})"
            )
        values[key] = float(value) if wanted is float else value
    unknown = sorted(set(table) - set(_CALIBRATION_KEYS))
    if unknown:
        raise ScenarioError(
            f"unknown key constants.{unknown[0]} in {str(path)!r}; "
            f"known: {_known(_CALIBRATION_KEYS)}"
        )
    if values["gpu"] not in presets.GPUS:
        raise ScenarioError(
            f"constants.gpu={values['gpu']!r} must be one of {_known(presets.GPUS)} "
            f"(in {str(path)!r})"
        )
    return KernelConstants(**values)


def read_schedule_file(path: Path, name: str, placement: str) -> list[list[Step]]:
    """Per-rank op orders from a file, checked (schedules.custom); ``name`` is how the
    one-line ScenarioError refers to the file (the key or the CLI flag)."""
    text = _read_text(path, name, f"{name}: cannot read")
    try:
        orders = parse_orders(text)
        check_orders(orders, placement)
    except ValueError as exc:
        raise ScenarioError(f"{name}: {exc}") from None
    return orders


# --- the validation set -----------------------------------------------------------------

VALIDATION_FILES = {
    "megatron": "megatron_2021_table1.csv",
    "layers": "korthikanti_2022_table4_layer.csv",
    "dgx2": "megatron_2020_dgx2_v100.csv",
    "h100": "megatron_core_2024_h100.csv",
}


def read_validation_set(folder: str | Path) -> dict[str, list[dict[str, str]]]:
    """The calibration tables (scenarios/validation/) as rows of strings, by table."""
    folder = Path(folder)
    out = {}
    for table, name in VALIDATION_FILES.items():
        path = folder / name
        try:
            with path.open(newline="", encoding="utf-8") as f:
                out[table] = list(csv.DictReader(f))
        except OSError as exc:
            raise ScenarioError(
                f"validation table {str(path)!r} cannot be read: {exc.strerror}"
            ) from None
    return out


def read_search_journal(path: str | Path) -> tuple[dict[str, Any] | None, dict[str, dict]]:
    """(header, {layout key: row}) of a search's results file (stepsim search --out);
    (None, {}) when there is none. A line cut short by an interrupted write is skipped."""
    path = Path(path)
    if not path.exists():
        return None, {}
    header, rows = None, {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if n == 0:
                header = entry.get("search") if isinstance(entry, dict) else None
                if header is None:
                    raise ScenarioError(f"{str(path)!r} is not a stepsim search journal")
            elif isinstance(entry, dict) and "layout" in entry and "row" in entry:
                rows[entry["layout"]] = entry["row"]
    return header, rows

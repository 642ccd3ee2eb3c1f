"""A search's journal (`stepsim search --out DIR` keeps DIR/search.jsonl): read back and
checked line by line before an interrupted search resumes from it.

The journal is JSON lines: the first names the search it belongs to
(``{"search": HEADER}``, plan.search.journal_header), each other one simulated layout
(``{"layout": KEY, "row": METRICS}``, MetricsRow.row()). Nothing in it is reused
unchecked: a missing, empty, cut or unreadable header, a line that is neither a header
nor a row, a malformed layout key, a row without a metric it must have or with a time
that is not a finite positive number is refused with one line naming the file, the line
and what to do. Two lines are not damage: the last line cut short by an interrupted
write (no newline after it; dropped, its layout is simulated again), and such a cut line
with the next run's first row appended to it (the row kept). The file is read by
files.read_text (the file layer); this module only parses.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from stepsim.schedules import SCHEDULES

from ..ir.results import IDLE_CAUSE_COLUMN, IDLE_CAUSES, MetricsRow
from ..ir.vocabulary import (
    ALL_BREAKDOWN_KEYS,
    BREAKDOWN_COLUMN,
    BREAKDOWN_KEYS,
    DATA_PARALLEL_SHARDING,
    RECOMPUTE_GRANULARITIES,
)
from .errors import ScenarioError
from .files import read_text

ROW_START = '{"layout": '  # how json.dumps begins a row line (its default separators)


def _choice(names: tuple[str, ...] | list[str]) -> str:
    return "(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + ")"


# plan.space.Layout.key: tp8-pp16[-first5-last5]-dp8-mb1-1f1b-v1-full-none-sp
LAYOUT_KEY = re.compile(
    r"tp[1-9]\d{0,6}-pp[1-9]\d{0,6}(?:-first[1-9]\d{0,6}-last[1-9]\d{0,6})?-dp[1-9]\d{0,6}"
    rf"-mb[1-9]\d{{0,6}}-{_choice(list(SCHEDULES))}-v[1-9]\d{{0,3}}"
    rf"-{_choice(RECOMPUTE_GRANULARITIES)}-{_choice(DATA_PARALLEL_SHARDING)}-(?:sp|nosp)"
)

_INTS = {"num_gpus", "num_microbatches"}
_SPREAD = ("breakdown_s", "idle_by_cause_s")  # fields a row holds as columns of their own
_FLAGS = {"fits_in_memory"}
_POSITIVE = {"iteration_time_s"}
_REQUIRED = [f.name for f in fields(MetricsRow) if f.name not in _SPREAD] + [
    BREAKDOWN_COLUMN.format(k) for k in BREAKDOWN_KEYS
]
_OPTIONAL = [BREAKDOWN_COLUMN.format(k) for k in ALL_BREAKDOWN_KEYS if k not in BREAKDOWN_KEYS]
# the idle split: null without a pipeline, absent from journals written before it
_NULLABLE = {IDLE_CAUSE_COLUMN.format(k) for k in IDLE_CAUSES}
_OPTIONAL += sorted(_NULLABLE)


_DAMAGED = object()  # what _load returns for a line that is not JSON


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def row_problem(row: Any) -> str | None:
    """What makes ``row`` unusable as a journal row's metrics (None: nothing): a metric
    missing, of the wrong type, not finite, negative, or a time that is not > 0."""
    if not isinstance(row, dict):
        return "its row is not a JSON object"
    for name in _REQUIRED + [n for n in _OPTIONAL if n in row]:
        if name not in row:
            return f"its row has no {name}"
        value = row[name]
        if value is None and name in _NULLABLE:
            continue
        if name in _FLAGS:
            if not isinstance(value, bool):
                return f"{name}={_shown(value)} must be true or false"
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name}={_shown(value)} must be a number"
        if name in _INTS and (not isinstance(value, int) or value < 1):
            return f"{name}={_shown(value)} must be a whole number >= 1"
        if not math.isfinite(value):
            return f"{name}={_shown(value)} must be finite"
        if name in _POSITIVE and value <= 0:
            return f"{name}={_shown(value)} must be > 0"
        if value < 0 and not name.startswith(BREAKDOWN_COLUMN.format("")):
            return f"{name}={_shown(value)} must be >= 0"
    return None


def parse_search_journal(text: str, what: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(header, {layout key: row}) of a journal's text, every line checked (the module
    notes); an empty text is refused as a missing header. ``what`` names the file in
    the messages."""
    fix = "delete the file (or use another --out) and run the search again"
    lines = text.split("\n")
    cut = lines.pop()  # after the last newline: "" when the file ends with one
    if not lines and not cut.strip():
        raise ScenarioError(f"{what} is empty (no header line naming its search); {fix}")
    header: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for n, line in enumerate([*lines, cut], start=1):
        last = n == len(lines) + 1
        if n > 1 and not line.strip():
            continue
        entry = _load(line)
        if n == 1:
            search = entry.get("search") if isinstance(entry, dict) else None
            if not isinstance(search, dict) or not search:
                why = "is cut short or not JSON" if entry is _DAMAGED else "names no search"
                raise ScenarioError(
                    f"{what} line 1 {why}: it is not a stepsim search journal's header, so "
                    f"whose results the file holds cannot be told; {fix}"
                )
            header = search
            continue
        if entry is _DAMAGED and last:
            continue  # the last row, cut short by an interrupted write: simulated again
        if entry is _DAMAGED and line.startswith(ROW_START):
            # a row cut short, then the next run's first row appended to it
            entry = _load(line[line.rfind(ROW_START) :])
        if entry is _DAMAGED:
            raise ScenarioError(f"{what} line {n} is damaged (not JSON); {fix}")
        if not isinstance(entry, dict) or set(entry) != {"layout", "row"}:
            raise ScenarioError(
                f'{what} line {n} is not a row ({{"layout": ..., "row": {{...}}}}); {fix}'
            )
        key = entry["layout"]
        if not isinstance(key, str) or not LAYOUT_KEY.fullmatch(key):
            raise ScenarioError(
                f"{what} line {n}: layout {_shown(key)} is not a layout name "
                f"(tp8-pp16-dp8-mb1-1f1b-v1-full-none-sp); {fix}"
            )
        problem = row_problem(entry["row"])
        if problem is not None:
            raise ScenarioError(f"{what} line {n} ({key}): {problem}; {fix}")
        rows[key] = entry["row"]
    return header, rows


def _load(line: str) -> Any:
    """The line's JSON value; _DAMAGED when it is not JSON (or nests past the parser).
    Python's json reads NaN and Infinity, which JSON has not: they are kept, as numbers
    that row_problem refuses."""
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return _DAMAGED


def read_search_journal(
    path: str | Path,
) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """(header, {layout key: row}) of a search's journal (stepsim search --out), checked
    (parse_search_journal); (None, {}) when there is no such file."""
    path = Path(path)
    if not path.exists():
        return None, {}
    what = f"search journal {str(path)!r}"
    return parse_search_journal(read_text(path, what, "journal_bytes"), what)

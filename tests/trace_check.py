"""Read a Chrome/Perfetto trace the way Perfetto's JSON importer does and list what it
would not show.

Perfetto (src/trace_processor/importers/json/) turns each "X" event's ``ts`` and
``dur`` (microseconds) into nanoseconds separately, ``llround(value * 1000)``, sorts
the events by that start, and builds a stack of slices per (pid, tid) track: a slice
that starts inside an open one must also end inside it. One that begins inside
another and ends after it (a partial overlap) is not nested, and Perfetto drops it.
Zero-duration slices are allowed. ``problems()`` returns one line per slice so lost.
Usable as a script too: ``python tests/trace_check.py trace.json``.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path


def ns(microseconds) -> int:
    """A ts or dur as Perfetto reads it: round(value * 1000) nanoseconds."""
    return round(microseconds * 1000)


def load(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def tracks(trace: dict) -> dict[tuple, list[tuple[int, int, str]]]:
    """(pid, tid) -> its complete slices (start_ns, end_ns, name) in Perfetto's order:
    by start, ties in file order (its sorter is stable)."""
    found: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X":
            start = ns(event["ts"])
            found[(event["pid"], event["tid"])].append(
                (start, start + ns(event["dur"]), event["name"])
            )
    for slices in found.values():
        slices.sort(key=lambda s: s[0])
    return dict(found)


def problems(trace: dict) -> list[str]:
    """Each slice Perfetto would drop: it starts inside an open slice of its track and
    ends after that slice ends."""
    found = []
    for (pid, tid), slices in sorted(tracks(trace).items()):
        stack: list[tuple[int, int, str]] = []
        for start, end, name in slices:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                top = stack[-1]
                found.append(
                    f"pid {pid} tid {tid}: {name!r} [{start}, {end}] ns crosses "
                    f"{top[2]!r} [{top[0]}, {top[1]}] ns"
                )
                continue  # dropped: never becomes a parent
            stack.append((start, end, name))
    return found


def check_flows(trace: dict) -> list[str]:
    """Flow (v2) ids: each bind_id leaves exactly one slice and enters exactly one."""
    out: dict = defaultdict(int)
    into: dict = defaultdict(int)
    for event in trace["traceEvents"]:
        if "bind_id" in event:
            if event.get("flow_out"):
                out[event["bind_id"]] += 1
            if event.get("flow_in"):
                into[event["bind_id"]] += 1
    return [
        f"flow {key}: {out[key]} out, {into[key]} in"
        for key in sorted(set(out) | set(into))
        if out[key] != 1 or into[key] != 1
    ]


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        document = load(Path(arg))
        lost = problems(document)
        total = sum(len(s) for s in tracks(document).values())
        print(f"{arg}: {total} slices, {len(lost)} lost under Perfetto's nesting rule")
        for line in lost[:10]:
            print("  " + line)

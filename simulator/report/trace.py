"""Chrome/Perfetto traces: a simulated iteration (a process per simulated GPU, a
thread per stream and concurrent slot, counters for the busiest links, pipeline sends
linked to the ops that receive them) and the bubble study's schedules: as dicts
(`chrome_trace`), or, for a run's, as the same document's compact JSON text made from
the spans' columns with no dict per event and handed on in pieces as it is made
(`chrome_trace_chunks`: the CLI streams them to trace.json).

Written so that Perfetto shows every slice (docs/design.md, "Traces"):

- Times are whole nanoseconds. Each boundary (a span's start or end, in seconds) is
  rounded to an integer number of nanoseconds once, and ``ts`` and ``dur`` are written
  as ``start_ns / 1000`` and ``(end_ns - start_ns) / 1000`` microseconds. Perfetto's
  JSON importer reads each of them back as ``llround(value * 1000)`` ns
  (importers/json), so back-to-back slices share their boundary exactly; float
  microseconds rounded separately used to cross by 1 ns, and Perfetto drops a slice
  that starts inside another and ends after it.
- A thread track is a stack: slices nest or are disjoint. A stream that runs several
  transfers at once (gradient collectives of different buckets on the data-parallel
  stream, overlapping pipeline sends) is split into one track per concurrent slot:
  each span takes the lowest-numbered slot free at its start.
- A run whose idle is split by cause (report/idle.py) has its idle pieces as slices on
  a track of their own per GPU, "idle by cause" under its compute track, named by
  cause: they never overlap the compute stream's slices.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import itemgetter, methodcaller
from typing import NamedTuple

import numpy as np

from ..comm.congruent import copies_of
from ..ir.ops import Workload
from ..ir.results import LinkLoad, Result, SharedLink, Span, Trace
from ..ir.vocabulary import (
    BACKWARD,
    COMPUTE_STREAM,
    CP_STREAM,
    DP_STREAM,
    EP_STREAM,
    FORWARD,
    OFFLOAD_STREAM,
    PASS_KINDS,
    PP_SEND,
    PP_STREAM,
    RECOMPUTE,
    STREAM_ORDER,
    TP_STREAM,
    WEIGHT,
)
from .idle import IDLE_CAUSE_STYLES, IdleMap
from .metrics import compute_lanes, spans_per_gpu

IDLE_TRACK = "idle"  # the track of a GPU's idle pieces by cause, under its compute track
# the name of a stream's track in the trace (its first slot; the next are "#2", "#3"...)
TRACK_TITLES: dict[str, str] = {
    COMPUTE_STREAM: "compute",
    PP_STREAM: "pp send",
    DP_STREAM: "dp comm",
    TP_STREAM: "tp comm",
    CP_STREAM: "cp comm",
    EP_STREAM: "ep dispatch/combine",
    OFFLOAD_STREAM: "host offload",
    IDLE_TRACK: "idle by cause",
}


def to_ns(seconds: float) -> int:
    """A boundary in whole nanoseconds: rounded once, shared by the spans that meet there."""
    return round(seconds * 1e9)


def us(nanoseconds: int) -> float:
    """Whole nanoseconds as trace microseconds. ``n / 1000`` is the double nearest to
    the decimal with three places, and JSON writes the shortest repr that reads back as
    that double (Python's float repr), so the text is exactly ``n / 1000`` while doubles
    near it are closer than 1e-4 apart (n up to 1e15 ns, 11 days simulated) and
    ``round(value * 1000)`` gives n back."""
    return nanoseconds / 1000


def slots(spans: list[Span], starts: list[int], ends: list[int]) -> list[int]:
    """Each span's slot on its (GPU, stream): the lowest one whose last span has ended
    by the span's start (in whole ns), taken in order of start; a new slot when all are
    busy. Deterministic, and no two spans of a slot overlap."""
    codes: dict[tuple[int, str], int] = {}
    track = [codes.setdefault((sp.gpu, sp.stream), len(codes)) for sp in spans]
    return _slot_numbers(
        np.array(track, dtype=np.int64),
        np.array(starts, dtype=np.int64),
        np.array(ends, dtype=np.int64),
    ).tolist()


def _slot_numbers(track: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`slots` on arrays: each span's track (a code per GPU and stream), start and end
    in ns. A track whose spans, in order of start, each begin once the one before has
    ended keeps them all in slot 0 (nearly every track: found without a loop); only the
    tracks where some overlap are taken span by span."""
    n = len(track)
    slot = np.zeros(n, dtype=np.int64)
    if n < 2:
        return slot
    order = np.lexsort((np.arange(n), ends, starts, track))  # by track, start, end, index
    t, s, e = track[order], starts[order], ends[order]
    clash = (t[1:] == t[:-1]) & (s[1:] < e[:-1])
    for bad in np.unique(t[1:][clash]).tolist():
        members = order[t == bad]  # this track's spans in order of (start, end, index)
        busy: list[int] = []  # each slot's last end
        for i, start, end in zip(
            members.tolist(), starts[members].tolist(), ends[members].tolist(), strict=True
        ):
            k = 0  # most streams never run two things at once: slot 0 is free
            while k < len(busy) and busy[k] > start:
                k += 1
            if k == len(busy):
                busy.append(end)
            else:
                busy[k] = end
            slot[i] = k
    return slot


class TraceView(NamedTuple):
    """What a trace is drawn from: one run's (`of`), or several jobs' run together
    (report/jobreport.py), whose metrics are per job."""

    scenario_name: str
    workload: Workload
    trace: Trace
    capacities: Sequence[float]
    busiest_links: Sequence[LinkLoad | SharedLink]  # the links drawn as counter tracks
    fast_forward: str | None  # what a fast-forwarded run's trace shows, None: all of it
    idle: IdleMap | None = None  # each GPU's idle pieces by cause; None: not split

    @classmethod
    def of(cls, result: Result, idle: IdleMap | None = None) -> TraceView:
        m, ff = result.metrics, result.metrics.fast_forward
        note = None
        if ff is not None:  # the short run's spans (run/fastforward.py)
            note = (
                f"a run of {ff.simulated_microbatches} of the {m.num_microbatches} "
                f"micro-batches is shown; the iteration ({m.iteration_time_s:.6g} s) "
                f"adds {ff.periods_skipped} copies of its period from {ff.proved_at_s:.6g} s"
            )
        return cls(
            result.scenario.name,
            result.workload,
            result.trace,
            result.cluster.capacities,
            m.busiest_links,
            note,
            idle,
        )


def chrome_trace(result: Result, idle: IdleMap | None = None) -> dict:
    """Chrome trace event format: a process per simulated GPU, a thread per stream and
    concurrent slot, and ``idle``'s pieces (run/idlemap.py) on a track of their own.
    Opens in Perfetto (ui.perfetto.dev) and chrome://tracing."""
    return view_trace(TraceView.of(result, idle))


def us_text(nanoseconds: int) -> str:
    """``repr(us(nanoseconds))`` from the integer (what JSON writes for it; see `us`):
    the microseconds with up to three decimals, trailing zeros dropped, at least one,
    for 0 <= n < 10^15 (11 days, `us`'s range); ``repr`` beyond."""
    if not 0 <= nanoseconds < 10**15:
        return repr(us(nanoseconds))
    whole, part = divmod(nanoseconds, 1000)
    return f"{whole}{_DECIMALS[part]}"


# the text after a whole number of microseconds for each remainder in ns (`us_text`)
_DECIMALS: list[str] = [".0"] + [f".{part:03d}".rstrip("0") for part in range(1, 1000)]


def _us_texts(nanoseconds: np.ndarray) -> tuple[list, list]:
    """`us_text` of each value as two lists whose items, written one after the other,
    are its text: the whole microseconds and the decimals (for values in `us_text`'s
    range; beyond it, each whole text and an empty string)."""
    if len(nanoseconds) == 0 or (nanoseconds.min() >= 0 and nanoseconds.max() < 10**15):
        whole, part = np.divmod(nanoseconds, 1000)
        return whole.tolist(), _DECIMAL_ARRAY[part].tolist()
    return [us_text(n) for n in nanoseconds.tolist()], [""] * len(nanoseconds)


_DECIMAL_ARRAY = np.array(_DECIMALS, dtype=object)


def chrome_trace_bytes(result: Result, idle: IdleMap | None = None) -> bytes:
    """`chrome_trace` as the compact JSON the CLI writes (``json.dumps`` with separators
    ``(",", ":")``), byte for byte, but written as text from the spans' columns: no
    dict per span, which at MT-NLG's 311,348 spans cost more than the run."""
    return view_trace_text(TraceView.of(result, idle)).encode()


def chrome_trace_chunks(result: Result, idle: IdleMap | None = None) -> Iterator[str]:
    """`chrome_trace_bytes`' text in pieces, as they are made (`view_trace_chunks`)."""
    return view_trace_chunks(TraceView.of(result, idle))


def view_trace_text(result: TraceView) -> str:
    """`view_trace`'s document as compact JSON text, the same bytes as ``json.dumps(
    view_trace(result), separators=(",", ":"))``."""
    return "".join(view_trace_chunks(result))


# span events formatted and handed on at a time: the byte rows of 10,000 (about 2 MB)
# were quicker to write than 50,000's (their rows stay in the cache)
CHUNK_EVENTS = 10_000


def view_trace_chunks(result: TraceView) -> Iterator[str]:
    """`view_trace_text` in pieces, each handed on once made (a writer streams them to
    its file): the metadata and counter events through json, the idle pieces formatted
    from columns, and the spans written ten thousand at a time as rows of bytes
    (`_SpanRows`: each event's name, thread, times, micro-batch and flow picked from
    tables or written as digits by numpy, with no Python step per span)."""
    laid = _layout(result)
    flows = _pipeline_flows(result, laid)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    yield '{"traceEvents":['
    comma = ""  # between events: none before the first

    def joined(events: list[str] | str) -> str:
        """The events (a list, or their text joined by commas), after a comma unless
        they are the first."""
        nonlocal comma
        if not events:
            return ""
        text, comma = comma + (events if isinstance(events, str) else ",".join(events)), ","
        return text

    yield joined([dumps(event) for event in laid.head])
    cols = laid.columns
    # each span's (label, kind) as a number, and '{"ph":"X","name":...,"cat":...,' of each
    found, name_of = _distinct(cols.label * len(cols.kinds) + cols.kind)
    code = [
        (cols.labels[k // len(cols.kinds)], cols.kinds[k % len(cols.kinds)]) for k in found.tolist()
    ]
    names = [
        f'{{"ph":"X","name":{dumps(f"{label} {kind}")},"cat":{dumps(kind)},' for label, kind in code
    ]
    threads = [f'{thread},"ts":' for thread in laid.thread_texts.tolist()]
    way = np.zeros(len(cols.gpu), dtype=np.int64)  # each span's flow: 0 none, 1 out, 2 in
    bind = np.zeros(len(cols.gpu), dtype=np.int64)
    if flows:
        linked = np.fromiter(flows, np.int64, len(flows))
        signed = np.fromiter(flows.values(), np.int64, len(flows))
        bind[linked], way[linked] = np.abs(signed), np.where(signed > 0, 1, 2)
    rows = _SpanRows(_byte_rows(names), _byte_rows(threads))
    for at in range(0, len(cols.gpu), CHUNK_EVENTS):
        part = slice(at, at + CHUNK_EVENTS)
        yield joined(
            rows.text(
                name_of[part],
                laid.thread_of[part],
                laid.starts[part],
                laid.ends[part],
                cols.microbatch[part],
                way[part],
                bind[part],
            )
        )
    causes = {
        cause: f'"name":{dumps(style.legend)},"cat":"idle_by_cause"'
        for cause, style in IDLE_CAUSE_STYLES.items()
    }
    keys = {cause: dumps(cause) for cause in IDLE_CAUSE_STYLES}
    gpus, tids, kinds, starts_idle, ends_idle = _idle_slices(result, laid.tid_of)
    ts_whole, ts_part = _us_texts(starts_idle)
    dur_whole, dur_part = _us_texts(ends_idle - starts_idle)
    yield joined(
        [
            f'{{"ph":"X",{causes[cause]},"pid":{gpu},"tid":{tid},"ts":{a}{b},"dur":{c}{d},'
            f'"args":{{"cause":{keys[cause]}}}}}'
            for gpu, tid, cause, a, b, c, d in zip(
                gpus, tids, kinds, ts_whole, ts_part, dur_whole, dur_part, strict=True
            )
        ]
    )
    yield joined([dumps(event) for event in _link_counters(result)])
    yield '],"displayTimeUnit":"ms","otherData":' + dumps(_other_data(result)) + "}"


def _byte_rows(texts: Sequence[str]) -> np.ndarray:
    """Each text (ASCII, as json writes) as a row of bytes, zero bytes after it up to
    the longest: a table whose rows an array of codes picks."""
    raw = [text.encode("ascii") for text in texts]
    width = max(map(len, raw), default=0)
    table = b"".join(text.ljust(width, b"\0") for text in raw)
    return np.frombuffer(table, np.uint8).reshape(len(raw), width)


def _digit_rows(values: np.ndarray) -> np.ndarray:
    """Each integer's decimal text (as ``str`` writes it: '-' first when negative) as
    a row of bytes, zero bytes before the digits up to the longest."""
    size = np.abs(values)
    width = len(str(int(size.max()))) if len(values) else 1
    if width <= 9:  # below 2**32: the divisions are quicker on 32 bits
        size = size.astype(np.uint32)
    columns = np.empty((width, len(values)), dtype=np.uint8)  # a digit's column a row
    rest = size
    for k in range(width):  # the digit of 10**k, none before the first (0 keeps its digit)
        shifted = rest // 10
        digit = (rest - shifted * 10).astype(np.uint8) + 48
        if k:
            digit[size < 10**k] = 0
        columns[width - 1 - k] = digit
        rest = shifted
    if (values < 0).any():
        return np.column_stack([np.where(values < 0, 45, 0).astype(np.uint8), columns.T])
    return columns.T


def _constant(text: str, n: int) -> np.ndarray:
    """``text`` as ``n`` rows of bytes."""
    return np.broadcast_to(np.frombuffer(text.encode("ascii"), np.uint8), (n, len(text)))


def _joined_rows(blocks: list[np.ndarray]) -> str:
    """Rows of bytes laid side by side, block after block (a column of texts each),
    written row after row with the zero bytes (padding) left out: the rows' texts one
    after the other. JSON text holds no zero byte (json escapes it)."""
    matrix = np.concatenate(blocks, axis=1)
    return matrix[matrix != 0].tobytes().decode("ascii")


_DECIMAL_ROWS = _byte_rows(_DECIMALS)
_FLOW_HEADS = _byte_rows(["}", ',"bind_id":', ',"bind_id":'])  # by way: none, out, in
_FLOW_TAILS = _byte_rows(["", ',"flow_out":true}', ',"flow_in":true}'])
US_RANGE_NS = 10**15  # times written from whole and decimal columns below this (`us_text`)


class _SpanRows(NamedTuple):
    """Span events as text, many at a time: each event's pieces as columns of bytes
    (`_joined_rows`), picked from tables (names, threads, decimals) or written as
    digits, with no Python step per event. ``names``: '{"ph":"X","name":..,"cat":..,'
    of each (label, kind); ``threads``: '"pid":..,"tid":..,"ts":' of each track."""

    names: np.ndarray
    threads: np.ndarray

    def text(
        self,
        name: np.ndarray,
        thread: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        microbatch: np.ndarray,
        way: np.ndarray,
        bind: np.ndarray,
    ) -> str:
        """The events, comma separated, each as `_span_event` writes it."""
        n, durations = len(name), ends - starts
        if not n:
            return ""
        if min(starts.min(), durations.min()) < 0 or max(starts.max(), durations.max()) >= (
            US_RANGE_NS
        ):  # a float repr beyond `us_text`'s range: event by event
            return ",".join(
                _span_event(*row)
                for row in zip(
                    _table_texts(self.names, name),
                    _table_texts(self.threads, thread),
                    starts.tolist(),
                    ends.tolist(),
                    microbatch.tolist(),
                    way.tolist(),
                    bind.tolist(),
                    strict=True,
                )
            )
        bind_digits = _digit_rows(bind)
        bind_digits[way == 0] = 0
        text = _joined_rows(
            [
                self.names[name],
                self.threads[thread],
                _digit_rows(starts // 1000),
                _DECIMAL_ROWS[starts % 1000],
                _constant(',"dur":', n),
                _digit_rows(durations // 1000),
                _DECIMAL_ROWS[durations % 1000],
                _constant(',"args":{"microbatch":', n),
                _digit_rows(microbatch),
                _constant("}", n),
                _FLOW_HEADS[way],
                bind_digits,
                _FLOW_TAILS[way],
                _constant(",", n),
            ]
        )
        return text[:-1]


def _table_texts(table: np.ndarray, codes: np.ndarray) -> list[str]:
    """The texts of a `_byte_rows` table that ``codes`` pick."""
    return [row.tobytes().rstrip(b"\0").decode("ascii") for row in table[codes]]


def _span_event(
    name: str, thread: str, start: int, end: int, microbatch: int, way: int, bind: int
) -> str:
    """One span's event, its pieces as `_SpanRows` has them."""
    flow = "}" if way == 0 else f',"bind_id":{bind},"{("flow_out", "flow_in")[way - 1]}":true}}'
    return (
        f'{name}{thread}{us_text(start)},"dur":{us_text(end - start)},'
        f'"args":{{"microbatch":{microbatch}}}{flow}'
    )


def _other_data(result: TraceView) -> dict:
    other: dict = {"scenario": result.scenario_name}
    if result.fast_forward is not None:
        other["fast_forward"] = result.fast_forward
    return other


class _Columns(NamedTuple):
    """The spans (each GPU's: `spans_per_gpu`) field by field as arrays: numbers as
    they are, each text field as a code into its distinct values (in order of first
    appearance)."""

    gpu: np.ndarray  # int64
    stream: np.ndarray  # int64, an index into streams
    kind: np.ndarray  # into kinds
    label: np.ndarray  # into labels
    microbatch: np.ndarray  # int64
    start_s: np.ndarray  # float64
    end_s: np.ndarray
    op: np.ndarray  # int64
    streams: list[str]
    kinds: list[str]
    labels: list[str]

    @classmethod
    def of(cls, spans: Sequence[Span]) -> _Columns:
        n = len(spans)

        def numbers(k: int, dtype: type) -> np.ndarray:
            return np.fromiter(map(itemgetter(k), spans), dtype, n)

        def coded(k: int) -> tuple[np.ndarray, list[str]]:
            # each value's first index, in one pass; then numbered in order of them
            seen: dict[object, int] = {}
            first = map(seen.setdefault, map(itemgetter(k), spans), range(n))
            found, code = _distinct(np.fromiter(first, np.int64, n))
            return code, [spans[i][k] for i in found.tolist()]

        (stream, streams), (kind, kinds), (label, labels) = coded(1), coded(2), coded(3)
        return cls(
            numbers(0, np.int64),
            stream,
            kind,
            label,
            numbers(4, np.int64),
            numbers(5, np.float64),
            numbers(6, np.float64),
            numbers(7, np.int64),
            streams,
            kinds,
            labels,
        )

    def texts(self, codes: np.ndarray, values: list[str]) -> list[str]:
        """The values that ``codes`` (of a text field) stand for."""
        return np.array(values, dtype=object)[codes].tolist()


class _Laid(NamedTuple):
    """What `_layout` finds: the spans' columns, their whole-nanosecond starts and ends,
    each one's thread (an index into ``thread_texts``, the '"pid":..,"tid":..' text of
    each track, and into ``thread_ids``), the thread ids and the metadata events."""

    columns: _Columns
    starts: np.ndarray  # int64 ns
    ends: np.ndarray
    thread_of: np.ndarray  # each span's track, an index into the two below
    thread_texts: np.ndarray  # object: '"pid":G,"tid":T' of each track
    thread_ids: list[int]
    tid_of: dict[tuple[int, str, int], int]
    head: list[dict]


def _ns(seconds: Sequence[float] | np.ndarray) -> np.ndarray:
    """`to_ns` of each value (``rint`` rounds half to even, as ``round`` does)."""
    return np.rint(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` of non-negative integers: the distinct
    ones in order and each key's index among them; without a sort where they lie in a
    range not much longer than the keys."""
    if not len(keys) or keys.max() > 4 * len(keys) + 1000:
        found, index = np.unique(keys, return_inverse=True)
        return found, index.reshape(-1)
    present = np.zeros(int(keys.max()) + 1, dtype=bool)
    present[keys] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[keys]


def _layout(result: TraceView) -> _Laid:
    """The spans' columns, whole-nanosecond starts and ends, concurrency slots and thread
    ids, and the metadata events naming processes and threads."""
    cols = _Columns.of(spans_per_gpu(result.trace))  # a congruent TP group's: each GPU's
    starts, ends = _ns(cols.start_s), _ns(cols.end_s)
    gpu, streams = cols.gpu, cols.streams
    track = gpu * len(streams) + cols.stream
    slot = _slot_numbers(track, starts, ends)
    top = int(slot.max()) + 1 if len(slot) else 1
    # each span's (GPU, stream, slot) as one number, and the distinct ones
    found, thread_of = _distinct(track * top + slot)
    used = [
        (int(key // top) // len(streams), streams[int(key // top) % len(streams)], int(key % top))
        for key in found.tolist()
    ]
    lanes = compute_lanes(result.trace.lanes)
    tracks: set[tuple[int, str, int]] = {(lane.gpu, COMPUTE_STREAM, 0) for lane in lanes}
    tracks |= set(used)
    tracks |= {(gpu, IDLE_TRACK, 0) for gpu, pieces in (result.idle or {}).items() if pieces}
    tid_of = _thread_ids(tracks)
    thread_ids = [tid_of[key] for key in used]
    thread_texts = np.array(
        [f'"pid":{key[0]},"tid":{tid}' for key, tid in zip(used, thread_ids, strict=True)],
        dtype=object,
    )
    events: list[dict] = []
    for lane in lanes:
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(_meta(lane.gpu, 0, "process_name", name=name))
        events.append(_meta(lane.gpu, 0, "process_sort_index", sort_index=lane.stage))
    for key, tid in sorted(tid_of.items(), key=lambda item: (item[0][0], item[1])):
        gpu_of, stream, slot_of = key
        title = TRACK_TITLES.get(stream, stream) + (f" #{slot_of + 1}" if slot_of else "")
        events.append(_meta(gpu_of, tid, "thread_name", name=title))
        events.append(_meta(gpu_of, tid, "thread_sort_index", sort_index=tid))
    return _Laid(cols, starts, ends, thread_of, thread_texts, thread_ids, tid_of, events)


def view_trace(result: TraceView) -> dict:
    """`chrome_trace` of what a `TraceView` holds."""
    laid = _layout(result)
    flows = _pipeline_flows(result, laid)
    cols, events = laid.columns, laid.head
    tids = [laid.thread_ids[k] for k in laid.thread_of.tolist()]
    starts, ends = laid.starts.tolist(), laid.ends.tolist()
    for i, (gpu, kind, label, microbatch) in enumerate(
        zip(
            cols.gpu.tolist(),
            cols.texts(cols.kind, cols.kinds),
            cols.texts(cols.label, cols.labels),
            cols.microbatch.tolist(),
            strict=True,
        )
    ):
        event = {
            "ph": "X",
            "name": f"{label} {kind}",
            "cat": kind,
            "pid": gpu,
            "tid": tids[i],
            "ts": us(starts[i]),
            "dur": us(ends[i] - starts[i]),
            "args": {"microbatch": microbatch},
        }
        if i in flows:
            event["bind_id"] = abs(flows[i])
            event["flow_out" if flows[i] > 0 else "flow_in"] = True
        events.append(event)
    gpus, tids_idle, causes, starts_idle, ends_idle = _idle_slices(result, laid.tid_of)
    for gpu, tid, cause, start, end in zip(
        gpus, tids_idle, causes, starts_idle.tolist(), ends_idle.tolist(), strict=True
    ):
        events.append(
            {
                "ph": "X",
                "name": IDLE_CAUSE_STYLES[cause].legend,
                "cat": "idle_by_cause",
                "pid": gpu,
                "tid": tid,
                "ts": us(start),
                "dur": us(end - start),
                "args": {"cause": cause},
            }
        )
    events += _link_counters(result)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _other_data(result),
    }


def _meta(pid: int, tid: int, event: str, **args) -> dict:
    """A metadata event: a process's or thread's name or sort index."""
    return {"ph": "M", "name": event, "pid": pid, "tid": tid, "args": args}


def _idle_slices(
    result: TraceView, tid_of: dict
) -> tuple[list[int], list[int], list[str], np.ndarray, np.ndarray]:
    """GPUs, tids, causes, start and end ns of the idle pieces, GPU by GPU in time
    order; pieces shorter than a nanosecond once rounded are left out."""
    pieces = [
        (gpu, piece) for gpu, of_gpu in sorted((result.idle or {}).items()) for piece in of_gpu
    ]
    starts = _ns([piece.start_s for _, piece in pieces])
    ends = _ns([piece.end_s for _, piece in pieces])
    kept = np.nonzero(ends > starts)[0].tolist()
    gpus = [pieces[k][0] for k in kept]
    return (
        gpus,
        [tid_of[(gpu, IDLE_TRACK, 0)] for gpu in gpus],
        [pieces[k][1].cause for k in kept],
        starts[kept],
        ends[kept],
    )


def _thread_ids(tracks: set[tuple[int, str, int]]) -> dict[tuple[int, str, int], int]:
    """Thread ids per GPU, numbered in stream order (compute first, tid 0, then its idle
    by cause), slots in order."""
    order = {**STREAM_ORDER, IDLE_TRACK: 0.5}
    ordered = sorted(tracks, key=lambda t: (t[0], order.get(t[1], 9), t[1], t[2]))
    tid_of: dict[tuple[int, str, int], int] = {}
    next_tid: defaultdict[int, int] = defaultdict(int)
    for track in ordered:
        tid_of[track] = next_tid[track[0]]
        next_tid[track[0]] += 1
    return tid_of


def _pipeline_flows(result: TraceView, laid: _Laid) -> dict[int, int]:
    """Span index -> its bind_id, for "flow_out", or minus it, for "flow_in" (numbers:
    no object per flow to collect): each pipeline send's span linked
    to the span of the op on another GPU that consumes what it sent (a forward, a
    backward...). Chrome trace format flow events, version 2 (``bind_id`` with
    ``flow_out`` / ``flow_in`` on the complete events, as Perfetto's JSON importer
    reads them). An op fed by several sends keeps the first; a pair is linked only when
    the receive starts after the send does, so the importer meets the send first.
    Found on arrays with an entry per op or span; the loop is over the linked pairs."""
    ops, lanes = result.workload.ops, result.workload.lanes
    cols, starts = laid.columns, laid.starts
    if not ops or not len(cols.gpu):
        return {}
    n = len(ops)
    # each op's kind as the spans' code of it (a send's when no span is one; -2: a kind
    # no span has)
    code = {kind: k for k, kind in enumerate(cols.kinds)}
    send = code.setdefault(PP_SEND, len(code))
    op_kind = np.fromiter(map(code.get, map(itemgetter(2), ops), repeat(-2)), np.int64, n)
    is_send_op = op_kind == send
    sends = np.flatnonzero(is_send_op)
    # send op -> the first op (by index) on another GPU that lists it among its deps
    counts = np.fromiter(map(len, map(itemgetter(8), ops)), dtype=np.int64, count=n)
    needs = np.flatnonzero(counts)  # most ops list no dep: only the others' are read
    listed = map(itemgetter(8), _picked(ops, needs))
    dep = np.fromiter(chain.from_iterable(listed), np.int64, int(counts.sum()))
    needer = np.repeat(needs, counts[needs])
    # the GPU of each op that is a send or lists a dep (-1: not looked up)
    gpu_of_op = np.full(n, -1, dtype=np.int64)
    looked = np.zeros(n, dtype=bool)
    looked[sends] = looked[needs] = True
    looked = np.flatnonzero(looked)
    gpu_of_op[looked] = np.array([lane.gpu for lane in lanes], dtype=np.int64)[
        np.fromiter(map(itemgetter(1), _picked(ops, looked)), np.int64, len(looked))
    ]
    feeds = is_send_op[dep] & (gpu_of_op[dep] != gpu_of_op[needer])
    consumer = _first_of(dep[feeds], needer[feeds], n)
    # op -> its first span of the op's own kind (not a wait): a send's, another's
    span_op = cols.op
    own = cols.kind == op_kind[span_op]
    is_send = own & (cols.kind == send)
    index = np.arange(len(span_op), dtype=np.int64)
    send_span = _first_of(span_op[is_send], index[is_send], n)
    # Blocking p2p (a framework's pipeline_p2p): the send is a rendezvous of the sending
    # and the receiving stage's ops ("send F3" / "recv F3", the same transfer); what
    # consumes it is the receiving GPU's first pass of that micro-batch after it.
    rendezvous = np.fromiter(map(itemgetter(10), _picked(ops, sends)), np.int64, len(sends))
    joined = rendezvous >= 0
    if joined.any():
        passes = own & np.isin(
            cols.kind, _codes(cols.kinds, (FORWARD, BACKWARD, RECOMPUTE, WEIGHT))
        )
        sender, k = _first_passes_after(
            ops,
            laid,
            np.flatnonzero(passes),
            sends[joined],
            rendezvous[joined],
            gpu_of_op,
            send_span,
            consumer,
        )
        consumer[sender] = span_op[k]
    fed = np.zeros(n, dtype=bool)  # the consumers: only their spans are looked up
    fed[consumer[consumer >= 0]] = True
    mine = own & ~is_send & fed[span_op]
    own_span = _first_of(span_op[mine], index[mine], n)
    # each send's span (in order of the send op) and its consumer's
    sent = np.flatnonzero(send_span >= 0)
    fed = consumer[sent]
    sent, got = send_span[sent], np.where(fed >= 0, own_span[np.maximum(fed, 0)], -1)
    linked = got >= 0
    linked[linked] = starts[got[linked]] > starts[sent[linked]]
    flows: dict[int, int] = {}
    # a congruent TP group's lane (comm/congruent.py): its spans are each followed by
    # their copies for the group's other GPUs, and rank k's send feeds rank k's op
    copies = copies_of(result.trace.lanes)
    sent, got = sent[linked], got[linked]
    for i, j, gpu_i, gpu_j in zip(
        sent.tolist(), got.tolist(), cols.gpu[sent].tolist(), cols.gpu[got].tolist(), strict=True
    ):
        if j in flows:
            continue
        for copy in range(copies.get(gpu_i, 1) if gpu_j in copies else 1):
            bind_id = len(flows) // 2 + 1
            flows[i + copy] = bind_id
            flows[j + copy] = -bind_id
    return flows


def _picked(values: Sequence, at: np.ndarray) -> Iterator:
    """The items of ``values`` at the indices ``at``, in order."""
    return map(values.__getitem__, at.tolist())


def _codes(values: list[str], wanted: tuple[str, ...]) -> list[int]:
    """The codes of those of a text field's distinct ``values`` that are ``wanted``."""
    return [code for code, value in enumerate(values) if value in wanted]


def _first_of(keys: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Over keys 0..n-1: the value at each key's first occurrence in ``keys``; -1 for a
    key that does not occur."""
    out = np.full(n, -1, dtype=np.int64)
    found, first = np.unique(keys, return_index=True)
    out[found] = values[first]
    return out


def _first_passes_after(
    ops: Sequence,
    laid: _Laid,
    passes: np.ndarray,
    members: np.ndarray,
    group: np.ndarray,
    gpu_of_op: np.ndarray,
    send_span: np.ndarray,
    consumer: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Blocking sends (``members`` of rendezvous groups, ``group`` each one's first
    member) without a consumer yet, and the pass span each is consumed by: for the
    send's group's members on other GPUs, in op order, the first that runs a pass
    (``passes``: span indices) of the send's micro-batch starting at or after the
    send's span ends (in seconds); of the passes starting on that nanosecond, the lowest
    span index. Sends whose group has no such pass are left out."""
    cols, none = laid.columns, np.zeros(0, dtype=np.int64)
    order = np.argsort(group, kind="stable")  # the groups' members, each group in op order
    members, group = members[order], group[order]
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    size = np.diff(np.r_[first, len(members)])
    low, width = np.repeat(first, size), np.repeat(size, size)
    labels = map(itemgetter(3), _picked(ops, members))
    sending = np.flatnonzero(
        np.fromiter(map(methodcaller("startswith", "send"), labels), bool, len(members))
    )
    # every (send, member of its group) pair: sends in op order, each's members in order
    reps = width[sending]
    offset = np.arange(int(reps.sum()), dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    sender = members[np.repeat(sending, reps)]
    other = members[np.repeat(low[sending], reps) + offset]
    keep = (gpu_of_op[other] != gpu_of_op[sender]) & (consumer[sender] < 0)
    keep &= send_span[sender] >= 0
    sender, other = sender[keep], other[keep]
    if not len(sender) or not len(passes):
        return none, none
    # queries (the other's GPU, the send's micro-batch, the send's end) and passes
    # (GPU, micro-batch, start), each (GPU, micro-batch) as one key
    ask_mb = np.fromiter(map(itemgetter(4), _picked(ops, sender)), np.int64, len(sender))
    pass_mb = cols.microbatch[passes]
    low_mb = min(int(ask_mb.min()), int(pass_mb.min()))
    span_mb = max(int(ask_mb.max()), int(pass_mb.max())) - low_mb + 1
    ask_key = gpu_of_op[other] * span_mb + (ask_mb - low_mb)
    pass_key = cols.gpu[passes] * span_mb + (pass_mb - low_mb)
    pass_start = cols.start_s[passes]
    by = np.lexsort((passes, pass_start, pass_key))  # by key, start, span index
    passes, pass_key, pass_start = passes[by], pass_key[by], pass_start[by]
    # merged by key and seconds, a query before passes starting at its time (bisect_left)
    n = len(passes)
    merged = np.lexsort(
        (
            np.r_[np.ones(n, np.int8), np.zeros(len(sender), np.int8)],
            np.r_[pass_start, cols.end_s[send_span[sender]]],
            np.r_[pass_key, ask_key],
        )
    )
    position = np.empty(len(merged), dtype=np.int64)
    position[merged] = np.arange(len(merged))
    # the first pass at or after each merged place (n: none)
    ahead = np.minimum.accumulate(np.where(merged < n, merged, n)[::-1])[::-1]
    hit = ahead[position[n:]]
    found = hit < n
    found[found] = pass_key[hit[found]] == ask_key[found]
    # the lowest span index from each pass on, among its key's passes on its nanosecond
    ns = laid.starts[passes]
    run = np.cumsum(np.r_[True, (pass_key[1:] != pass_key[:-1]) | (ns[1:] != ns[:-1])])
    big = int(passes.max()) + 1
    lowest = np.minimum.accumulate((passes + run * big)[::-1])[::-1] - run * big
    sender, k = sender[found], lowest[hit[found]]
    chosen, first = np.unique(sender, return_index=True)  # each send's first member found
    return chosen, k[first]


NETWORK_PID = 1_000_000_000  # a process of its own for the link counters


def _link_counters(result: TraceView, top: int = 8, bins: int = 400) -> list[dict]:
    """Utilization of the busiest links over time, as Chrome trace counter tracks."""
    from .linkstats import utilization_over_time

    busiest = result.busiest_links[:top]
    if not busiest:
        return []
    chosen = [link.index for link in busiest]
    capacities = result.capacities
    edges, series = utilization_over_time(
        result.trace.link_intervals, capacities, chosen, result.trace.end_s, bins
    )
    events: list[dict] = [
        _meta(NETWORK_PID, 0, "process_name", name="network: busiest links (utilization %)")
    ]
    for link in busiest:
        for start, value in zip(edges[:-1], series[link.index], strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": link.link,
                    "pid": NETWORK_PID,
                    "ts": us(to_ns(start)),
                    "args": {"utilization %": round(100 * float(value), 3)},
                }
            )
    return events


def study_trace(studies: list, time_unit_ns: int = 1_000_000) -> dict:
    """A Chrome/Perfetto trace: a process per schedule, a thread per rank; abstract time
    units are written as milliseconds, boundaries in whole nanoseconds as above."""
    events: list[dict] = []
    for pid, study in enumerate(studies):
        events.append(_meta(pid, 0, "process_name", name=study.name))
        for rank in range(study.num_ranks):
            events.append(_meta(pid, rank, "thread_name", name=f"rank {rank}"))
        for span in study.trace.spans:
            if span.kind not in PASS_KINDS:
                continue  # the gaps are the bubble
            start = round(span.start_s * time_unit_ns)
            end = round(span.end_s * time_unit_ns)
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": span.gpu,
                    "name": span.label,
                    "cat": span.kind,
                    "ts": us(start),
                    "dur": us(end - start),
                    "args": {"microbatch": span.microbatch},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}

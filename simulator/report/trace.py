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
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Sequence
from itertools import chain
from operator import itemgetter
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


CHUNK_EVENTS = 50_000  # span events formatted and handed on at a time


def view_trace_chunks(result: TraceView) -> Iterator[str]:
    """`view_trace_text` in pieces, each handed on once made (a writer streams them to
    its file): the metadata and counter events through json, the spans and idle pieces
    formatted from columns (each span's name, thread, times and micro-batch as lists
    made at once), a few tens of thousands of events a piece."""
    laid = _layout(result)
    flows = _pipeline_flows(result, laid)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    yield '{"traceEvents":['
    comma = ""  # between events: none before the first

    def joined(events: list[str]) -> str:
        nonlocal comma
        if not events:
            return ""
        text, comma = comma + ",".join(events), ","
        return text

    yield joined([dumps(event) for event in laid.head])
    cols = laid.columns
    # '"name":...,"cat":...' of each (label, kind), '"pid":...,"tid":...' of each track
    named = {
        key: f'"name":{dumps(f"{key[0]} {key[1]}")},"cat":{dumps(key[1])}'
        for key in dict.fromkeys(zip(cols.label, cols.kind, strict=True))
    }
    tails = ["}"] * len(cols.gpu)  # what ends each span's event: its flow, if any
    for i, (bind_id, way) in flows.items():
        tails[i] = f',"bind_id":{bind_id},"{way}":true}}'
    for at in range(0, len(cols.gpu), CHUNK_EVENTS):
        part = slice(at, at + CHUNK_EVENTS)
        starts = laid.starts[part]
        ts_whole, ts_part = _us_texts(starts)
        dur_whole, dur_part = _us_texts(laid.ends[part] - starts)
        names = [named[key] for key in zip(cols.label[part], cols.kind[part], strict=True)]
        threads = laid.thread_texts[laid.thread_of[part]].tolist()
        yield joined(
            [
                f'{{"ph":"X",{name},{thread},"ts":{a}{b},"dur":{c}{d},'
                f'"args":{{"microbatch":{mb}}}{tail}'
                for name, thread, a, b, c, d, mb, tail in zip(
                    names,
                    threads,
                    ts_whole,
                    ts_part,
                    dur_whole,
                    dur_part,
                    cols.microbatch[part],
                    tails[part],
                    strict=True,
                )
            ]
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


def _other_data(result: TraceView) -> dict:
    other: dict = {"scenario": result.scenario_name}
    if result.fast_forward is not None:
        other["fast_forward"] = result.fast_forward
    return other


class _Columns(NamedTuple):
    """The spans (each GPU's: `spans_per_gpu`) field by field; times as arrays."""

    gpu: list[int]
    stream: list[str]
    kind: list[str]
    label: list[str]
    microbatch: list[int]
    start_s: np.ndarray
    end_s: np.ndarray
    op: list[int]

    @classmethod
    def of(cls, spans: Sequence[Span]) -> _Columns:
        def field(k: int) -> list:
            return list(map(itemgetter(k), spans))

        def times(k: int) -> np.ndarray:
            return np.fromiter(map(itemgetter(k), spans), np.float64, len(spans))

        return cls(field(0), field(1), field(2), field(3), field(4), times(5), times(6), field(7))


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


def _layout(result: TraceView) -> _Laid:
    """The spans' columns, whole-nanosecond starts and ends, concurrency slots and thread
    ids, and the metadata events naming processes and threads."""
    cols = _Columns.of(spans_per_gpu(result.trace))  # a congruent TP group's: each GPU's
    starts, ends = _ns(cols.start_s), _ns(cols.end_s)
    stream_code = {stream: k for k, stream in enumerate(dict.fromkeys(cols.stream))}
    gpu = np.array(cols.gpu, dtype=np.int64)
    track = gpu * len(stream_code) + np.array([stream_code[s] for s in cols.stream], dtype=np.int64)
    slot = _slot_numbers(track, starts, ends)
    top = int(slot.max()) + 1 if len(slot) else 1
    # each span's (GPU, stream, slot) as one number, and the distinct ones
    found, thread_of = np.unique(track * top + slot, return_inverse=True)
    streams = list(stream_code)
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
    return _Laid(
        cols, starts, ends, thread_of.reshape(-1), thread_texts, thread_ids, tid_of, events
    )


def view_trace(result: TraceView) -> dict:
    """`chrome_trace` of what a `TraceView` holds."""
    laid = _layout(result)
    flows = _pipeline_flows(result, laid)
    cols, events = laid.columns, laid.head
    tids = [laid.thread_ids[k] for k in laid.thread_of.tolist()]
    starts, ends = laid.starts.tolist(), laid.ends.tolist()
    for i, (gpu, kind, label, microbatch) in enumerate(
        zip(cols.gpu, cols.kind, cols.label, cols.microbatch, strict=True)
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
            bind_id, direction = flows[i]
            event["bind_id"] = bind_id
            event[direction] = True
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


def _first_of(keys: np.ndarray, values: np.ndarray) -> dict[int, int]:
    """key -> the value at its first occurrence in ``keys``."""
    found, first = np.unique(keys, return_index=True)
    return dict(zip(found.tolist(), values[first].tolist(), strict=True))


def _pipeline_flows(result: TraceView, laid: _Laid) -> dict[int, tuple[int, str]]:
    """Span index -> (bind_id, "flow_out" | "flow_in"): each pipeline send's span linked
    to the span of the op on another GPU that consumes what it sent (a forward, a
    backward...). Chrome trace format flow events, version 2 (``bind_id`` with
    ``flow_out`` / ``flow_in`` on the complete events, as Perfetto's JSON importer
    reads them). An op fed by several sends keeps the first; a pair is linked only when
    the receive starts after the send does, so the importer meets the send first."""
    ops, lanes = result.workload.ops, result.workload.lanes
    cols, starts = laid.columns, laid.starts
    if not ops or not cols.gpu:
        return {}
    n = len(ops)
    op_kind = list(map(itemgetter(2), ops))  # the ops' kinds, micro-batches and deps
    op_mb = list(map(itemgetter(4), ops))
    op_deps = list(map(itemgetter(8), ops))
    code = {kind: k for k, kind in enumerate(sorted({*op_kind, *cols.kind}))}
    kind_of_op = np.fromiter(map(code.__getitem__, op_kind), np.int64, n)
    gpu_of_op = np.array([lane.gpu for lane in lanes], dtype=np.int64)[
        np.fromiter(map(itemgetter(1), ops), np.int64, n)
    ]
    send = code.get(PP_SEND, -1)
    # send op -> the first op (by index) on another GPU that lists it among its deps
    counts = np.fromiter(map(len, op_deps), dtype=np.int64, count=n)
    dep = np.fromiter(chain.from_iterable(op_deps), np.int64, int(counts.sum()))
    needer = np.repeat(np.arange(n, dtype=np.int64), counts)
    feeds = (kind_of_op[dep] == send) & (gpu_of_op[dep] != gpu_of_op[needer])
    consumer = _first_of(dep[feeds], needer[feeds])
    # op -> index of its span (the op's own kind, not a wait)
    span_op = np.array(cols.op, dtype=np.int64)
    span_kind = np.fromiter(map(code.__getitem__, cols.kind), np.int64, len(cols.kind))
    own = span_kind == kind_of_op[span_op]
    index = np.arange(len(span_op), dtype=np.int64)
    is_send = own & (span_kind == send)
    send_span = _first_of(span_op[is_send], index[is_send])
    own_span = _first_of(span_op[own & ~is_send], index[own & ~is_send])
    # Blocking p2p (a framework's pipeline_p2p): the send is a rendezvous of the sending
    # and the receiving stage's ops ("send F3" / "recv F3", the same transfer); what
    # consumes it is the receiving GPU's first pass of that micro-batch after it.
    rendezvous = np.fromiter(map(itemgetter(10), ops), np.int64, n)
    joined = np.nonzero((kind_of_op == send) & (rendezvous >= 0))[0]
    members: dict[int, list[int]] = defaultdict(list)
    for i, first in zip(joined.tolist(), rendezvous[joined].tolist(), strict=True):
        members[first].append(i)
    gpus = gpu_of_op.tolist()
    if members:
        passes = _Passes.of(cols, own, span_kind, code, starts)
        end_s = cols.end_s.tolist()
        for group in members.values():
            for sender in [o for o in group if ops[o].label.startswith("send")]:
                for other in group:
                    if gpus[other] != gpus[sender]:
                        k = passes.first_after(gpus[other], op_mb[sender], end_s[send_span[sender]])
                        if k is not None:
                            consumer.setdefault(sender, cols.op[k])
    flows: dict[int, tuple[int, str]] = {}
    # a congruent TP group's lane (comm/congruent.py): its spans are each followed by
    # their copies for the group's other GPUs, and rank k's send feeds rank k's op
    copies = copies_of(result.trace.lanes)
    at = starts.tolist()
    for sender, i in sorted(send_span.items()):
        j = own_span.get(consumer.get(sender, -1))
        if j is None or j in flows or at[j] <= at[i]:
            continue
        for k in range(copies.get(cols.gpu[i], 1) if cols.gpu[j] in copies else 1):
            bind_id = len(flows) // 2 + 1
            flows[i + k] = (bind_id, "flow_out")
            flows[j + k] = (bind_id, "flow_in")
    return flows


class _Passes(NamedTuple):
    """The pass spans (forward, backward, recompute, weight; the op's own kind) by GPU
    and micro-batch, each group in order of start, then index: their starts in seconds
    and in ns, their span indices, and each (GPU, micro-batch)'s range of them."""

    start_s: list[float]
    ns: list[int]
    span: list[int]
    ranges: dict[tuple[int, int], tuple[int, int]]

    @classmethod
    def of(
        cls, cols: _Columns, own: np.ndarray, span_kind: np.ndarray, code: dict, starts: np.ndarray
    ) -> _Passes:
        kinds = [code[kind] for kind in (FORWARD, BACKWARD, RECOMPUTE, WEIGHT) if kind in code]
        chosen = np.nonzero(own & np.isin(span_kind, kinds))[0]
        gpu = np.array(cols.gpu, dtype=np.int64)[chosen]
        microbatch = np.array(cols.microbatch, dtype=np.int64)[chosen]
        order = np.lexsort((chosen, cols.start_s[chosen], microbatch, gpu))
        chosen, gpu, microbatch = chosen[order], gpu[order], microbatch[order]
        cut = np.nonzero((gpu[1:] != gpu[:-1]) | (microbatch[1:] != microbatch[:-1]))[0] + 1
        lows = [0, *cut.tolist()]
        highs = [*cut.tolist(), len(chosen)]
        ranges = (
            {
                (g, m): (low, high)
                for g, m, low, high in zip(
                    gpu[lows].tolist(), microbatch[lows].tolist(), lows, highs, strict=True
                )
            }
            if len(chosen)
            else {}
        )
        return cls(cols.start_s[chosen].tolist(), starts[chosen].tolist(), chosen.tolist(), ranges)

    def first_after(self, gpu: int, microbatch: int, end_s: float) -> int | None:
        """The pass span of ``gpu`` and ``microbatch`` starting first (in ns; of those,
        the lowest index) among those that start at or after ``end_s``, or None."""
        low, high = self.ranges.get((gpu, microbatch), (0, 0))
        at = bisect_left(self.start_s, end_s, low, high)
        if at == high:
            return None
        best, stop = self.span[at], at + 1
        while stop < high and self.ns[stop] == self.ns[at]:
            best = min(best, self.span[stop])
            stop += 1
        return best


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

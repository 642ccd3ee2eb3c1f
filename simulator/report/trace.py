"""Chrome/Perfetto traces: a simulated iteration (a process per simulated GPU, a
thread per stream and concurrent slot, counters for the busiest links, pipeline sends
linked to the ops that receive them) and the bubble study's schedules. Dicts only; the
CLI writes them as JSON.

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
from collections.abc import Sequence
from typing import NamedTuple

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
    slot_of = [0] * len(spans)
    busy_until: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i in sorted(range(len(spans)), key=lambda i: (starts[i], ends[i], i)):
        track, start = busy_until[(spans[i].gpu, spans[i].stream)], starts[i]
        slot = 0  # most streams never run two things at once: slot 0 is free
        while slot < len(track) and track[slot] > start:
            slot += 1
        if slot == len(track):
            track.append(ends[i])
        else:
            track[slot] = ends[i]
        slot_of[i] = slot
    return slot_of


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
    if not part:
        return f"{whole}.0"
    return f"{whole}.{part:03d}".rstrip("0")


def chrome_trace_bytes(result: Result, idle: IdleMap | None = None) -> bytes:
    """`chrome_trace` as the compact JSON the CLI writes (``json.dumps`` with separators
    ``(",", ":")``), byte for byte, but written as text event by event: no dict per
    span, which at MT-NLG's 311,348 spans cost more than the run."""
    return view_trace_text(TraceView.of(result, idle)).encode()


def view_trace_text(result: TraceView) -> str:
    """`view_trace`'s document as compact JSON text, the same bytes as ``json.dumps(
    view_trace(result), separators=(",", ":"))``: the metadata and counter events
    through json, each span formatted directly."""
    spans, starts, ends, slot_of, tid_of, head = _layout(result)
    flows = _pipeline_flows(result, spans, starts)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    names: dict[tuple[str, str], str] = {}
    kinds: dict[str, str] = {}
    parts = [dumps(event) for event in head]
    for i, sp in enumerate(spans):
        name = names.get((sp.label, sp.kind))
        if name is None:
            name = names[(sp.label, sp.kind)] = dumps(f"{sp.label} {sp.kind}")
        cat = kinds.get(sp.kind)
        if cat is None:
            cat = kinds[sp.kind] = dumps(sp.kind)
        text = (
            f'{{"ph":"X","name":{name},"cat":{cat},"pid":{sp.gpu},'
            f'"tid":{tid_of[(sp.gpu, sp.stream, slot_of[i])]},"ts":{us_text(starts[i])},'
            f'"dur":{us_text(ends[i] - starts[i])},"args":{{"microbatch":{sp.microbatch}}}'
        )
        flow = flows.get(i)
        if flow is not None:
            text += f',"bind_id":{flow[0]},"{flow[1]}":true'
        parts.append(text + "}")
    causes = {
        cause: (dumps(style.legend), dumps(cause)) for cause, style in IDLE_CAUSE_STYLES.items()
    }
    for gpu, tid, cause, start, end in _idle_slices(result, tid_of):
        name, key = causes[cause]
        parts.append(
            f'{{"ph":"X","name":{name},"cat":"idle_by_cause","pid":{gpu},"tid":{tid},'
            f'"ts":{us_text(start)},"dur":{us_text(end - start)},"args":{{"cause":{key}}}}}'
        )
    parts += [dumps(event) for event in _link_counters(result)]
    return (
        '{"traceEvents":['
        + ",".join(parts)
        + '],"displayTimeUnit":"ms","otherData":'
        + dumps(_other_data(result))
        + "}"
    )


def _other_data(result: TraceView) -> dict:
    other: dict = {"scenario": result.scenario_name}
    if result.fast_forward is not None:
        other["fast_forward"] = result.fast_forward
    return other


def _layout(result: TraceView):
    """The spans, their whole-nanosecond starts and ends, concurrency slots and thread
    ids, and the metadata events naming processes and threads."""
    spans = spans_per_gpu(result.trace)  # a congruent TP group's lane: each GPU's
    starts = [to_ns(sp.start_s) for sp in spans]
    ends = [to_ns(sp.end_s) for sp in spans]
    slot_of = slots(spans, starts, ends)
    lanes = compute_lanes(result.trace.lanes)
    tracks: set[tuple[int, str, int]] = {(lane.gpu, COMPUTE_STREAM, 0) for lane in lanes}
    tracks |= {(sp.gpu, sp.stream, slot) for sp, slot in zip(spans, slot_of, strict=True)}
    tracks |= {(gpu, IDLE_TRACK, 0) for gpu, pieces in (result.idle or {}).items() if pieces}
    tid_of = _thread_ids(tracks)
    events: list[dict] = []
    for lane in lanes:
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(_meta(lane.gpu, 0, "process_name", name=name))
        events.append(_meta(lane.gpu, 0, "process_sort_index", sort_index=lane.stage))
    for track, tid in sorted(tid_of.items(), key=lambda item: (item[0][0], item[1])):
        gpu, stream, slot = track
        title = TRACK_TITLES.get(stream, stream) + (f" #{slot + 1}" if slot else "")
        events.append(_meta(gpu, tid, "thread_name", name=title))
        events.append(_meta(gpu, tid, "thread_sort_index", sort_index=tid))
    return spans, starts, ends, slot_of, tid_of, events


def view_trace(result: TraceView) -> dict:
    """`chrome_trace` of what a `TraceView` holds."""
    spans, starts, ends, slot_of, tid_of, events = _layout(result)
    flows = _pipeline_flows(result, spans, starts)
    for i, sp in enumerate(spans):
        event = {
            "ph": "X",
            "name": f"{sp.label} {sp.kind}",
            "cat": sp.kind,
            "pid": sp.gpu,
            "tid": tid_of[(sp.gpu, sp.stream, slot_of[i])],
            "ts": us(starts[i]),
            "dur": us(ends[i] - starts[i]),
            "args": {"microbatch": sp.microbatch},
        }
        if i in flows:
            bind_id, direction = flows[i]
            event["bind_id"] = bind_id
            event[direction] = True
        events.append(event)
    for gpu, tid, cause, start, end in _idle_slices(result, tid_of):
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


def _idle_slices(result: TraceView, tid_of: dict) -> list[tuple[int, int, str, int, int]]:
    """(GPU, tid, cause, start ns, end ns) of each idle piece, GPU by GPU in time order;
    pieces shorter than a nanosecond once rounded are left out."""
    out = []
    for gpu, pieces in sorted((result.idle or {}).items()):
        for piece in pieces:
            start, end = to_ns(piece.start_s), to_ns(piece.end_s)
            if end > start:
                out.append((gpu, tid_of[(gpu, IDLE_TRACK, 0)], piece.cause, start, end))
    return out


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


def _pipeline_flows(result: TraceView, spans: list[Span], starts: list[int]) -> dict:
    """Span index -> (bind_id, "flow_out" | "flow_in"): each pipeline send's span linked
    to the span of the op on another GPU that consumes what it sent (a forward, a
    backward...). Chrome trace format flow events, version 2 (``bind_id`` with
    ``flow_out`` / ``flow_in`` on the complete events, as Perfetto's JSON importer
    reads them). An op fed by several sends keeps the first; a pair is linked only when
    the receive starts after the send does, so the importer meets the send first."""
    ops, lanes = result.workload.ops, result.workload.lanes
    consumer: dict[int, int] = {}  # send op -> the first op on another GPU that needs it
    for op in ops:
        for dep in op.deps:
            sent = ops[dep]
            if sent.kind == PP_SEND and lanes[sent.lane].gpu != lanes[op.lane].gpu:
                consumer.setdefault(dep, op.index)
    # op -> index of its span (the op's own kind, not a wait)
    send_span: dict[int, int] = {}
    own_span: dict[int, int] = {}
    for i, sp in enumerate(spans):
        if sp.kind == ops[sp.op].kind:
            (send_span if sp.kind == PP_SEND else own_span).setdefault(sp.op, i)
    # Blocking p2p (a framework's pipeline_p2p): the send is a rendezvous of the sending
    # and the receiving stage's ops ("send F3" / "recv F3", the same transfer); what
    # consumes it is the receiving GPU's first pass of that micro-batch after it.
    passes: dict[tuple[int, int], list[int]] = defaultdict(list)  # (gpu, mb) -> spans
    for i, sp in enumerate(spans):
        if sp.kind in (FORWARD, BACKWARD, RECOMPUTE, WEIGHT) and sp.kind == ops[sp.op].kind:
            passes[(sp.gpu, sp.microbatch)].append(i)
    members: dict[int, list[int]] = defaultdict(list)
    for op in ops:
        if op.kind == PP_SEND and op.rendezvous >= 0:
            members[op.rendezvous].append(op.index)
    for group in members.values():
        sender = [o for o in group if ops[o].label.startswith("send")]
        for send in sender:
            for other in group:
                if lanes[ops[other].lane].gpu == lanes[ops[send].lane].gpu:
                    continue
                gpu, end = lanes[ops[other].lane].gpu, spans[send_span[send]].end_s
                after = [
                    k
                    for k in passes.get((gpu, ops[send].microbatch), ())
                    if spans[k].start_s >= end
                ]
                if after:
                    consumer.setdefault(send, spans[min(after, key=starts.__getitem__)].op)
    flows: dict[int, tuple[int, str]] = {}
    # a congruent TP group's lane (comm/congruent.py): its spans are each followed by
    # their copies for the group's other GPUs, and rank k's send feeds rank k's op
    copies = copies_of(result.trace.lanes)
    for send, i in sorted(send_span.items()):
        j = own_span.get(consumer.get(send, -1))
        if j is None or j in flows or starts[j] <= starts[i]:
            continue
        for k in range(copies.get(spans[i].gpu, 1) if spans[j].gpu in copies else 1):
            bind_id = len(flows) // 2 + 1
            flows[i + k] = (bind_id, "flow_out")
            flows[j + k] = (bind_id, "flow_in")
    return flows


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

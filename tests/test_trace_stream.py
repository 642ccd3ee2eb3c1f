"""The trace written from columns and streamed (issue 34 part 2): the same bytes as the
writer it replaced, a dict per event through json.dumps, kept here as the reference;
the pieces it is made of (slots, flows, decimals, the timeline's span groups) against
their plain loops; and the file written piece by piece."""

import gzip
import json
import random
from collections import defaultdict
from itertools import groupby

import pytest

from stepsim.cli.cmd_run import gzipped
from stepsim.comm.congruent import copies_of
from stepsim.ir.results import Span
from stepsim.ir.vocabulary import (
    BACKWARD,
    COMPUTE_STREAM,
    FORWARD,
    PP_SEND,
    RECOMPUTE,
    STREAM_ORDER,
    WEIGHT,
)
from stepsim.report import trace
from stepsim.report.idle import IDLE_CAUSE_STYLES
from stepsim.report.metrics import compute_lanes, spans_per_gpu
from stepsim.run.idlemap import idle_pieces
from stepsim.run.iteration import run
from tests.helpers import load

# -- the reference: the trace document as it was built before, event by event ------------


def _reference_slots(spans, starts, ends):
    slot_of = [0] * len(spans)
    busy_until = defaultdict(list)
    for i in sorted(range(len(spans)), key=lambda i: (starts[i], ends[i], i)):
        track, start = busy_until[(spans[i].gpu, spans[i].stream)], starts[i]
        slot = 0
        while slot < len(track) and track[slot] > start:
            slot += 1
        if slot == len(track):
            track.append(ends[i])
        else:
            track[slot] = ends[i]
        slot_of[i] = slot
    return slot_of


def _reference_flows(view, spans, starts):
    ops, lanes = view.workload.ops, view.workload.lanes
    consumer = {}
    for op in ops:
        for dep in op.deps:
            sent = ops[dep]
            if sent.kind == PP_SEND and lanes[sent.lane].gpu != lanes[op.lane].gpu:
                consumer.setdefault(dep, op.index)
    send_span, own_span = {}, {}
    for i, sp in enumerate(spans):
        if sp.kind == ops[sp.op].kind:
            (send_span if sp.kind == PP_SEND else own_span).setdefault(sp.op, i)
    passes = defaultdict(list)
    for i, sp in enumerate(spans):
        if sp.kind in (FORWARD, BACKWARD, RECOMPUTE, WEIGHT) and sp.kind == ops[sp.op].kind:
            passes[(sp.gpu, sp.microbatch)].append(i)
    members = defaultdict(list)
    for op in ops:
        if op.kind == PP_SEND and op.rendezvous >= 0:
            members[op.rendezvous].append(op.index)
    for group in members.values():
        for send in [o for o in group if ops[o].label.startswith("send")]:
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
    flows = {}
    copies = copies_of(view.trace.lanes)
    for send, i in sorted(send_span.items()):
        j = own_span.get(consumer.get(send, -1))
        if j is None or j in flows or starts[j] <= starts[i]:
            continue
        for k in range(copies.get(spans[i].gpu, 1) if spans[j].gpu in copies else 1):
            bind_id = len(flows) // 2 + 1
            flows[i + k] = (bind_id, "flow_out")
            flows[j + k] = (bind_id, "flow_in")
    return flows


def _reference_document(view) -> dict:
    spans = spans_per_gpu(view.trace)
    starts = [trace.to_ns(sp.start_s) for sp in spans]
    ends = [trace.to_ns(sp.end_s) for sp in spans]
    slot_of = _reference_slots(spans, starts, ends)
    lanes = compute_lanes(view.trace.lanes)
    tracks = {(lane.gpu, COMPUTE_STREAM, 0) for lane in lanes}
    tracks |= {(sp.gpu, sp.stream, slot) for sp, slot in zip(spans, slot_of, strict=True)}
    idle = view.idle or {}
    tracks |= {(gpu, trace.IDLE_TRACK, 0) for gpu, pieces in idle.items() if pieces}
    tid_of = trace._thread_ids(tracks)
    events = []
    for lane in lanes:
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(trace._meta(lane.gpu, 0, "process_name", name=name))
        events.append(trace._meta(lane.gpu, 0, "process_sort_index", sort_index=lane.stage))
    for (gpu, stream, slot), tid in sorted(tid_of.items(), key=lambda t: (t[0][0], t[1])):
        title = trace.TRACK_TITLES.get(stream, stream) + (f" #{slot + 1}" if slot else "")
        events.append(trace._meta(gpu, tid, "thread_name", name=title))
        events.append(trace._meta(gpu, tid, "thread_sort_index", sort_index=tid))
    flows = _reference_flows(view, spans, starts)
    for i, sp in enumerate(spans):
        event = {
            "ph": "X",
            "name": f"{sp.label} {sp.kind}",
            "cat": sp.kind,
            "pid": sp.gpu,
            "tid": tid_of[(sp.gpu, sp.stream, slot_of[i])],
            "ts": trace.us(starts[i]),
            "dur": trace.us(ends[i] - starts[i]),
            "args": {"microbatch": sp.microbatch},
        }
        if i in flows:
            event["bind_id"], direction = flows[i]
            event[direction] = True
        events.append(event)
    for gpu, pieces in sorted(idle.items()):
        for piece in pieces:
            start, end = trace.to_ns(piece.start_s), trace.to_ns(piece.end_s)
            if end > start:
                events.append(
                    {
                        "ph": "X",
                        "name": IDLE_CAUSE_STYLES[piece.cause].legend,
                        "cat": "idle_by_cause",
                        "pid": gpu,
                        "tid": tid_of[(gpu, trace.IDLE_TRACK, 0)],
                        "ts": trace.us(start),
                        "dur": trace.us(end - start),
                        "args": {"cause": piece.cause},
                    }
                )
    events += trace._link_counters(view)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": trace._other_data(view)}


CASES = {
    # tiny's default: Megatron's batched blocking p2p (sends as rendezvous), idle by cause
    "two stages": dict(parallel={"pipeline_model_parallel_size": 2}, training={}),
    "interleaved, gradients overlapped on several dp tracks": dict(
        parallel={
            "pipeline_model_parallel_size": 2,
            "virtual_pipeline_model_parallel_size": 2,
            "data_parallel_size": 2,
        },
        training={"schedule": "interleaved", "overlap_grad_reduce": True},
    ),
    # overlapped p2p: a send is consumed through the deps of the op that needs it
    "overlapped sends": dict(
        parallel={"pipeline_model_parallel_size": 4},
        training={"pipeline_p2p": "overlapped"},
    ),
    # exact mode: congruent TP groups, one lane standing for several GPUs (copies)
    "exact, TP groups as one lane": dict(
        parallel={
            "pipeline_model_parallel_size": 2,
            "tensor_model_parallel_size": 2,
            "data_parallel_size": 2,
        },
        training={},
        network={"symmetry": False},
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    sections = CASES[request.param]
    training = {"global_batch_size": 8, **sections["training"]}
    result = run(load(**{**sections, "training": training}))
    return request.param, result, idle_pieces(result)


def test_the_streamed_trace_is_the_reference_documents_json(case, monkeypatch):
    """Byte for byte the compact JSON of the document the writer used to build (a dict
    per event), with and without the idle by cause, in one piece or in many."""
    name, result, idle = case
    for pieces in (None, idle):
        view = trace.TraceView.of(result, pieces)
        expected = json.dumps(_reference_document(view), separators=(",", ":"))
        assert trace.view_trace_text(view) == expected, name
        assert json.dumps(trace.view_trace(view), separators=(",", ":")) == expected, name
    if name == "exact, TP groups as one lane":
        assert copies_of(result.trace.lanes), "the case has no congruent group"
    monkeypatch.setattr(trace, "CHUNK_EVENTS", 7)  # many pieces: commas between them
    chunks = list(trace.chrome_trace_chunks(result, idle))
    assert len(chunks) > 10
    assert "".join(chunks).encode() == trace.chrome_trace_bytes(result, idle)


def test_every_case_has_flows_and_idle(case):
    name, result, idle = case
    events = json.loads(trace.chrome_trace_bytes(result, idle))["traceEvents"]
    assert any("bind_id" in e for e in events), name
    assert any(e.get("cat") == "idle_by_cause" for e in events), name


def test_slots_match_the_greedy_loop_on_random_intervals():
    """Tracks that never overlap (all slot 0, found without a loop) and tracks that do
    (taken span by span), ties in start and end included."""
    rng = random.Random(3)
    for _ in range(40):
        spans = []
        for _ in range(rng.randrange(1, 60)):
            start = rng.randrange(0, 30)
            end = start + rng.choice((0, 1, 2, 5, 9))
            spans.append(
                Span(rng.randrange(3), rng.choice(("dp", "pp")), "x", "x", -1, start, end, 0)
            )
        starts = [sp.start_s for sp in spans]
        ends = [sp.end_s for sp in spans]
        assert trace.slots(spans, starts, ends) == _reference_slots(spans, starts, ends)


def test_microsecond_texts_in_and_beyond_range():
    import numpy as np

    values = [0, 1, 999, 1000, 123_456_789, 10**15 - 1]
    whole, part = trace._us_texts(np.array(values))
    assert [f"{w}{p}" for w, p in zip(whole, part, strict=True)] == [
        repr(trace.us(n)) for n in values
    ]
    beyond = [-5, 10**15, 10**16 + 3]  # repr of the float, as json writes it
    whole, part = trace._us_texts(np.array(values + beyond))
    assert [f"{w}{p}" for w, p in zip(whole, part, strict=True)] == [
        repr(trace.us(n)) for n in values + beyond
    ]


def test_the_timeline_groups_spans_as_a_sort_did(case):
    """`_span_groups` against sorting the spans by GPU, stream order, kind and start and
    grouping them: the same groups, each span's start and end in the same order."""
    from stepsim.report.timeline import _span_groups

    _, result, _ = case
    spans = result.trace.spans
    ordered = sorted(
        spans, key=lambda sp: (sp.gpu, STREAM_ORDER.get(sp.stream, 9), sp.kind, sp.start_s)
    )
    expected = [
        (key, [(sp.start_s, sp.end_s) for sp in group])
        for key, group in groupby(ordered, key=lambda sp: (sp.gpu, sp.stream, sp.kind))
    ]
    found = [
        (key, list(zip(starts.tolist(), ends.tolist(), strict=True)))
        for key, starts, ends in _span_groups(spans)
    ]
    assert found == expected
    kept = {"forward", "pp_send"}
    assert [key for key, _, _ in _span_groups(spans, kept)] == [
        key for key, _ in expected if key[2] in kept
    ]


def test_gzipped_pieces_are_gzip_compress_of_the_whole():
    rng = random.Random(5)
    text = json.dumps([rng.random() for _ in range(3000)]).encode()
    cuts = sorted(rng.sample(range(1, len(text)), 40))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert b"".join(gzipped(iter(chunks))) == gzip.compress(text, mtime=0)
    assert b"".join(gzipped(iter([]))) == gzip.compress(b"", mtime=0)

"""The trace's span events written many at a time as columns of bytes (report/trace.py
`_SpanRows`) and the blocking sends' consumers found on arrays (`_first_passes_after`),
each against the plain event-by-event writer or loop on random input: times in and
beyond the range written from whole numbers, negative micro-batches, flows, ties."""

import json
import random
from bisect import bisect_left
from types import SimpleNamespace

import numpy as np

from stepsim.report import trace


def _event(name, kind, pid, tid, start, end, microbatch, way, bind):
    event = {
        "ph": "X",
        "name": name,
        "cat": kind,
        "pid": pid,
        "tid": tid,
        "ts": trace.us(start),
        "dur": trace.us(end - start),
        "args": {"microbatch": microbatch},
    }
    if way:
        event["bind_id"] = bind
        event[("flow_out", "flow_in")[way - 1]] = True
    return json.dumps(event, separators=(",", ":"))


def test_span_rows_are_the_json_of_each_event():
    rng = random.Random(7)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    pairs = [("F0", "forward"), ('send "B12"', "pp_send"), ("é\\x", "tp_comm"), ("", "idle")]
    tracks = [(0, 0), (3, 2), (1_000_000_000, 11)]
    names = [f'{{"ph":"X","name":{dumps(f"{a} {b}")},"cat":{dumps(b)},' for a, b in pairs]
    threads = [f'"pid":{p},"tid":{t},"ts":' for p, t in tracks]
    rows = trace._SpanRows(trace._byte_rows(names), trace._byte_rows(threads))
    edges = [0, 1, 999, 1000, 1001, 123_456_789, 10**15 - 1]
    for beyond in (False, True):
        n = 300
        name = [rng.randrange(len(pairs)) for _ in range(n)]
        thread = [rng.randrange(len(tracks)) for _ in range(n)]
        starts = [rng.choice(edges) if rng.random() < 0.3 else rng.randrange(10**13) for _ in name]
        ends = [s + rng.choice((0, 1, 999, 1000, rng.randrange(10**9))) for s in starts]
        ends = [min(e, 10**15 - 1) for e in ends]
        if beyond:  # a float's repr, as json writes it
            starts[5], ends[5] = 10**15 + 3, 10**15 + 9
        microbatch = [rng.randrange(-3, 200) for _ in name]
        way = [rng.choice((0, 0, 1, 2)) for _ in name]
        bind = [rng.randrange(1, 10**6) if w else 0 for w in way]
        expected = ",".join(
            _event(f"{pairs[a][0]} {pairs[a][1]}", pairs[a][1], *tracks[t], *rest)
            for a, t, *rest in zip(name, thread, starts, ends, microbatch, way, bind, strict=True)
        )
        columns = [np.array(c, dtype=np.int64) for c in (name, thread, starts, ends)]
        columns += [np.array(c, dtype=np.int64) for c in (microbatch, way, bind)]
        assert rows.text(*columns) == expected
        assert rows.text(*[c[:0] for c in columns]) == ""


def test_digit_rows_and_distinct_keys():
    values = np.array([0, 7, 10, 99, -1, -40, 2**32 - 1, 2**32, -(10**15), 10**18])
    rows = trace._digit_rows(values)
    assert [r[r != 0].tobytes().decode() for r in rows] == [str(v) for v in values.tolist()]
    rng = np.random.default_rng(2)
    for keys in (rng.integers(0, 50, 200), rng.integers(0, 10**12, 200), np.zeros(0, np.int64)):
        found, index = trace._distinct(keys)
        expected_found, expected_index = np.unique(keys, return_inverse=True)
        assert found.tolist() == expected_found.tolist()
        assert index.tolist() == expected_index.reshape(-1).tolist()


def _reference_consumers(ops, cols, ns, passes, members, group, gpu_of_op, send_span, consumer):
    """The loop `_first_passes_after` replaced: each group's sends, in op order, and
    for each its group's members on other GPUs, in op order, bisecting the passes."""
    by_key: dict = {}
    for k in sorted(passes, key=lambda k: (cols.start_s[k], k)):
        by_key.setdefault((cols.gpu[k], cols.microbatch[k]), []).append(k)
    groups: dict = {}
    for op, first in sorted(zip(members, group, strict=True)):
        groups.setdefault(first, []).append(op)
    found = {}
    for ops_of in groups.values():
        for sender in [o for o in ops_of if ops[o][3].startswith("send")]:
            if consumer[sender] >= 0 or send_span[sender] < 0:
                continue
            for other in ops_of:
                if gpu_of_op[other] == gpu_of_op[sender]:
                    continue
                line = by_key.get((gpu_of_op[other], ops[sender][4]), [])
                at = bisect_left([cols.start_s[k] for k in line], cols.end_s[send_span[sender]])
                if at < len(line):
                    tied = [k for k in line[at:] if ns[k] == ns[line[at]]]
                    found.setdefault(sender, min(tied))
    return found


def test_blocking_sends_find_the_pass_the_loop_found():
    rng = random.Random(11)
    times = [0.0, 1e-9, 1.4e-9, 1.6e-9, 2e-9, 2.4e-9, 3e-9, 5e-9]  # ties once in whole ns
    linked = 0
    for _ in range(60):
        spans = 50
        start = np.array([rng.choice(times) for _ in range(spans)])
        cols = SimpleNamespace(
            gpu=np.array([rng.randrange(3) for _ in range(spans)]),
            microbatch=np.array([rng.randrange(-1, 3) for _ in range(spans)]),
            start_s=start,
            end_s=start + np.array([rng.choice(times) for _ in range(spans)]),
        )
        laid = SimpleNamespace(columns=cols, starts=trace._ns(start))
        ops = [
            (o, 0, "pp_send", rng.choice(("send", "recv")), rng.randrange(-1, 3)) for o in range(30)
        ]
        gpu_of_op = np.array([rng.randrange(3) for _ in ops])
        members = np.array(sorted(rng.sample(range(len(ops)), 20)))
        group = np.array([rng.choice((0, 4, 9)) for _ in members])
        send_span = np.array([rng.randrange(-1, spans) for _ in ops])
        consumer = np.array([rng.choice((-1, -1, -1, 2)) for _ in ops])
        passes = np.array(sorted(rng.sample(range(spans), rng.randrange(0, spans))), dtype=int)
        sender, span = trace._first_passes_after(
            ops, laid, passes, members, group, gpu_of_op, send_span, consumer
        )
        expected = _reference_consumers(
            ops, cols, laid.starts, passes, members, group, gpu_of_op, send_span, consumer
        )
        assert dict(zip(sender.tolist(), span.tolist(), strict=True)) == expected
        linked += len(expected)
    assert linked > 100

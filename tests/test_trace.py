"""The Perfetto trace: whole-nanosecond boundaries, one track per concurrent slot,
pipeline sends linked to their receives, and nothing Perfetto would drop."""

import gzip
import json
import random
from decimal import Decimal
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.ir.results import Span
from stepsim.report.trace import chrome_trace, slots, to_ns, us
from stepsim.run.idlemap import idle_pieces
from stepsim.run.iteration import run
from stepsim.scenario import load_scenario
from stepsim.schedules import SCHEDULES
from tests import trace_check
from tests.helpers import load

TINY = Path(__file__).resolve().parent.parent / "scenarios" / "tiny-2gpu.toml"


def _written(trace: dict) -> dict:
    """The trace as it reaches Perfetto: through the JSON text."""
    return json.loads(json.dumps(trace, separators=(",", ":")))


def _thread_names(trace: dict) -> dict:
    events = trace["traceEvents"]
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}


def _span(stream, start_s, end_s, gpu=0):
    return Span(gpu, stream, "dp_sync", "x", -1, start_s, end_s, 0)


# -- the checker itself --------------------------------------------------------------------


def _x(ts, dur, tid=0, name="s"):
    return {"ph": "X", "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}


def test_checker_accepts_nesting_disjoint_and_zero_length_slices():
    events = [_x(0, 10), _x(2, 3), _x(5, 5), _x(10, 0), _x(10, 1), _x(11, 0)]
    assert trace_check.problems({"traceEvents": events}) == []


def test_checker_finds_a_partial_overlap_on_a_track_only():
    crossing = [_x(0.0, 10.001), _x(10.0, 5)]  # the second starts 1 ns before the first ends
    assert len(trace_check.problems({"traceEvents": crossing})) == 1
    apart = [_x(0.0, 10.001, tid=0), _x(10.0, 5, tid=1)]
    assert trace_check.problems({"traceEvents": apart}) == []


# -- times in whole nanoseconds ------------------------------------------------------------


def test_microseconds_are_written_exactly_as_whole_nanoseconds():
    """JSON writes n / 1000 as the decimal with three places, so Perfetto's
    llround(value * 1000) and exact decimal arithmetic both give n back."""
    rng = random.Random(7)
    values = [0, 1, 999, 1001, 10**12 + 1, 10**15 - 1]
    values += [rng.randrange(10**15) for _ in range(5000)]
    for n in values:
        text = json.dumps(us(n))
        assert Decimal(text) * 1000 == n, text
        assert trace_check.ns(json.loads(text)) == n


def test_back_to_back_spans_share_their_boundary():
    """Two spans meeting at 0.2712791785 s, half a nanosecond: written as float
    microseconds, ts and dur round apart and the first ends 1 ns after the second
    starts; rounded once to whole ns, both hold 271279178 (or both 271279179)."""
    a, b, c = 0.268728488, 0.2712791785, 0.28
    floats = [_x(a * 1e6, (b - a) * 1e6), _x(b * 1e6, (c - b) * 1e6)]
    assert len(trace_check.problems(_written({"traceEvents": floats}))) == 1
    first, second = (to_ns(a), to_ns(b)), (to_ns(b), to_ns(c))
    assert first[1] == second[0]
    whole = [_x(us(s), us(e - s)) for s, e in (first, second)]
    assert trace_check.problems(_written({"traceEvents": whole})) == []


def test_slots_take_the_lowest_free_one():
    """[0,10] [5,15] [10,20] [12,13] s: the third reuses slot 0 (free at 10), the fourth
    finds slots 0 and 1 busy and opens slot 2."""
    spans = [_span("dp", a, b) for a, b in ((0, 10), (5, 15), (10, 20), (12, 13))]
    starts = [to_ns(sp.start_s) for sp in spans]
    ends = [to_ns(sp.end_s) for sp in spans]
    assert slots(spans, starts, ends) == [0, 1, 0, 2]
    other = [_span("dp", 0, 10), _span("dp", 5, 15, gpu=1), _span("pp", 5, 15)]
    assert slots(other, [0, 5, 5], [10, 15, 15]) == [0, 0, 0]  # per GPU and stream


# -- real traces ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return run(load_scenario(TINY))


def test_tiny_trace_loses_no_slice(tiny):
    trace = _written(chrome_trace(tiny))
    assert trace_check.problems(trace) == []
    assert sum(map(len, trace_check.tracks(trace).values())) == len(tiny.trace.spans)


def test_the_float_microsecond_writer_would_lose_slices(tiny):
    """What the trace used to be (ts, dur as float microseconds of the span's seconds):
    the checker finds the slices Perfetto dropped."""
    trace = chrome_trace(tiny)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for event, sp in zip(complete, tiny.trace.spans, strict=True):
        event["ts"], event["dur"] = sp.start_s * 1e6, (sp.end_s - sp.start_s) * 1e6
        event["tid"] = 0 if sp.stream == "compute" else 1
    assert len(trace_check.problems(_written(trace))) > 0


def test_tiny_pipeline_sends_flow_to_their_receives(tiny):
    """Two stages, 8 micro-batches: 8 activation sends 0 -> 1 and 8 gradient sends
    1 -> 0, each linked to the op on the other GPU that consumes it, which starts after
    the send has ended."""
    trace = _written(chrome_trace(tiny))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    out = {e["bind_id"]: e for e in events if e.get("flow_out")}
    into = {e["bind_id"]: e for e in events if e.get("flow_in")}
    assert trace_check.check_flows(trace) == []
    assert len(out) == 16 and out.keys() == into.keys()
    names = _thread_names(trace)
    for key, send in out.items():
        receive = into[key]
        # Megatron's batched blocking p2p (tiny's default engine) holds a send and a
        # receive on the pp stream at once: the send may sit on its second track
        assert send["cat"] == "pp_send" and names[(send["pid"], send["tid"])].startswith("pp send")
        assert send["name"].startswith("send")
        assert receive["pid"] == 1 - send["pid"]
        assert receive["cat"] == ("forward" if send["pid"] == 0 else "backward")
        assert trace_check.ns(receive["ts"]) >= trace_check.ns(send["ts"]) + trace_check.ns(
            send["dur"]
        )
        assert receive["args"]["microbatch"] == send["args"]["microbatch"]


def test_counters_are_on_whole_nanoseconds(tiny):
    counters = [e for e in chrome_trace(tiny)["traceEvents"] if e["ph"] == "C"]
    assert counters
    for event in counters:
        assert Decimal(json.dumps(event["ts"])) * 1000 % 1 == 0


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_traces_whole(name):
    v = 2 if SCHEDULES[name].chunked else 1
    untied = SCHEDULES[name].placement == "dual"  # dualpipe's copies: untied embeddings
    result = run(
        load(
            model={"num_layers": 8, "vocab_size": 16, "seq_length": 512},
            parallel={
                "pipeline_model_parallel_size": 4,
                "virtual_pipeline_model_parallel_size": v,
                "data_parallel_size": 2,
            },
            training={
                "global_batch_size": 16,
                "schedule": name,
                "overlap_grad_reduce": True,
                **({"share_embeddings_and_output_weights": False} if untied else {}),
            },
        )
    )
    trace = _written(chrome_trace(result))
    assert trace_check.problems(trace) == []
    assert trace_check.check_flows(trace) == []
    assert sum(map(len, trace_check.tracks(trace).values())) == len(result.trace.spans)


DP_MODES = [
    (overlap, sharding, symmetry)
    for overlap in (False, True)
    for sharding in ("none", "optimizer", "full")
    for symmetry in (True, False)
]


@pytest.mark.parametrize(("overlap", "sharding", "symmetry"), DP_MODES)
def test_every_data_parallel_mode_traces_whole(overlap, sharding, symmetry):
    result = run(
        load(
            parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 2},
            training={
                "global_batch_size": 8,
                "overlap_grad_reduce": overlap,
                "data_parallel_sharding": sharding,
            },
            network={"symmetry": symmetry},
        )
    )
    trace = _written(chrome_trace(result))
    assert trace_check.problems(trace) == []
    assert trace_check.check_flows(trace) == []
    assert sum(map(len, trace_check.tracks(trace).values())) == len(result.trace.spans)


def test_concurrent_gradient_collectives_get_tracks_of_their_own():
    """With overlap_grad_reduce each layer's gradients are reduced as soon as they are
    ready, several at once on the data-parallel stream: more than one dp track, each
    named, and no two slices of a track overlap."""
    result = run(
        load(
            parallel={"pipeline_model_parallel_size": 2, "data_parallel_size": 2},
            training={"global_batch_size": 8, "overlap_grad_reduce": True},
        )
    )
    trace = _written(chrome_trace(result))
    names = _thread_names(trace)
    assert "dp comm #2" in names.values()
    for track, found in trace_check.tracks(trace).items():
        assert track in names
        for (_, end, _), (start, _, _) in zip(found, found[1:], strict=False):
            assert end <= start


# -- the run command's trace files ----------------------------------------------------------


def test_run_writes_a_gzipped_trace_or_none(tmp_path, capsys):
    assert main(["run", str(TINY), "--out", str(tmp_path / "gz"), "--trace", "gz"]) == 0
    assert "trace.json.gz" in capsys.readouterr().out
    assert not (tmp_path / "gz" / "trace.json").exists()
    packed = (tmp_path / "gz" / "trace.json.gz").read_bytes()
    trace = json.loads(gzip.decompress(packed))
    assert trace_check.problems(trace) == [] and trace["otherData"]["scenario"] == "tiny-2gpu"
    assert main(["run", str(TINY), "--out", str(tmp_path / "gz"), "--trace", "gz"]) == 0
    assert (tmp_path / "gz" / "trace.json.gz").read_bytes() == packed  # deterministic
    assert main(["run", str(TINY), "--out", str(tmp_path / "none"), "--no-trace"]) == 0
    assert "trace" not in capsys.readouterr().out.split("wrote")[-1]
    written = sorted(p.name for p in (tmp_path / "none").iterdir())
    assert written == [
        "breakdown.svg",
        "metrics.json",
        "scenario.resolved.toml",
        "stepsim-manifest.json",  # cli/outfolder.py: the folder is complete
        "timeline.svg",
    ]
    assert main(["run", str(TINY), "--out", str(tmp_path / "bare"), "--pictures", "none"]) == 0
    assert "timeline" not in capsys.readouterr().out.split("wrote")[-1]
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == [
        "metrics.json",
        "scenario.resolved.toml",
        "stepsim-manifest.json",
        "trace.json",
    ]


def test_trace_and_no_trace_exclude_each_other(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["run", str(TINY), "--trace", "gz", "--no-trace"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_text_of_a_microsecond_is_its_float_repr():
    from stepsim.report.trace import us_text

    rng = random.Random(7)
    values = [0, 1, 9, 10, 999, 1000, 1001, 1500, 10**12 + 7, 10**15 - 1, 10**15, 10**16 + 3]
    values += [rng.randrange(10**15) for _ in range(2000)]
    for n in values:
        assert us_text(n) == repr(us(n)), n


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["parallel.virtual_pipeline_model_parallel_size=2", 'training.schedule="interleaved"'],
        ['training.framework="deepspeed"', 'training.framework_version="0.5.4"'],
    ],
)
def test_the_trace_text_is_the_json_of_the_trace_document(overrides):
    """The CLI writes the trace as text, event by event: the same bytes as the compact
    json.dumps of `chrome_trace`'s document (flows, counters and metadata included)."""
    from stepsim.report.trace import chrome_trace_bytes

    result = run(load_scenario(TINY, overrides))
    document = chrome_trace(result)
    assert any("bind_id" in event for event in document["traceEvents"])
    assert chrome_trace_bytes(result) == json.dumps(document, separators=(",", ":")).encode()
    idle = idle_pieces(result)  # with the idle by cause (the run command's)
    document = chrome_trace(result, idle)
    assert any(event.get("cat") == "idle_by_cause" for event in document["traceEvents"])
    assert chrome_trace_bytes(result, idle) == json.dumps(document, separators=(",", ":")).encode()


def test_idle_pieces_sit_on_a_track_of_their_own(tiny):
    """Each GPU's idle by cause: slices named by cause on its "idle by cause" track,
    under its compute track, adding up to its idle pieces to the nanosecond; nothing
    Perfetto would drop, and the other tracks as they were."""
    from stepsim.report.idle import IDLE_CAUSE_STYLES

    idle = idle_pieces(tiny)
    trace = _written(chrome_trace(tiny, idle))
    assert trace_check.problems(trace) == []
    names = _thread_names(trace)
    found = trace_check.tracks(trace)
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "idle_by_cause"]
    assert {e["name"] for e in slices} == {style.legend for style in IDLE_CAUSE_STYLES.values()}
    for gpu, pieces in idle.items():
        assert names[(gpu, 0)] == "compute" and names[(gpu, 1)] == "idle by cause"
        mine = [e for e in slices if e["pid"] == gpu]
        assert {e["tid"] for e in mine} == {1}
        assert {e["args"]["cause"] for e in mine} == {p.cause for p in pieces}
        total_ns = sum(trace_check.ns(e["dur"]) for e in mine)
        assert abs(total_ns - sum(p.end_s - p.start_s for p in pieces) * 1e9) <= len(mine)
    assert sum(len(v) for k, v in found.items() if names[k] != "idle by cause") == len(
        tiny.trace.spans
    )

"""A run's idle split by cause (run/bubble.py `idle_causes`): the schedule's own bubble,
stage imbalance and waits on communication, by closed form and against the engine."""

import math
from pathlib import Path

import pytest

from stepsim.emit.abstract import abstract_pipeline
from stepsim.engine.core import simulate
from stepsim.ir.vocabulary import COMPUTE_STREAM, MODEL_KINDS
from stepsim.run.bubble import free_idle, idle_causes
from stepsim.run.idlemap import idle_pieces, split_idle
from stepsim.schedules import SCHEDULES
from stepsim.schedules import build as build_schedule

TINY = Path(__file__).resolve().parent.parent / "scenarios" / "tiny-2gpu.toml"


def _engine_idle(orders, rank_times, v, placement):
    trace = _abstract_run(orders, rank_times, v, placement)
    busy = [0.0] * len(orders)
    for span in trace.spans:
        if span.stream == COMPUTE_STREAM and span.kind in MODEL_KINDS:
            busy[span.gpu] += span.end_s - span.start_s
    return [trace.end_s - b for b in busy]


@pytest.mark.parametrize(
    "name, p, m, v",
    [
        ("1f1b", 4, 8, 1),
        ("interleaved", 4, 8, 2),
        ("zbh1", 4, 8, 1),
        ("zbv", 4, 8, 2),
        ("dualpipe", 4, 8, 2),
        ("gpipe", 3, 5, 1),
    ],
)
def test_the_direct_computation_is_the_engines(name, p, m, v):
    """Free communication: each op starts at its rank's previous op's end or its input's,
    whichever is later; the engine on the same abstract workload agrees to rounding."""
    orders = build_schedule(name, p, m, v)
    split = SCHEDULES[name].split_backward
    rank_times = [(1.0 + 0.3 * r, 2.0 + 0.1 * r, (0.7 if split else 0.0)) for r in range(p)]
    placement = SCHEDULES[name].placement
    direct = free_idle(orders, rank_times, num_chunks=v, placement=placement)
    engine = _engine_idle(orders, rank_times, v, placement)
    assert direct == pytest.approx(engine, rel=1e-9, abs=1e-9)


def test_equal_stages_and_free_communication_give_the_textbook_bubble():
    """1F1B with p stages of equal F and B: (p - 1)(F + B) per rank, nothing else."""
    p, m, f, b = 4, 8, 1.0, 2.0
    orders = build_schedule("1f1b", p, m, 1)
    idle = (p - 1) * (f + b)
    causes = idle_causes(orders, [(f, b, 0.0)] * p, idle, num_chunks=1, placement="looped")
    assert causes.schedule_s == pytest.approx(idle)
    assert causes.imbalance_s == 0.0 and causes.communication_s == 0.0


def test_a_slower_stage_adds_exactly_its_surplus_as_imbalance():
    """1F1B on two stages, the last slower (F', B'): it runs back to back from the first
    forward's end f, so the makespan is f + m (F' + B') + b (the first stage's last
    backward); the idle beyond the equal-stage bubble is the imbalance, and whatever
    idle the run had on top is communication's."""
    m, f, b, f2, b2 = 8, 1.0, 2.0, 1.5, 3.0
    orders = build_schedule("1f1b", 2, m, 1)
    times = [(f, b, 0.0), (f2, b2, 0.0)]
    makespan = f + m * (f2 + b2) + b
    own = (2 * makespan - m * (f + b) - m * (f2 + b2)) / 2
    kw = {"num_chunks": 1, "placement": "looped"}
    assert math.fsum(free_idle(orders, times, **kw)) / 2 == pytest.approx(own)
    mf, mb = (f + f2) / 2, (b + b2) / 2
    equal = mf + mb  # (p - 1)(F + B) per rank at the mean times
    assert math.fsum(free_idle(orders, [(mf, mb, 0.0)] * 2, **kw)) / 2 == pytest.approx(equal)
    idle = own + 1.0  # one more second of waiting: communication's
    causes = idle_causes(orders, times, idle, **kw)
    assert causes.schedule_s == pytest.approx(equal)
    assert causes.imbalance_s == pytest.approx(own - equal)
    assert causes.communication_s == pytest.approx(1.0)


def test_the_parts_never_exceed_the_idle_they_split():
    orders = build_schedule("1f1b", 4, 8, 1)
    times = [(1.0, 2.0, 0.0), (1.0, 2.0, 0.0), (2.0, 4.0, 0.0), (1.0, 2.0, 0.0)]
    causes = idle_causes(orders, times, 0.5, num_chunks=1, placement="looped")
    assert causes.schedule_s + causes.imbalance_s + causes.communication_s == pytest.approx(0.5)
    assert min(causes.schedule_s, causes.imbalance_s, causes.communication_s) >= 0.0


def test_a_run_reports_its_idle_by_cause_adding_up_to_it():
    from pathlib import Path

    from stepsim.report.summary import summary_text
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    tiny = Path(__file__).resolve().parent.parent / "scenarios" / "tiny-2gpu.toml"
    result = run(load_scenario(tiny))
    m = result.metrics
    assert m.idle_by_cause_s is not None
    assert math.fsum(m.idle_by_cause_s.values()) == pytest.approx(m.breakdown_s["idle"])
    assert m.to_json()["idle_by_cause_s"] == m.idle_by_cause_s
    assert "the schedule's own" in summary_text(result)
    # p = 2, m = 8: the schedule's own bubble is (p - 1)(F + B) at the stages' mean
    f = sum(t[0] for t in _times(result)) / 2
    b = sum(t[1] for t in _times(result)) / 2
    assert m.idle_by_cause_s["schedule"] == pytest.approx(f + b)
    one = run(load_scenario(tiny, ["parallel.pipeline_model_parallel_size=1"]))
    assert one.metrics.idle_by_cause_s is None and "idle_by_cause_s" not in one.metrics.to_json()


def _times(result):
    from stepsim.run.bubble import PASS_OF_KIND, pass_times

    return pass_times(result.workload, 2, PASS_OF_KIND)


# -- the idle pieces: each stretch of a GPU's idle by cause (run/idlemap.py) ------------------


def _abstract_run(orders, rank_times, v=1, placement="looped", latency=0.0):
    workload = abstract_pipeline(
        orders,
        forward_s=0.0,
        backward_s=0.0,
        num_chunks=v,
        placement=placement,
        rank_times=rank_times,
        p2p_latency_s=latency,
    )
    return simulate(workload)


def _sums(pieces):
    """GPU -> seconds per cause."""
    return {
        gpu: {c: math.fsum(p.end_s - p.start_s for p in found if p.cause == c) for c in CAUSES}
        for gpu, found in pieces.items()
    }


def _busy(trace, gpu):
    from stepsim.ir.vocabulary import CATEGORY_OF_KIND, IDLE_TIME
    from stepsim.report.metrics import spans_per_gpu  # a congruent group's GPUs: its lane's

    return sorted(
        (sp.start_s, sp.end_s)
        for sp in spans_per_gpu(trace)
        if sp.gpu == gpu and sp.stream == COMPUTE_STREAM and CATEGORY_OF_KIND[sp.kind] != IDLE_TIME
    )


def _covered(intervals):
    """The length of the union of the intervals."""
    total, at = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > at:
            total += end - max(start, at)
            at = end
    return total


def _assert_pieces_fill_the_idle(trace, pieces):
    """Per GPU, the pieces and the busy spans tile the iteration: no overlap, no hole."""
    for gpu, found in pieces.items():
        busy, idle = _busy(trace, gpu), [(p.start_s, p.end_s) for p in found]
        assert all(a < b for a, b in idle)
        assert _covered(busy + idle) == pytest.approx(trace.end_s, rel=1e-12)
        assert _covered(busy) + _covered(idle) == pytest.approx(trace.end_s, rel=1e-12)
        assert _covered(idle) == pytest.approx(math.fsum(b - a for a, b in idle), rel=1e-12)


CAUSES = ("schedule", "imbalance", "communication")


@pytest.mark.parametrize("name, v", [("1f1b", 1), ("interleaved", 2), ("zbv", 2)])
def test_equal_stages_and_free_communication_idle_on_the_schedule_alone(name, v):
    """The simulated run is the mean-time run itself: every piece is the schedule's, and
    with 1F1B each GPU's add up to (p - 1)(F + B)."""
    p, m = 4, 8
    split = SCHEDULES[name].split_backward
    times = (1.0, 2.0, 0.5 if split else 0.0)
    orders = build_schedule(name, p, m, v)
    placement = SCHEDULES[name].placement
    trace = _abstract_run(orders, [tuple(t / v for t in times)] * p, v, placement)
    pieces = split_idle(trace, orders, [times] * p, num_chunks=v, placement=placement)
    assert {piece.cause for found in pieces.values() for piece in found} == {"schedule"}
    _assert_pieces_fill_the_idle(trace, pieces)
    if name == "1f1b":
        for sums in _sums(pieces).values():
            assert sums["schedule"] == pytest.approx((p - 1) * (1.0 + 2.0))


def test_a_slower_last_stage_is_imbalance_on_the_stage_before_it():
    """1F1B on two stages, the last slower by d = F' + B' - F - B per micro-batch (the
    closed forms of test_a_slower_stage_adds_exactly_its_surplus_as_imbalance): the slow
    stage idles f + b, all of it the schedule's; the fast one idles f + b + m d, of which
    the schedule's bubble 2(F̄ + B̄) less the slow stage's f + b and the rest, (m - 1) d,
    is imbalance: the pieces' mean is the split's, (m - 1) d / 2, its surplus exactly.
    Between its first and last backward the fast stage waits d before each backward,
    all of it imbalance."""
    m, f, b, f2, b2 = 8, 1.0, 2.0, 1.5, 3.0
    d = f2 + b2 - f - b
    orders = build_schedule("1f1b", 2, m, 1)
    times = [(f, b, 0.0), (f2, b2, 0.0)]
    trace = _abstract_run(orders, times)
    pieces = split_idle(trace, orders, times, num_chunks=1, placement="looped")
    sums = _sums(pieces)
    assert sums[1] == pytest.approx({"schedule": f + b, "imbalance": 0.0, "communication": 0.0})
    mean = (f + f2) / 2 + (b + b2) / 2
    assert sums[0]["schedule"] == pytest.approx(2 * mean - (f + b))
    assert sums[0]["imbalance"] == pytest.approx((m - 1) * d)
    assert sums[0]["communication"] == 0.0
    causes = idle_causes(
        orders, times, (f + b + f + b + m * d) / 2, num_chunks=1, placement="looped"
    )
    assert (sums[0]["imbalance"] + sums[1]["imbalance"]) / 2 == pytest.approx(causes.imbalance_s)
    steady = [
        p for p in pieces[0] if p.cause == "imbalance" and p.end_s - p.start_s == pytest.approx(d)
    ]
    assert len(steady) == m - 2
    _assert_pieces_fill_the_idle(trace, pieces)


def test_a_hop_latency_is_waiting_on_communication():
    """Equal stages, a latency c on every hop: the pieces' mean per cause is the split
    of the run's own idle (idle_causes), the latency's share waiting on communication."""
    p, m, c = 4, 8, 0.25
    orders = build_schedule("1f1b", p, m, 1)
    times = [(1.0, 2.0, 0.0)] * p
    trace = _abstract_run(orders, times, latency=c)
    pieces = split_idle(trace, orders, times, num_chunks=1, placement="looped")
    sums = _sums(pieces)
    idle = math.fsum(math.fsum(s.values()) for s in sums.values()) / p
    causes = idle_causes(orders, times, idle, num_chunks=1, placement="looped")
    expected_s = (causes.schedule_s, causes.imbalance_s, causes.communication_s)
    for cause, expected in zip(CAUSES, expected_s, strict=True):
        assert math.fsum(s[cause] for s in sums.values()) / p == pytest.approx(expected)
    assert causes.communication_s > 0 and causes.imbalance_s == 0
    _assert_pieces_fill_the_idle(trace, pieces)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["parallel.virtual_pipeline_model_parallel_size=2", 'training.schedule="interleaved"'],
        ['training.schedule="dualpipe"', "training.share_embeddings_and_output_weights=false"],
        [
            "network.symmetry=false",
            "parallel.tensor_model_parallel_size=2",
            "cluster.gpus_per_node=4",
            "cluster.nics_per_node=4",
        ],
    ],
)
def test_a_runs_pieces_add_up_to_its_idle_by_cause(overrides):
    """The pieces' mean over GPUs is the metrics' idle_by_cause_s, per cause, and each
    GPU's pieces fill exactly the idle its compute stream's spans leave."""
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    result = run(load_scenario(TINY, overrides))
    pieces = idle_pieces(result)
    stands = {}
    for lane in result.trace.lanes:
        if lane.stream == COMPUTE_STREAM:
            for k in range(lane.copies):
                stands[lane.gpu + k] = lane.stands_for
    sums = _sums(pieces)
    total = sum(stands.values())
    for cause in CAUSES:
        mean = math.fsum(stands[g] * s[cause] for g, s in sums.items()) / total
        assert mean == pytest.approx(result.metrics.idle_by_cause_s[cause], rel=1e-9, abs=1e-15)
    _assert_pieces_fill_the_idle(result.trace, pieces)
    assert (
        idle_pieces(run(load_scenario(TINY, ["parallel.pipeline_model_parallel_size=1"]))) is None
    )


def test_a_fast_forwarded_runs_pieces_split_the_run_it_shows():
    """A fast-forward's trace holds the micro-batches it simulated: its pieces are split
    against that shorter run's orders and fill its idle."""
    from stepsim.cost.orders import stage_orders
    from stepsim.run.bubble import PASS_OF_KIND, pass_times
    from stepsim.run.fastforward import with_microbatches
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    result = run(
        load_scenario(TINY, ["training.global_batch_size=240", "parallel.data_parallel_size=1"])
    )
    ff = result.metrics.fast_forward
    assert ff is not None
    pieces = idle_pieces(result)
    _assert_pieces_fill_the_idle(result.trace, pieces)
    short = with_microbatches(result.scenario, ff.simulated_microbatches)
    sums = _sums(pieces)
    idle = math.fsum(math.fsum(s.values()) for s in sums.values()) / len(sums)
    times = pass_times(result.workload, 2, PASS_OF_KIND)
    causes = idle_causes(stage_orders(short), times, idle, num_chunks=1, placement="looped")
    expected_s = (causes.schedule_s, causes.imbalance_s, causes.communication_s)
    for cause, expected in zip(CAUSES, expected_s, strict=True):
        assert math.fsum(s[cause] for s in sums.values()) / len(sums) == pytest.approx(expected)


def test_the_timeline_draws_the_idle_by_cause(monkeypatch):
    """Three light colours with their legend entries, in bars and binned (each cause's
    share of a time slice, said in the legend's title); no plain idle entry then."""
    from matplotlib.colors import to_rgb

    from stepsim.report import timeline
    from stepsim.report.idle import IDLE_CAUSE_STYLES
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    result = run(load_scenario(TINY))
    idle = idle_pieces(result)
    labels = [style.legend for style in IDLE_CAUSE_STYLES.values()]
    assert labels == [
        "idle: schedule's own bubble",
        "idle: stage imbalance",
        "idle: waiting on communication",
    ]
    figure = timeline.timeline_figure(result, idle)
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert set(labels) <= set(legend) and "idle (bubble)" not in legend
    faces = {
        tuple(face[:3])
        for collection in figure.axes[0].collections
        for face in collection.get_facecolors()
    }
    assert {to_rgb(style.color) for style in IDLE_CAUSE_STYLES.values()} <= faces
    monkeypatch.setattr(timeline, "RASTER_ABOVE_SPANS", 10)
    binned = timeline.timeline_figure(result, idle)
    assert "idle by cause" in binned.legends[0].get_title().get_text()
    assert set(labels) <= {t.get_text() for t in binned.legends[0].get_texts()}
    picture = binned.axes[0].images[0].get_array()  # every band, as RGBA bytes
    band = picture[: timeline.RASTER_PIXELS[0]]  # stage 0's compute band: it waits on stage 1
    colours = {tuple(pixel) for pixel in band[..., :3].reshape(-1, 3).tolist()}
    imbalance = to_rgb(IDLE_CAUSE_STYLES["imbalance"].color)
    assert tuple(round(255 * c) for c in imbalance) in colours

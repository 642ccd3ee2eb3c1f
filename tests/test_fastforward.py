"""The steady-state fast-forward (simulator/run/fastforward.py, engine/steady.py): where it
is proved, its metrics equal the full simulation's to rounding; where not, the run is
the full simulation, bit for bit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stepsim.cost.orders import stage_orders
from stepsim.emit.lowering import lower
from stepsim.emit.p2pcalls import p2p_items
from stepsim.engine import steady
from stepsim.engine.core import _Engine
from stepsim.engine.network import FairShareNetwork
from stepsim.engine.steady import same
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import COMPUTE_STREAM, FORWARD
from stepsim.report.summary import summary_text
from stepsim.report.trace import chrome_trace
from stepsim.run.iteration import PEAK_BINS, build_cluster, fastforward, run
from stepsim.scenario import scenario_from_dict
from tests import trace_check
from tests.helpers import scenario

# the short runs are m' = p v + 2 q micro-batches (2 p v + 4 q where the backward is
# split); these m are at least 10 m' (the cost rule, `fastforward.worth_it`, takes m
# from about 2.2 m'; a split backward 10 m')
CASES = [
    ("1f1b", 120, 1),  # m' = 6, q = 1
    ("interleaved", 320, 2),  # m' = 16, q = 4 (the micro-batch group)
    ("zbh1", 120, 1),  # m' = 12
    ("zbv_unit", 200, 2),  # m' = 20
]


def _scenario(schedule, m, chunks=1, overlap=False, fast_forward=None, **training):
    parallel = {"pipeline_model_parallel_size": 4, "data_parallel_size": 2}
    if chunks > 1:
        parallel["virtual_pipeline_model_parallel_size"] = chunks
    network = {"model": "fair-share"}
    if fast_forward is not None:
        network["fast_forward"] = fast_forward
    doc = scenario(
        model={"num_layers": 8},
        parallel=parallel,
        training={
            "global_batch_size": 2 * m,
            "schedule": schedule,
            "overlap_grad_reduce": overlap,
            **training,
        },
        network=network,
    )
    return scenario_from_dict(doc)


def _numbers(metrics) -> dict:
    out = metrics.to_json()
    out.pop("fast_forward", None)
    # the fast-forward says so among the assumptions; the full run does not
    out["assumptions"] = [a for a in out["assumptions"] if not a.startswith("fast-forwarded")]
    out.pop("busiest_links")  # links of equal load may be named differently (below)
    return out


def _close(a, b, rel: float) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key], rel)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y, rel)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-15)
    else:
        assert a == b


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(("schedule", "m", "chunks"), CASES)
def test_fast_forward_equals_the_full_run(schedule, m, chunks, overlap):
    fast = run(_scenario(schedule, m, chunks, overlap))
    full = run(_scenario(schedule, m, chunks, overlap, fast_forward=False))
    used = fast.metrics.fast_forward
    assert used is not None and full.metrics.fast_forward is None
    assert any(a.startswith("fast-forwarded") for a in fast.metrics.assumptions)
    assert used.simulated_microbatches + used.periods_skipped * used.period_microbatches == m
    # the same numbers but for rounding (measured: iteration time within 2e-14)
    assert fast.metrics.iteration_time_s == pytest.approx(full.metrics.iteration_time_s, rel=1e-12)
    _close(_numbers(fast.metrics), _numbers(full.metrics), rel=1e-9)
    # counted, not simulated: spans by their start, transfers as started
    assert fast.metrics.simulated_spans == full.metrics.simulated_spans
    assert fast.metrics.simulated_transfers == full.metrics.simulated_transfers
    # the trace is the short run's, and a valid one
    assert fast.trace.end_s < full.trace.end_s
    trace = json.loads(json.dumps(chrome_trace(fast), separators=(",", ":")))
    assert trace_check.problems(trace) == []
    assert "fast_forward" in trace["otherData"]
    assert "fast_forward" not in json.loads(json.dumps(chrome_trace(full)))["otherData"]
    assert fast.metrics.to_json()["fast_forward"]["period_microbatches"] == (
        4 if schedule == "interleaved" else 1
    )


@pytest.mark.parametrize(("tensor", "collapsed"), [(2, True), (1, False)])
def test_exact_mode_is_fast_forwarded_as_the_full_run(tensor, collapsed):
    """Exact mode (every GPU simulated, a congruent TP group as one lane) fast-forwards
    as symmetric mode does: the proof is the engine's state, whatever the lanes. The
    metrics are the full exact run's, spans and transfers counted per GPU (a collapsed
    group's lane once per rank)."""

    def exact(fast_forward):
        network = {"model": "fair-share", "symmetry": False}
        if fast_forward is not None:
            network["fast_forward"] = fast_forward
        doc = scenario(
            model={"num_layers": 8},
            cluster={"num_nodes": tensor},
            parallel={
                "tensor_model_parallel_size": tensor,
                "pipeline_model_parallel_size": 4,
                "data_parallel_size": 2,
            },
            training={"global_batch_size": 120, "schedule": "1f1b"},
            network=network,
        )
        return scenario_from_dict(doc)

    fast, full = run(exact(None)), run(exact(False))
    assert any(lane.copies > 1 for lane in fast.workload.lanes) == collapsed
    assert fast.metrics.fast_forward is not None and full.metrics.fast_forward is None
    assert fast.metrics.iteration_time_s == pytest.approx(full.metrics.iteration_time_s, rel=1e-12)
    _close(_numbers(fast.metrics), _numbers(full.metrics), rel=1e-9)
    assert fast.metrics.simulated_spans == full.metrics.simulated_spans
    assert fast.metrics.simulated_transfers == full.metrics.simulated_transfers


def test_link_loads_equal_the_full_run():
    """Each link's utilization over the iteration and over time, from the short run and
    its inserted periods, against the full run's, link for link."""
    scenario = _scenario("1f1b", 120, overlap=True)
    full = run(_scenario("1f1b", 120, overlap=True, fast_forward=False))
    cluster = build_cluster(scenario.cluster, pattern=True)
    network = FairShareNetwork.factory(cluster.capacities)
    plan = fastforward.fast_forward(scenario, lambda s: lower(s, cluster), network)
    assert plan is not None
    end_s, utilization, series_of = fastforward.link_loads(plan, cluster.capacities, PEAK_BINS)
    assert end_s == pytest.approx(full.metrics.iteration_time_s, rel=1e-12)
    chosen = [link.index for link in full.metrics.busiest_links]
    assert chosen
    series = series_of(chosen)
    for link in full.metrics.busiest_links:
        assert utilization[link.index] == pytest.approx(link.utilization, rel=1e-9)
        assert series[link.index].max() == pytest.approx(link.peak_utilization, rel=1e-9)


@pytest.mark.parametrize(
    ("schedule", "m", "chunks", "why"),
    [
        ("gpipe", 240, 1, "all forwards, then all backwards: no period is inserted"),
        ("looped_bfs", 240, 2, "breadth first: no period is inserted"),
        ("1f1b", 12, 1, "m = 2 m': the full run is expected to cost less"),
        ("zbh1", 60, 1, "a split backward is tried from 10 m' only"),
    ],
)
def test_falls_back_to_the_full_run_bit_for_bit(schedule, m, chunks, why):
    fast = run(_scenario(schedule, m, chunks))
    full = run(_scenario(schedule, m, chunks, fast_forward=False))
    assert fast.metrics.fast_forward is None, why
    assert fast.metrics.to_json() == full.metrics.to_json()
    assert fast.trace.spans == full.trace.spans


@pytest.mark.parametrize("m", [24, 30])
def test_a_few_short_runs_long_is_fast_forwarded(m):
    """m' = 6 here: m = 4 m' and 5 m' (under the 10 m' of before) are fast-forwarded, as
    the fast-forward is expected to cost less than the full run, and the iteration is
    the full run's to 1e-9 relative."""
    fast = run(_scenario("1f1b", m))
    full = run(_scenario("1f1b", m, fast_forward=False))
    used = fast.metrics.fast_forward
    assert used is not None and used.simulated_microbatches == 6
    assert fastforward.worth_it(m, used.simulated_microbatches)
    assert any(a.startswith("fast-forwarded") for a in fast.metrics.assumptions)
    assert fast.metrics.iteration_time_s == pytest.approx(full.metrics.iteration_time_s, rel=1e-9)


def test_the_rule_compares_expected_costs():
    """On synthetic costs (in micro-batches of the full run): the fast-forward is used
    when ``short_cost x m' + orders_cost x m`` is below ``m``, not at it."""
    assert fastforward.expected_cost(100, 20, short_cost=2.0, orders_cost=0.1) == 50.0
    assert fastforward.worth_it(41, 20, short_cost=2.0, orders_cost=0.0)
    assert not fastforward.worth_it(40, 20, short_cost=2.0, orders_cost=0.0)
    # a schedule check of half a micro-batch per micro-batch doubles the threshold
    assert not fastforward.worth_it(80, 20, short_cost=2.0, orders_cost=0.5)
    assert fastforward.worth_it(81, 20, short_cost=2.0, orders_cost=0.5)
    # a cost per micro-batch of m at or above a full run's is never worth it
    assert not fastforward.worth_it(10**9, 1, short_cost=0.1, orders_cost=1.0)
    # longer runs only get more worth it, and the threshold is between 2 and 10 m'
    for m_short in (8, 36, 74):
        found = [m for m in range(1, 20 * m_short) if fastforward.worth_it(m, m_short)]
        assert found == list(range(found[0], 20 * m_short))
        assert 2 * m_short < found[0] < 10 * m_short
        # where the proof may fail, from RISKY_SAVING x m' on, as before
        risky = [
            m
            for m in range(1, 20 * m_short)
            if fastforward.worth_it(m, m_short, proof_may_fail=True)
        ]
        assert risky[0] == fastforward.RISKY_SAVING * m_short


def test_no_period_in_the_orders_costs_no_lowering():
    """GPipe's orders of m' + 1 are not m''s with a period inserted: refused before
    either short scenario is lowered."""
    lowered = []
    s = _scenario("gpipe", 240)
    network = FairShareNetwork.factory(())
    assert fastforward.fast_forward(s, lowered.append, network) is None
    assert lowered == []


def test_perturbed_runs_are_simulated_in_full():
    s = _scenario("1f1b", 120)
    doc = scenario(
        model={"num_layers": 8},
        parallel={"pipeline_model_parallel_size": 4, "data_parallel_size": 2},
        training={"global_batch_size": 240, "schedule": "1f1b"},
        perturbation=[{"kind": "slow_gpu", "gpu": 1, "factor": 1.1}],
    )
    perturbed = scenario_from_dict(doc)
    assert fastforward.applies(s) and not fastforward.applies(perturbed)
    assert run(perturbed).metrics.fast_forward is None


def _chain(m: int, consumer_s: float):
    """Two lanes: a forward per micro-batch (1 s), and a consumer of each (``consumer_s``)."""
    builder = WorkloadBuilder()
    a = builder.lane(gpu=0, stream=COMPUTE_STREAM, stage=0)
    b = builder.lane(gpu=1, stream=COMPUTE_STREAM, stage=1)
    made = [builder.add(a, FORWARD, f"F{i}", microbatch=i, duration_s=1.0) for i in range(m)]
    for i in range(m):
        builder.add(b, FORWARD, f"G{i}", microbatch=i, duration_s=consumer_s, deps=(made[i],))
    return builder.build()


@pytest.mark.parametrize(("consumer_s", "proved"), [(1.0, True), (0.5, True), (1.5, False)])
def test_the_state_must_repeat(consumer_s, proved):
    """Both chains insert one op per lane per micro-batch; only where the consumer keeps
    up does the state repeat (a slower one falls further behind every period)."""
    shape = fastforward._insertion(_chain(12, consumer_s), _chain(13, consumer_s), 1)
    assert shape is not None
    plan = fastforward._prove(
        None, _chain(12, consumer_s), FairShareNetwork.factory(()), shape, 100, 1
    )
    assert (plan is not None) == proved
    if proved:
        assert plan.second.time_s - plan.first.time_s == pytest.approx(1.0)
        assert fastforward.iteration_s(plan) == pytest.approx(112 + consumer_s)


def test_same_compares_numbers_within_tolerance():
    assert same((1, (2.0, "a")), (1, (2.0 + 1e-12, "a")), 1e-9)
    assert not same((1, (2.0, "a")), (1, (2.1, "a")), 1e-9)
    assert not same((1, (2.0,)), (1, (2.0, 3.0)), 1e-9)
    assert not same(("lane op", 1), ("lane op", 2), 1e-9)


def test_context_parallel_wire_time_counts_the_skipped_periods():
    """The summary's CP time on the wire is read off the trace: a fast-forwarded run's
    adds the skipped periods' copies of its proved period."""
    parallel = {"pipeline_model_parallel_size": 4, "data_parallel_size": 1}
    results = []
    for fast_forward in (True, False):
        doc = scenario(
            model={"num_layers": 8},
            parallel={**parallel, "context_parallel_size": 2},
            training={"global_batch_size": 120, "attention_backend": "flash"},
            network={"fast_forward": fast_forward},
        )
        results.append(run(scenario_from_dict(doc)))
    assert results[0].metrics.fast_forward is not None
    lines = [
        [line for line in summary_text(r).splitlines() if "CP communication" in line]
        for r in results
    ]
    assert lines[0] == lines[1] and len(lines[0]) == 1


# -- the observed run and the insertion checks against their first, plainer forms ----------

# small layouts whose short runs cover what the snapshots describe: TP collectives alone on
# lane 0's links, interleaving, a split backward, overlapped gradient reduces, DeepSpeed's
# blocking p2p pairs
OBSERVED = [
    ("1f1b", 120, 1, {"tensor_model_parallel_size": 2, "data_parallel_size": 1}, {}),
    ("interleaved", 320, 2, {}, {"overlap_grad_reduce": True}),
    ("zbh1", 120, 1, {}, {"overlap_grad_reduce": True}),
    ("1f1b", 120, 1, {}, {"framework": "deepspeed"}),
]


def _observed_scenario(schedule, m, chunks, parallel, training):
    par = {"pipeline_model_parallel_size": 4, "data_parallel_size": 2, **parallel}
    if chunks > 1:
        par["virtual_pipeline_model_parallel_size"] = chunks
    doc = scenario(
        model={"num_layers": 8},
        parallel=par,
        training={
            "global_batch_size": par["data_parallel_size"] * m,
            "schedule": schedule,
            **training,
        },
        network={"model": "fair-share"},
    )
    return scenario_from_dict(doc)


def _captured(monkeypatch, s):
    """What the fast-forward of ``s`` gives `simulate_observed` and `_insertion`."""
    seen: dict[str, tuple] = {}
    observe, insertion = fastforward.simulate_observed, fastforward._insertion

    def observed(*args):
        seen["observed"] = args
        return observe(*args)

    def inserted(*args):
        seen["insertion"] = args
        return insertion(*args)

    monkeypatch.setattr(fastforward, "simulate_observed", observed)
    monkeypatch.setattr(fastforward, "_insertion", inserted)
    assert run(s, spans=False, idle_split=False).metrics.fast_forward is not None
    monkeypatch.undo()
    return seen


def _stepped(workload, network, triggers):
    """`simulate_observed` as it was first written: simpy's own `step`, one event at a
    time, and a snapshot before the clock moves past a started trigger."""
    engine = _Engine(workload, network)
    pos_of = [0] * len(workload.ops)
    for lane in workload.lanes:
        for position, index in enumerate(lane.ops):
            pos_of[index] = position
    describe = steady._Describer(engine, pos_of)
    snapshots, pending = [], list(reversed(triggers))
    engine._wake(range(len(workload.lanes)))
    while True:
        now = engine.env.peek()
        while pending:
            started_s = engine.start_s[pending[-1]]
            if started_s is None or now <= started_s:
                break
            pending.pop()
            snapshots.append(describe(started_s))
        if now == math.inf:
            break
        engine.env.step()
    return engine.result(), snapshots, engine.start_s, engine.end_s


@pytest.mark.parametrize(("schedule", "m", "chunks", "parallel", "training"), OBSERVED)
def test_the_observed_run_is_the_stepped_one_to_the_bit(
    monkeypatch, schedule, m, chunks, parallel, training
):
    """`simulate_observed` runs the engine's own loop (lane 0 through its callbacks, a
    marker after each trigger's instant): the same trace, op times and snapshots, to the
    bit, as stepping simpy one event at a time and looking before each step."""
    # a longer short run than the default (p v + 2 q): more snapshots to compare
    monkeypatch.setattr(fastforward, "WARM_PERIODS", 2)
    monkeypatch.setattr(fastforward, "STEADY_PERIODS", 4)
    s = _observed_scenario(schedule, m, chunks, parallel, training)
    workload, network, triggers = _captured(monkeypatch, s)["observed"]
    fast = steady.simulate_observed(workload, network, triggers)
    slow = _stepped(workload, network, triggers)
    assert repr(fast[0]) == repr(slow[0])
    assert fast[2:] == slow[2:]
    assert len(fast[1]) == len(slow[1]) == len(triggers) > 2
    for a, b in zip(fast[1], slow[1], strict=True):
        assert (a.time_s, a.positions, a.state, a.num_transfers) == (
            b.time_s,
            b.positions,
            b.state,
            b.num_transfers,
        )


def _signatures(workload, shift, moved):
    """Each lane's ops as tuples of what the engine reads (the first `_insertion`'s)."""
    where = [(0, 0)] * len(workload.ops)
    for lane in workload.lanes:
        for position, index in enumerate(lane.ops):
            where[index] = (lane.index, position + moved[lane.index])
    return [
        [
            (
                op.kind,
                op.microbatch + shift if op.microbatch >= 0 else -1,
                op.duration_s,
                op.transfer,
                op.blocking,
                op.flops,
                tuple(where[d] for d in op.deps),
                where[op.rendezvous] if op.rendezvous >= 0 else None,
            )
            for op in (workload.ops[i] for i in lane.ops)
        ]
        for lane in workload.lanes
    ]


def _insertion_by_signatures(short, longer, q):
    """`_insertion` as it was first written: whole signature lists, then compared."""
    if [lane[1:5] for lane in short.lanes] != [lane[1:5] for lane in longer.lanes]:
        return None
    n = [len(b.ops) - len(a.ops) for a, b in zip(short.lanes, longer.lanes, strict=True)]
    if min(n) < 0 or n[0] == 0:
        return None
    none = [0] * len(n)
    plain, moved = _signatures(short, 0, none), _signatures(short, q, n)
    target = _signatures(longer, 0, none)
    ends, starts = [], []
    for here, there, later, k in zip(plain, target, moved, n, strict=True):
        a = 0
        while a < len(here) and here[a] == there[a]:
            a += 1
        b = len(here)
        while b > 0 and later[b - 1] == there[b - 1 + k]:
            b -= 1
        if b > a - k:
            return None
        ends.append(a)
        starts.append(b)
    return n, ends, starts


def _with_op(workload, index, **fields):
    ops = list(workload.ops)
    ops[index] = ops[index]._replace(**fields)
    return workload._replace(ops=tuple(ops))


@pytest.mark.parametrize(("schedule", "m", "chunks", "parallel", "training"), OBSERVED)
def test_the_insertion_check_is_the_signatures_one(
    monkeypatch, schedule, m, chunks, parallel, training
):
    """`_insertion` compares op by op and stops at the first difference; it finds what
    comparing whole signature lists found, on the short workloads and on ones changed
    in a field the engine reads (in and after the inserted period, first and last ops)."""
    s = _observed_scenario(schedule, m, chunks, parallel, training)
    short, longer, q = _captured(monkeypatch, s)["insertion"]
    found = fastforward._insertion(short, longer, q)
    assert found is not None and found == _insertion_by_signatures(short, longer, q)
    n, ends, _ = found
    lane0 = longer.lanes[0].ops
    with_deps = next(i for i in lane0[ends[0] :] if longer.ops[i].deps)
    changes = [
        (lane0[ends[0] - 1], {"duration_s": 1.0}),
        (lane0[ends[0]], {"microbatch": -1}),
        (lane0[0], {"flops": -1.0}),
        (lane0[-1], {"kind": "idle"}),
        (with_deps, {"deps": longer.ops[with_deps].deps[::-1] + (lane0[0],)}),
        (lane0[ends[0] + n[0] // 2], {"rendezvous": lane0[1]}),
    ]
    assert fastforward._insertion(short, longer, q + 1) == _insertion_by_signatures(
        short, longer, q + 1
    )
    for index, fields in changes:
        changed = _with_op(longer, index, **fields)
        assert fastforward._insertion(short, changed, q) == _insertion_by_signatures(
            short, changed, q
        )


def _shift(item, by):
    """A schedule item with micro-batches + by (the first `_orders_insert`'s way)."""
    fields = getattr(item, "_fields", None)
    if fields is None:
        return item
    values = {}
    for name in fields:
        value = getattr(item, name)
        if name == "microbatch" and value >= 0:
            values[name] = value + by
        elif type(value) is tuple:
            values[name] = tuple(_shift(v, by) for v in value)
    return item._replace(**values) if values else item


@pytest.mark.parametrize(
    ("schedule", "chunks", "training"),
    [
        ("1f1b", 1, {}),
        ("interleaved", 2, {}),
        ("zbv", 2, {}),
        ("gpipe", 1, {}),
        ("1f1b", 1, {"framework": "deepspeed"}),
    ],
)
def test_schedule_items_compare_moved_as_when_shifted(schedule, chunks, training):
    """`_moved(x, y, by)` is ``type(x) is type(y) and _shift(x, by) == y`` on every pair
    of items of two ranks' orders with their p2p calls, at several shifts."""
    s = _observed_scenario(schedule, 24, chunks, {}, training)
    items = [item for order in p2p_items(s, stage_orders(s))[:2] for item in order[:24]]
    for x in items:
        for y in items:
            for by in (0, 1, 2):
                expected = type(x) is type(y) and _shift(x, by) == y
                assert fastforward._moved(x, y, by) == expected


def test_the_lowerings_of_one_run_build_each_transfer_once(monkeypatch):
    """The fast-forward's lowerings differ only in the number of micro-batches: with one
    memo (collectives.Pattern) the second builds no collective again and is the same
    workload as a lowering of its own."""
    from stepsim.comm import collectives
    from stepsim.scenario import load_scenario

    base = load_scenario("gpt3-175b-128nodes")
    cluster = build_cluster(base.cluster, pattern=True)
    short = fastforward.with_microbatches(base, 36)
    longer = fastforward.with_microbatches(base, 37)
    built = []
    ring = collectives.ring  # every collective's first candidate
    monkeypatch.setattr(collectives, "ring", lambda *args: built.append(1) or ring(*args))
    memo: dict = {}
    lower(short, cluster, memo=memo)
    once = len(built)
    shared = lower(longer, cluster, memo=memo)
    assert once > 0 and len(built) == once
    assert shared == lower(longer, cluster)


def test_full_iteration_cuts_and_copies_intervals():
    """`full_iteration`, by hand: T = 2, period 3, k = 2. An interval before T stays, one
    across T + Δ = 5 is cut there (its tail moved k Δ = 6 later), one inside the window
    [2, 5) is copied at 5 and 8, one across T has its window part copied."""
    from stepsim.ir.results import FastForward
    from stepsim.report.timeline import _covered_at, full_end_s, full_iteration

    ff = FastForward(
        simulated_microbatches=4,
        period_microbatches=1,
        periods_skipped=2,
        period_s=3.0,
        proved_at_s=2.0,
    )
    starts, ends = np.array([0.0, 1.0, 3.0, 4.0, 6.0]), np.array([1.0, 3.0, 4.0, 7.0, 7.0])
    got = full_iteration(starts, ends, ff)
    assert list(zip(*(a.tolist() for a in got), strict=True)) == [
        (0.0, 1.0),  # before T
        (1.0, 3.0),  # across T: as is up to T + Δ
        (3.0, 4.0),
        (4.0, 5.0),  # cut at T + Δ
        (5.0, 6.0),  # copy 1 of [2, 3) (the one across T)
        (6.0, 7.0),  # copy 1 of [3, 4)
        (7.0, 8.0),  # copy 1 of [4, 5)
        (8.0, 9.0),  # copy 2
        (9.0, 10.0),
        (10.0, 11.0),
        (11.0, 13.0),  # [5, 7) of the one across T + Δ, 6 later
        (12.0, 13.0),  # [6, 7), 6 later
    ]
    assert full_end_s(7.0, ff) == 13.0 and full_end_s(7.0, None) == 7.0
    assert full_iteration(starts, ends, None) == (starts, ends)

    # the binned picture's coverage without the copies made: what they cover
    def coverage(starts, ends):
        times = np.concatenate([starts, ends])
        order = np.argsort(times, kind="stable")
        level = np.cumsum(np.repeat([1.0, -1.0], len(starts))[order])
        times = times[order]
        return times, np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])

    edges = np.linspace(0.0, 13.0, 53)
    made = np.interp(edges, *coverage(*got))
    assert np.abs(_covered_at(edges, *coverage(starts, ends), ff) - made).max() < 1e-12


@pytest.mark.parametrize(("schedule", "m", "chunks"), CASES[:2])
def test_the_timeline_draws_the_whole_iteration(schedule, m, chunks):
    """A fast-forwarded run's timeline is the full run's: each kind's share of every
    time slice, the idle's in all, to rounding; the end is the iteration's."""
    from stepsim.report import timeline
    from stepsim.report.metrics import compute_lanes
    from stepsim.run.idlemap import idle_pieces

    fast = run(_scenario(schedule, m, chunks))
    full = run(_scenario(schedule, m, chunks, fast_forward=False))
    ff = fast.metrics.fast_forward
    assert ff is not None
    rows = {lane.gpu: i for i, lane in enumerate(compute_lanes(fast.trace.lanes))}
    end_s = timeline.full_end_s(fast.trace.end_s, ff)
    assert end_s == pytest.approx(full.trace.end_s, rel=1e-12)
    # as many spans as the full run's, so drawn as it is (bars or time slices)
    assert timeline.drawn_spans(fast.trace.spans, ff) == len(full.trace.spans)
    assert timeline.timeline_view(fast).binned == timeline.timeline_view(full).binned
    kinds, _, drawn = timeline.raster_shares(
        fast.trace._replace(end_s=end_s), rows, idle_pieces(fast), ff
    )
    _, _, expected = timeline.raster_shares(full.trace, rows, idle_pieces(full))
    spans = len(kinds) - 3  # then the three idle causes
    assert np.abs(drawn[:, :spans] - expected[:, :spans]).max() < 1e-9
    assert drawn[:, :spans].sum() > 100  # (something was drawn)
    # the idle causes are split over the micro-batches simulated: their sum is the full's
    idle = drawn[:, spans:].sum(axis=1) - expected[:, spans:].sum(axis=1)
    assert np.abs(idle).max() < 1e-9


def test_the_timeline_numbers_the_repeated_micro_batches():
    """Few micro-batches, drawn as bars with their numbers: a fast-forwarded run labels
    the copies of its period as the full run labels its passes."""
    from stepsim.report import timeline

    def labels(result):
        figure = timeline.timeline_figure(result)
        found = [(t.get_text(), t.get_position()) for t in figure.axes[0].texts]
        return sorted((text, round(x, 9), round(y, 9)) for text, (x, y) in found)

    fast = run(_scenario("1f1b", 24))
    assert fast.metrics.fast_forward is not None
    drawn = labels(fast)
    assert {text for text, _, _ in drawn} == {str(mb) for mb in range(24)}
    assert drawn == labels(run(_scenario("1f1b", 24, fast_forward=False)))

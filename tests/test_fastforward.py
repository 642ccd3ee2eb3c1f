"""The steady-state fast-forward (simulator/run/fastforward.py, engine/steady.py): where it
is proved, its metrics equal the full simulation's to rounding; where not, the run is
the full simulation, bit for bit."""

from __future__ import annotations

import json

import pytest

from stepsim.emit.lowering import lower
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

# the short runs are m' = 2 p v + 4 q micro-batches; these m are at least 10 m' (the
# cost rule, `fastforward.worth_it`, takes m from about 3.1 m'; a split backward 10 m')
CASES = [
    ("1f1b", 120, 1),  # m' = 12, q = 1
    ("interleaved", 320, 2),  # m' = 32, q = 4 (the micro-batch group)
    ("zbh1", 120, 1),
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
        ("1f1b", 24, 1, "m = 2 m': the full run is expected to cost less"),
        ("zbh1", 60, 1, "a split backward is tried from 10 m' only"),
    ],
)
def test_falls_back_to_the_full_run_bit_for_bit(schedule, m, chunks, why):
    fast = run(_scenario(schedule, m, chunks))
    full = run(_scenario(schedule, m, chunks, fast_forward=False))
    assert fast.metrics.fast_forward is None, why
    assert fast.metrics.to_json() == full.metrics.to_json()
    assert fast.trace.spans == full.trace.spans


@pytest.mark.parametrize("m", [48, 60])
def test_a_few_short_runs_long_is_fast_forwarded(m):
    """m' = 12 here: m = 4 m' and 5 m' (under the 10 m' of before) are fast-forwarded, as
    the fast-forward is expected to cost less than the full run, and the iteration is
    the full run's to 1e-9 relative."""
    fast = run(_scenario("1f1b", m))
    full = run(_scenario("1f1b", m, fast_forward=False))
    used = fast.metrics.fast_forward
    assert used is not None and used.simulated_microbatches == 12
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

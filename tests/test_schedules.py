"""Schedules against closed forms and the reference vectors (tests/data)."""

import json
from pathlib import Path

import pytest

from schedules import SCHEDULES, gpipe, one_f_one_b, peak_inflight, step_label
from simulator.engine import IDLE, PP_WAIT, simulate
from simulator.workload import abstract_pipeline

VECTORS = json.loads((Path(__file__).parent / "data" / "pipeline_vectors.json").read_text())
CASES = [c for c in VECTORS["cases"] if c["schedule"] in SCHEDULES]


def _run(case):
    orders = SCHEDULES[case["schedule"]](case["p"], case["m"])
    durations = case["op_durations"]  # the fused backward is B + W for these schedules
    workload = abstract_pipeline(
        orders, forward_s=durations["F"], backward_s=durations["B"], p2p_latency_s=case["c"]
    )
    return orders, simulate(workload)


def test_reference_has_cases_for_every_schedule_we_ship():
    assert {c["schedule"] for c in CASES} == set(SCHEDULES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reference_vector_reproduced_exactly(case):
    orders, trace = _run(case)
    assert [" ".join(step_label(s) for s in o) for o in orders] == case["rank_order"]
    assert trace.end_s == pytest.approx(case["makespan"], rel=1e-12, abs=1e-12)
    for rank, order in enumerate(orders):
        assert peak_inflight(order) == case["per_rank_peak_inflight_w"][rank]
        busy = sum(
            s.end_s - s.start_s
            for s in trace.spans
            if s.gpu == rank and s.kind in ("forward", "backward")
        )
        assert busy == pytest.approx(case["per_rank_busy"][rank])
        # the reference bubble is makespan - busy: our idle plus exposed p2p waits
        waits = sum(
            s.end_s - s.start_s for s in trace.spans if s.gpu == rank and s.kind in (IDLE, PP_WAIT)
        )
        tail = trace.end_s - max(
            s.end_s for s in trace.spans if s.gpu == rank and s.stream == "compute"
        )
        assert waits + tail == pytest.approx(case["per_rank_bubble"][rank])
    if "ops" in case:
        for rank, ops in enumerate(case["ops"]):
            got = [
                (s.label, s.start_s, s.end_s)
                for s in trace.spans
                if s.gpu == rank and s.kind in ("forward", "backward")
            ]
            assert [g[0] for g in got] == [o[0] for o in ops]
            for (_, start, end), (_, ref_start, ref_end) in zip(got, ops, strict=True):
                assert start == pytest.approx(ref_start) and end == pytest.approx(ref_end)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 4), (4, 9), (7, 3), (8, 32)])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (0.7, 1.3)])
def test_free_communication_takes_m_plus_p_minus_1_times_f_plus_b(schedule, p, m, f, b):
    orders = SCHEDULES[schedule](p, m)
    trace = simulate(abstract_pipeline(orders, forward_s=f, backward_s=b))
    assert trace.end_s == pytest.approx((m + p - 1) * (f + b), rel=1e-12)
    # bubble per stage is (p - 1)(F + B), the closed form's (p - 1) / m of the ideal
    for rank in range(p):
        idle = sum(s.end_s - s.start_s for s in trace.spans if s.gpu == rank and s.kind == IDLE)
        tail = trace.end_s - max(
            s.end_s for s in trace.spans if s.gpu == rank and s.stream == "compute"
        )
        assert idle + tail == pytest.approx((p - 1) * (f + b))


def test_every_microbatch_runs_forward_then_backward_once_per_stage():
    for schedule in (gpipe, one_f_one_b):
        for order in schedule(5, 11):
            assert sorted(s.microbatch for s in order if s.kind == "F") == list(range(11))
            assert sorted(s.microbatch for s in order if s.kind == "B") == list(range(11))
            seen = set()
            for step in order:
                if step.kind == "F":
                    seen.add(step.microbatch)
                else:
                    assert step.microbatch in seen


def test_1f1b_holds_fewer_activations_than_gpipe():
    assert [peak_inflight(o) for o in one_f_one_b(4, 8)] == [4, 3, 2, 1]
    assert [peak_inflight(o) for o in gpipe(4, 8)] == [8, 8, 8, 8]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least one stage"):
        one_f_one_b(0, 4)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 3)])
def test_bubble_share_of_the_iteration_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    from simulator.metrics import stage_breakdowns

    trace = simulate(abstract_pipeline(SCHEDULES[schedule](p, m), forward_s=1.0, backward_s=2.0))
    for row in stage_breakdowns(trace):
        assert row["idle"] / trace.end_s == pytest.approx((p - 1) / (m + p - 1))
        assert row["compute"] == pytest.approx(m * 3.0)

"""Schedules against the reference vectors (tests/data), closed forms and invariants."""

import json
from pathlib import Path

import numpy as np
import pytest

from stepsim.emit.abstract import abstract_pipeline
from stepsim.engine.core import simulate
from stepsim.ir.vocabulary import IDLE, PP_WAIT
from stepsim.report.metrics import stage_breakdowns
from stepsim.schedules import SCHEDULES, Step, build, check, peak_inflight, stage_of, step_label

VECTORS = json.loads((Path(__file__).parent / "data" / "pipeline_vectors.json").read_text())
CASES = [c for c in VECTORS["cases"] if c["schedule"] in SCHEDULES]
COMPUTE = ("forward", "backward", "weight")


def _simulate(name, p, m, v, durations, c, group=None):
    orders = build(name, p, m, v, group)
    workload = abstract_pipeline(
        orders,
        forward_s=durations["F"],
        backward_s=durations["B"],
        weight_s=durations.get("W", 0.0),
        p2p_latency_s=c,
        num_chunks=v,
        placement=SCHEDULES[name].placement,
    )
    return orders, simulate(workload)


# the reference file's "zbv" is the unit-time greedy (its generator has no op times in
# the order): stepsim's `zbv_unit`; `zbv` is the authors' timed one (test_zbv_timed.py)
REFERENCE_NAMES = {"zbv": "zbv_unit"}


def _case(case):
    return _simulate(
        REFERENCE_NAMES.get(case["schedule"], case["schedule"]),
        case["p"],
        case["m"],
        case["v"],
        case["op_durations"],
        case["c"],
        case.get("group_size") or _group_from_id(case["id"]),
    )


def _group_from_id(case_id):
    tail = case_id.rsplit("_", 1)[-1]
    return int(tail[1:]) if tail.startswith("g") and tail[1:].isdigit() else None


def test_every_reference_schedule_is_shipped():
    names = {c["schedule"] for c in VECTORS["cases"]}
    assert names <= set(SCHEDULES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reference_vector_reproduced_exactly(case):
    orders, trace = _case(case)
    v = case["v"]
    assert [" ".join(step_label(s, v) for s in o) for o in orders] == case["rank_order"]
    assert trace.end_s == pytest.approx(case["makespan"], rel=1e-12, abs=1e-12)
    for rank, order in enumerate(orders):
        assert peak_inflight(order, "B") == case["per_rank_peak_inflight_b"][rank]
        assert peak_inflight(order, "W") == case["per_rank_peak_inflight_w"][rank]
        mine = [s for s in trace.spans if s.gpu == rank and s.stream == "compute"]
        busy = sum(s.end_s - s.start_s for s in mine if s.kind in COMPUTE)
        assert busy == pytest.approx(case["per_rank_busy"][rank])
        waits = sum(s.end_s - s.start_s for s in mine if s.kind in (IDLE, PP_WAIT))
        tail = trace.end_s - max(s.end_s for s in mine)
        assert waits + tail == pytest.approx(case["per_rank_bubble"][rank])
    if "ops" in case:
        for rank, ops in enumerate(case["ops"]):
            got = [
                (s.label, s.start_s, s.end_s)
                for s in trace.spans
                if s.gpu == rank and s.kind in COMPUTE
            ]
            assert [g[0] for g in got] == [o[0] for o in ops]
            for (_, start, end), (_, ref_start, ref_end) in zip(got, ops, strict=True):
                assert start == pytest.approx(ref_start) and end == pytest.approx(ref_end)


# -- properties over random sizes --------------------------------------------------------

RNG = np.random.default_rng(2026)
RANDOM = []
# DualPipe's two have their own sizes and tests (test_dualpipe.py)
SINGLE = sorted(name for name in SCHEDULES if not name.startswith("dualpipe"))
for _ in range(60):
    name = str(RNG.choice(SINGLE))
    p = int(RNG.integers(1, 7))
    v = int(RNG.integers(2, 4)) if SCHEDULES[name].chunked else 1
    v = 2 if SCHEDULES[name].placement == "v" else v
    group = p
    m = group * int(RNG.integers(1, 5)) if SCHEDULES[name].grouped else int(RNG.integers(1, 13))
    f, b, w = (float(x) for x in RNG.uniform(0.2, 2.0, size=3))
    c = float(RNG.choice([0.0, 0.05]))
    RANDOM.append((name, p, m, v, f, b, w, c))


def _bound(name, p, m, v):
    """The schedule's documented peak of activations in flight, per rank."""
    if name in ("gpipe",):
        return [m] * p
    if name == "looped_bfs":
        return [m * v] * p
    if name == "1f1b":
        return [min(p - r, m) for r in range(p)]
    if name == "zbh1":
        return [min(p, m)] * p
    if name == "zbh2":
        return [min(2 * p - 1, m)] * p
    if name == "interleaved":
        return [
            min((p - r - 1) * 2 + (v - 1) * p + 1, m * v) if m != p else m * v for r in range(p)
        ]
    if name == "zbv":
        return [min(2 * p, 2 * m)] * p
    return [min((v - 1) * p + p, m * v)] * p  # interleaved_zb


@pytest.mark.parametrize("name, p, m, v, f, b, w, c", RANDOM)
def test_random_sizes_keep_every_invariant(name, p, m, v, f, b, w, c):
    split = SCHEDULES[name].split_backward
    durations = {"F": f, "B": b, "W": w} if split else {"F": f, "B": b + w}
    orders, trace = _simulate(name, p, m, v, durations, c)
    placement = SCHEDULES[name].placement
    for rank, order in enumerate(orders):
        # every (micro-batch, chunk) has F, B (and W) once, in that order
        expected = {(i, k) for i in range(m) for k in range(v)}
        for kind in ("F", "B") + (("W",) if split else ()):
            assert sorted((s.microbatch, s.chunk) for s in order if s.kind == kind) == sorted(
                expected
            )
        position = {(s.kind, s.microbatch, s.chunk): i for i, s in enumerate(order)}
        for i, k in expected:
            assert position[("F", i, k)] < position[("B", i, k)]
            if split:
                assert position[("B", i, k)] < position[("W", i, k)]
        assert peak_inflight(order) <= _bound(name, p, m, v)[rank]
        assert {stage_of(rank, k, p, placement) for k in range(v)} <= set(range(p * v))
    # f, b, w are per op (one chunk); a rank's work per micro-batch is v times that
    F, B = v * f, v * (b + w)
    assert trace.end_s >= m * (F + B) - 1e-9
    if c == 0.0 and name in ("gpipe", "1f1b"):
        assert trace.end_s == pytest.approx((m + p - 1) * (F + B))
    if c == 0.0 and name == "interleaved":
        assert trace.end_s == pytest.approx(m * (F + B) + (p - 1) * (F + B) / v)


@pytest.mark.parametrize("name", ["zbv", "zbv_unit"])  # the authors' timed greedy and unit time
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_zbv_closed_form_with_equal_op_times(name, p):
    # m(F + B + W) + (p - 1)F/2 for F = B = W, no latency, m >= 2p - 1 (reference file)
    for m in (2 * p - 1, 3 * p + 1):
        orders = build(name, p, m, 2)
        trace = simulate(
            abstract_pipeline(
                orders, forward_s=0.5, backward_s=0.5, weight_s=0.5, num_chunks=2, placement="v"
            )
        )
        assert trace.end_s == pytest.approx(m * 3.0 + (p - 1) * 0.5)
        assert [peak_inflight(o) for o in orders] == [2 * p] * p


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 3)])
def test_bubble_share_of_the_iteration_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    trace = simulate(abstract_pipeline(build(schedule, p, m), forward_s=1.0, backward_s=2.0))
    for row in stage_breakdowns(trace):
        assert row["idle"] / trace.end_s == pytest.approx((p - 1) / (m + p - 1))
        assert row["compute"] == pytest.approx(m * 3.0)


def test_1f1b_holds_fewer_activations_than_gpipe():
    assert [peak_inflight(o) for o in build("1f1b", 4, 8)] == [4, 3, 2, 1]
    assert [peak_inflight(o) for o in build("gpipe", 4, 8)] == [8, 8, 8, 8]


def test_bad_sizes_are_refused_with_the_rule():
    assert "multiple of the micro-batch group size (4)" in check("interleaved", 4, 6, 2)
    assert "runs 2 or more chunks per rank" in check("interleaved", 4, 8, 1)
    assert "runs one chunk per rank" in check("zbh1", 4, 8, 2)
    assert "exactly 2 chunks" in check("zbv", 4, 8, 3)
    assert "at least 1" in check("1f1b", 0, 4)
    with pytest.raises(ValueError, match="not one of"):
        build("zigzag", 4, 8)


@pytest.mark.parametrize("placement", ["looped", "v"])
def test_holder_of_inverts_stage_of(placement):
    from stepsim.schedules import holder_of

    p, v = 5, 2
    for rank in range(p):
        for chunk in range(v):
            assert holder_of(stage_of(rank, chunk, p, placement), p, placement) == (rank, chunk)


def test_labels_round_trip():
    from stepsim.schedules import parse_label

    for step in (Step("F", 3), Step("B", 12, 1), Step("W", 0, 3)):
        assert parse_label(step_label(step, 4)) == step
    with pytest.raises(ValueError, match="not an op label"):
        parse_label("X3")

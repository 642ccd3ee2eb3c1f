"""A run's idle split by cause (run/bubble.py `idle_causes`): the schedule's own bubble,
stage imbalance and waits on communication, by closed form and against the engine."""

import math

import pytest

from stepsim.emit.abstract import abstract_pipeline
from stepsim.engine.core import simulate
from stepsim.ir.vocabulary import COMPUTE_STREAM, MODEL_KINDS
from stepsim.run.bubble import free_idle, idle_causes
from stepsim.schedules import SCHEDULES
from stepsim.schedules import build as build_schedule


def _engine_idle(orders, rank_times, v, placement):
    workload = abstract_pipeline(
        orders,
        forward_s=0.0,
        backward_s=0.0,
        num_chunks=v,
        placement=placement,
        rank_times=rank_times,
    )
    trace = simulate(workload)
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
    from stepsim.ir.vocabulary import BACKWARD, FORWARD, RECOMPUTE, WEIGHT
    from stepsim.run.bubble import pass_times

    kinds = {FORWARD: "F", BACKWARD: "B", RECOMPUTE: "B", WEIGHT: "W"}
    return pass_times(result.workload, 2, kinds)

"""Goodput over a run (`stepsim plan goodput`): the closed forms of plan/goodput.py —
no failures gives the iteration share, the searched interval matches Young's and
Daly's optima, the lost work of a hand-computed case — and the CLI."""

import json
import math

import pytest

from stepsim.cli import main
from stepsim.plan.goodput import (
    CHECKPOINT_BYTES_PER_PARAM,
    DEFAULT_MTBF_GPU_HOURS,
    Costs,
    Reliability,
    best_interval,
    costs_of,
    daly_interval_s,
    intervals,
    shares_at,
    young_interval_s,
)
from stepsim.plan.planning import model_params
from stepsim.scenario import load_scenario

TINY = "scenarios/tiny-2gpu.toml"


def costs(iteration_s=5.0, mtbf_s=10_800.0, checkpoint_s=60.0, restart_s=600.0, lag_s=0.0):
    return Costs(
        iteration_s=iteration_s,
        num_gpus=1024,
        checkpoint_bytes=1e12,
        job_mtbf_s=mtbf_s,
        write_s=checkpoint_s,
        blocking_s=checkpoint_s,
        lag_s=lag_s,
        restart_s=restart_s,
        load_s=0.0,
    )


def exact_optimum_s(c: Costs) -> float:
    """The continuous optimum of Daly's expected time: the root of
    1 - exp(-(tau + C) / M) = tau / M (d/dtau of tau / (e^((tau + C)/M) - 1) = 0),
    by bisection."""
    lo, hi = 0.0, c.job_mtbf_s
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - math.exp(-(mid + c.blocking_s) / c.job_mtbf_s) > mid / c.job_mtbf_s:
            lo = mid
        else:
            hi = mid
    return lo


def test_with_no_failures_goodput_is_the_iteration_share():
    c = costs(mtbf_s=math.inf)
    for k in (1, 7, 100):
        s = shares_at(c, k)
        assert s.goodput == pytest.approx(5.0 * k / (5.0 * k + 60.0), rel=1e-15)
        assert s.checkpoint == pytest.approx(60.0 / (5.0 * k + 60.0), rel=1e-15)
        assert s.lost == s.restart == 0.0
    assert best_interval(c) is None  # checkpointing never pays without failures
    assert [r.name for r in intervals(c, 10)] == ["given"]


def test_a_long_mtbf_tends_to_the_iteration_share():
    no_failures = shares_at(costs(mtbf_s=math.inf), 50).goodput
    assert shares_at(costs(mtbf_s=1e15), 50).goodput == pytest.approx(no_failures, rel=1e-9)


@pytest.mark.parametrize(
    ("iteration_s", "mtbf_s", "checkpoint_s"),
    [(5.0, 10_800.0, 60.0), (10.0, 36_000.0, 10.0), (1.0, 6_480.0, 2.8), (30.0, 7_200.0, 120.0)],
)
def test_daly_and_the_exact_optimum_match_the_searched_interval_within_a_step(
    iteration_s, mtbf_s, checkpoint_s
):
    c = costs(iteration_s=iteration_s, mtbf_s=mtbf_s, checkpoint_s=checkpoint_s)
    best = best_interval(c).interval_iterations
    assert abs(best - exact_optimum_s(c) / iteration_s) <= 1
    assert abs(best - daly_interval_s(c) / iteration_s) <= 1
    # the search is a search: its interval beats its neighbours
    assert shares_at(c, best).goodput >= shares_at(c, best + 1).goodput
    assert best == 1 or shares_at(c, best).goodput >= shares_at(c, best - 1).goodput


def test_young_matches_the_searched_interval_within_a_step_when_c_is_small():
    c = costs(iteration_s=10.0, mtbf_s=36_000.0, checkpoint_s=10.0)
    # Young: sqrt(2 x 10 x 36000) = 848.53 s; C / 2M = 1.389e-4, so
    # Daly: 848.53 (1 + 0.011785 / 3 + 1.389e-4 / 9) - 10 = 848.53 x 1.0039436 - 10 = 841.87 s
    assert young_interval_s(c) == pytest.approx(848.53, abs=0.01)
    assert daly_interval_s(c) == pytest.approx(841.87, abs=0.01)
    assert abs(best_interval(c).interval_iterations - young_interval_s(c) / 10.0) <= 1


def test_daly_beyond_twice_the_mtbf_is_the_mtbf():
    assert daly_interval_s(costs(mtbf_s=100.0, checkpoint_s=250.0)) == 100.0


def test_lost_work_and_restarts_on_a_hand_computed_case():
    # M = 1000 s, tau = 100 s (10 x 10 s), C = 10 s, R = 50 s: s = 110 s,
    # failures per segment e^0.11 - 1 = 0.116278, lost 1000 x 0.116278 - 110 = 6.278 s,
    # restarts 0.116278 x 1000 (e^0.05 - 1) = 0.116278 x 51.271 = 5.9617 s,
    # wall 110 + 6.278 + 5.962 = 122.240 s = Daly's 1000 e^0.05 (e^0.11 - 1)
    c = costs(iteration_s=10.0, mtbf_s=1000.0, checkpoint_s=10.0, restart_s=50.0)
    s = shares_at(c, 10)
    wall = 100 / s.goodput
    assert wall == pytest.approx(122.240, abs=1e-3)
    assert s.lost * wall == pytest.approx(6.278, abs=1e-3)
    assert s.restart * wall == pytest.approx(5.962, abs=1e-3)
    assert s.checkpoint * wall == pytest.approx(10.0, rel=1e-12)
    assert s.goodput + s.checkpoint + s.lost + s.restart == pytest.approx(1.0, rel=1e-12)


def test_lost_work_per_failure_is_half_a_segment_to_first_order():
    c = costs(iteration_s=1.0, mtbf_s=100_000.0, checkpoint_s=0.0, restart_s=0.0)
    s = shares_at(c, 1000)  # s / M = 0.01
    wall = 1000 / s.goodput
    failures = math.expm1(1000 / 100_000)
    assert s.lost * wall / failures == pytest.approx(500, rel=0.01)


def test_async_checkpoint_blocks_for_the_host_copy_and_waits_for_the_last_write():
    rel = Reliability(async_save=True, storage_write_gbytes_per_s=10.0)
    c = costs_of(rel, 1.0, 8, 1e9, 32.0)
    assert c.checkpoint_bytes == 1e9 * CHECKPOINT_BYTES_PER_PARAM
    assert c.write_s == pytest.approx(1.4) and c.lag_s == c.write_s
    assert c.blocking_s == pytest.approx(14e9 / 8 / 32e9)
    assert shares_at(c, 1).segment_s == pytest.approx(1.4)  # waits for the write
    assert shares_at(c, 5).segment_s == pytest.approx(5 + c.blocking_s)
    sync = costs_of(Reliability(storage_write_gbytes_per_s=10.0), 1.0, 8, 1e9, 32.0)
    assert sync.blocking_s == sync.write_s and sync.lag_s == 0.0
    assert sync.job_mtbf_s == pytest.approx(DEFAULT_MTBF_GPU_HOURS * 3600 / 8)


def test_plan_goodput_prints_the_shares_and_the_optima(capsys):
    args = ["plan", "goodput", TINY, "--iteration-s", "10", "--mtbf-gpu-hours", "2000"]
    assert main([*args, "--checkpoint-interval", "20", "--tokens", "1e9"]) == 0
    text = capsys.readouterr().out
    assert "iteration 10.000 s (given)" in text
    assert "job MTBF 1,000 h" in text
    for name in ("given", "searched best", "Young 1974", "Daly 2006"):
        assert name in text
    assert "1B tokens:" in text
    assert main([*args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    params = model_params(load_scenario(TINY))
    assert record["checkpoint_bytes"] == params * CHECKPOINT_BYTES_PER_PARAM
    assert record["job_mtbf_s"] == pytest.approx(2000 * 3600 / 2)
    assert [r["interval"] for r in record["intervals"]] == [
        "searched best",
        "Young 1974",
        "Daly 2006",
    ]
    assert record["goodput"] == record["intervals"][0]["goodput"]


def test_time_to_train_divides_by_goodput_only_when_asked(capsys):
    base = ["plan", "time-to-train", TINY, "--tokens", "1e12", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "goodput" not in plain
    assert main([*base, "--mtbf-gpu-hours", "100", "--checkpoint-interval", "1000"]) == 0
    record = json.loads(capsys.readouterr().out)
    goodput = record["goodput"]
    assert 0 < goodput["goodput"] < 1 and goodput["interval_iterations"] == 1000
    assert goodput["days"] == pytest.approx(plain["days"] / goodput["goodput"])
    assert main([*base[:-1], "--goodput"]) == 0
    assert "with failures, checkpoints and restarts" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--mtbf-gpu-hours", "0", "--mtbf-gpu-hours=0 must be a positive number"),
        ("--storage-gbytes-per-s", "-1", "--storage-gbytes-per-s=-1 must be"),
        ("--read-gbytes-per-s", "inf", "--read-gbytes-per-s=inf must be"),
        ("--restart-minutes", "-2", "--restart-minutes=-2 must be >= 0"),
        ("--checkpoint-interval", "0", "--checkpoint-interval=0 must be >= 1"),
        ("--iteration-s", "nan", "--iteration-s=nan must lie in [1e-06, 1e+06]"),
        ("--mtbf-gpu-hours", "1e300", "--mtbf-gpu-hours=1e+300 must be a positive number up to"),
    ],
)
def test_bad_goodput_flags_exit_2_with_one_line(capsys, flag, value, named):
    assert main(["plan", "goodput", TINY, "--iteration-s", "1", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err

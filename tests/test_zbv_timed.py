"""ZB-V as its authors build it (schedules/zbv_timed.py): their orders reproduced, the
closed form with equal op times, and the full simulator feeding it its own op times."""

import json
from pathlib import Path

import pytest

from stepsim.cost.orders import stage_orders
from stepsim.cost.schedule_costs import _avg_then_mid, hop_s, schedule_times
from stepsim.schedules import (
    ZbvTimes,
    build,
    default_memory,
    step_label,
    zbv_timed,
)
from stepsim.schedules.custom import check_orders
from tests.helpers import load as make_scenario

AUTHORS = json.loads((Path(__file__).parent / "data" / "zbv_authors.json").read_text())


def _labels(orders):
    return [" ".join(step_label(s, 2) for s in order) for order in orders]


@pytest.mark.parametrize(
    "case",
    AUTHORS["cases"],
    ids=[f"p{c['p']}m{c['m']}B{c['B']}c{c['c']}" for c in AUTHORS["cases"]],
)
def test_the_authors_orders_are_reproduced_exactly(case):
    times = ZbvTimes(
        case["F"], case["B"], case["W"], case["c"], case["f_mem"], case["b_mem"], case["w_mem"]
    )
    orders = zbv_timed(case["p"], case["m"], times)
    assert _labels(orders) == case["rank_order"]
    check_orders(orders, "v")  # every op once, in dependency order, no deadlock


def test_unequal_times_change_the_order_where_the_unit_greedy_does_not():
    # the case: p = 3, m = 4, F = 1, B = 2.5, W = 1, hop 0.1
    timed = zbv_timed(3, 4, ZbvTimes(1.0, 2.5, 1.0, 0.1))
    assert _labels(timed) != _labels(build("zbv_unit", 3, 4, 2))
    assert _labels(timed) != _labels(zbv_timed(3, 4))  # unit times give another order


def test_the_full_simulator_builds_zbv_from_its_own_op_times():
    s = make_scenario(
        model={"num_layers": 8},
        parallel={"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},
        training={"schedule": "zbv"},
    )
    times = schedule_times(s)
    assert times is not None and times.backward > times.forward > times.weight > 0
    assert times.hop == int(hop_s(s) * 1e6)  # whole microseconds, as the authors' timers
    m = s.model
    assert (times.f_mem, times.b_mem, times.w_mem) == default_memory(
        m.hidden_size, m.num_attention_heads, m.seq_length
    )
    assert stage_orders(s) == zbv_timed(4, s.num_microbatches, times)
    assert schedule_times(make_scenario(training={"schedule": "1f1b"})) is None


def test_chunk_times_are_averaged_per_rank_then_the_median_rank_taken():
    # the authors' avg_then_mid: the upper median for an even count, at least 1
    assert _avg_then_mid([[1, 3], [10, 10], [4, 4], [100, 0]]) == 10
    assert _avg_then_mid([[2], [4], [9]]) == 4
    assert _avg_then_mid([[0, 0]]) == 1


def test_the_hop_is_the_activation_over_nvlink_or_the_nic():
    inside = make_scenario(parallel={"pipeline_model_parallel_size": 2})
    cl, m = inside.cluster, inside.model
    nbytes = inside.training.micro_batch_size * m.seq_length * m.hidden_size * 2
    gpus = inside.parallel.tensor_model_parallel_size * inside.parallel.data_parallel_size
    if gpus * inside.parallel.pipeline_model_parallel_size <= cl.gpus_per_node:
        rate = cl.nvlink_gbytes_per_s * 1e9 * cl.nvlink_efficiency
        assert hop_s(inside) == pytest.approx(cl.nvlink_latency_us * 1e-6 + nbytes / rate)
    else:
        assert hop_s(inside) > nbytes / (cl.nic_gbps * 1e9 / 8)

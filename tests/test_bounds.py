"""The search's lower bounds on the iteration time (plan/bound.py): closed forms on
abstract times, and never above the simulated iteration on random small scenarios
(hypothesis, the property tests' strategy) and on shipped scenarios made short."""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
from helpers import load
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, _load, scenario_docs

from stepsim.cost.kernels import ZERO
from stepsim.cost.orders import stage_orders
from stepsim.plan.bound import (
    Inflight,
    compute_bound_s,
    iteration_lower_bound_s,
    pipeline_shape,
    schedule_bound_s,
)
from stepsim.plan.search import simulate_row
from stepsim.scenario import load_scenario
from stepsim.schedules import build as build_schedule

# STEPSIM_BOUND_EXAMPLES=500 (and STEPSIM_PROPERTY_RANDOM=1) hunts further than CI does
EXAMPLES = int(os.environ.get("STEPSIM_BOUND_EXAMPLES", "30"))


def _abstract(scenario, forward: float, backward: float, weight: float = 0.0):
    """The bound's per-layer times as a stub: ``forward``, ``backward`` (weight
    gradient included) and ``weight`` per layer, no embedding, output layer or
    optimizer step."""
    zero = SimpleNamespace(
        embedding_forward=ZERO,
        embedding_backward=ZERO,
        embedding_weight=ZERO,
        output_forward=ZERO,
        output_backward=ZERO,
        output_weight=ZERO,
    )
    p = scenario.parallel.pipeline_model_parallel_size
    return SimpleNamespace(
        forward=forward,
        backward=backward,
        weight=weight,
        recompute=0.0,
        extras=zero,
        optimizer=[0.0] * p,
        moe=False,
    )


def _scenario(p: int, m: int, schedule: str = "1f1b", v: int = 1, layers_per_stage: int = 2):
    one = {"node": "dgx-a100", "num_nodes": 1}
    return load(
        cluster=one,
        model={"num_layers": p * v * layers_per_stage},
        parallel={
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": p,
            "data_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": v,
        },
        training={"global_batch_size": m, "micro_batch_size": 1, "schedule": schedule},
    )


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 8), (8, 3)])
def test_one_chunk_schedules_bound_their_whole_bubble(schedule, p, m):
    """Equal stages, free communication: (m + p - 1)(F + B), the schedule's makespan."""
    scenario = _scenario(p, m, schedule)
    times = _abstract(scenario, forward=1.0, backward=2.0)
    shape = pipeline_shape(stage_orders(scenario))
    per_stage = 2  # layers
    assert schedule_bound_s(scenario, times, shape) == pytest.approx(
        (m + p - 1) * per_stage * 3.0, rel=1e-12
    )


def test_interleaving_bounds_its_smaller_bubble():
    """Megatron's interleaving with v chunks: (m + (p - 1) / v)(F + B) per rank."""
    p, v, m = 4, 2, 8
    scenario = _scenario(p, m, "interleaved", v=v, layers_per_stage=1)
    times = _abstract(scenario, forward=1.0, backward=2.0)
    shape = pipeline_shape(stage_orders(scenario))
    rank_time = v * 3.0  # a micro-batch's F + B on one rank: v chunks of one layer
    assert schedule_bound_s(scenario, times, shape) == pytest.approx(
        (m + (p - 1) / v) * rank_time, rel=1e-12
    )


def test_a_split_backward_waits_only_for_input_gradients_down_the_pipeline():
    """ZB-H1: the drain after a rank's last B is the input-gradient parts below it, and a
    rank's weight gradients after its last B count on that rank alone."""
    p, m = 4, 8
    scenario = _scenario(p, m, "zbh1")
    times = _abstract(scenario, forward=1.0, backward=3.0, weight=1.0)
    orders = build_schedule("zbh1", p, m, 1)
    shape = pipeline_shape(orders)
    layers = 2
    f, b, w = 1.0 * layers, 2.0 * layers, 1.0 * layers  # B: its input-gradient part
    expected = 0.0
    for rank, order in enumerate(orders):
        last = max(i for i, s in enumerate(order) if s.kind == "B")
        tail = (len(order) - 1 - last) * w
        own = m * (f + b + w) - tail
        expected = max(expected, rank * f + own + max(tail, rank * b))
    assert schedule_bound_s(scenario, times, shape) == pytest.approx(expected, rel=1e-12)


def test_one_stage_has_no_schedule_bound_beyond_its_compute():
    scenario = _scenario(1, 4)
    assert iteration_lower_bound_s(scenario) == compute_bound_s(scenario)


def test_the_schedule_bound_adds_the_bubble_to_the_compute_bound():
    scenario = load_scenario("gpt3-175b-128nodes")  # 1F1B, p = 16, m = 192
    bound, compute = iteration_lower_bound_s(scenario), compute_bound_s(scenario)
    # the drain: 15 stages' backward (with recomputation) of one micro-batch
    assert bound > compute * 1.04
    inflight = Inflight()
    assert iteration_lower_bound_s(scenario, inflight.shape(scenario)) == bound


def test_overlapped_pairs_and_moe_models_have_no_schedule_bound():
    scenario = _scenario(4, 8)
    times = _abstract(scenario, forward=1.0, backward=2.0)
    shape = pipeline_shape(stage_orders(scenario))
    assert schedule_bound_s(scenario, times, shape._replace(overlapped=True)) == 0.0
    times.moe = True
    assert schedule_bound_s(scenario, times, shape) == 0.0


@settings(SETTINGS, max_examples=EXAMPLES)
@given(scenario_docs())
def test_the_bound_never_exceeds_the_simulated_iteration(doc):
    scenario = _load(doc)
    simulated = simulate_row(scenario).iteration_time_s
    assert iteration_lower_bound_s(scenario) <= simulated * (1 + 1e-12)


# two, for time (the dense shipped scenarios at full length were checked once by hand,
# every bound below its iteration: 0.88 to 0.99 of it)
SHIPPED = [
    "gpt3-175b-128nodes",
    "mt-nlg-530b-420nodes",  # DeepSpeed's sequential blocking p2p
]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_bound_never_exceeds_a_shipped_scenario_made_short(name):
    """The shipped scenario with one micro-batch per stage and chunk (a short run:
    the bubble is then the largest part of the bound)."""
    base = load_scenario(name)
    par, tr = base.parallel, base.training
    batch = par.pipeline_model_parallel_size * tr.micro_batch_size * par.data_parallel_size
    short = replace(base, training=replace(tr, global_batch_size=batch))
    simulated = simulate_row(short).iteration_time_s
    bound = iteration_lower_bound_s(short)
    assert compute_bound_s(short) < bound <= simulated


@given(st.sampled_from(["1f1b", "gpipe", "zbh1", "zbh2"]), st.integers(2, 6), st.integers(1, 9))
@settings(SETTINGS, max_examples=20)
def test_the_schedule_bound_is_at_least_the_compute_bound_on_equal_stages(schedule, p, m):
    scenario = _scenario(p, m, schedule)
    times = _abstract(scenario, forward=1.0, backward=3.0, weight=1.0 if "zb" in schedule else 0)
    shape = pipeline_shape(stage_orders(scenario))
    busy = m * 2 * (1.0 + 3.0)
    assert schedule_bound_s(scenario, times, shape) >= busy * (1 - 1e-12)


def _dual(name: str, p: int, microbatches: int):
    return load(
        model={"num_layers": 4 * p, "vocab_size": 16, "seq_length": 512},
        parallel={"pipeline_model_parallel_size": p, "virtual_pipeline_model_parallel_size": 2},
        training={
            "global_batch_size": microbatches,
            "schedule": name,
            "share_embeddings_and_output_weights": False,
        },
    )


@pytest.mark.parametrize(
    ("name", "p", "m"), [("dualpipe", 4, 8), ("dualpipe", 2, 12), ("dualpipev", 4, 8)]
)
def test_dualpipes_bound_is_below_its_iteration(name, p, m):
    """DualPipe's copies each take half of the micro-batches, and its last rank starts
    at once with the second copy: the compute bound counts each chunk's passes from the
    orders and no wait before them (it once counted every micro-batch on both chunks)."""
    scenario = _dual(name, p, m)
    simulated = simulate_row(scenario).iteration_time_s
    assert iteration_lower_bound_s(scenario) <= simulated
    if name == "dualpipe":
        shape = pipeline_shape(stage_orders(scenario))
        assert {n for ends in shape.ranks for k, _, n in ends.counts if k == "F"} == {m // 2}


def test_the_search_counts_in_flight_activations_as_the_memory_model_does():
    from stepsim.cost.orders import inflight_per_stage

    inflight = Inflight()
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)):
        scenario = _scenario(4, 8, schedule, v=v)
        assert inflight(scenario) == inflight_per_stage(scenario)
        assert inflight.shape(scenario) == pipeline_shape(stage_orders(scenario))

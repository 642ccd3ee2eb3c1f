"""The whole path on small scenarios: FLOPs, breakdown, memory, determinism, deadlocks."""

import pytest

from stepsim.cost.memory import activation_bytes_per_layer
from stepsim.cost.params import layer_params_per_rank, stage_params_per_rank
from stepsim.engine.core import DeadlockError, _Blame, _Engine, simulate, simulate_totals
from stepsim.engine.lookover import alone, scan
from stepsim.engine.network import AnalyticalNetwork, FairShareNetwork, Network
from stepsim.ir.flows import Transfer, delay
from stepsim.ir.keys import LayerKey, PipelineKey
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import (
    BARRIER,
    COMPUTE_TIME,
    DP_SYNC,
    FORWARD,
    IDLE_TIME,
    PP_SEND,
    TP_COMM,
)
from stepsim.run.iteration import NETWORKS, run
from stepsim.scenario.loader import load_scenario
from tests.helpers import load

TWO_NODES = {
    "cluster": {"num_nodes": 2},
    "parallel": {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "data_parallel_size": 4,
    },
    "training": {"global_batch_size": 32, "recompute_granularity": "full"},
}


def test_hardware_flops_match_megatron_formula_with_full_recompute():
    # Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration
    s = load(**TWO_NODES)
    r = run(s).metrics
    B, sq, lay, h, V = 32, 1024, 4, 1024, 32000
    hardware = 96 * B * sq * lay * h**2 * (1 + sq / (6 * h) + V / (16 * lay * h))
    model = 72 * B * sq * lay * h**2 * (1 + sq / (6 * h) + V / (12 * lay * h))
    per_gpu_s = 1e12 * r.num_gpus * r.iteration_time_s
    assert r.hardware_tflops_per_gpu * per_gpu_s == pytest.approx(hardware, rel=1e-9)
    assert r.model_tflops_per_gpu * per_gpu_s == pytest.approx(model, rel=1e-9)
    assert r.mfu == pytest.approx(r.model_tflops_per_gpu / 312.0)


def test_breakdown_adds_up_to_the_iteration_on_every_stage():
    r = run(load(**TWO_NODES)).metrics
    for stage in r.stages:
        assert sum(stage.breakdown_s.values()) == pytest.approx(r.iteration_time_s)
        assert stage.stands_for_gpus == 2 * 4
    assert r.breakdown_s[TP_COMM] > 0 and r.breakdown_s[DP_SYNC] > 0
    assert 0 < r.bubble_fraction < 1


def test_same_input_same_spans_bit_for_bit():
    a, b = run(load(**TWO_NODES)), run(load(**TWO_NODES))
    assert a.trace.spans == b.trace.spans and a.metrics == b.metrics


def test_overlapping_grad_reduce_hides_data_parallel_sync():
    plain = run(load(**TWO_NODES)).metrics
    overlapped = run(
        load(**{**TWO_NODES, "training": {**TWO_NODES["training"], "overlap_grad_reduce": True}})
    ).metrics
    assert overlapped.breakdown_s[DP_SYNC] < plain.breakdown_s[DP_SYNC]
    assert overlapped.iteration_time_s < plain.iteration_time_s


def test_slower_nics_slow_only_the_inter_node_parts():
    fast = run(load(**TWO_NODES)).metrics
    slow_doc = {**TWO_NODES, "cluster": {"num_nodes": 2, "nic_gbps": 10}}
    slow = run(load(**slow_doc)).metrics
    assert slow.iteration_time_s > fast.iteration_time_s
    assert slow.breakdown_s[COMPUTE_TIME] == pytest.approx(fast.breakdown_s[COMPUTE_TIME])
    assert slow.breakdown_s[TP_COMM] == pytest.approx(fast.breakdown_s[TP_COMM])


def test_analytical_network_never_slower_than_fair_share():
    doc = {**TWO_NODES, "training": {**TWO_NODES["training"], "overlap_grad_reduce": True}}
    fair = run(load(**doc)).metrics
    analytical = run(load(**doc, network={"model": "analytical"})).metrics
    assert analytical.iteration_time_s <= fair.iteration_time_s * (1 + 1e-12)


def test_layer_params_and_memory_by_hand():
    s = load(**TWO_NODES)
    h = 1024
    t1 = load()  # TP 1
    assert layer_params_per_rank(t1) == 12 * h * h + 13 * h  # Narayanan et al. 2021, Sec 5.1
    # TP 2: the weight matrices and their sharded biases split, layernorms and two biases do not
    assert layer_params_per_rank(s) == (12 * h * h + 7 * h) / 2 + 6 * h
    first = stage_params_per_rank(s, 0)
    assert first == 2 * layer_params_per_rank(s) + 32000 * h / 2 + 1024 * h
    # full recompute keeps each layer's input: 2 s b h bytes per layer per micro-batch
    assert activation_bytes_per_layer(s) == 2 * 1024 * 1 * h
    stage0 = run(s).memory[0]
    assert stage0.inflight_activations == 2  # 1F1B: p - stage
    assert stage0.weights_bytes == 2 * first and stage0.optimizer_bytes == 12 * first
    working_set = 1024 * h * (10 + 24 / 2 + 5 * 16 * 1024 / (h * 2))  # one layer, no recompute
    assert stage0.activations_bytes == 2 * 2 * (2 * 1024 * h) + working_set


def test_no_recompute_activations_follow_korthikanti():
    s = load(parallel={"tensor_model_parallel_size": 2})
    sbh, a, sq, h, t = 1024 * 1024, 16, 1024, 1024, 2
    assert activation_bytes_per_layer(s) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * sq / (h * t))
    )


def test_deadlock_names_the_blocked_ops():
    builder = WorkloadBuilder()
    a = builder.lane(gpu=0, stream="compute", stage=0)
    b = builder.lane(gpu=1, stream="compute", stage=1)
    builder.add(a, FORWARD, "F0", duration_s=1.0, deps=["y"])
    builder.add(a, PP_SEND, "x", blocking=False, key="x", transfer=None)
    builder.add(b, BARRIER, "needs x", deps=["x"])
    builder.add(b, FORWARD, "F1", duration_s=1.0, key="y")
    with pytest.raises(DeadlockError, match="2 lanes cannot go on.*'F0' waits for forward 'F1'"):
        simulate(builder.build())


def test_iteration_ends_with_the_last_op_even_under_contention():
    # A short and a long flow share a link: the long one speeds up when the short one
    # ends, leaving a stale wake-up queued that must not extend the iteration.
    builder = WorkloadBuilder()
    for i, nbytes in enumerate((10.0, 100.0)):
        lane = builder.lane(gpu=i, stream="compute", stage=0)
        builder.add(lane, TP_COMM, f"t{i}", transfer=Transfer((0,), (1,), nbytes, 0.0))
    trace = simulate(builder.build(), network=FairShareNetwork.factory([10.0]))
    assert trace.end_s == pytest.approx(11.0)
    assert max(s.end_s for s in trace.spans) == trace.end_s


def test_recorded_idle_spans_are_the_idle_of_the_breakdown():
    result = run(load(**TWO_NODES))
    for lane, stage in zip(result.trace.lanes, result.metrics.stages, strict=True):
        spans = [s for s in result.trace.spans if s.gpu == lane.gpu and s.stream == "compute"]
        idle = sum(s.end_s - s.start_s for s in spans if s.kind == "idle")
        tail = result.trace.end_s - max(s.end_s for s in spans)
        assert idle + tail == pytest.approx(stage.breakdown_s[IDLE_TIME])
        # spans on a lane never overlap
        spans.sort(key=lambda s: s.start_s)
        assert all(a.end_s <= b.start_s + 1e-15 for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_no_stage_starts_a_microbatch_before_its_input_arrives(sp, recompute):
    doc = {
        **TWO_NODES,
        "parallel": {**TWO_NODES["parallel"], "sequence_parallel": sp},
        "training": {**TWO_NODES["training"], "recompute_granularity": recompute},
    }
    result = run(load(**doc))
    ops = result.workload.ops
    sends = {
        (result.workload.lanes[op.lane].stage, op.label): i
        for i, op in enumerate(ops)
        if op.kind == PP_SEND
    }
    end_of = {}
    for span in result.trace.spans:
        if span.stream == "pp":
            end_of[(span.gpu, span.label)] = span.end_s
    for lane in result.trace.lanes:
        stage = lane.stage
        for span in result.trace.spans:
            if span.gpu != lane.gpu or span.stream != "compute" or span.microbatch < 0:
                continue
            if span.kind in ("idle", "pp_wait"):
                continue
            source = stage - 1 if span.label.startswith("F") else stage + 1
            if not 0 <= source < 2 or (source, span.label) not in sends:
                continue
            source_gpu = result.trace.lanes[source].gpu
            assert span.start_s >= end_of[(source_gpu, span.label)] - 1e-15


def test_gpipe_keeps_every_microbatch_in_flight():
    doc = {**TWO_NODES, "training": {**TWO_NODES["training"], "schedule": "gpipe"}}
    memory = run(load(**doc)).memory
    assert [m.inflight_activations for m in memory] == [8, 8]


def test_gpus_sharing_a_nic_are_charged_together_in_the_lowering():
    # 4 V100s per node behind one NIC, one pipeline stage per node: 4 sends share it.
    s = load(
        cluster={"node": "v100x4", "num_nodes": 2},
        parallel={"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2},
        training={"global_batch_size": 2},
    )
    result = run(s)
    from stepsim.run.iteration import build_cluster

    links = build_cluster(s.cluster).links
    send = next(op for op in result.workload.ops if op.kind == PP_SEND)
    by_kind = {
        links[i].kind: m for i, m in zip(send.transfer.links, send.transfer.mults, strict=True)
    }
    assert by_kind == {"ib": 4, "pcie": 1}
    assert send.transfer.bytes_per_flow == 1 * 1024 * 1024 * 2 / 4


def _two_flows_on_one_link():
    builder = WorkloadBuilder()
    for i in range(2):
        lane = builder.lane(gpu=i, stream="compute", stage=0)
        builder.add(lane, TP_COMM, f"t{i}", transfer=Transfer((0,), (1,), 100.0, 0.0))
    return builder.build()


@pytest.mark.parametrize(
    ("network", "end_s"), [(FairShareNetwork, 20.0), (AnalyticalNetwork, 10.0)]
)
def test_the_engine_runs_the_network_it_is_given(network, end_s):
    # 100 bytes each on a 10 B/s link: shared, both end at 20 s; each as if alone, at 10 s
    trace = simulate(_two_flows_on_one_link(), network=network.factory([10.0]))
    assert trace.end_s == end_s
    assert trace.num_transfers == 2


def test_without_a_network_transfers_only_take_their_latency():
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    builder.add(lane, PP_SEND, "hop", transfer=delay(0.25))
    assert simulate(builder.build()).end_s == 0.25


def test_keys_of_different_kinds_with_equal_fields_name_different_ops():
    # a NamedTuple would equal any tuple of the same values; these keys must not
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    pipeline, layer = PipelineKey((0, 0), 1, "F0", 2), LayerKey((0, 0), 1, "F0", 2)
    assert pipeline != layer
    first = builder.add(lane, FORWARD, "a", duration_s=1.0, key=pipeline)
    second = builder.add(lane, FORWARD, "b", duration_s=1.0, key=layer)
    waits = builder.add(lane, BARRIER, "c", deps=[layer, pipeline, builder.last_key(lane)])
    assert builder.build().ops[waits].deps == (second, first, second)
    with pytest.raises(ValueError, match="two ops share the key"):
        builder.add(lane, FORWARD, "d", key=PipelineKey((0, 0), 1, "F0", 2))


def _alone_and_shared():
    """Lane 0: two TP collectives in a row on links 0, 1 (alone); lane 1: a blocking and
    a non-blocking one on link 2; lanes 2 and 3: one each on link 3 (shared)."""
    builder = WorkloadBuilder()
    lanes = [builder.lane(gpu=i, stream="compute", stage=0) for i in range(4)]
    ring = (Transfer((0, 1), (1, 2), 100.0, 0.5),)
    builder.add(lanes[0], TP_COMM, "a", transfer=ring)
    builder.add(lanes[0], FORWARD, "f", duration_s=1.0)
    builder.add(lanes[0], TP_COMM, "b", transfer=ring)
    builder.add(lanes[1], TP_COMM, "c", transfer=(Transfer((2,), (1,), 100.0, 0.0),))
    builder.add(lanes[1], PP_SEND, "d", transfer=Transfer((2,), (1,), 50.0, 0.0), blocking=False)
    for lane in lanes[2:]:
        builder.add(lane, TP_COMM, "e", transfer=(Transfer((3,), (1,), 100.0, 0.0),))
    return builder.build()


def test_only_collectives_no_other_transfer_meets_run_alone():
    workload = _alone_and_shared()
    ring = workload.ops[0].transfer
    assert alone(workload) == {id(ring)}


def test_transfers_alone_on_their_links_give_the_claimed_path_s_trace_to_the_bit():
    class Claimed(FairShareNetwork):  # every transfer through start: the claimed path
        start_alone = Network.start_alone

    capacities = [40.0, 40.0, 10.0, 10.0]
    fast = simulate(_alone_and_shared(), network=FairShareNetwork.factory(capacities))
    plain = simulate(_alone_and_shared(), network=Claimed.factory(capacities))
    assert fast == plain
    # lane 0: 0.5 s latency + 100 B at 20 B/s (link 1 carries two flows), a 1 s forward,
    # the same again
    assert [sp.end_s for sp in fast.spans if sp.gpu == 0] == [5.5, 6.5, 12.0]
    assert fast.num_transfers == 6


def _pairs():
    """Blocking p2p pairs as DeepSpeed's are lowered (a non-blocking member op per side,
    then a barrier on it): lanes 0-1 and 1-2 each on link 4 (both hold lane 1: alone);
    lanes 3-4 on link 5, where lane 3 goes on without waiting, beside a blocking op of
    lane 5 (no lane in common: shared); a multi-phase pair of lanes 6-7 on link 6."""
    builder = WorkloadBuilder()
    lanes = [builder.lane(gpu=i, stream="compute", stage=i) for i in range(8)]
    hop = Transfer((4,), (1,), 100.0, 0.0)

    def member(lane, name, transfer, waits=True):
        index = builder.add(lane, PP_SEND, name, transfer=transfer, blocking=False, rendezvous=name)
        if waits:
            builder.add(lane, BARRIER, name, deps=[index])
        builder.add(lane, FORWARD, "f", duration_s=1.0)

    for a, b, name in ((0, 1, "p"), (1, 2, "q")):
        member(lanes[a], name, hop)
        member(lanes[b], name, hop)
    other = Transfer((5,), (1,), 100.0, 0.0)
    member(lanes[3], "r", other, waits=False)
    member(lanes[4], "r", other)
    builder.add(lanes[5], TP_COMM, "t", transfer=(other,))
    two = (Transfer((6,), (1,), 10.0, 0.0), Transfer((6,), (1,), 10.0, 0.0))
    member(lanes[6], "s", two)
    member(lanes[7], "s", two)
    return builder.build()


def test_a_collective_whose_lanes_wait_for_it_runs_alone_where_they_hold_its_links():
    workload = _pairs()
    assert alone(workload) == {id(workload.ops[0].transfer)}
    capacities = [10.0] * 7
    fast = simulate(workload, network=FairShareNetwork.factory(capacities))
    plain = simulate(_pairs(), network=_Claimed.factory(capacities))
    assert repr(fast) == repr(plain)
    # lane 1: the pair with lane 0 (10 s at 10 B/s), a forward, then the pair with lane 2
    assert [sp.end_s for sp in fast.spans if sp.gpu == 1 and sp.kind == FORWARD] == [11.0, 22.0]


@pytest.mark.parametrize(
    "sections",
    [
        {"training": {"framework": "deepspeed"}},  # blocking p2p pairs alone
        {"network": {"symmetry": False}},  # exact: TP collectives of a rank per lane
        {"perturbation": [{"kind": "slow_gpu", "gpu": 3, "factor": 1.05}]},
    ],
)
def test_collectives_alone_on_their_links_give_the_claimed_path_s_run_to_the_bit(sections):
    doc = {**TWO_NODES, "training": {**TWO_NODES["training"], **sections.get("training", {})}}
    scenario = load(**{**sections, **doc, "network": sections.get("network", {})})
    result = run(scenario, idle_split=False)
    workload, capacities = result.workload, result.cluster.capacities
    members, lone = scan(workload)
    assert any(id(workload.ops[first].transfer) in lone for first in members)
    fast = simulate(workload, network=FairShareNetwork.factory(capacities), blame=True)
    plain = simulate(workload, network=_Claimed.factory(capacities), blame=True)
    assert repr(fast) == repr(plain)


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("tiny-2gpu", []),
        ("mt-nlg-530b-straggler", ["training.global_batch_size=96"]),  # DeepSpeed, a wait table
        ("llama3-8b-128k-cp8-h100", ["training.global_batch_size=16"]),  # context parallel
    ],
)
def test_metrics_added_up_while_simulating_are_the_spans_metrics_to_the_bit(name, overrides):
    """`stepsim run --json` keeps no spans (engine.core.simulate_totals): its metrics are
    those summed from the recorded spans, float for float."""
    scenario = load_scenario(name, overrides)
    kept, added = run(scenario), run(scenario, spans=False)
    assert added.trace.spans == [] and kept.trace.spans
    assert added.metrics == kept.metrics
    assert added.metrics.to_json() == kept.metrics.to_json()


def test_a_congruent_group_keeps_its_spans_for_the_totals():
    scenario = load_scenario("tiny-2gpu", ["network.symmetry=false"])
    result = run(scenario, spans=False)
    if any(lane.copies > 1 for lane in result.workload.lanes):
        assert result.trace.spans  # the reports give the group's lane to each GPU
    with pytest.raises(ValueError, match="congruent group"):
        lanes = result.workload.lanes
        simulate_totals(result.workload._replace(lanes=(lanes[0]._replace(copies=2), *lanes[1:])))


def _simpy_loop(workload, network, *, totals, blame):
    """The engine with simpy's own run loop, every event through its callbacks: what
    `_Engine._run_clock`'s few steps for the common events must give to the bit."""
    engine = _Engine(workload, network, totals=totals)
    engine.blame = _Blame() if blame else None
    engine._wake(range(len(workload.lanes)))
    engine.env.run()
    return engine.result(), engine.seconds, engine.num_spans


class _Claimed(FairShareNetwork):  # every transfer through start: no alone path
    start_alone = Network.start_alone


@pytest.mark.parametrize(
    "sections",
    [
        {},  # symmetric: TP all-reduces alone on NVLink, p2p sends, the DP all-reduce
        {"network": {"symmetry": False}},  # exact: collectives meet at rendezvous
        {"network": {"model": "analytical"}},
        {"training": {"framework": "deepspeed"}},  # blocking p2p pairs, barriers
        {"perturbation": [{"kind": "slow_gpu", "gpu": 3, "factor": 1.05}]},  # who waited
    ],
)
def test_the_engine_s_run_loop_gives_simpy_s_run_to_the_bit(sections):
    """`_Engine.run` pops simpy's queue itself and ends the commonest events (a compute
    op, a transfer alone on its links) in a few steps: the same trace, intervals,
    waits, totals and counts as simpy's loop running every callback."""
    doc = {**TWO_NODES, "training": {**TWO_NODES["training"], **sections.get("training", {})}}
    scenario = load(**{**sections, **doc, "network": sections.get("network", {})})
    result = run(scenario, idle_split=False)
    workload, capacities = result.workload, result.cluster.capacities
    networks = [NETWORKS[scenario.network.model].factory(capacities)]
    if scenario.network.model == "fair-share":
        networks.append(_Claimed.factory(capacities))
    blame = "perturbation" in sections
    for network in networks:
        for totals in (
            (False, True) if all(lane.copies == 1 for lane in workload.lanes) else (False,)
        ):
            engine = _Engine(workload, network, totals=totals)
            engine.blame = _Blame() if blame else None
            fast = engine.run(), engine.seconds, engine.num_spans
            slow = _simpy_loop(workload, network, totals=totals, blame=blame)
            assert repr(fast) == repr(slow)
            assert fast[0].spans or totals
            assert fast[0].waits or not blame


def test_progress_comes_once_per_percent_of_the_ops_done_in_order():
    """The run loop counts the ops it ends itself and asks about the progress callback
    only now and then: each 1 % of the ops is reported once, when the count has passed
    it (not always at the op that passed it), and every op is counted."""
    result = run(load(**TWO_NODES), idle_split=False)
    workload = result.workload
    network = FairShareNetwork.factory(result.cluster.capacities)
    for totals in (False, True):
        seen: list[float] = []
        engine = _Engine(workload, network, seen.append, totals=totals)
        engine.run()
        n = len(workload.ops)
        every = n // 100
        assert engine.num_done == n
        assert 90 <= len(seen) <= n // every and seen == sorted(set(seen))
        for k, fraction in enumerate(seen, start=1):
            assert k * every / n <= fraction <= 1.0
        assert seen[-1] >= (n // every) * every / n

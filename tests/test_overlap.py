"""F&B pairs with their MoE layers overlapped (overlap_moe_expert_parallel_comm): closed
forms with communication far below and far above the compute it hides behind."""

from __future__ import annotations

import json

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.moe import moe_block_work
from stepsim.cost.orders import stage_orders
from stepsim.emit.overlap import sharing_compute
from stepsim.ir.vocabulary import COMPUTE_STREAM, EP_COMM, EP_STREAM
from stepsim.report.trace import chrome_trace
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError, scenario_from_dict
from stepsim.schedules import Step, overlapped
from stepsim.schedules.dualpipe import combined_1f1b
from tests import trace_check
from tests.helpers import scenario

M = 4  # micro-batches: F0, F1&B0, F2&B1, F3&B2, B3 under the combined 1F1B


def _scenario(overlap: bool, nvlink_gbytes_per_s: float, fraction: float = 0.0, **training):
    tr = {"global_batch_size": 2 * M, "moe_token_dispatcher_type": "alltoall", **training}
    if overlap:
        tr |= {"overlap_moe_expert_parallel_comm": True}
    if overlap and fraction is not None:
        tr |= {"moe_comm_sm_fraction": fraction}
    return scenario_from_dict(
        scenario(
            model={
                "num_layers": 1,
                "num_experts": 4,
                "moe_router_topk": 2,
                "moe_routing": "balanced",
            },
            cluster={
                "node": "dgx-h100",
                "num_nodes": 1,
                "nvlink_gbytes_per_s": nvlink_gbytes_per_s,
                "collective_base_latency_us": 1.0,
            },
            parallel={
                "data_parallel_size": 2,
                "expert_model_parallel_size": 2,
                "expert_tensor_parallel_size": 1,
            },
            training=tr,
        )
    )


def test_combined_1f1b_pairs_each_steady_forward_with_the_backward_after_it():
    orders = stage_orders(_scenario(True, 1e6))
    assert orders == [[Step("F", 0), *[s for i in range(M - 1) for s in (
        Step("F", i + 1), Step("B", i))], Step("B", M - 1)]]  # fmt: skip
    assert [s.overlapped for s in orders[0]] == [False] + [False, True] * (M - 1) + [False]
    two = combined_1f1b([[Step("F", 0), Step("F", 1), Step("B", 0), Step("F", 2), Step("B", 1)]])
    assert [s.overlapped for s in two[0]] == [False, False, True, False, True]
    assert overlapped(Step("B", 0)) in two[0]


def test_fast_communication_is_hidden_in_every_pair():
    """Communication far below the compute it overlaps, SMs free: the compute is unchanged,
    each pair's all-to-alls are hidden, and what stays exposed is the unpaired first
    forward's and last backward's, 2 of the 2m passes."""
    plain, paired = run(_scenario(False, 1e6)).metrics, run(_scenario(True, 1e6)).metrics
    assert paired.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"], rel=1e-12)
    exposed = plain.breakdown_s[EP_COMM]
    assert exposed > 0
    assert paired.breakdown_s[EP_COMM] == pytest.approx(exposed / M, rel=1e-9)
    assert paired.iteration_time_s == pytest.approx(
        plain.iteration_time_s - exposed * (M - 1) / M, rel=1e-9
    )


def test_slow_communication_decides_the_pair():
    """Communication far above the compute: within a pair the all-to-alls run back to
    back on the communication stream (4 per MoE layer: the combine's dual, the forward's
    token-count all-gather and dispatch, the dispatch's dual, the combine: Megatron-Core's
    combined-1F1B order), so the pair takes them plus the compute before the first and
    after the last; the compute they hid is what the iteration saves."""
    plain, paired = run(_scenario(False, 1.0)), run(_scenario(True, 1.0))
    spans = sorted((s for s in paired.trace.spans if s.kind == EP_COMM), key=lambda s: s.start_s)
    assert {s.stream for s in spans} == {EP_STREAM}
    one = max(s.end_s - s.start_s for s in spans)
    # the all-to-alls; the token counts' all-gather before each dispatch is bytes, not MB
    counts = [s for s in spans if s.end_s - s.start_s <= one / 2]
    spans = [s for s in spans if s.end_s - s.start_s > one / 2]
    assert len(counts) == M  # one per forward: F0's, then one in each pair
    assert all(s.end_s - s.start_s == pytest.approx(one, rel=1e-9) for s in spans)
    # spans 0-1: F0 alone; 2-13: three pairs of 4 (with the forward's count all-gather
    # among them); 14-15: B3 alone
    windows = []
    for pair in range(M - 1):
        four = spans[2 + 4 * pair : 6 + 4 * pair]
        chain = sorted([*four, counts[1 + pair]], key=lambda s: s.start_s)
        for before, after in zip(chain, chain[1:], strict=False):
            assert after.start_s == pytest.approx(before.end_s, rel=1e-12)
        windows.append((chain[0], chain[-1]))
    compute = [s for s in paired.trace.spans if s.stream == COMPUTE_STREAM]
    hidden = sum(
        min(c.end_s, last.end_s) - max(c.start_s, first.start_s)
        for first, last in windows
        for c in compute
        if c.kind in ("forward", "backward") and c.end_s > first.start_s and c.start_s < last.end_s
    )
    assert hidden > 0
    assert paired.metrics.iteration_time_s == pytest.approx(
        plain.metrics.iteration_time_s - hidden, rel=1e-9
    )


def test_communication_sms_slow_the_gemms_through_the_wave_model():
    """A share f of the SMs held by communication: the pairs' kernels run on
    round(SMs (1 - f)); DeepSeek's 20 of 132 leaves 112, as a GEMM sharing 20 SMs."""
    cm = ComputeModel(_scenario(True, 1e6, 20 / 132))
    shared = sharing_compute(cm, 20 / 132)
    assert shared.constants.num_sms == 112 == cm.constants.num_sms - 20
    assert shared.gemm(4096, 4096, 4096) == cm.gemm_sharing(4096, 4096, 4096, 20)
    assert shared.memory_bound(1e9) == cm.memory_bound(1e9)
    assert sharing_compute(cm, 0.0) is cm
    plain = run(_scenario(False, 1e6)).metrics.breakdown_s["compute"]
    slower = run(_scenario(True, 1e6, 20 / 132)).metrics.breakdown_s["compute"]
    assert slower > plain
    # unset, the share is DeepSeek's when the overlap is on
    assert _scenario(True, 1e6, None).training.comm_sm_fraction == 20 / 132


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"moe_token_dispatcher_type": "allgather"}, "needs training.moe_token_dispatcher_type"),
        ({"recompute_granularity": "full"}, "cannot go with full recomputation"),
    ],
)  # fmt: skip
def test_rules(training, message):
    with pytest.raises(ScenarioError, match=message):
        _scenario(True, 1e6, **training)


def test_rules_need_expert_parallelism_and_the_overlap():
    with pytest.raises(ScenarioError, match="moe_comm_sm_fraction=0.1 applies only with"):
        _scenario(False, 1e6, moe_comm_sm_fraction=0.1)
    dense = scenario(training={"overlap_moe_expert_parallel_comm": True})
    with pytest.raises(ScenarioError, match="needs an MoE model with parallel.expert_model"):
        scenario_from_dict(dense)
    pipeline = scenario(
        model={"num_layers": 2, "num_experts": 4},
        parallel={
            "pipeline_model_parallel_size": 2,
            "data_parallel_size": 2,
            "expert_model_parallel_size": 2,
            "expert_tensor_parallel_size": 1,
        },
        training={
            "overlap_moe_expert_parallel_comm": True,
            "moe_token_dispatcher_type": "alltoall",
            "pipeline_p2p": "overlapped",
        },
    )
    with pytest.raises(ScenarioError, match="needs training.schedule in interleaved, dualpipev"):
        scenario_from_dict(pipeline)


def test_exact_mode_gives_symmetric_modes_time_with_dualpipev_pairs():
    """Every GPU's own all-to-alls on its own communication lane (exact mode) give the
    representative's time, with TP, SP, PP 2 in a V and EP over half the stage; the
    trace keeps every span, the all-to-alls on each GPU's "ep" thread."""
    times = []
    for symmetric in (True, False):
        doc = scenario(
            model={"num_layers": 4, "num_experts": 4, "moe_router_topk": 2},
            cluster={"node": "dgx-h100", "num_nodes": 1},
            parallel={
                "pipeline_model_parallel_size": 2,
                "virtual_pipeline_model_parallel_size": 2,
                "data_parallel_size": 2,
                "tensor_model_parallel_size": 2,
                "expert_model_parallel_size": 2,
                "expert_tensor_parallel_size": 1,
                "sequence_parallel": True,
            },
            training={
                "global_batch_size": 16,
                "schedule": "dualpipev",
                "moe_token_dispatcher_type": "alltoall",
                "overlap_moe_expert_parallel_comm": True,
            },
            network={"model": "fair-share", "symmetry": symmetric},
        )
        result = run(scenario_from_dict(doc))
        times.append(result.metrics.iteration_time_s)
        trace = json.loads(json.dumps(chrome_trace(result), separators=(",", ":")))
        assert trace_check.problems(trace) == []
        assert sum(map(len, trace_check.tracks(trace).values())) == len(result.trace.spans)
        names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        assert any("ep" in name for name in names)
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_delayed_weight_gradients_run_after_the_dispatch_dual_is_launched():
    """`delay_wgrad_compute`: in a pair the experts' weight gradients run as their own
    kernel after the dispatch's dual all-to-all is launched, so that all-to-all never
    starts later than without the delay and the iteration is never longer; without the
    overlap the key is refused."""
    experts_w = moe_block_work(ComputeModel(_scenario(True, 1.0))).experts_w.duration_s
    for bandwidth in (1.0, 10.0, 1e6):
        plain = run(_scenario(True, bandwidth))
        delayed = run(_scenario(True, bandwidth, delay_wgrad_compute=True))
        assert delayed.metrics.iteration_time_s <= plain.metrics.iteration_time_s * (1 + 1e-12)
        spans = [s for s in delayed.trace.spans if s.label == "B0" and s.kind == "backward"]
        assert any(s.end_s - s.start_s == pytest.approx(experts_w) for s in spans)
        before = [s for s in plain.trace.spans if s.label == "B0" and s.kind == "backward"]
        assert len(spans) == len(before) + 1
    # where the dispatch's dual waits for the weight gradients, the pair gets shorter
    plain = run(_scenario(True, 20.0)).metrics.iteration_time_s
    assert run(_scenario(True, 20.0, delay_wgrad_compute=True)).metrics.iteration_time_s < plain
    with pytest.raises(ScenarioError, match="delay_wgrad_compute=True applies only with"):
        _scenario(False, 1.0, delay_wgrad_compute=True)

"""Exact mode's congruent TP groups (comm/congruent.py): a group whose ranks nothing
tells apart is one lane, and every number the run reports is exact mode's with a lane
per GPU, to the bit."""

import dataclasses

import pytest

import stepsim.run.iteration as run_module
from stepsim.report.metrics import compute_lanes, spans_per_gpu
from stepsim.run.iteration import run
from stepsim.scenario.perturbation import PerturbationSpec
from tests.helpers import load

# TP 4 on 8-GPU nodes (two groups per node, each rank its own NIC), PP 4, DP 4, ZeRO-1
# with overlapped buckets, tied embeddings: sends, rings and the tied all-reduce coupled
LAYOUT = {
    "cluster": {"num_nodes": 8},
    "parallel": {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 4,
        "data_parallel_size": 4,
    },
    "training": {
        "global_batch_size": 16,
        "overlap_grad_reduce": True,
        "data_parallel_sharding": "optimizer",
    },
    "network": {"symmetry": False},
}
VARIANTS = {
    "megatron": {},
    "deepspeed's blocking p2p": {"framework": "deepspeed", "overlap_grad_reduce": False},
    "overlapped p2p, sequence parallel": {"pipeline_p2p": "overlapped"},
}


def _per_gpu(scenario, monkeypatch):
    """The run with a lane per GPU (exact mode before congruent groups)."""
    with monkeypatch.context() as m:
        m.setattr(run_module, "collapsible", lambda _scenario: False)
        return run(scenario)


def _spans_by_gpu(trace):
    out = {}
    for span in spans_per_gpu(trace):
        out.setdefault((span.gpu, span.stream), []).append(span[2:7])
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_congruent_group_is_one_lane_and_reports_exact_modes_numbers(variant, monkeypatch):
    training = {**LAYOUT["training"], **VARIANTS[variant]}
    parallel = LAYOUT["parallel"] | ({"sequence_parallel": True} if "sequence" in variant else {})
    s = load(**{**LAYOUT, "training": training, "parallel": parallel})
    collapsed, exact = run(s), _per_gpu(s, monkeypatch)
    assert [lane.copies for lane in collapsed.workload.lanes] == [4] * 16
    assert all(lane.copies == 1 for lane in exact.workload.lanes)
    assert len(exact.workload.ops) == 4 * len(collapsed.workload.ops)
    assert collapsed.metrics.to_json() == exact.metrics.to_json()
    # each GPU of a group did what the group's lane did, span for span
    assert _spans_by_gpu(collapsed.trace) == _spans_by_gpu(exact.trace)
    lanes = compute_lanes(collapsed.workload.lanes)
    assert [lane.gpu for lane in lanes] == [lane.gpu for lane in exact.workload.lanes]


def test_a_slow_node_slows_whole_groups_and_they_stay_one_lane(monkeypatch):
    slow = PerturbationSpec(kind="slow_gpu", node=5, factor=1.3)
    s = dataclasses.replace(load(**LAYOUT), perturbations=(slow,))
    collapsed, exact = run(s), _per_gpu(s, monkeypatch)
    assert all(lane.copies == 4 for lane in collapsed.workload.lanes)
    assert collapsed.metrics.to_json() == exact.metrics.to_json()
    assert collapsed.metrics.waits  # who waited for whom, per GPU as exact mode says


@pytest.mark.parametrize(
    "p",
    [
        PerturbationSpec(kind="slow_gpu", gpu=36, factor=1.3),
        PerturbationSpec(kind="jitter", node=5, sigma=0.05, seed=1),
        PerturbationSpec(kind="slow_nic", node=5, nic=3, bandwidth_factor=0.5),
    ],
)
def test_what_tells_ranks_apart_keeps_a_lane_per_gpu(p):
    s = dataclasses.replace(load(**LAYOUT), perturbations=(p,))
    assert all(lane.copies == 1 for lane in run(s).workload.lanes)


def test_ranks_sharing_a_nic_keep_a_lane_per_gpu():
    """One NIC per node: every rank's sends and rings cross it, so one coupled flow would
    fill it in one step where exact mode's flows take T (RankLinks falls back)."""
    s = load(**{**LAYOUT, "cluster": {"num_nodes": 8, "nics_per_node": 1}})
    assert all(lane.copies == 1 for lane in run(s).workload.lanes)

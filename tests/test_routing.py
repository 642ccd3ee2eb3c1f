"""Routing skew (`model.moe_routing`; cost/routing.py, docs/moe.md): the shares, the
busiest rank's experts, the all-to-all-v by closed form, and the rules."""

import dataclasses
import math

import pytest

from stepsim.comm.collectives import Fabric
from stepsim.comm.placement import StageComm, placement_of
from stepsim.cost.compute import ComputeModel
from stepsim.cost.moe import busiest_rank, moe_block_work
from stepsim.cost.routing import expert_shares, grouped_gemm, rank_loads, rank_rows
from stepsim.ir.vocabulary import ALL_TO_ALL
from stepsim.report.summary import summary_text
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario import ScenarioError
from stepsim.scenario.loader import scenario_to_dict
from tests.helpers import load, time_transfers
from tests.test_moe import H, S, moe_scenario

ZIPF = {"moe_routing": "zipf", "moe_routing_zipf_exponent": 1.0}
# a cluster on which communication costs (next to) nothing: the time is the compute's
FREE = {
    "node": "dgx-h100",
    "nvlink_gbytes_per_s": 1e7,
    "nic_gbps": 1e7,
    "pcie_gbytes_per_s": 1e7,
    "nvlink_latency_us": 0.0,
    "pcie_latency_us": 0.0,
    "ib_latency_us": 0.0,
    "collective_base_latency_us": 0.0,
}


def test_zipf_shares_fall_as_one_over_rank_and_are_capped_at_one_over_topk():
    model = moe_scenario(experts=8, topk=2, model=ZIPF).model
    shares = expert_shares(model, 1)
    assert math.fsum(shares) == pytest.approx(1.0)
    harmonic = sum(1 / (e + 1) for e in range(8))
    assert shares[0] == pytest.approx(1 / harmonic)  # 0.368 < 1/2: not capped
    assert shares[3] / shares[1] == pytest.approx(2 / 4)
    steep = moe_scenario(experts=8, topk=4, model={**ZIPF, "moe_routing_zipf_exponent": 2.0})
    capped = expert_shares(steep.model, 1)
    assert capped[0] == pytest.approx(1 / 4)  # 1/H_8,2 = 0.65 > 1/4: capped
    assert math.fsum(capped) == pytest.approx(1.0)
    assert capped[1] == pytest.approx(1 / 4)  # rescaled above the cap too: capped
    assert capped[3] / capped[2] == pytest.approx(9 / 16)


def test_steep_zipf_over_many_experts_caps_the_top_k_and_leaves_the_rest_near_zero():
    """(e+1)^x overflows a float past 1e308 (4096 experts, x = 100): those experts'
    shares are 0 (no OverflowError); the rest water-filled under the 1/k cap."""
    steep = {**ZIPF, "moe_routing_zipf_exponent": 100.0}
    model = dataclasses.replace(
        moe_scenario(experts=8, topk=2, model=steep).model, num_experts=4096
    )
    shares = expert_shares(model, 1)
    assert shares[0] == 0.5  # capped; expert 1 takes the other half, less what follows
    assert shares[2] == pytest.approx(0.5 * (2 / 3) ** 100)
    assert shares[1] == pytest.approx(0.5)
    assert shares[-1] == 0.0  # 4096^100 overflows: 0
    assert math.fsum(shares) == pytest.approx(1.0)


def test_rank_loads_put_the_hottest_experts_on_ep_rank_zero():
    """Experts sit in order on the EP ranks (Megatron-Core): under zipf rank 0 is the
    busiest, its load EP x the shares of its E / EP experts."""
    scenario = moe_scenario(experts=8, topk=2, ep=4, dp=4, model=ZIPF)
    loads = rank_loads(scenario.model, 4)
    harmonic = sum(1 / (e + 1) for e in range(8))
    assert loads[0] == pytest.approx(4 * (1 + 1 / 2) / harmonic)
    assert math.fsum(loads) == pytest.approx(4)
    assert busiest_rank(ComputeModel(scenario)) == 0
    rows = rank_rows(ComputeModel(scenario), 0)
    assert math.fsum(rows) == pytest.approx(S * 2 * loads[0])  # n k l_0: its received copies


def test_zipf_exponent_zero_is_balanced_to_the_bit():
    balanced = moe_scenario(ep=4, dp=4)
    flat = moe_scenario(ep=4, dp=4, model={**ZIPF, "moe_routing_zipf_exponent": 0.0})
    assert run(flat).metrics.iteration_time_s == run(balanced).metrics.iteration_time_s


def test_grouped_gemm_of_equal_shapes_is_the_batched_gemm():
    cm = ComputeModel(moe_scenario())
    assert grouped_gemm(cm, [(512.0, 2048.0, 1024.0)] * 4) == cm.gemm(512, 2048, 1024, 4)
    # the unequal shapes' tile and wave sum meets the batched GEMM as the shapes meet (the
    # line above takes a shortcut; this goes through the sum)
    for m in (96.0, 512.0, 3000.0):
        near = [(m, 2048.0, 1024.0)] * 3 + [(m * (1 - 1e-12), 2048.0, 1024.0)]
        batched = cm.gemm(m, 2048, 1024, 4).duration_s
        assert grouped_gemm(cm, near).duration_s == pytest.approx(batched, rel=1e-9)
    # unequal: each expert's tiles overhang its own rows; an empty expert computes nothing
    alone = grouped_gemm(cm, [(512.0, 2048.0, 1024.0)])
    assert grouped_gemm(cm, [(512.0, 2048.0, 1024.0), (0.0, 2048.0, 1024.0)]) == alone
    uneven = grouped_gemm(cm, [(1000.0, 2048.0, 1024.0), (24.0, 2048.0, 1024.0)])
    assert uneven.flops == cm.gemm(512, 2048, 1024, 2).flops
    assert uneven.duration_s > cm.gemm(512, 2048, 1024, 2).duration_s  # a 24-row tile wasted


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_alltoall_v_bytes_per_rank_by_closed_form(ep):
    """The dispatch's flows into EP rank b carry l_b / EP of each sender's n k rows; the
    busiest rank's ingress (its NVLink, inside a node) moves (EP - 1) l_0 / EP of them,
    and the all-to-all-v ends when it has: (EP - 1) l_0 n k h 2 / EP / bandwidth."""
    scenario = moe_scenario(experts=8, topk=2, ep=ep, dp=ep, model=ZIPF)
    loads = rank_loads(scenario.model, ep)
    cluster = build_cluster(scenario.cluster, pattern=True)
    comm = StageComm(scenario, Fabric.of(cluster, 0.0), placement_of(scenario), 0)
    copies = S * 2 * H * 2  # n k h bytes a GPU sends in all
    dispatch = comm.expert("ep", ALL_TO_ALL, copies, loads=(loads, False))
    assert dispatch.bytes_per_flow == copies / ep
    nvlink = scenario.cluster.nvlink_gbytes_per_s * 1e9 * scenario.cluster.nvlink_efficiency
    hottest = (ep - 1) * loads[0] * copies / ep
    latency = dispatch.latency_s
    assert time_transfers(cluster, dispatch) == pytest.approx(hottest / nvlink + latency)
    # the combine sends the same bytes back: the busiest rank's egress decides
    combine = comm.expert("ep", ALL_TO_ALL, copies, loads=(loads, True))
    assert time_transfers(cluster, combine) == pytest.approx(hottest / nvlink + latency)
    assert max(combine.mults) == pytest.approx((ep - 1) * loads[0])


def _experts_time(scenario, rank=None):
    work = moe_block_work(ComputeModel(scenario), rank)
    return work.experts.duration_s + work.experts_b.duration_s


@pytest.mark.parametrize("routing", [ZIPF, {**ZIPF, "moe_routing_zipf_exponent": 2.0}])
def test_skew_raises_the_time_by_the_busiest_ranks_excess_when_communication_is_free(routing):
    """p = 1, every layer MoE, 8 micro-batches: with the links (next to) free, the step
    is the compute lane's, and skew adds per micro-batch and layer the busiest rank's
    expert time over the balanced rank's."""
    kwargs = {"experts": 8, "topk": 2, "ep": 4, "dp": 4, "cluster": FREE}
    balanced, skew = moe_scenario(**kwargs), moe_scenario(**kwargs, model=routing)
    excess = _experts_time(skew) - _experts_time(balanced)
    assert excess > 0
    layers, microbatches = 2, skew.num_microbatches
    added = run(skew).metrics.iteration_time_s - run(balanced).metrics.iteration_time_s
    # (the all-to-all-v's extra bytes to the busiest rank still take ~1e-10 s a collective)
    assert added == pytest.approx(layers * microbatches * excess, rel=1e-5)
    # the representative's FLOPs stay the mean rank's: MFU is the model's whatever the skew
    assert moe_block_work(ComputeModel(skew)).experts.flops == pytest.approx(
        moe_block_work(ComputeModel(balanced)).experts.flops
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ep": 4, "dp": 4},
        {"ep": 8, "dp": 16, "nodes": 2},
        {"tp": 2, "ep": 2, "dp": 4, "parallel": {"expert_tensor_parallel_size": 2}},
        {"ep": 4, "dp": 4, "training": {"moe_token_dispatcher_type": "allgather"}},
    ],
)
def test_exact_mode_gives_each_rank_its_load_and_agrees_with_symmetric(kwargs):
    """Exact mode computes every EP rank's own experts and waits at the all-to-alls for
    the busiest; symmetric mode's representative computes the busiest's: one time."""
    model = {**ZIPF, "moe_routing_zipf_exponent": 1.5}
    symmetric = moe_scenario(**kwargs, model=model)
    exact = moe_scenario(**kwargs, model=model, network={"model": "fair-share", "symmetry": False})
    cm = ComputeModel(symmetric)
    assert _experts_time(symmetric, 0) > _experts_time(symmetric, cm.parallel.ep_size - 1)
    assert run(exact).metrics.iteration_time_s == pytest.approx(
        run(symmetric).metrics.iteration_time_s, rel=1e-9
    )


def test_shares_file_is_read_resolved_and_written_back(tmp_path):
    shares = tmp_path / "shares.txt"
    shares.write_text("# expert shares\n4\n2\n1\n1\n\n1\n1\n1\n1 # last\n")
    doc = {"moe_routing": "shares", "moe_routing_shares_file": str(shares)}
    scenario = moe_scenario(ep=4, dp=4, model=doc)
    assert scenario.model.moe_routing_shares == (4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert expert_shares(scenario.model, 1)[0] == pytest.approx(4 / 12)
    assert rank_loads(scenario.model, 4)[0] == pytest.approx(4 * 6 / 12)
    written = scenario_to_dict(scenario)["model"]
    assert written["moe_routing_shares_file"] == str(shares.resolve())
    assert "moe_routing_shares" not in written
    # and in Python, the tuple alone
    model = dataclasses.replace(
        scenario.model, moe_routing_shares_file=None, moe_routing_shares=(1.0,) * 8
    )
    assert expert_shares(model, 1) == expert_shares(moe_scenario().model, 1)
    with pytest.raises(ScenarioError, match="moe_routing_shares=.* applies to model.moe_routing"):
        dataclasses.replace(model, moe_routing="zipf")


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({"moe_routing_zipf_exponent": 1.0}, "applies to model.moe_routing='zipf' only"),
        ({"moe_routing": "shares"}, "missing key model.moe_routing_shares_file"),
    ],
)
def test_routing_rules(model, match):
    with pytest.raises(ScenarioError, match=match):
        moe_scenario(model=model)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1\n1\n", "one share per expert: 2 given, model.num_experts=8"),
        ("9\n1\n1\n1\n1\n1\n1\n1\n", "no expert may take more than 1/moe_router_topk=0.5"),
        ("1\nx\n", "line 2 is not a number"),
        ("1\n-1\n", "line 2 must be a share >= 0"),
        ("0\n0\n0\n0\n0\n0\n0\n0\n", "must not all be 0"),
    ],
)
def test_shares_file_rules(tmp_path, text, match):
    path = tmp_path / "shares.txt"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=match):
        moe_scenario(model={"moe_routing": "shares", "moe_routing_shares_file": str(path)})


def test_routing_keys_need_an_moe_model():
    with pytest.raises(ScenarioError, match="model.moe_routing='zipf' needs model.num_experts"):
        load(
            model={"num_layers": 2, "hidden_size": H, "seq_length": S, "moe_routing": "zipf"},
            cluster={"node": "dgx-h100", "num_nodes": 1},
        )


def test_the_summary_names_the_routing_and_the_busiest_ranks_load():
    skew = moe_scenario(experts=8, topk=2, ep=4, dp=4, model=ZIPF)
    loads = rank_loads(skew.model, 4)
    text = summary_text(run(skew))
    assert f"zipf (exponent 1): the busiest EP rank (rank 0) gets {loads[0]:.3g} x" in text
    assert "  routing " not in summary_text(run(moe_scenario(ep=4, dp=4)))


def test_a_shares_file_error_never_echoes_the_file(tmp_path):
    """Pointed at a file that is not a shares file, the error names the line only."""
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:secret-line\n")
    with pytest.raises(ScenarioError) as caught:
        moe_scenario(model={"moe_routing": "shares", "moe_routing_shares_file": str(path)})
    assert "secret" not in str(caught.value) and "line 1 is not a number" in str(caught.value)

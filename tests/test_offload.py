"""Activation offloading (`training.cpu_offloading`, emit/offload.py): memory, the copies'
bytes and when the compute stream waits for them, by closed form; the rules' errors."""

import math

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.memory import (
    activation_bytes_per_layer,
    moe_activation_bytes,
    offload_saving_bytes,
    stage_memory,
)
from stepsim.ir.vocabulary import COMPUTE_STREAM, OFFLOAD, OFFLOAD_STREAM
from stepsim.report.summary import summary_text
from stepsim.run.iteration import build_cluster, memory_per_stage, run
from stepsim.scenario import ScenarioError
from tests.helpers import load
from tests.test_moe import moe_scenario

LAYERS, MB = 6, 3


def _scenario(n=None, *, cluster=None, parallel=None, network=None, **training):
    """A small dense model on one DGX H100, PP 1, Megatron-Core 2025; offloading the first
    ``n`` layers (None: off)."""
    offload = {} if n is None else {"cpu_offloading": True, "cpu_offloading_num_layers": n}
    return load(
        model={"num_layers": LAYERS},
        cluster={"node": "dgx-h100", "num_nodes": 1, **(cluster or {})},
        parallel=parallel or {},
        network={"model": "fair-share", **(network or {})},
        training={
            "framework_version": "2025",
            "global_batch_size": MB,
            "attention_backend": "flash",
            **offload,
            **training,
        },
    )


def _copies(result):
    return [op for op in result.workload.ops if op.kind == OFFLOAD]


def test_memory_drops_by_the_offloaded_layers_activations():
    plain = stage_memory(_scenario(), 0, 1)
    for n in (1, 3, LAYERS - 1):
        scenario = _scenario(n)
        offloaded = stage_memory(scenario, 0, 1)
        per_layer = activation_bytes_per_layer(scenario)
        assert plain.activations_bytes - offloaded.activations_bytes == pytest.approx(
            n * per_layer, rel=1e-12
        )
        assert offloaded.weights_bytes == plain.weights_bytes
    assert offload_saving_bytes(_scenario(0), 0) == 0.0  # on, no layer: nothing moves


def test_moe_layers_leave_the_largest_window_of_layers_on_the_gpu():
    # first layer dense, the rest MoE: TE keeps at most L - N consecutive layers, the
    # largest window (the last ones, all MoE) is what stays
    def scenario(n=None):
        offload = {} if n is None else {"cpu_offloading": True, "cpu_offloading_num_layers": n}
        return moe_scenario(
            model={"num_layers": 4, "first_k_dense_replace": 1},
            training={"framework_version": "2025", **offload},
        )

    plain = memory_per_stage(scenario())[0].activations_bytes
    off = memory_per_stage(scenario(2))[0].activations_bytes
    s = scenario(2)
    dense = activation_bytes_per_layer(s)
    moe = moe_activation_bytes(s, activation_bytes_per_layer(s, dense_mlp=False))
    assert moe != dense
    assert plain - off == pytest.approx((dense + 3 * moe) - 2 * moe, rel=1e-12)


def test_the_copies_move_twice_the_offloaded_activations_per_microbatch():
    n = 3
    scenario = _scenario(n)
    result = run(scenario)
    copies = _copies(result)
    assert len(copies) == 2 * n * MB
    moved = math.fsum(op.transfer[0].bytes_per_flow for op in copies)
    assert moved == pytest.approx(2 * n * MB * activation_bytes_per_layer(scenario), rel=1e-12)
    lanes = {result.workload.lanes[op.lane].stream for op in copies}
    assert lanes == {OFFLOAD_STREAM}
    text = summary_text(result)
    assert f"activation offload        {n} of {LAYERS} layers" in text
    assert f"{moved / 1e9:.4g} GB per GPU per iteration" in text


@pytest.mark.parametrize("link", ["host", "pcie"])
def test_a_fast_host_link_costs_no_time(link):
    fast = {"host_link_gbytes_per_s": 1e7} if link == "host" else {"pcie_gbytes_per_s": 1e7}
    plain = run(_scenario(cluster=fast)).metrics
    offloaded = run(_scenario(3, cluster=fast)).metrics
    assert offloaded.iteration_time_s == plain.iteration_time_s
    assert offloaded.breakdown_s[OFFLOAD] == 0.0
    assert OFFLOAD not in plain.breakdown_s  # the category only where offloading is on


def _copy_s(scenario, link):
    """One layer's copy: the hop's latency, then its bytes at the link's rate."""
    nbytes = activation_bytes_per_layer(scenario)
    cl = scenario.cluster
    rate = cl.host_link_bytes_per_s if link == "host" else cl.pcie_gbytes_per_s * 1e9
    return cl.pcie_latency_us * 1e-6 + nbytes / rate


@pytest.mark.parametrize("link", ["host", "pcie"])
def test_offloading_all_but_one_layer_serializes_every_copy(link):
    # N = L - 1: layer i + 1's forward waits for layer i's copy out, layer i's backward
    # for its copy back, issued only when that backward begins (TE warns of no overlap)
    slow = {"host_link_gbytes_per_s": 5.0} if link == "host" else {"pcie_gbytes_per_s": 5.0}
    plain = run(_scenario(cluster=slow)).metrics
    scenario = _scenario(LAYERS - 1, cluster=slow)
    offloaded = run(scenario).metrics
    stall = MB * 2 * (LAYERS - 1) * _copy_s(scenario, link)
    assert offloaded.iteration_time_s - plain.iteration_time_s == pytest.approx(stall, rel=1e-9)
    assert offloaded.breakdown_s[OFFLOAD] == pytest.approx(stall, rel=1e-9)


def test_one_offloaded_layer_waits_only_for_what_the_layers_between_do_not_hide():
    # N = 1: layer 0 leaves after its forward and must be out before layer L - 1's
    # forward; it comes back after layer L - 1's backward and must be in before layer 0's
    scenario = _scenario(1, cluster={"host_link_gbytes_per_s": 0.5})
    layer = ComputeModel(scenario).layer()
    forward = (layer.attention_forward + layer.mlp_forward).duration_s
    backward = (layer.mlp_backward + layer.attention_backward).duration_s
    copy = _copy_s(scenario, "host")
    hidden_f, hidden_b = (LAYERS - 2) * forward, (LAYERS - 2) * backward
    assert copy > max(hidden_f, hidden_b)  # the link is slow enough to show both waits
    stall = MB * ((copy - hidden_f) + (copy - hidden_b))
    plain = run(_scenario(cluster={"host_link_gbytes_per_s": 0.5})).metrics
    offloaded = run(scenario).metrics
    assert offloaded.iteration_time_s - plain.iteration_time_s == pytest.approx(stall, rel=1e-9)


def test_copies_share_the_pcie_link_with_the_nic():
    # two nodes, TP 8 in each, DP 2 over the NICs: the gradient all-reduce crosses the
    # GPU's PCIe link the copies cross; the link's bytes are both
    two = {"num_nodes": 2}
    dp = {"tensor_model_parallel_size": 8, "data_parallel_size": 2}
    n = 2
    plain = run(_scenario(cluster=two, parallel=dp, global_batch_size=2 * MB))
    offloaded = run(_scenario(n, cluster=two, parallel=dp, global_batch_size=2 * MB))
    pcie = {link.kind: link for link in plain.metrics.busiest_links}["pcie"]
    pcie_off = {link.kind: link for link in offloaded.metrics.busiest_links}["pcie"]
    per_layer = activation_bytes_per_layer(offloaded.scenario)
    copied = n * MB * per_layer / 1e9  # one direction
    assert pcie_off.gbytes == pytest.approx(pcie.gbytes + copied, rel=1e-6)


def test_exact_mode_agrees_with_symmetric_mode():
    # (the steady-state fast-forward needs PP > 1, which offloading is not run with)
    tp2 = {"tensor_model_parallel_size": 2, "data_parallel_size": 4}
    slow = {"pcie_gbytes_per_s": 2.0}
    symmetric = run(_scenario(2, cluster=slow, parallel=tp2, global_batch_size=4 * MB)).metrics
    exact = run(
        _scenario(
            2, cluster=slow, parallel=tp2, network={"symmetry": False}, global_batch_size=4 * MB
        )
    ).metrics
    assert symmetric.breakdown_s[OFFLOAD] > 0  # the slow link shows
    assert exact.iteration_time_s == pytest.approx(symmetric.iteration_time_s, rel=1e-9)
    assert exact.breakdown_s[OFFLOAD] == pytest.approx(symmetric.breakdown_s[OFFLOAD], rel=1e-9)


def test_weights_alone_offload_nothing_and_the_grace_superchips_have_c2c():
    weights = _scenario(
        3, cpu_offloading_activations=False, cpu_offloading_weights=True
    )  # TE: deprecated, no effect
    assert weights.training.offloaded_layers == 0
    assert not _copies(run(weights))
    assert _scenario(cluster={"node": "gb200-nvl72"}).cluster.host_link_bytes_per_s == 197e9
    assert _scenario().cluster.host_link_bytes_per_s is None
    # a positive layer count turns offloading on (Megatron-LM's arguments.py)
    implied = _scenario(cpu_offloading_num_layers=2)
    assert implied.training.offloaded_layers == 2


@pytest.mark.parametrize(
    ("training", "parallel", "message"),
    [
        (
            {"cpu_offloading_num_layers": LAYERS},
            {},
            f"training.cpu_offloading_num_layers={LAYERS} must be less than "
            f"model.num_layers={LAYERS} (Megatron-Core: CPU offloading can be done only for "
            f"layers less than {LAYERS})",
        ),
        (
            {"cpu_offloading_activations": False},
            {},
            "training.cpu_offloading_activations=False and training.cpu_offloading_weights "
            "= false leave nothing to offload (Transformer Engine: CPU Offloading is enabled "
            "while it is not mentioned what to offload)",
        ),
        (
            {},
            {"pipeline_model_parallel_size": 2},
            "training.cpu_offloading=True cannot go with pipeline parallelism (Megatron-Core: "
            "no support for pipeline parallelism with CPU offloading); "
            "parallel.pipeline_model_parallel_size=2",
        ),
        (
            {"recompute_granularity": "full"},
            {},
            "training.cpu_offloading=True cannot go with activation recomputation "
            "(Megatron-Core: CPU offloading does not work when recomputation is enabled); "
            "training.recompute_granularity='full'",
        ),
        (
            {"schedule": "gpipe"},
            {},
            'training.cpu_offloading=True needs training.schedule = "1f1b" (stepsim models '
            "Megatron-Core without pipeline parallelism, each micro-batch's backward right "
            "after its forward), not 'gpipe'",
        ),
        (
            {"framework_version": "2021"},
            {},
            "training.cpu_offloading=True is Megatron-Core's (megatron 2024 or 2025), not "
            "megatron 2021",
        ),
    ],
)
def test_each_rule_names_key_value_and_rule(training, parallel, message):
    with pytest.raises(ScenarioError) as err:
        _scenario(2, parallel=parallel, **training)
    assert str(err.value).startswith(message)


def test_an_implied_offloading_names_the_layer_count():
    with pytest.raises(ScenarioError) as err:
        _scenario(cpu_offloading_num_layers=2, recompute_granularity="selective")
    assert str(err.value).startswith("training.cpu_offloading_num_layers=2 cannot go with")


def test_the_f_and_b_overlap_is_refused():
    with pytest.raises(ScenarioError) as err:
        moe_scenario(
            ep=2,
            dp=2,
            training={
                "framework_version": "2025",
                "overlap_moe_expert_parallel_comm": True,
                "cpu_offloading": True,
                "cpu_offloading_num_layers": 1,
            },
        )
    assert "is not modelled with training.overlap_moe_expert_parallel_comm" in str(err.value)


def test_stage_memory_reports_the_offloaded_layers_only_on_the_gpu_that_has_them():
    scenario = _scenario(2)
    assert offload_saving_bytes(scenario, 0) > 0
    lanes = run(scenario).workload.lanes
    assert sorted(lane.stream for lane in lanes) == sorted([COMPUTE_STREAM, OFFLOAD_STREAM])


@pytest.mark.parametrize(
    "fabric",
    [{"fabric": "switch"}, {"fabric": "fat-tree", "nodes_per_leaf": 2}],
)
def test_a_gpus_pcie_link_is_the_same_in_the_pattern_and_the_whole_graph(fabric):
    s = load(
        cluster={"node": "dgx-h100", "num_nodes": 6, **fabric},
        parallel={"data_parallel_size": 48},
        training={"global_batch_size": 48},
    )
    whole, pattern = build_cluster(s.cluster), build_cluster(s.cluster, pattern=True)
    for gpu in range(48):
        out, back = whole.pcie_links(gpu)
        assert pattern.pcie_links(gpu) == (out, back)
        link = whole.links[out]
        assert (link.src, link.kind) == (("gpu", gpu), "pcie")
        assert whole.links[back].dst == ("gpu", gpu) and pattern.links[out] == link

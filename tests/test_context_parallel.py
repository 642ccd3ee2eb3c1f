"""Context parallelism: bytes by closed form, groups, memory, placement and the rules."""

from dataclasses import replace

import pytest

from stepsim.comm.placement import placement_of
from stepsim.cost.compute import ComputeModel
from stepsim.cost.context import ContextAttention
from stepsim.cost.memory import activation_bytes_per_layer
from stepsim.ir.vocabulary import BREAKDOWN_KEYS, CP_COMM
from stepsim.run.iteration import memory_per_stage, run
from stepsim.scenario import ScenarioError, dumps_toml, scenario_to_dict
from tests.helpers import load, lowered_with_and_without_replay

E = 2  # bytes per bf16 element
S, B, A, G, D = 4096, 1, 16, 8, 64  # sequence, micro-batch, heads, query groups, head size


def cp_scenario(cp=2, tp=2, comm=None, nodes=1, cluster=None, **sections):
    parallel = {
        "tensor_model_parallel_size": tp,
        "context_parallel_size": cp,
        "data_parallel_size": 1,
        **({"cp_comm_type": comm} if comm else {}),
        **sections.pop("parallel", {}),
    }
    return load(
        model={
            "num_layers": 2,
            "hidden_size": A * D,
            "num_attention_heads": A,
            "num_query_groups": G,
            "seq_length": S,
        },
        cluster={"node": "dgx-h100", "num_nodes": nodes, **(cluster or {})},
        parallel=parallel,
        training={
            "attention_backend": "flash",
            "global_batch_size": 2,
            **sections.pop("training", {}),
        },
        **sections,
    )


def kv_bytes(cp, tp):
    """K and V of a rank's s / CP tokens, its g / T query groups."""
    return 2 * E * B * (S // cp) * (G / tp) * D


@pytest.mark.parametrize("cp", [2, 4])
def test_p2p_ring_sends_cp_minus_1_kv_blocks_forward_and_twice_that_backward(cp):
    """TE's AttnFuncWithCPAndKVP2P: forward steps 0..CP-2 send K/V; backward step 0 K/V,
    steps 1..CP-2 K/V and dK/dV, the last dK/dV: 2 (CP - 1) blocks."""
    core = ContextAttention(ComputeModel(cp_scenario(cp=cp)))
    kv = kv_bytes(cp, 2)
    assert core.kv_bytes == kv
    assert core.bytes_sent(backward=False) == (cp - 1) * kv
    assert core.bytes_sent(backward=True) == 2 * (cp - 1) * kv
    assert [s.message_bytes for s in core.backward] == [kv] + [2 * kv] * (cp - 2) + [kv]


def test_the_whole_iteration_sends_the_closed_form_on_the_ring():
    """Every CP op of the simulated lane: layers x micro-batches x 3 (CP - 1) K/V blocks."""
    s = cp_scenario(cp=4)
    result = run(s)
    ops = [op for op in result.workload.ops if op.kind == CP_COMM]
    layers, microbatches = s.model.num_layers, s.num_microbatches
    assert sum(op.transfer.bytes_per_flow for op in ops) == pytest.approx(
        layers * microbatches * 3 * 3 * kv_bytes(4, 2)
    )
    assert len(ops) == layers * microbatches * (3 + 4)  # CP - 1 forward, CP backward


def test_all_gather_and_a2a_bytes_by_closed_form():
    cp, tp = 2, 2
    kv, q = kv_bytes(cp, tp), E * B * (S // cp) * (A / tp) * D
    gather = ContextAttention(ComputeModel(cp_scenario(cp=cp, comm="all_gather")))
    # all-gather of K/V forward; again, and dK/dV reduce-scattered, backward
    assert gather.bytes_sent(False) == (cp - 1) * kv
    assert gather.bytes_sent(True) == 2 * (cp - 1) * kv
    a2a = ContextAttention(ComputeModel(cp_scenario(cp=cp, comm="a2a")))
    # Q, K, V in and O out (backward: dO in, dQ, dK, dV out), (CP - 1) / CP of each
    assert a2a.bytes_sent(False) == pytest.approx((q + kv + q) * (cp - 1) / cp)
    assert a2a.bytes_sent(True) == pytest.approx((q + q + kv) * (cp - 1) / cp)


def test_cp_1_is_the_scenario_without_it():
    plain = load(training={"attention_backend": "flash"})
    one = replace(plain, parallel=replace(plain.parallel, context_parallel_size=1))
    assert run(one).metrics == run(plain).metrics
    assert list(run(plain).metrics.breakdown_s) == list(BREAKDOWN_KEYS)
    assert "context_parallel_size" not in dumps_toml(scenario_to_dict(plain))


def test_gradients_and_zero_shards_go_over_data_x_context_parallel():
    s = cp_scenario(cp=2, tp=2, parallel={"data_parallel_size": 2})
    placement = placement_of(s)
    assert len(placement.dp_group(0, 0)) == 4  # DP 2 x CP 2
    assert placement.cp_group(1, 3, 0) == [1 + 2 * 2, 1 + 2 * 3]  # replicas 2, 3: T apart
    sharded = replace(s, training=replace(s.training, data_parallel_sharding="optimizer"))
    full = memory_per_stage(s)[0].optimizer_bytes
    assert memory_per_stage(sharded)[0].optimizer_bytes == pytest.approx(full / 4)


def test_activations_divide_by_cp():
    one = activation_bytes_per_layer(cp_scenario(cp=1))
    assert activation_bytes_per_layer(cp_scenario(cp=4)) == pytest.approx(one / 4)


def test_a_ring_across_nodes_is_slower_than_inside_one():
    """TP 4 x CP 2 on an 8-GPU node stays on NVLink; on 4-GPU nodes the ring crosses
    InfiniBand. all_gather's exchange is exposed, so the iteration shows it."""
    inside = run(cp_scenario(cp=2, tp=4, comm="all_gather")).metrics
    four = {"gpus_per_node": 4, "nics_per_node": 4}
    across = run(cp_scenario(cp=2, tp=4, comm="all_gather", nodes=2, cluster=four)).metrics
    assert across.breakdown_s[CP_COMM] > inside.breakdown_s[CP_COMM] > 0
    assert across.iteration_time_s > inside.iteration_time_s


def test_exact_mode_agrees_with_symmetric_mode():
    s = cp_scenario(cp=2, tp=2, parallel={"data_parallel_size": 2})
    exact = replace(s, network=replace(s.network, symmetry=False))
    assert run(exact).metrics.iteration_time_s == pytest.approx(
        run(s).metrics.iteration_time_s, rel=1e-9
    )


def test_the_rules_name_key_value_and_rule():
    with pytest.raises(
        ScenarioError, match=r"context_parallel_size=3 must split model.seq_length=4096"
    ):
        cp_scenario(cp=3, tp=1, parallel={"data_parallel_size": 1})
    with pytest.raises(ScenarioError, match=r"needs Transformer Engine's attention"):
        cp_scenario(training={"attention_backend": "unfused"})
    with pytest.raises(ScenarioError, match=r"must divide model.num_query_groups per TP rank=2"):
        cp_scenario(cp=4, tp=4, comm="a2a", nodes=2)
    with pytest.raises(ScenarioError, match=r"tensor x context parallel size=12"):
        load(
            model={"seq_length": 1536, "num_attention_heads": 16},
            cluster={"node": "dgx-h100", "num_nodes": 2},
            parallel={"tensor_model_parallel_size": 4, "context_parallel_size": 3},
            training={"attention_backend": "flash", "global_batch_size": 1},
        )
    with pytest.raises(ScenarioError, match=r"context_parallel_size.*0"):
        cp_scenario(cp=0)


@pytest.mark.parametrize("symmetry", [True, False])
def test_layers_with_ring_steps_are_replayed_as_the_blocks_make_them(symmetry, monkeypatch):
    """A ring step's barrier names its send by index within the layer body, which
    WorkloadBuilder.replay moves with the body (exact mode: with its rendezvous)."""
    s = cp_scenario(
        cp=2,
        tp=2,
        parallel={"data_parallel_size": 2},
        training={"recompute_granularity": "selective"},
        network={"model": "fair-share", "symmetry": symmetry},
    )
    replayed, made, replays = lowered_with_and_without_replay(s, monkeypatch)
    assert replays and replayed == made

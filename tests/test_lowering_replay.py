"""Layer bodies, passes' layers and blocking p2p calls replayed from a record
(lowering.layer_body and pass_body, p2pcalls._again; WorkloadBuilder.replay) are the ops
the blocks and calls would have made: the same workload with replay turned off."""

import pytest

from tests.helpers import load, lowered_with_and_without_replay

TP2_PP2 = {
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 2,
    "data_parallel_size": 2,
}
CASES = {
    "plain": ({}, {}, {}),
    "full recompute": ({}, {"recompute_granularity": "full"}, {}),
    "selective recompute": ({}, {"recompute_granularity": "selective"}, {}),
    "sequence parallel": ({"sequence_parallel": True}, {}, {}),
    "tp comm overlap": ({"sequence_parallel": True}, {"tp_comm_overlap": True}, {}),
    "split backward": ({}, {"schedule": "zbh1"}, {}),
    "deepspeed": ({}, {"framework": "deepspeed"}, {}),
    "deepspeed 0.5.0": ({}, {"framework": "deepspeed", "framework_version": "0.5.0"}, {}),
    "deepspeed, exact mode": ({}, {"framework": "deepspeed"}, {"symmetry": False}),
    "megatron 2021": ({}, {"framework": "megatron", "framework_version": "2021"}, {}),
    "exact mode": ({}, {}, {"symmetry": False}),
    "exact mode, sequence parallel": ({"sequence_parallel": True}, {}, {"symmetry": False}),
}


@pytest.mark.parametrize("name", CASES)
def test_replayed_layers_are_the_ops_the_blocks_make(name, monkeypatch):
    parallel, training, network = CASES[name]
    scenario = load(
        parallel={**TP2_PP2, **parallel},
        training={"global_batch_size": 16, **training},
        network={"model": "fair-share", **network},
    )
    replayed, made, replays = lowered_with_and_without_replay(scenario, monkeypatch)
    assert replayed == made
    # replayed unless the bodies name ops (TP collectives alongside the GEMMs)
    assert bool(replays) == (name != "tp comm overlap")

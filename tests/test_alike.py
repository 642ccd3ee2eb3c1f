"""Exact mode's GPUs of a stage added from one GPU's record (emit/alike.py): the same
workload, and the same run, to the bit, as lowering every GPU on its own."""

import dataclasses

import pytest

from stepsim.emit import alike, lowering
from stepsim.ir.keys import PipelineKey, RendezvousKey
from stepsim.ir.vocabulary import CP_COMM
from stepsim.run.iteration import build_cluster, run
from stepsim.scenario.perturbation import PerturbationSpec
from tests.helpers import load

P = PerturbationSpec

# 4 DGX A100 nodes, two per leaf of a fat tree with two spines: TP 4, PP 2, DP 4
SMALL = {
    "model": {
        "num_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "seq_length": 512,
        "vocab_size": 8192,
    },
    "cluster": {"num_nodes": 4, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2},
    "parallel": {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 2,
        "data_parallel_size": 4,
    },
    "training": {
        "global_batch_size": 8,
        "overlap_grad_reduce": True,
        "data_parallel_sharding": "optimizer",
    },
    "network": {"symmetry": False},
}


def scenario(training=None, parallel=None, perturbations=()):
    doc = {
        **SMALL,
        "training": {**SMALL["training"], **(training or {})},
        "parallel": {**SMALL["parallel"], **(parallel or {})},
    }
    return dataclasses.replace(load(**doc), perturbations=tuple(perturbations))


@pytest.fixture
def shared(monkeypatch):
    """How many stages were added from a record (not lowered GPU by GPU)."""
    count = []
    lower_alike = alike.AlikeBuilder.lower_alike

    def counted(self, *args):
        lower_alike(self, *args)
        count.append(1)

    monkeypatch.setattr(alike.AlikeBuilder, "lower_alike", counted)
    return count


def _uplink(s) -> int:
    cluster = build_cluster(s.cluster)
    return next(i for i in range(len(cluster.links)) if cluster.link_role(i) == "uplink")


RUNS = {
    "a failed uplink": lambda s: P(kind="slow_link", link=_uplink(s), down=True),
    "one slow GPU": lambda s: P(kind="slow_gpu", gpu=13, factor=1.05),
    "a slow NIC": lambda s: P(kind="slow_nic", node=1, nic=2, bandwidth_factor=0.5),
}


@pytest.mark.parametrize("case", RUNS)
def test_a_perturbed_exact_run_is_the_same_to_the_bit(case, shared, monkeypatch):
    s = scenario()
    s = dataclasses.replace(s, perturbations=(RUNS[case](s),))
    with_records = run(s)
    assert len(shared) == 2  # both stages, every GPU from its stage's record
    monkeypatch.setattr(lowering, "shareable", lambda scenario: False)
    one_by_one = run(s)
    assert with_records.workload == one_by_one.workload
    assert with_records.metrics == one_by_one.metrics
    assert with_records.trace.spans == one_by_one.trace.spans


LOWERINGS = {
    "deepspeed's blocking p2p": ({"framework": "deepspeed"}, {}),
    "interleaved, megatron's batched p2p": (
        {"schedule": "interleaved"},
        {"virtual_pipeline_model_parallel_size": 2},
    ),
    "split backward": ({"schedule": "zbh1"}, {}),
    "FSDP": ({"data_parallel_sharding": "full"}, {}),
    "sequence parallel, overlapped TP": ({"tp_comm_overlap": True}, {"sequence_parallel": True}),
    "selective recompute, blocking sync": (
        {"recompute_granularity": "selective", "overlap_grad_reduce": False},
        {},
    ),
    "DualPipe": (
        {
            "schedule": "dualpipe",
            "global_batch_size": 16,
            "share_embeddings_and_output_weights": False,
        },
        {},
    ),
}


@pytest.mark.parametrize("case", LOWERINGS)
def test_the_workload_is_the_same_as_each_gpu_lowered_on_its_own(case, shared):
    training, parallel = LOWERINGS[case]
    s = scenario(training, parallel)
    cluster = build_cluster(s.cluster)
    with_records = lowering.lower(s, cluster, collapse=False)
    assert len(shared) == s.parallel.pipeline_model_parallel_size
    assert with_records == lowering.lower(s, cluster, collapse=False, share=False)


def test_a_stage_whose_gpus_lower_unlike_is_lowered_gpu_by_gpu(shared, monkeypatch):
    s = scenario()
    cluster = build_cluster(s.cluster)
    monkeypatch.setattr(alike, "_symbolic", lambda *args: [])  # the last GPU "differs"
    assert lowering.lower(s, cluster, collapse=False) == lowering.lower(
        s, cluster, collapse=False, share=False
    )
    assert shared == []


def test_names_of_other_gpus_and_groups_do_not_relabel():
    who = (1, 2)
    assert alike._name_of(PipelineKey(who, 0, "F", 3), who, 0)[0] == "who"
    with pytest.raises(alike.NotAlike):
        alike._name_of(PipelineKey((0, 2), 0, "F", 3), who, 0)
    with pytest.raises(alike.NotAlike):
        alike._name_of(RendezvousKey(CP_COMM, 0, (1, 0), 1), who, 0)
    context = scenario(
        {"attention_backend": "fused"}, {"context_parallel_size": 2, "data_parallel_size": 2}
    )
    assert not alike.shareable(context)
    assert not alike.shareable(dataclasses.replace(scenario(), network=load().network))

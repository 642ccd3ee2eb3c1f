"""Exact-mode cases for tools/golden.py --exact: shipped scenarios cut down and
small scenarios with perturbations, every GPU simulated (``network.symmetry = false``).

Exact mode's outputs must stay byte-identical when its mechanism changes (lanes
collapsed, ops shared), as symmetric mode's must; the plain recording has no exact
run. The small scenarios are the contention cases (`CONTENTION`, which
tests/test_symmetry.py also runs both ways) and tests/test_perturbation.py's perturbed
layouts, written out as scenario files.
"""

from __future__ import annotations

from pathlib import Path

from stepsim.scenario import dumps_toml, scenario_from_dict, scenario_to_dict

EXACT = ["--set", "network.symmetry=false"]
# shipped scenario, extra --set arguments (fewer micro-batches: seconds, not minutes)
SHIPPED = {
    "tiny-2gpu": [],
    "mixtral-8x7b-16-h100": ["--set", "training.global_batch_size=32"],
    "llama3-8b-128k-cp8-h100": [],
    "gpt3-175b-128nodes": ["--set", "training.global_batch_size=64"],
    "mt-nlg-530b-straggler": ["--set", "training.global_batch_size=96"],
}

_MODEL = {
    "num_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "seq_length": 2048,
    "vocab_size": 32000,
}
_SMALL = {
    "num_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def _doc(model, cluster, parallel, training, network=None, perturbation=None) -> dict:
    doc = {
        "name": "exact-case",
        "model": model,
        "cluster": {"node": "dgx-a100", **cluster},
        "parallel": parallel,
        "training": {"micro_batch_size": 1, **training},
        "network": {"model": "fair-share", "symmetry": False, **(network or {})},
    }
    if perturbation:
        doc["perturbation"] = perturbation
    return doc


def _contended(cluster=None, parallel=None, training=None, network=None) -> dict:
    layout = {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 4,
        "data_parallel_size": 2,
        **(parallel or {}),
    }
    return _doc(
        _MODEL,
        {"num_nodes": 8, "nic_gbps": 50.0, **(cluster or {})},
        layout,
        {"global_batch_size": 16, **(training or {})},
        network,
    )


_MIXED_LAYOUT = {
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 4,
    "data_parallel_size": 4,
}
_MIXED_TRAINING = {
    "global_batch_size": 16,
    "overlap_grad_reduce": True,
    "data_parallel_sharding": "optimizer",
}


def _mixed(perturbation, training=None, cluster=None) -> dict:
    return _doc(
        _SMALL,
        cluster or {"num_nodes": 8},
        _MIXED_LAYOUT,
        training or _MIXED_TRAINING,
        perturbation=perturbation,
    )


_SLOW_GPU = {"kind": "slow_gpu", "gpu": 36, "factor": 1.3}
_TREE = {"num_nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 2, "spine_switches": 2}

# symmetric mode against exact mode where sharing links matters (tests/test_symmetry.py
# runs each both ways; a node is one tensor-parallel group, so data-parallel rings and
# pipeline sends both leave the node through its NICs)
CONTENTION = {
    # one 25 Gb/s NIC per node: gradient buckets and both directions' pipeline sends
    # of eight GPUs queue on it (fair sharing doubles the iteration over "analytical")
    "one-nic-per-node": _contended(
        cluster={"nics_per_node": 1, "nic_gbps": 25.0}, training={"overlap_grad_reduce": True}
    ),
    # one node per leaf, uplinks at 1/8: every flow between nodes crosses the spines
    "oversubscribed-fat-tree": _contended(
        cluster={"fabric": "fat-tree", "nodes_per_leaf": 1, "oversubscription": 8.0}
        | {"nic_gbps": 100.0},
        training={"overlap_grad_reduce": True},
        network={"collective_algorithm": "ring"},
    ),
    # FSDP's gathers and reduce-scatters on a side stream, beside the pipeline sends
    # (overlapped: sends that run beside compute, where sharing the NIC shows most)
    "interleaved-fsdp": _contended(
        parallel={"virtual_pipeline_model_parallel_size": 2},
        training={
            "schedule": "interleaved",
            "data_parallel_sharding": "full",
            "pipeline_p2p": "overlapped",
        },
    ),
    # the same under Megatron's blocking batched calls (rendezvous across chunks and the
    # ring from the last rank to the first)
    "interleaved-fsdp-blocking-p2p": _contended(
        parallel={"virtual_pipeline_model_parallel_size": 2},
        training={
            "schedule": "interleaved",
            "data_parallel_sharding": "full",
            "pipeline_p2p": "batched-blocking",
        },
    ),
    "zbv-zero1-sequence-parallel": _contended(
        cluster={"nic_gbps": 25.0},
        parallel={"sequence_parallel": True},
        training={
            "schedule": "zbv",
            "data_parallel_sharding": "optimizer",
            "recompute_granularity": "selective",
        },
    ),
    # DeepSpeed's sequential blocking p2p (rendezvous of two stage lanes), meta messages,
    # whole gradients from every tensor rank and the re-gather, on one NIC per node
    "deepspeed-0.5.0-sequential-p2p": _contended(
        cluster={"nics_per_node": 1, "nic_gbps": 25.0},
        training={"framework": "deepspeed", "framework_version": "0.5.0"},
    ),
    "async-allreduce-tree-buckets": _contended(
        training={"async_tensor_model_parallel_allreduce": True, "overlap_grad_reduce": True},
        network={"collective_algorithm": "tree"},
    ),
    "tp-comm-overlap": _contended(
        parallel={"sequence_parallel": True},
        training={"tp_comm_overlap": True, "overlap_grad_reduce": True},
    ),
    # DeepSpeed's gradient path: the tied embedding's all-reduce (a rendezvous of the
    # first and last stage) before ZeRO-1's bucketed all-reduce of bf16 gradients
    "deepspeed-tied-zero1-buckets": _contended(
        cluster={"nic_gbps": 25.0},
        training={
            "params_dtype": "bf16",
            "communication_data_type": "bf16",
            "data_parallel_sharding": "optimizer",
            "zero_grad_collective": "all-reduce",
            "reduce_bucket_size": 20_000_000,
            "allgather_bucket_size": 20_000_000,
            "tied_grad_reduce_order": "before-dp",
            "gradient_accumulation_fusion": False,
        },
    ),
}

GENERATED = {
    **CONTENTION,
    "mixed-clean": _mixed(None),
    "mixed-slow-node": _mixed([{"kind": "slow_gpu", "node": 5, "factor": 1.3}]),
    "mixed-gpu-type": _mixed([{"kind": "gpu_type", "node": 5, "gpu_model": "a100-sxm4-40gb"}]),
    "mixed-slow-gpu": _mixed([_SLOW_GPU]),
    "mixed-jitter-node": _mixed([{"kind": "jitter", "node": 5, "sigma": 0.05, "seed": 1}]),
    "mixed-jitter-all": _mixed([{"kind": "jitter", "sigma": 0.02, "seed": 2}]),
    "mixed-slow-nic": _mixed([{"kind": "slow_nic", "node": 5, "nic": 3, "bandwidth_factor": 0.5}]),
    "mixed-slow-link": _mixed([{"kind": "slow_link", "link": 7, "bandwidth_factor": 0.25}]),
    "mixed-tree-slow-node": _mixed([{"kind": "slow_gpu", "node": 5, "factor": 1.3}], cluster=_TREE),
    "mixed-tree-uplink-down": _mixed(
        [{"kind": "slow_link", "link": 336, "down": True}], cluster=_TREE
    ),
    "mixed-deepspeed-slow-gpu": _mixed(
        [_SLOW_GPU], training={"global_batch_size": 16, "framework": "deepspeed"}
    ),
    "mixed-overlapped-p2p-slow-gpu": _mixed(
        [_SLOW_GPU], training={**_MIXED_TRAINING, "pipeline_p2p": "overlapped"}
    ),
    "mixed-zero2-slow-gpu": _mixed(
        [_SLOW_GPU], training={**_MIXED_TRAINING, "data_parallel_sharding": "gradients"}
    ),
    "mixed-after-flush-slow-gpu": _mixed(
        [_SLOW_GPU],
        training={
            **_MIXED_TRAINING,
            "overlap_grad_reduce": False,
            "data_parallel_sharding": "none",
        },
    ),
}


def write_generated(folder: Path) -> dict[str, Path]:
    """Each generated case as a scenario file in ``folder``, resolved (so a key's
    default moving would show as a change of the file)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, doc in GENERATED.items():
        path = folder / f"{name}.toml"
        path.write_text(dumps_toml(scenario_to_dict(scenario_from_dict(doc))), encoding="utf-8")
        out[name] = path
    return out

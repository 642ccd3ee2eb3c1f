"""What a result rests on, said wherever a planner reads one: the kernel constants'
provenance (fitted on a calibration set, a user's file or fit, or "uncalibrated: scaled
from ..."), and the assumptions that may flatter it or that differ from what was asked
(one non-blocking switch for the whole cluster, network links at line rate, network
constants borrowed from another node, a mechanism the framework's rules turned off or
changed, an overlap the framework offers that the scenario leaves off). Every command's
text header, JSON document and CSV rows carry them (cli/common.py, plan/answers.py,
report/summary.py)."""

from __future__ import annotations

from typing import Any

from stepsim.schedules import DUAL

from ..ir.vocabulary import SHARD_FULL
from ..scenario import ClusterSpec, Scenario
from ..scenario.frameworks import MEGATRON
from ..scenario.hardware import NETWORK_SOURCES
from ..scenario.overlap_rules import OVERLAP_SCHEDULES
from ..scenario.presets import NODES

# Megatron versions (frameworks.VERSIONS) whose Megatron-Core has --overlap-grad-reduce,
# --overlap-param-gather, --tp-comm-overlap and (2025) the expert all-to-all overlap;
# Megatron-LM 2021/2022 and DeepSpeed's pipeline engine have none of them.
OVERLAP_VERSIONS = ("2024", "2025")


def overlaps_left_off(scenario: Scenario) -> tuple[str, ...]:
    """The overlaps the scenario's framework offers for its layout that it leaves off: a
    result without them is slower than the same run tuned, which a planner should know
    (DeepSeek-V3's DualPipe exists to hide the expert all-to-alls)."""
    t, par, model = scenario.training, scenario.parallel, scenario.model
    if t.framework != MEGATRON or t.mechanism("framework_version") not in OVERLAP_VERSIONS:
        return ()  # none of these exists there
    dp = par.data_parallel_size
    off = []
    version = t.mechanism("framework_version")
    pairs = par.pipeline_model_parallel_size == 1 or t.schedule in OVERLAP_SCHEDULES
    if model.moe and par.ep_size > 1 and not t.moe_overlap and version == "2025" and pairs:
        off.append(
            "expert all-to-alls with the paired micro-batch's compute "
            "(training.overlap_moe_expert_parallel_comm)"
        )
    # under DualPipe the reduce waits for the copies' sum either way (summary._grad_reduce_text)
    sharded = t.data_parallel_sharding == SHARD_FULL
    if dp > 1 and not sharded and not t.overlap_grad_reduce and t.placement != DUAL:
        off.append("gradient reduction with the backward (training.overlap_grad_reduce)")
    if par.tensor_model_parallel_size > 1 and par.sequence_parallel and not t.tp_comm_overlap:
        off.append("sequence-parallel collectives with their GEMMs (training.tp_comm_overlap)")
    return tuple(off)


def fabric_text(cluster: ClusterSpec) -> str:
    """How the nodes are joined, in a few words."""
    c = cluster
    if c.num_nodes == 1:
        return "one node"
    if c.fabric == "switch":
        return f"one non-blocking switch for all {c.num_nodes} nodes"
    over = f", {c.oversubscription:g}:1 oversubscribed" if c.oversubscription != 1.0 else ""
    if c.fabric == "fat-tree":
        return (
            f"{c.fabric_levels}-level fat tree, {c.nodes_per_leaf} nodes a leaf, "
            f"{c.spine_switches} spines{over}"
        )
    return f"{c.fabric} fabric, {c.nodes_per_leaf} nodes a leaf group{over}"


def assumptions(scenario: Scenario) -> tuple[str, ...]:
    """What the result assumes that may make it faster than the real cluster, or that
    leaves it slower than the framework could run it."""
    c = scenario.cluster
    out = []
    if c.fabric == "switch" and c.num_nodes > 1:
        out.append(
            "one non-blocking switch joins all the nodes (no oversubscription, one hop "
            "between any two; cluster.fabric sets a fat tree or rails)"
        )
    preset = NODES.get(c.node or "")
    if preset is None and c.nvlink_efficiency == 1.0 and c.nic_efficiency == 1.0:
        out.append(
            "NVLink and NICs at their full line rate (a custom node without "
            "nvlink_efficiency or nic_efficiency)"
        )
    network = NETWORK_SOURCES.get(c.node or "", "")
    as_preset = preset is not None and all(
        getattr(c, k) == preset[k] for k in ("nvlink_efficiency", "nic_efficiency")
    )
    if as_preset and "uncalibrated" in network:
        out.append(f"network constants {network}")
    # what the framework's rules changed from what the scenario asked (frameworks.resolve)
    for note in filter(None, scenario.training.framework_note.split("; ")):
        out.append(f"changed by the framework's rules: {note}")
    off = overlaps_left_off(scenario)
    if off:
        out.append(
            f"not overlapped, as the scenario asks (the framework offers it): {'; '.join(off)}"
        )
    return tuple(out)


def uncalibrated(scenario: Scenario) -> bool:
    return "uncalibrated" in scenario.kernel_constants.source.lower()


def labels(scenario: Scenario) -> dict[str, Any]:
    """The labels as JSON documents carry them."""
    return {
        "label": scenario.kernel_constants.source,
        "uncalibrated": uncalibrated(scenario),
        "assumptions": list(assumptions(scenario)),
    }


def label_lines(scenario: Scenario) -> list[str]:
    """The lines a text header adds: the calibration, and what is assumed."""
    lines = [f"  calibration: {scenario.kernel_constants.source}"]
    lines += [f"  assumes: {a}" for a in assumptions(scenario)]
    return lines

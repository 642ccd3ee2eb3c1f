"""What a result rests on, said wherever a planner reads one: the kernel constants'
provenance (fitted on a calibration set, a user's file or fit, or "uncalibrated: scaled
from ..."), and the assumptions that may flatter it or that differ from what was asked
(one non-blocking switch for the whole cluster, network links at line rate, network
constants borrowed from another node, a mechanism the framework's rules turned off or
changed). Every command's text header, JSON document and CSV rows carry them
(cli/common.py, plan/answers.py, report/summary.py)."""

from __future__ import annotations

from typing import Any

from ..scenario import ClusterSpec, Scenario
from ..scenario.hardware import NETWORK_SOURCES
from ..scenario.presets import NODES


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
    """What the result assumes that may make it faster than the real cluster."""
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

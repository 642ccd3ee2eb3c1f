"""The InfiniBand fabric between nodes (``FabricShape.kind``):

``switch`` — one non-blocking switch; every NIC has its own port::

    NIC ── switch ── NIC

``fat-tree`` — leaves of ``nodes_per_leaf`` nodes (all their NICs) under
``spines`` spine switches; with ``levels = 3`` pods of ``leaves_per_pod``
leaves have their own aggregation switches joined by core switches. Each
level's uplinks carry 1/``oversubscription`` of the bandwidth below it,
split evenly over the switches above (one aggregated link per pair)::

              spine 0 ... spine S-1
             /   |     X     |   \\
        leaf 0  leaf 1 ... leaf L-1
        |||||   |||||       |||||
        nodes 0..n-1, n..2n-1, ...

``rail-optimized`` — as the 2-level fat tree, but each group of
``nodes_per_leaf`` nodes has one leaf per rail: NIC k of every node in the
group plugs into rail leaf k, so same-rail traffic stays one switch away
(the DGX SuperPOD wiring).

``rail-only`` — no spines: one switch per rail, NIC k of every node on rail
switch k (Wang et al., "Rail-only: A Low-Cost High-Performance Network for
Training LLMs with Trillion Parameters", arXiv 2307.12169). Each switch holds
``nodes_per_leaf`` nodes (its ports), so the cluster has at most that many.

``multi-plane`` — ``planes`` separate two-level fat trees (DeepSeek-V3's eight
planes): NIC k of every node sits on plane k mod ``planes``; each plane has its
leaves of ``nodes_per_leaf`` nodes and its own ``spines``, and no cable joins two
planes. With one leaf group a plane is a single switch, as rail-only's rails are.

On both, traffic between NICs of different rails or planes has no switch path: it
crosses to the source server's GPU of the destination's local index over NVLink
first, then leaves through that GPU's NIC (NCCL's PXN; topologies.cluster routes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import TYPE_CHECKING

from .node import HYBRID_CUBE_MESH, NIC, SWITCH, NodeShape, cable

if TYPE_CHECKING:
    from .drawing import Drawing

FABRICS = ("switch", "fat-tree", "rail-optimized", "rail-only", "multi-plane")
PLANAR = ("rail-only", "multi-plane")  # no switch path between rails / planes


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricShape:
    kind: str = "switch"
    levels: int = 2  # fat-tree only: 2 or 3
    nodes_per_leaf: int = 16
    leaves_per_pod: int = 8  # 3-level fat-tree only
    spines: int = 4  # switches above each leaf (and above each pod's aggregation)
    oversubscription: float = 1.0
    latency_s: float = 0.0  # one hop NIC <-> switch or switch <-> switch
    planes: int = 0  # multi-plane only: 0 = one plane per NIC of a node


def planes_of(fabric: FabricShape, nics_per_node: int) -> int:
    """Rails (rail-optimized, rail-only) or planes (multi-plane): separate leaves per
    NIC index, NIC k on number k mod this; 1 for the other fabrics."""
    if fabric.kind == "multi-plane":
        return fabric.planes or nics_per_node
    return nics_per_node if fabric.kind in ("rail-optimized", "rail-only") else 1


def add_fabric(graph: Drawing, num_nodes: int, node: NodeShape, fabric: FabricShape) -> None:
    nic_bw, lat = node.nic_bytes_per_s, fabric.latency_s
    if fabric.kind == "switch":
        for n in range(num_nodes):
            for k in range(node.nics):
                cable(graph, (NIC, n, k), (SWITCH, 1, 0), "ib", nic_bw, lat)
        return
    if fabric.kind not in FABRICS:
        raise ValueError(f"unknown fabric {fabric.kind!r}")
    if fabric.kind == "rail-only" and num_nodes > fabric.nodes_per_leaf:
        raise ValueError(
            f"{num_nodes} nodes on rail switches of {fabric.nodes_per_leaf} nodes each"
        )
    npl = num_nodes if fabric.kind == "rail-only" else fabric.nodes_per_leaf
    groups = ceil(num_nodes / npl)
    rails = planes_of(fabric, node.nics)
    leaf_down_bw = npl * node.nics * nic_bw / rails
    for n in range(num_nodes):
        group = n // npl
        for k in range(node.nics):
            leaf = group * rails + k % rails
            cable(graph, (NIC, n, k), (SWITCH, 1, leaf), "ib", nic_bw, lat)
    leaves = groups * rails
    if leaves == 1 or fabric.kind == "rail-only" or groups == 1 and fabric.kind in PLANAR:
        return
    up_total = leaf_down_bw / fabric.oversubscription
    spines = spines_per_leaf(fabric, node.nics)
    if fabric.kind == "fat-tree" and fabric.levels == 3:
        pods = ceil(leaves / fabric.leaves_per_pod)
        for leaf in range(leaves):
            pod = leaf // fabric.leaves_per_pod
            for s in range(spines):
                agg = (SWITCH, 2, pod * spines + s)
                cable(graph, (SWITCH, 1, leaf), agg, "ib", up_total / spines, lat)
        if pods == 1:
            return
        agg_up_total = fabric.leaves_per_pod * (up_total / spines) / fabric.oversubscription
        for a in range(pods * spines):
            for c in range(spines):
                cable(graph, (SWITCH, 2, a), (SWITCH, 3, c), "ib", agg_up_total / spines, lat)
        return
    for leaf in range(leaves):
        # multi-plane: plane p's leaves reach its own spines only
        first = (leaf % rails) * spines if fabric.kind == "multi-plane" else 0
        for s in range(first, first + spines):
            cable(graph, (SWITCH, 1, leaf), (SWITCH, 2, s), "ib", up_total / spines, lat)


def spines_per_leaf(fabric: FabricShape, nics_per_node: int) -> int:
    """The switches each leaf connects up to: a leaf reaches a spine through at least
    one port, so no more spines than its uplink ports."""
    rails = planes_of(fabric, nics_per_node)
    down_ports = fabric.nodes_per_leaf * nics_per_node // rails
    return min(fabric.spines, max(int(down_ports / fabric.oversubscription), 1))


def cable_count(
    num_nodes: int, gpus: int, nics: int, nvlink_topology: str, fabric: FabricShape
) -> int:
    """The cables (two directed links each) ``build_graph`` draws, counted from the
    shapes without drawing them, so a cluster too large to build is refused first:
    per server a PCIe cable per GPU and an InfiniBand cable per NIC, its NVLink (one
    cable per GPU to the NVSwitch, one per pair in a mesh) and the switch levels."""
    nvlink = {"nvswitch": gpus, "all-to-all": gpus * (gpus - 1) // 2}.get(
        nvlink_topology, len(HYBRID_CUBE_MESH)
    )
    cables = num_nodes * (gpus + nics + nvlink)
    if fabric.kind == "switch":
        return cables
    rails = planes_of(fabric, nics)
    if fabric.kind == "rail-only":
        return cables
    groups = ceil(num_nodes / fabric.nodes_per_leaf)
    leaves = groups * rails
    if leaves == 1 or groups == 1 and fabric.kind in PLANAR:
        return cables
    spines = spines_per_leaf(fabric, nics)
    cables += leaves * spines
    if fabric.kind == "fat-tree" and fabric.levels == 3:
        pods = ceil(leaves / fabric.leaves_per_pod)
        if pods > 1:
            cables += pods * spines * spines
    return cables

"""What a cluster graph holds: counts, bandwidth by link kind, bisection bandwidth."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .node import GPU, NIC, SWITCH

if TYPE_CHECKING:
    from .drawing import Drawing


def summarize(graph: Drawing, gpus_per_node: int) -> dict:
    """Counts of GPUs, NICs and switches, directed links by kind, and bisection bandwidth.

    Bisection bandwidth is the most bytes/s that can cross, in one direction, from the
    first half of the nodes to the second (a max-flow over the graph, each node's GPUs
    and NVLink collapsed into one vertex since they do not lie between the halves).
    """
    kinds = Counter(n[0] for n in graph)
    switches = Counter(n[1] for n in graph if n[0] == SWITCH)
    links: dict[str, dict[str, float]] = {}
    for _, _, data in graph.edges(data=True):
        entry = links.setdefault(
            data["kind"],
            {
                "count": 0,
                "total_bytes_per_s": 0.0,
                "min_bytes_per_s": float("inf"),
                "max_bytes_per_s": 0.0,
            },
        )
        bandwidth = data["bandwidth_bytes_per_s"]
        entry["count"] += 1
        entry["total_bytes_per_s"] += bandwidth
        entry["min_bytes_per_s"] = min(entry["min_bytes_per_s"], bandwidth)
        entry["max_bytes_per_s"] = max(entry["max_bytes_per_s"], bandwidth)
    num_nodes = kinds[GPU] // gpus_per_node
    return {
        "num_nodes": num_nodes,
        "num_gpus": kinds[GPU],
        "num_nics": kinds[NIC],
        "switches_by_level": dict(sorted(switches.items())),
        "links": dict(sorted(links.items())),
        "bisection_bytes_per_s": bisection_bytes_per_s(graph, gpus_per_node),
    }


def bisection_bytes_per_s(graph: Drawing, gpus_per_node: int) -> float:
    import networkx as nx  # its max-flow (`stepsim topology` only)

    num_nodes = sum(1 for n in graph if n[0] == GPU) // gpus_per_node
    if num_nodes < 2:
        return 0.0
    flow = nx.DiGraph()
    for a, b, data in graph.edges(data=True):
        if a[0] == GPU or b[0] == GPU or a[0] not in (NIC, SWITCH) or b[0] not in (NIC, SWITCH):
            continue
        u, v = _vertex(a), _vertex(b)
        capacity = data["bandwidth_bytes_per_s"]
        if flow.has_edge(u, v):  # a server's several NICs on one switch add up
            capacity += flow[u][v]["capacity"]
        flow.add_edge(u, v, capacity=capacity)
    half = num_nodes // 2
    for node in range(num_nodes):
        side = ("source",) if node < half else ("sink",)
        if node < half:
            flow.add_edge(side, ("server", node))
        else:
            flow.add_edge(("server", node), side)
    return float(nx.maximum_flow_value(flow, ("source",), ("sink",)))


def _vertex(n: tuple) -> tuple:
    """A NIC stands for its whole server: the NVLink side is never the bottleneck."""
    return ("server", n[1]) if n[0] == NIC else n


_SWITCH_LEVEL = {1: "switch", 2: "spine", 3: "core"}  # level 1: the only or leaf switch


def endpoint_name(n: tuple) -> str:
    if n[0] == GPU:
        return f"GPU {n[1]}"
    if n[0] == NIC:
        return f"NIC {n[2]} of node {n[1]}"
    if n[0] == SWITCH:
        return f"{_SWITCH_LEVEL.get(n[1], f'level-{n[1]} switch')} {n[2]}"
    return f"NVSwitch of node {n[1]}"


def link_name(src: tuple, dst: tuple) -> str:
    return f"{endpoint_name(src)} -> {endpoint_name(dst)}"


# what a link does, finer than its kind: "ib" cables are a NIC's own link to its leaf or a
# switch's uplink, which a 135 vs 400 Gb/s study tells apart
LINK_ROLES = ("nvlink", "pcie", "nic", "uplink")


def link_role(kind: str, src: tuple, dst: tuple) -> str:
    if kind != "ib":
        return kind
    return "nic" if NIC in (src[0], dst[0]) else "uplink"

"""The cluster as a graph of GPUs, NVSwitches, NICs and an InfiniBand switch.

``build_graph`` draws the cluster with networkx; ``Cluster`` freezes it into
directed links and routes, built once and then only read. A node looks like::

    GPU0 ─┐              ┌─ NIC0 ─┐
    GPU1 ─┼─ NVSwitch    ├─ NIC1 ─┼── IB switch ── (other nodes' NICs)
     ...  ┘  (NVLink)    ...      ┘
    GPU i ── NIC(i) over PCIe, NIC(i) = i * nics_per_node // gpus_per_node

With as many NICs as GPUs this is the rail-optimized DGX wiring (GPU i uses
NIC i). Every cable is two directed links, one per direction, each with its own
bandwidth and latency, so traffic in opposite directions does not compete.
"""

from __future__ import annotations

from typing import NamedTuple

import networkx as nx

GPU = "gpu"
NVSWITCH = "nvswitch"
NIC = "nic"
IB_SWITCH = "ib-switch"


class Link(NamedTuple):
    index: int
    src: tuple
    dst: tuple
    kind: str  # "nvlink", "pcie" or "ib"
    bandwidth_bytes_per_s: float
    latency_s: float


def build_graph(
    *,
    num_nodes: int,
    gpus_per_node: int,
    nics_per_node: int,
    nvlink_bytes_per_s: float,
    nvlink_latency_s: float,
    pcie_bytes_per_s: float,
    pcie_latency_s: float,
    nic_bytes_per_s: float,
    ib_latency_s: float,
) -> nx.DiGraph:
    """Nodes of NVSwitch-connected GPUs joined by a non-blocking InfiniBand switch.

    Graph nodes are tuples: ``("gpu", global_index)``, ``("nvswitch", node)``,
    ``("nic", node, k)`` and ``("ib-switch",)``. Every edge carries
    ``bandwidth_bytes_per_s``, ``latency_s`` and ``kind``.
    """
    graph = nx.DiGraph()
    fabric = (IB_SWITCH,)
    graph.add_node(fabric)

    def cable(a: tuple, b: tuple, kind: str, bandwidth: float, latency: float) -> None:
        graph.add_edge(a, b, kind=kind, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
        graph.add_edge(b, a, kind=kind, bandwidth_bytes_per_s=bandwidth, latency_s=latency)

    for node in range(num_nodes):
        switch = (NVSWITCH, node)
        for k in range(nics_per_node):
            cable((NIC, node, k), fabric, "ib", nic_bytes_per_s, ib_latency_s)
        for local in range(gpus_per_node):
            gpu = (GPU, node * gpus_per_node + local)
            cable(gpu, switch, "nvlink", nvlink_bytes_per_s, nvlink_latency_s)
            nic = (NIC, node, local * nics_per_node // gpus_per_node)
            cable(gpu, nic, "pcie", pcie_bytes_per_s, pcie_latency_s)
    return graph


class Cluster:
    """Directed links with integer indices and cached GPU-to-GPU routes.

    A route inside a node goes GPU -> NVSwitch -> GPU; between nodes it goes
    GPU -> its NIC -> fabric -> the other GPU's NIC -> GPU, the fabric part
    being a shortest path that never passes through a GPU.
    """

    def __init__(self, graph: nx.DiGraph, *, gpus_per_node: int) -> None:
        self.graph = graph
        self.gpus_per_node = gpus_per_node
        self.links: list[Link] = []
        self._index: dict[tuple[tuple, tuple], int] = {}
        for src, dst, data in graph.edges(data=True):
            link = Link(
                len(self.links),
                src,
                dst,
                data["kind"],
                data["bandwidth_bytes_per_s"],
                data["latency_s"],
            )
            self._index[(src, dst)] = link.index
            self.links.append(link)
        self.num_gpus = sum(1 for n in graph if n[0] == GPU)
        self._gpu_nic = {
            g: next(n for n in graph.successors((GPU, g)) if n[0] == NIC)
            for g in range(self.num_gpus)
        }
        # Each NIC hangs off one fabric switch; paths between switches are searched
        # on the switches alone (a copy, so that the search never sees GPUs or NICs).
        self._nic_switch = {n: self._fabric_neighbor(n) for n in graph if n[0] == NIC}
        self._switches = nx.DiGraph(
            graph.subgraph(n for n in graph if n[0] not in (GPU, NVSWITCH, NIC))
        )
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._fabric_paths: dict[tuple[tuple, tuple], list[tuple]] = {}  # switch to switch

    def _fabric_neighbor(self, nic: tuple) -> tuple:
        (switch,) = (n for n in self.graph.successors(nic) if n[0] not in (GPU, NVSWITCH))
        return switch

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """Link indices from one GPU to another (empty for a GPU to itself)."""
        key = (src_gpu, dst_gpu)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._find_route(src_gpu, dst_gpu)
        return route

    def route_latency_s(self, route: tuple[int, ...]) -> float:
        return sum(self.links[i].latency_s for i in route)

    def _find_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        if src_gpu == dst_gpu:
            return ()
        src, dst = (GPU, src_gpu), (GPU, dst_gpu)
        if self.node_of(src_gpu) == self.node_of(dst_gpu):
            switch = (NVSWITCH, self.node_of(src_gpu))
            path = [src, switch, dst]
        else:
            nic_a, nic_b = self._gpu_nic[src_gpu], self._gpu_nic[dst_gpu]
            sw_a, sw_b = self._nic_switch[nic_a], self._nic_switch[nic_b]
            middle = self._fabric_paths.get((sw_a, sw_b))
            if middle is None:
                middle = nx.shortest_path(self._switches, sw_a, sw_b)
                self._fabric_paths[(sw_a, sw_b)] = middle
            path = [src, nic_a, *middle, nic_b, dst]
        return tuple(self._index[(a, b)] for a, b in zip(path, path[1:], strict=False))

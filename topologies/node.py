"""One server: GPUs joined by NVLink, each GPU wired to a NIC over PCIe.

Three NVLink layouts (``NodeShape.nvlink_topology``):

``nvswitch`` (DGX A100 / H100 / H200) — every GPU has one port into the
NVSwitch carrying its whole NVLink bandwidth::

    GPU0 ─┐              GPU i ── NIC(i) over PCIe
    GPU1 ─┼─ NVSwitch    NIC(i) = i * nics // gpus
     ...  ┘

``all-to-all`` (a 4 x V100 SXM2 node such as Jean Zay's) — a direct link
between every pair, made of 6 // (gpus-1) of the GPU's 6 NVLink 2 lanes (two
per pair with 4 GPUs, so 1/3 of the GPU's bandwidth each); at most 7 GPUs.

``hybrid-cube-mesh`` (DGX-1 with V100) — 8 GPUs, 6 NVLink lanes each, as in
NVIDIA's DGX-1 V100 system architecture white paper (the cube with two
faces' diagonals); pairs joined by 1 or 2 lanes::

    GPU0: 1 x1  2 x1  3 x2  4 x2     GPU4: 0 x2  5 x1  6 x1  7 x2
    GPU1: 0 x1  2 x2  3 x1  5 x2     GPU5: 1 x2  4 x1  6 x2  7 x1
    GPU2: 0 x1  1 x2  3 x2  6 x1     GPU6: 2 x1  4 x1  5 x2  7 x2
    GPU3: 0 x2  1 x1  2 x2  7 x1     GPU7: 3 x1  4 x2  5 x1  6 x2
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

GPU = "gpu"
NVSWITCH = "nvswitch"
NIC = "nic"
SWITCH = "switch"

NVLINK_TOPOLOGIES = ("nvswitch", "all-to-all", "hybrid-cube-mesh")

# (gpu a, gpu b, NVLink lanes) for the DGX-1 V100 hybrid cube-mesh.
HYBRID_CUBE_MESH = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
)  # fmt: skip
MESH_LANES_PER_GPU = 6  # NVLink 2 on V100, the GPU these meshes are built from


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeShape:
    gpus: int
    nics: int
    nvlink_topology: str
    nvlink_bytes_per_s: float  # one GPU's NVLink bandwidth, one direction, all lanes
    nvlink_latency_s: float
    pcie_bytes_per_s: float
    pcie_latency_s: float
    nic_bytes_per_s: float


def cable(
    graph: nx.DiGraph,
    a: tuple,
    b: tuple,
    kind: str,
    bandwidth: float,
    latency: float,
    lanes: int = 1,
) -> None:
    """A full-duplex cable (two directed links) of ``lanes`` parallel lanes."""
    for u, v in ((a, b), (b, a)):
        graph.add_edge(
            u, v, kind=kind, bandwidth_bytes_per_s=bandwidth, latency_s=latency, lanes=lanes
        )


def add_node(graph: nx.DiGraph, index: int, shape: NodeShape) -> None:
    first = index * shape.gpus
    gpus = [(GPU, first + local) for local in range(shape.gpus)]
    for local, gpu in enumerate(gpus):
        graph.add_node(gpu)
        nic = (NIC, index, local * shape.nics // shape.gpus)
        cable(graph, gpu, nic, "pcie", shape.pcie_bytes_per_s, shape.pcie_latency_s)
    bandwidth, latency = shape.nvlink_bytes_per_s, shape.nvlink_latency_s
    if shape.nvlink_topology == "nvswitch":
        switch = (NVSWITCH, index)
        for gpu in gpus:
            cable(graph, gpu, switch, "nvlink", bandwidth, latency)
    elif shape.nvlink_topology == "all-to-all":
        if shape.gpus == 1:
            return  # a lone GPU has no NVLink peers
        if shape.gpus - 1 > MESH_LANES_PER_GPU:
            raise ValueError(f"{shape.gpus} GPUs cannot all be joined by 6 NVLink lanes each")
        lanes = MESH_LANES_PER_GPU // (shape.gpus - 1)
        lane = bandwidth / MESH_LANES_PER_GPU
        for a in range(shape.gpus):
            for b in range(a + 1, shape.gpus):
                cable(graph, gpus[a], gpus[b], "nvlink", lanes * lane, latency, lanes)
    elif shape.nvlink_topology == "hybrid-cube-mesh":
        if shape.gpus != 8:
            raise ValueError(f"a hybrid cube-mesh node has 8 GPUs, not {shape.gpus}")
        lane = bandwidth / MESH_LANES_PER_GPU
        for a, b, lanes in HYBRID_CUBE_MESH:
            cable(graph, gpus[a], gpus[b], "nvlink", lanes * lane, latency, lanes)
    else:
        raise ValueError(f"unknown NVLink topology {shape.nvlink_topology!r}")

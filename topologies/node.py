"""One server, and the NVLink domain its GPUs belong to.

Three groupings of GPUs that today's nodes make coincide:

- the server: a box of GPUs and NICs, each GPU wired over PCIe to a NIC
  (``add_server``; ``NodeShape`` is its shape);
- the NIC group: the GPUs of a server that share one NIC (``nic_of``: one GPU
  per NIC on a DGX, two on a DGX-1, four on a 4 x V100 node);
- the NVLink domain: the GPUs one NVLink / NVSwitch fabric joins
  (``add_nvlink_domain``); traffic inside it never touches a NIC.

Every node preset is one server that is its own NVLink domain, so a domain is
``gpus_per_node`` GPUs (scenario.spec.ClusterSpec.nvlink_domain_gpus) and
``build_graph`` refuses any other size. A rack-scale domain spans servers: a
GB200 / GB300 NVL72 rack is one NVLink domain of 72 GPUs across 18 servers
(compute trays of 4 GPUs, each tray with its own NICs) joined by NVSwitch trays.
The ``gb200-nvl72`` and ``gb300-nvl72`` presets model the rack as one node of 72
GPUs and 72 NICs on one NVSwitch: with a NIC per GPU, every GPU reaches the rest
of its rack over NVLink and leaves it through its own NIC, so the trays' borders
change no link, route or ring (topologies.describe names the NVSwitch "of node
N": of rack N). Only a rack whose trays share NICs between GPUs, or an NVLink
domain over several racks (NVL576), would need servers smaller than the domain,
which would take:

- a cluster key for the domain size, a multiple of ``gpus_per_node`` (today
  ``ClusterSpec.nvlink_domain_gpus`` is a property; the key replaces it);
- ``build_graph`` already draws each domain's servers and then one NVSwitch
  ``("nvswitch", domain)`` for the domain's GPUs; only its size check goes;
- ``Cluster`` already routes and builds NVLink rings by domain
  (``nvlink_domain_of``), and leaves a domain through the GPU's own NIC;
- the collectives (stepsim.comm.collectives) group a group's GPUs by
  server (``node_of``) both for their NVLink rings and for the hops between
  servers: they would group by domain for the first and by server for NICs;
- topologies.describe splits the bisection by server and names an NVSwitch
  "of node N": by domain, since a domain's NVLink traffic never crosses the
  fabric;
- the loader's symmetry rules (a stage's GPUs divide or are a multiple of a
  node) would be stated per domain as well as per server;
- only the ``nvswitch`` layout spans servers; the meshes below are one box.

Three NVLink layouts (``NodeShape.nvlink_topology``):

``nvswitch`` (DGX A100 / H100 / H200 / B200, an NVL72 rack) — every GPU has one
port into the NVSwitch carrying its whole NVLink bandwidth::

    GPU0 ─┐              GPU i ── NIC(i) over PCIe
    GPU1 ─┼─ NVSwitch    NIC(i) = i * nics // gpus (nic_of)
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .drawing import Drawing


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
    graph: Drawing,
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


def nic_of(shape: NodeShape, local_gpu: int) -> int:
    """The NIC a server's GPU uses: its NIC group is ``gpus // nics`` GPUs in a row."""
    return local_gpu * shape.nics // shape.gpus


def add_server(graph: Drawing, index: int, shape: NodeShape) -> None:
    """Server ``index``: its GPUs, its NICs and the PCIe cable from each GPU to its NIC."""
    first = index * shape.gpus
    for local in range(shape.gpus):
        gpu = (GPU, first + local)
        graph.add_node(gpu)
        nic = (NIC, index, nic_of(shape, local))
        cable(graph, gpu, nic, "pcie", shape.pcie_bytes_per_s, shape.pcie_latency_s)


def add_nvlink_domain(graph: Drawing, index: int, gpus: list[tuple], shape: NodeShape) -> None:
    """NVLink domain ``index``: the NVLink fabric (``shape.nvlink_topology``) joining
    ``gpus``, which are already in the graph."""
    bandwidth, latency = shape.nvlink_bytes_per_s, shape.nvlink_latency_s
    if shape.nvlink_topology == "nvswitch":
        switch = (NVSWITCH, index)
        for gpu in gpus:
            cable(graph, gpu, switch, "nvlink", bandwidth, latency)
    elif shape.nvlink_topology == "all-to-all":
        if len(gpus) == 1:
            return  # a lone GPU has no NVLink peers
        if len(gpus) - 1 > MESH_LANES_PER_GPU:
            raise ValueError(f"{len(gpus)} GPUs cannot all be joined by 6 NVLink lanes each")
        lanes = MESH_LANES_PER_GPU // (len(gpus) - 1)
        lane = bandwidth / MESH_LANES_PER_GPU
        for a in range(len(gpus)):
            for b in range(a + 1, len(gpus)):
                cable(graph, gpus[a], gpus[b], "nvlink", lanes * lane, latency, lanes)
    elif shape.nvlink_topology == "hybrid-cube-mesh":
        if len(gpus) != 8:
            raise ValueError(f"a hybrid cube-mesh node has 8 GPUs, not {len(gpus)}")
        lane = bandwidth / MESH_LANES_PER_GPU
        for a, b, lanes in HYBRID_CUBE_MESH:
            cable(graph, gpus[a], gpus[b], "nvlink", lanes * lane, latency, lanes)
    else:
        raise ValueError(f"unknown NVLink topology {shape.nvlink_topology!r}")

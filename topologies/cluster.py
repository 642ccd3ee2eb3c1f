"""The cluster as a graph: GPUs, NVLink inside NVLink domains, NICs, an InfiniBand fabric.

``build_graph`` draws the cluster (a `Drawing`: servers and NVLink domains from
topologies.node, the fabric from topologies.fabric); ``Cluster`` freezes it into
directed links and routes, built once and then only read. "Node" is a server
here; today every server is its own NVLink domain (topologies.node says what a
domain spanning servers would need).

Every cable is two directed links, one per direction, each with its own
bandwidth and latency, so traffic in opposite directions does not compete.
Graph nodes are tuples: ``("gpu", g)``, ``("nvswitch", node)``,
``("nic", node, k)`` and ``("switch", level, index)``; an NVSwitch is numbered by
its NVLink domain, which is its server's number while the two coincide.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import NamedTuple

from .describe import link_role
from .detour import Detours
from .drawing import Drawing, bfs_predecessors, descendants
from .fabric import FabricShape, add_fabric
from .node import GPU, NIC, NVSWITCH, SWITCH, NodeShape, add_nvlink_domain, add_server

# Enough Hamiltonian cycles to find disjoint ones in any node of up to 8 GPUs.
_MAX_CYCLES = 5000


class Link(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index; renaming changes the API
    src: tuple
    dst: tuple
    kind: str  # "nvlink", "pcie" or "ib"
    bandwidth_bytes_per_s: float
    latency_s: float


def build_graph(
    num_nodes: int, node: NodeShape, fabric: FabricShape, *, nvlink_domain_gpus: int
) -> Drawing:
    """``num_nodes`` servers of shape ``node``, their GPUs in NVLink domains of
    ``nvlink_domain_gpus`` (today: exactly one server each), on ``fabric``.

    Each domain is drawn whole, its servers then its NVLink, so that graph vertices
    and edges (and so link numbers) come in server order."""
    check_nvlink_domain(node.gpus, nvlink_domain_gpus)
    servers_per_domain = nvlink_domain_gpus // node.gpus
    graph = Drawing()
    for domain in range(num_nodes // servers_per_domain):
        servers = range(domain * servers_per_domain, (domain + 1) * servers_per_domain)
        for server in servers:
            add_server(graph, server, node)
        first_gpu = domain * nvlink_domain_gpus
        gpus = [(GPU, g) for g in range(first_gpu, first_gpu + nvlink_domain_gpus)]
        add_nvlink_domain(graph, domain, gpus, node)
    add_fabric(graph, num_nodes, node, fabric)
    return graph


def check_nvlink_domain(gpus_per_server: int, nvlink_domain_gpus: int) -> None:
    """Only domains of one server are modelled (topologies.node lists what a domain
    spanning servers, such as a GB200 NVL72 rack, still needs)."""
    if nvlink_domain_gpus != gpus_per_server:
        raise ValueError(
            f"an NVLink domain of {nvlink_domain_gpus} GPUs over servers of "
            f"{gpus_per_server} is not modelled: each server must be its own NVLink domain"
        )


class Cluster(Detours):
    """Directed links with integer indices and cached GPU-to-GPU routes.

    Inside an NVLink domain a route takes the NVLink graph (through the NVSwitch,
    or a direct link, or two hops through a GPU adjacent to both when a mesh has no
    direct link). Between domains it goes GPU -> its NIC -> switches -> the other
    GPU's NIC -> GPU. Among the equally short switch paths the one numbered
    (destination NIC port mod number of paths) is taken: destination-based
    routing as InfiniBand's fat-tree routing does (D-mod-K). It spreads
    destinations evenly over the spines, and traffic shifted from one replica
    to the next stays balanced, which lets one simulated group stand for its
    replicas (docs/design.md).
    """

    def __init__(self, graph: Drawing, *, gpus_per_node: int, nvlink_domain_gpus: int) -> None:
        check_nvlink_domain(gpus_per_node, nvlink_domain_gpus)
        self.graph = graph
        self.gpus_per_node = gpus_per_node
        self.nvlink_domain_gpus = nvlink_domain_gpus
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
        self.capacities = [link.bandwidth_bytes_per_s for link in self.links]
        self.num_gpus = sum(1 for n in graph if n[0] == GPU)
        self._gpu_nic = {
            g: next(n for n in graph.successors((GPU, g)) if n[0] == NIC)
            for g in range(self.num_gpus)
        }
        self._nic_switch = {
            n: next(s for s in graph.successors(n) if s[0] == SWITCH) for n in graph if n[0] == NIC
        }
        self._switches = graph.subgraph(n for n in graph if n[0] == SWITCH)
        # Destination port number of every NIC, for destination-based routing.
        self._port = {nic: i for i, nic in enumerate(sorted(n for n in graph if n[0] == NIC))}
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._switch_paths: dict[tuple[tuple, tuple], list[list[tuple]]] = {}
        # breadth-first predecessors from each source switch, shared by its targets
        self._switch_pred: dict[tuple, dict[tuple, list[tuple]]] = {}
        self._rings: dict[tuple[int, ...], list[list[int]]] = {}

    def index_of(self, src: tuple, dst: tuple) -> int:
        """The number of the link from vertex ``src`` to vertex ``dst``."""
        return self._index[(src, dst)]

    def nic_of_gpu(self, gpu: int) -> tuple:
        """The NIC vertex a GPU reaches other servers through."""
        return self._gpu_nic[gpu]

    def pcie_links(self, gpu: int) -> tuple[int, int]:
        """The GPU's PCIe link (to its NIC, and back): the GPU's own PCIe lanes, which its
        copies to and from host memory cross too (activation offloading; no PCIe switch
        or host vertex is drawn)."""
        vertex, nic = (GPU, gpu), self._gpu_nic[gpu]
        return self._index[(vertex, nic)], self._index[(nic, vertex)]

    def link_role(self, index: int) -> str:
        """What link ``index`` does (topologies.describe.LINK_ROLES)."""
        link = self.links[index]
        return link_role(link.kind, link.src, link.dst)

    def node_of(self, gpu: int) -> int:
        """The server a GPU sits in."""
        return gpu // self.gpus_per_node

    def nvlink_domain_of(self, gpu: int) -> int:
        """The NVLink domain a GPU belongs to (its server's number today)."""
        return gpu // self.nvlink_domain_gpus

    def route_latency_s(self, route: tuple[int, ...]) -> float:
        return sum(self.links[i].latency_s for i in route)

    def _find_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        if src_gpu == dst_gpu:
            return ()
        src, dst = (GPU, src_gpu), (GPU, dst_gpu)
        if self.nvlink_domain_of(src_gpu) == self.nvlink_domain_of(dst_gpu):
            path = self._nvlink_path(src, dst)
        else:
            nic_a, nic_b = self._gpu_nic[src_gpu], self._gpu_nic[dst_gpu]
            leaf_a, leaf_b = self._nic_switch[nic_a], self._nic_switch[nic_b]
            if leaf_b not in self._predecessors(leaf_a):
                # another rail or plane (rail-only, multi-plane): over NVLink to this
                # server's GPU of the destination's local index, then out through its NIC
                gpn = self.gpus_per_node
                via = self.node_of(src_gpu) * gpn + dst_gpu % gpn
                return self.route(src_gpu, via) + self.route(via, dst_gpu)
            choices = self._switch_paths_between(leaf_a, leaf_b)
            middle = choices[self._port[nic_b] % len(choices)]
            path = [src, nic_a, *middle, nic_b, dst]
        return tuple(self._index[(a, b)] for a, b in zip(path, path[1:], strict=False))

    def _nvlink_path(self, src: tuple, dst: tuple) -> list[tuple]:
        graph = self.graph
        switch = (NVSWITCH, self.nvlink_domain_of(src[1]))
        if switch in graph:
            return [src, switch, dst]
        if graph.has_edge(src, dst):
            return [src, dst]
        # Mesh without a direct link: through the GPU adjacent to both whose
        # narrower link is widest, the lowest-numbered on a tie.
        via = [n for n in graph.successors(src) if n[0] == GPU and graph.has_edge(n, dst)]
        if not via:
            raise ValueError(f"no NVLink path from GPU {src[1]} to GPU {dst[1]} within a node")

        def width(n: tuple) -> tuple[float, int]:
            bandwidth = min(
                graph[src][n]["bandwidth_bytes_per_s"], graph[n][dst]["bandwidth_bytes_per_s"]
            )
            return (-bandwidth, n[1])

        return [src, min(via, key=width), dst]

    def intra_node_rings(self, members: Sequence[int]) -> list[list[int]]:
        """Directed rings over GPUs of one node (one NVLink domain), as NCCL channels
        would use NVLink.

        Behind an NVSwitch one ring in rank order is as good as any. On a mesh the
        rings are a largest set of Hamiltonian cycles that share no NVLink lane, each
        in both directions; with none, the rank order (routed through other GPUs).
        """
        key = tuple(members)
        rings = self._rings.get(key)
        if rings is None:
            rings = self._rings[key] = self._find_rings(list(members))
        return rings

    def _find_rings(self, members: list[int]) -> list[list[int]]:
        if len(members) < 3 or (NVSWITCH, self.nvlink_domain_of(members[0])) in self.graph:
            return [members]
        lanes = {
            frozenset((a, b)): self.graph[(GPU, a)][(GPU, b)].get("lanes", 1)
            for a in members
            for b in members
            if a != b and self.graph.has_edge((GPU, a), (GPU, b))
        }
        cycles = list(islice(_hamiltonian_cycles(members, lanes), _MAX_CYCLES))
        best = _disjoint_cycles(cycles, lanes)
        if not best:
            return [members]
        return [ring for cycle in best for ring in (cycle, [cycle[0], *cycle[:0:-1]])]

    def fail_switch_links(self, pairs: Sequence[tuple[tuple, tuple]]) -> list[tuple]:
        """Take the links between switches ``pairs`` (src, dst vertices) out of routing:
        routes found from now on take the remaining shortest switch paths (D-mod-K over
        fewer of them). Link numbers are kept (the links carry nothing). Returns the leaf
        switches (those with NICs) that could reach each other before and cannot now."""
        leaves = sorted(set(self._nic_switch.values()))
        before = {a: descendants(self._switches, a) for a in leaves}
        self._switches.remove_edges_from(pairs)
        self._switch_pred.clear()
        self._switch_paths.clear()
        self._routes.clear()
        return [
            a
            for a in leaves
            if not before[a].intersection(leaves) <= descendants(self._switches, a)
        ]

    def _predecessors(self, a: tuple) -> dict[tuple, list[tuple]]:
        """Breadth-first predecessors of every switch reachable from switch ``a``."""
        pred = self._switch_pred.get(a)
        if pred is None:
            pred = self._switch_pred[a] = bfs_predecessors(self._switches, a)
        return pred

    def _switch_paths_between(self, a: tuple, b: tuple) -> list[list[tuple]]:
        """Every shortest switch path from a to b, sorted (what networkx's all_shortest_paths
        gives, but with one breadth-first search per source switch instead of one per
        pair: a 3-level fat tree of 1,000 single-node leaves has about 6,000 pairs)."""
        paths = self._switch_paths.get((a, b))
        if paths is None:
            pred = self._predecessors(a)
            if b not in pred:
                raise ValueError(f"no switch path from {a} to {b}")
            paths = sorted(_paths_back(pred, a, b))
            self._switch_paths[(a, b)] = paths
        return paths


def _paths_back(pred: dict[tuple, list[tuple]], source: tuple, target: tuple) -> list[list[tuple]]:
    """All shortest paths from source to target, walked back through breadth-first
    predecessors (each path listed once, source first)."""
    if target == source:
        return [[source]]
    return [
        [*path, target] for before in pred[target] for path in _paths_back(pred, source, before)
    ]


def _hamiltonian_cycles(members: list[int], lanes: dict[frozenset, int]) -> Iterator[list[int]]:
    """Every cycle through all members along NVLink, each once (starting at the first,
    second member smaller than the last, so a cycle and its reverse count once)."""
    first, rest = members[0], members[1:]

    def extend(path: list[int], left: list[int]) -> Iterator[list[int]]:
        if not left:
            if frozenset((path[-1], first)) in lanes and path[1] < path[-1]:
                yield list(path)
            return
        for gpu in left:
            if frozenset((path[-1], gpu)) in lanes:
                path.append(gpu)
                yield from extend(path, [g for g in left if g != gpu])
                path.pop()

    yield from extend([first], rest)


def _disjoint_cycles(cycles: list[list[int]], lanes: dict[frozenset, int]) -> list[list[int]]:
    """A largest set of cycles that together use no pair more often than it has lanes
    (depth-first, first found wins: deterministic)."""
    best: list[list[int]] = []
    # No more cycles than the member with the fewest lanes allows (two lane ends each).
    members = {g for pair in lanes for g in pair}
    bound = min(sum(n for pair, n in lanes.items() if g in pair) for g in members) // 2

    def pairs(cycle: list[int]) -> list[frozenset]:
        return [frozenset((cycle[i], cycle[(i + 1) % len(cycle)])) for i in range(len(cycle))]

    def search(start: int, chosen: list[list[int]], free: dict[frozenset, int]) -> None:
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
        for i in range(start, len(cycles)):
            if len(best) >= bound:
                return
            used = pairs(cycles[i])
            if all(free[p] > 0 for p in used):
                for p in used:
                    free[p] -= 1
                chosen.append(cycles[i])
                search(i + 1, chosen, free)
                chosen.pop()
                for p in used:
                    free[p] += 1

    search(0, [], dict(lanes))
    return best

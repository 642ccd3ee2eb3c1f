"""A cluster on one switch, known from its repeating unit instead of drawn whole.

Every server of a one-switch cluster is drawn by the same code (topologies.node), and
the switch gives every NIC its own port, so the whole graph is the unit of two servers
on the switch repeated: ``PatternCluster`` builds that unit as an ordinary ``Cluster``
(two servers and their switch) and answers for ``num_nodes`` servers by arithmetic,
with exactly the link numbers, links and routes ``Cluster`` gives over the whole graph
(tests/test_pattern.py compares them link by link and route by route). Set-up then
costs the same for 16 servers as for 16,384; the whole graph is drawn only when asked
for (``graph``: a drawing, a summary).

Link numbers of the whole graph (the drawing lists a vertex's links in the order they
were drawn, vertices in the order they were added): server ``n``'s vertices come
``n``-th, each of its ``B`` links (PCIe, NVLink, and each NIC's cable up to the
switch) at ``n * B`` plus its number in server 0; the switch comes last, its link
down to NIC ``k`` of server ``n`` at ``num_nodes * B + n * nics + k``.

This covers one-switch fabrics (``switch``, or a fat tree whose nodes fit under one
leaf); topologies.tree_pattern covers fat trees and rails with several leaves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from math import ceil
from typing import TYPE_CHECKING

import numpy as np

from .cluster import Cluster, Link, build_graph
from .detour import Detours
from .fabric import FabricShape
from .node import GPU, NIC, NVSWITCH, SWITCH, NodeShape

if TYPE_CHECKING:
    from .drawing import Drawing

_UNIT_NODES = 2  # the repeating unit: two servers (a route between servers) on the switch


def one_switch(num_nodes: int, fabric: FabricShape) -> bool:
    """Whether the fabric is a single switch every NIC plugs into."""
    if fabric.kind == "switch":
        return True
    if fabric.kind == "fat-tree":
        return ceil(num_nodes / fabric.nodes_per_leaf) == 1
    return False


class Links(Sequence):
    """The whole cluster's links, made on demand from the unit's."""

    def __init__(self, cluster: _CountedCluster) -> None:
        self._cluster = cluster

    def __len__(self) -> int:
        return self._cluster.num_links

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._cluster.link(index)

    def __iter__(self) -> Iterator[Link]:
        return (self._cluster.link(i) for i in range(len(self)))


class _CountedCluster(Detours):
    """What a cluster counted from its pattern (`PatternCluster`, the tree fabrics'
    `tree_pattern.TreePatternCluster`) answers as the whole graph would, from the
    attributes both set: ``num_nodes``, ``node``, ``fabric``, ``gpus_per_node``,
    ``nvlink_domain_gpus`` and ``_graph`` (None until drawn)."""

    num_nodes: int
    node: NodeShape
    fabric: FabricShape
    gpus_per_node: int
    nvlink_domain_gpus: int
    _graph: Drawing | None
    num_links: int  # and ``link``, for `Links`
    unit: Cluster  # servers 0 and 1, drawn
    block: int  # links from each server's vertices

    if TYPE_CHECKING:  # what each subclass has (declared for the type checker only)

        def link(self, index: int) -> Link: ...

    @property
    def graph(self):
        """The whole graph, drawn on first use (a drawing or a summary asks for it)."""
        if self._graph is None:
            self._graph = build_graph(
                self.num_nodes,
                self.node,
                self.fabric,
                nvlink_domain_gpus=self.nvlink_domain_gpus,
            )
        return self._graph

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def nvlink_domain_of(self, gpu: int) -> int:
        return gpu // self.nvlink_domain_gpus

    def pcie_links(self, gpu: int) -> tuple[int, int]:
        """`Cluster.pcie_links`: the unit's link of the same GPU of server 0, moved to the
        GPU's server (each server's links are a block of ``block`` in server order)."""
        server, local = divmod(gpu, self.gpus_per_node)
        up, down = self.unit.pcie_links(local)
        return up + server * self.block, down + server * self.block


class PatternCluster(_CountedCluster):
    """``Cluster``'s answers (links, routes, rings) for ``num_nodes`` servers on one
    switch, from a unit of two servers. ``translate(links, k)`` maps link numbers of
    servers ``n`` to those of servers ``n + k`` (an automorphism of the fabric and of
    its routes: every server alike, one path through the switch)."""

    def __init__(
        self, num_nodes: int, node: NodeShape, fabric: FabricShape, *, nvlink_domain_gpus: int
    ) -> None:
        if not one_switch(num_nodes, fabric):
            raise ValueError("a pattern cluster needs a one-switch fabric")
        self.num_nodes, self.node, self.fabric = num_nodes, node, fabric
        self.gpus_per_node = node.gpus
        self.nvlink_domain_gpus = nvlink_domain_gpus
        unit_nodes = min(num_nodes, _UNIT_NODES)
        self.unit = Cluster(
            build_graph(unit_nodes, node, fabric, nvlink_domain_gpus=nvlink_domain_gpus),
            gpus_per_node=node.gpus,
            nvlink_domain_gpus=nvlink_domain_gpus,
        )
        self.nics = node.nics
        unit_links = self.unit.links
        self.block = (len(unit_links) - unit_nodes * self.nics) // unit_nodes  # B
        self._check_unit(unit_nodes)
        self.server_links = self.num_nodes * self.block
        self.num_links = self.server_links + self.num_nodes * self.nics
        self.num_gpus = num_nodes * node.gpus
        self.links: Sequence[Link] = Links(self)
        unit_caps = [link.bandwidth_bytes_per_s for link in unit_links]
        down_caps = unit_caps[unit_nodes * self.block : unit_nodes * self.block + self.nics]
        # repeated, not recomputed: the same float objects, as cheap as a list can be
        self.capacities = unit_caps[: self.block] * num_nodes + down_caps * num_nodes
        self._latency = [link.latency_s for link in unit_links]
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        # `_template`'s, by the two GPUs' local numbers
        self._templates: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {}
        self._graph = None

    def _check_unit(self, unit_nodes: int) -> None:
        """The unit is what the module docstring says: B links from each server's
        vertices, in server order, then the switch's down-links in (server, NIC) order.
        Cheap, and any drawing change that breaks the arithmetic fails here, loudly."""
        links, block = self.unit.links, self.block
        for n in range(unit_nodes):
            for link in links[n * block : (n + 1) * block]:
                if link.src[0] == SWITCH or _server_of(link.src, self.gpus_per_node) != n:
                    raise AssertionError(f"unit link {link} is not server {n}'s")
        down = links[unit_nodes * block :]
        expected = [(NIC, n, k) for n in range(unit_nodes) for k in range(self.nics)]
        if [link.dst for link in down] != expected or {link.src for link in down} != {
            (SWITCH, 1, 0)
        }:
            raise AssertionError("the unit's switch links are not its NICs' in order")

    # -- what Cluster answers --------------------------------------------------------

    def link(self, index: int) -> Link:
        block, nics = self.block, self.nics
        if index < self.server_links:
            n, j = divmod(index, block)
            u = self.unit.links[j]
            gpn = self.gpus_per_node
            return u._replace(
                index=index, src=moved_vertex(u.src, n, gpn), dst=moved_vertex(u.dst, n, gpn)
            )
        n, k = divmod(index - self.server_links, nics)
        u = self.unit.links[self._unit_nodes() * block + k]
        return u._replace(index=index, dst=(NIC, n, k))

    def link_role(self, index: int) -> str:
        """What link ``index`` does: what the unit's link standing for it does."""
        return self.unit.link_role(self._unit_index(index))

    def link_roles(self, indices: np.ndarray) -> list[str]:
        """`link_role` of each of ``indices`` (an array), found once per unit link."""
        unit = np.where(
            indices < self.server_links,
            indices % self.block,
            self._unit_nodes() * self.block + (indices - self.server_links) % self.nics,
        )
        role = {u: self.unit.link_role(u) for u in set(unit.tolist())}
        return [role[u] for u in unit.tolist()]

    def route_latency_s(self, route: tuple[int, ...]) -> float:
        return sum(self._latency[self._unit_index(i)] for i in route)

    def intra_node_rings(self, members: Sequence[int]) -> list[list[int]]:
        """The unit's rings for the same GPUs of server 0, moved to the members' server
        (rings depend on the members' order and the NVLink lanes between them, both the
        same in every server)."""
        offset = self.node_of(members[0]) * self.gpus_per_node
        rings = self.unit.intra_node_rings([m - offset for m in members])
        return [[g + offset for g in ring] for ring in rings]

    # -- the pattern -------------------------------------------------------------------

    region_nodes = 1  # a copy in other servers shares no link with the representative
    shift_nodes = 1  # moving by any number of whole servers moves routes alike

    def moves(self, last: int, nodes: int) -> bool:
        """Whether moving by ``nodes`` servers, up to server ``last``, moves routes
        alike: on one switch, always."""
        return True

    def translate(self, links: Sequence[int], nodes: int) -> tuple[int, ...]:
        """Link numbers ``links`` of servers ``n`` as those of servers ``n + nodes``
        (every server's links and switch port move alike, and keep their order)."""
        server_shift, port_shift = nodes * self.block, nodes * self.nics
        server_links = self.server_links
        if len(links) > _ARRAY_LINKS:  # a collective over many servers: on an array
            found = np.asarray(links)
            found = found + np.where(found < server_links, server_shift, port_shift)
            return tuple(found.tolist())
        return tuple(i + server_shift if i < server_links else i + port_shift for i in links)

    def _unit_nodes(self) -> int:
        return min(self.num_nodes, _UNIT_NODES)

    def _unit_index(self, index: int) -> int:
        """The unit's link standing for link ``index`` (same kind, bandwidth, latency)."""
        if index < self.server_links:
            return index % self.block
        return self._unit_nodes() * self.block + (index - self.server_links) % self.nics

    def _find_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        gpn, block = self.gpus_per_node, self.block
        (na, a), (nb, b) = divmod(src_gpu, gpn), divmod(dst_gpu, gpn)
        if na == nb:  # inside one server: server 0's route, moved
            return tuple(i + na * block for i in self.unit.route(a, b))
        # between servers: the unit's route from server 0 to server 1, each end moved
        template = self._templates.get((a, b))
        if template is None:
            template = self._templates[(a, b)] = self._template(a, b)
        servers = (na, nb)
        return tuple([base + servers[end] * scale for end, base, scale in template])

    def count_routes(
        self, edges: Sequence[tuple[int, int]], own: np.ndarray
    ) -> tuple[list[tuple[tuple[int, int], int]], list[tuple[int, int]]] | None:
        """What `route` gives for ``edges``, counted on arrays: the edges by the unit
        path they take (one edge of each, in order of first appearance, and how many
        take it: the same local GPUs, in one server or two, cross links of the same
        bandwidths) and how many times their routes cross each link of ``own`` (a
        sorted array), as (link, times) in link order. None while a GPU is detoured
        (its routes are not the pattern's)."""
        if self.detours or not edges:
            return None
        gpn, block = self.gpus_per_node, self.block
        pairs = np.fromiter(chain.from_iterable(edges), np.int64, 2 * len(edges))
        servers, local = np.divmod(pairs.reshape(-1, 2), gpn)
        na, nb = servers[:, 0], servers[:, 1]
        same = na == nb
        key = (local[:, 0] * gpn + local[:, 1]) * 2 + same
        keys, first, inverse, counts = np.unique(
            key, return_index=True, return_inverse=True, return_counts=True
        )
        crossed = []
        for number, k in enumerate(keys.tolist()):
            taking = inverse == number  # the edges that take this path
            a, b = divmod(k // 2, gpn)
            if k % 2:  # inside one server: server 0's route, moved
                moved = na[taking] * block
                crossed += [moved + i for i in self.unit.route(a, b)]
            else:
                template = self._templates.get((a, b))
                if template is None:
                    template = self._templates[(a, b)] = self._template(a, b)
                ends = (na[taking], nb[taking])
                crossed += [base + ends[end] * scale for end, base, scale in template]
        links = np.concatenate(crossed) if crossed else np.zeros(0, np.int64)
        # each crossed link of ``own`` and how often (sorted and counted: np.unique's
        # counts would import numpy.ma, 14 ms of start-up)
        at = np.minimum(np.searchsorted(own, links), max(len(own) - 1, 0))
        mine = np.sort(links[own[at] == links]) if len(own) else links[:0]
        starts = np.flatnonzero(np.concatenate(([True], mine[1:] != mine[:-1])))[: len(mine)]
        hit, times = mine[starts], np.diff(np.append(starts, len(mine)))
        order = np.argsort(first, kind="stable")  # paths in order of first appearance
        firsts, times_of = first[order].tolist(), counts[order].tolist()
        samples = [(edges[i], n) for i, n in zip(firsts, times_of, strict=True)]
        return samples, list(zip(hit.tolist(), times.tolist(), strict=True))

    def slowest_hop_s(self, edges: Sequence[tuple[int, int]]) -> float | None:
        """The greatest `route_latency_s` of the edges' routes, one route asked per unit
        path (the same local GPUs, in one server or two, cross links of the same
        latencies in the same order: the same sum); None while a GPU is detoured."""
        if self.detours or not edges:
            return None
        gpn = self.gpus_per_node
        pairs = np.fromiter(chain.from_iterable(edges), np.int64, 2 * len(edges))
        servers, local = np.divmod(pairs.reshape(-1, 2), gpn)
        key = (local[:, 0] * gpn + local[:, 1]) * 2 + (servers[:, 0] == servers[:, 1])
        # return_index: np.unique without index outputs imports numpy.ma (start-up)
        _, first = np.unique(key, return_index=True)
        route, latency_s = self.route, self.route_latency_s
        return max(latency_s(route(*edges[i])) for i in first.tolist())

    def _template(self, a: int, b: int) -> tuple[tuple[int, int, int], ...]:
        """The unit's route from local GPU ``a`` of server 0 to ``b`` of server 1 as
        (end, base, scale) per link: link ``base + server * scale``, where ``server`` is
        the source's (end 0) or the destination's (end 1)."""
        block, nics = self.block, self.nics
        unit_block_end = self._unit_nodes() * block
        out = []
        for i in self.unit.route(a, self.gpus_per_node + b):
            if i < unit_block_end:  # a server's own link: block j of server m
                m, j = divmod(i, block)
                out.append((m, j, block))
            else:  # the switch's port k down to server m
                m, k = divmod(i - unit_block_end, nics)
                out.append((m, self.server_links + k, nics))
        return tuple(out)


# `PatternCluster.translate` moves longer tuples of links on an array (shorter ones cost
# less in a loop than the array's set-up)
_ARRAY_LINKS = 256


def moved_vertex(vertex: tuple, n: int, gpus_per_node: int) -> tuple:
    """A vertex of server 0 (a GPU, NIC or NVSwitch) as the same one of server ``n``;
    a switch stays."""
    kind = vertex[0]
    if kind == GPU:
        return (GPU, vertex[1] + n * gpus_per_node)
    if kind == NIC:
        return (NIC, vertex[1] + n, vertex[2])
    if kind == NVSWITCH:
        return (NVSWITCH, vertex[1] + n)
    return vertex


def _server_of(vertex: tuple, gpus_per_node: int) -> int:
    if vertex[0] == GPU:
        return vertex[1] // gpus_per_node
    return vertex[1]  # a NIC's or an NVSwitch's server

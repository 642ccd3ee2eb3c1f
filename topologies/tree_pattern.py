"""A fat tree (2 or 3 levels) or rail-optimized fabric known from its pattern.

``TreePatternCluster`` answers as ``Cluster`` does over the whole graph (link numbers,
links, routes with destination-based spine choice, rings) without drawing it: the
servers are one unit of two servers repeated (as in topologies.pattern), and the
switches are counted in the order topologies.fabric draws them, each with its links
down then up, so any link's number is a base per switch plus its place among that
switch's links (the drawing numbers a vertex's links in the order they were drawn).

Where copies may be left out and stages moved (comm/placement.py):

- ``region_nodes``: the servers whose links no route from outside crosses. A route
  between servers climbs from its source's leaf and descends into its destination's
  leaf, so a copy in other leaf groups (3 levels with several pods: other pods) shares
  no link with the representative.
- ``shift_nodes``: moving every GPU by a multiple of this many servers moves every
  route alike: leaves onto leaves (pods onto pods), and each NIC's port number by a
  multiple of the number of equal shortest paths, so D-mod-K picks the same spine.
  A move that would reach the last, partly filled leaf group is not one (its links
  are numbered differently): ``moves`` says which are.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from math import ceil, gcd

import numpy as np

from .cluster import Cluster, Link, build_graph
from .describe import link_role
from .fabric import FabricShape, spines_per_leaf
from .node import GPU, NIC, SWITCH, NodeShape
from .pattern import Links, _CountedCluster, moved_vertex


class TreePatternCluster(_CountedCluster):
    """``Cluster``'s answers for a fat tree (2 or 3 levels) or a rail-optimized fabric,
    counted from a two-server unit and the switch levels (the module docstring)."""

    def __init__(
        self, num_nodes: int, node: NodeShape, fabric: FabricShape, *, nvlink_domain_gpus: int
    ) -> None:
        rails = node.nics if fabric.kind == "rail-optimized" else 1
        if fabric.kind not in ("fat-tree", "rail-optimized"):
            raise ValueError(f"not a tree fabric: {fabric.kind!r}")
        self.num_nodes, self.node, self.fabric = num_nodes, node, fabric
        self.gpus_per_node, self.nics, self.rails = node.gpus, node.nics, rails
        self.nvlink_domain_gpus = nvlink_domain_gpus
        self.num_gpus = num_nodes * node.gpus
        npl = self.npl = fabric.nodes_per_leaf
        self.groups = ceil(num_nodes / npl)
        self.leaves = self.groups * rails
        if self.leaves == 1:
            raise ValueError("one leaf: topologies.pattern's one-switch cluster")
        self.three = fabric.kind == "fat-tree" and fabric.levels == 3
        s = self.spines = spines_per_leaf(fabric, node.nics)
        self.lpp = fabric.leaves_per_pod
        self.pods = ceil(self.leaves / self.lpp) if self.three else 1
        # the unit: two servers on one switch, for the links inside a server
        self.unit = Cluster(
            build_graph(
                min(num_nodes, 2),
                node,
                FabricShape(kind="switch", latency_s=fabric.latency_s),
                nvlink_domain_gpus=nvlink_domain_gpus,
            ),
            gpus_per_node=node.gpus,
            nvlink_domain_gpus=nvlink_domain_gpus,
        )
        unit_servers = min(num_nodes, 2)
        self.block = (len(self.unit.links) - unit_servers * node.nics) // unit_servers
        self.server_links = num_nodes * self.block
        # bandwidths exactly as topologies.fabric computes them
        nic_bw, lat = node.nic_bytes_per_s, fabric.latency_s
        leaf_down_bw = npl * node.nics * nic_bw / rails
        up_total = leaf_down_bw / fabric.oversubscription
        self.up_bw = up_total / s
        self.core_bw = self.lpp * (up_total / s) / fabric.oversubscription / s
        self.nic_bw, self.lat = nic_bw, lat
        # the switches in the order they are drawn, with their number of links
        switches: list[tuple] = [(SWITCH, 1, leaf) for leaf in range(self.leaves)]
        if self.three:
            switches += [(SWITCH, 2, a) for a in range(self.pods * s)]
            if self.pods > 1:
                switches += [(SWITCH, 3, c) for c in range(s)]
        else:
            switches += [(SWITCH, 2, sp) for sp in range(s)]
        self.switches = switches
        self._switch_index = {v: i for i, v in enumerate(switches)}
        bases, caps, base = [], [], self.server_links
        for v in switches:
            bases.append(base)
            down = self._down(v)
            caps.append(self._caps(v, down))
            base += len(down)
        self.bases = bases
        self.num_links = base
        self.links: Sequence[Link] = Links(self)
        unit_caps = self.unit.capacities
        self.capacities = unit_caps[: self.block] * num_nodes + [c for cs in caps for c in cs]
        self._unit_latency = [link.latency_s for link in self.unit.links]
        self.region_nodes = npl * (self.lpp if self.three and self.pods > 1 else 1)
        paths = s**3 if self.three and self.pods > 1 else s
        step = paths // gcd(paths, node.nics)  # servers whose NICs move ports by k x paths
        self.shift_nodes = self.region_nodes * step // gcd(self.region_nodes, step)
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._graph = None

    # -- the switches' links ---------------------------------------------------------

    def _nodes_of_group(self, group: int) -> range:
        return range(group * self.npl, min((group + 1) * self.npl, self.num_nodes))

    def _leaves_of_pod(self, pod: int) -> range:
        return range(pod * self.lpp, min((pod + 1) * self.lpp, self.leaves))

    def _down(self, v: tuple) -> list[tuple]:
        """The vertices switch ``v``'s links go to, in the order they were drawn."""
        level, i = v[1], v[2]
        s = self.spines
        if level == 1:
            group, rail = divmod(i, self.rails)
            if self.rails > 1:
                nics = [(NIC, n, rail) for n in self._nodes_of_group(group)]
            else:
                nics = [(NIC, n, k) for n in self._nodes_of_group(group) for k in range(self.nics)]
            if self.three:
                pod = i // self.lpp
                return nics + [(SWITCH, 2, pod * s + j) for j in range(s)]
            return nics + [(SWITCH, 2, j) for j in range(s)]
        if level == 2 and not self.three:
            return [(SWITCH, 1, leaf) for leaf in range(self.leaves)]
        if level == 2:
            leaves = [(SWITCH, 1, leaf) for leaf in self._leaves_of_pod(i // s)]
            return leaves + ([(SWITCH, 3, c) for c in range(s)] if self.pods > 1 else [])
        return [(SWITCH, 2, a) for a in range(self.pods * s)]

    def _bandwidth(self, src: tuple, dst: tuple) -> float:
        if dst[0] == NIC:
            return self.nic_bw
        if SWITCH == src[0] == dst[0] and 3 in (src[1], dst[1]):
            return self.core_bw
        return self.up_bw

    def _caps(self, v: tuple, down: list[tuple]) -> list[float]:
        return [self._bandwidth(v, d) for d in down]

    def _position(self, src: tuple, dst: tuple) -> int:
        """Where ``dst`` is among switch ``src``'s links (inverse of ``_down``)."""
        level, i = src[1], src[2]
        s = self.spines
        if level == 1:
            group, rail = divmod(i, self.rails)
            under = len(self._nodes_of_group(group)) * (1 if self.rails > 1 else self.nics)
            if dst[0] == NIC:
                first = group * self.npl
                if self.rails > 1:
                    return dst[1] - first
                return (dst[1] - first) * self.nics + dst[2]
            return under + dst[2] % s
        if level == 2 and not self.three:
            return dst[2]
        if level == 2:
            pod = i // s
            if dst[1] == 1:
                return dst[2] - pod * self.lpp
            return len(self._leaves_of_pod(pod)) + dst[2]
        return dst[2]

    def _index(self, src: tuple, dst: tuple) -> int:
        return self.bases[self._switch_index[src]] + self._position(src, dst)

    def _leaf_of(self, n: int, k: int) -> int:
        return (n // self.npl) * self.rails + (k if self.rails > 1 else 0)

    # -- what Cluster answers --------------------------------------------------------

    def link(self, index: int) -> Link:
        if index < self.server_links:
            n, j = divmod(index, self.block)
            u = self.unit.links[j]
            src, dst = moved_vertex(u.src, n, self.gpus_per_node), u.dst
            if dst[0] == SWITCH:
                dst = (SWITCH, 1, self._leaf_of(n, u.src[2]))
            else:
                dst = moved_vertex(dst, n, self.gpus_per_node)
            return u._replace(index=index, src=src, dst=dst)
        i = bisect_right(self.bases, index) - 1
        src = self.switches[i]
        dst = self._down(src)[index - self.bases[i]]
        return Link(index, src, dst, "ib", self._bandwidth(src, dst), self.lat)

    def link_role(self, index: int) -> str:
        if index < self.server_links:
            return self.unit.link_role(index % self.block)
        link = self.link(index)
        return link_role(link.kind, link.src, link.dst)

    def link_roles(self, indices: np.ndarray) -> list[str]:
        """`link_role` of each of ``indices`` (an array): a server's links found once per
        unit link, the switches' one by one."""
        role = {u: self.unit.link_role(u) for u in range(self.block)}
        block, server_links = self.block, self.server_links
        return [
            role[i % block] if i < server_links else self.link_role(i) for i in indices.tolist()
        ]

    def route_latency_s(self, route: tuple[int, ...]) -> float:
        block, lat, unit = self.block, self.lat, self._unit_latency
        server_links = self.server_links
        return sum(unit[i % block] if i < server_links else lat for i in route)

    def intra_node_rings(self, members: Sequence[int]) -> list[list[int]]:
        offset = self.node_of(members[0]) * self.gpus_per_node
        rings = self.unit.intra_node_rings([m - offset for m in members])
        return [[g + offset for g in ring] for ring in rings]

    def _find_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        gpn, block, unit = self.gpus_per_node, self.block, self.unit
        (na, a), (nb, b) = divmod(src_gpu, gpn), divmod(dst_gpu, gpn)
        if na == nb:
            return tuple(i + na * block for i in unit.route(a, b))
        nic_a, nic_b = unit.nic_of_gpu(a), unit.nic_of_gpu(b)
        up = na * block + unit.index_of((GPU, a), nic_a)
        out = [up, na * block + unit.index_of(nic_a, (SWITCH, 1, 0))]
        ka, kb = nic_a[2], nic_b[2]
        la, lb = (SWITCH, 1, self._leaf_of(na, ka)), (SWITCH, 1, self._leaf_of(nb, kb))
        path = [la, *self._middle(la, lb, nb * self.nics + kb), lb, (NIC, nb, kb)]
        if la == lb:
            del path[1]
        out += [self._index(x, y) for x, y in zip(path, path[1:], strict=False)]
        out.append(nb * block + unit.index_of(nic_b, (GPU, b)))
        return tuple(out)

    def _middle(self, la: tuple, lb: tuple, port: int) -> list[tuple]:
        """The switches between two leaves on the path D-mod-K picks: the shortest
        paths sorted, the one numbered port mod their number (topologies.cluster)."""
        if la == lb:
            return []
        s = self.spines
        if not self.three:
            return [(SWITCH, 2, port % s)]
        pa, pb = la[2] // self.lpp, lb[2] // self.lpp
        if pa == pb:
            return [(SWITCH, 2, pa * s + port % s)]
        i = port % s**3
        return [
            (SWITCH, 2, pa * s + i // s**2),
            (SWITCH, 3, i // s % s),
            (SWITCH, 2, pb * s + i % s),
        ]

    # -- the pattern -------------------------------------------------------------------

    def moves(self, last: int, nodes: int) -> bool:
        """Whether moving by ``nodes`` servers, up to server ``last`` once moved, moves
        routes alike: a multiple of ``shift_nodes`` clear of a partly filled group."""
        if nodes % self.shift_nodes:
            return False
        return last < (self.num_nodes // self.region_nodes) * self.region_nodes

    def translate(self, links: Sequence[int], nodes: int) -> tuple[int, ...]:
        """Link numbers moved by ``nodes`` servers (``moves`` must hold)."""
        out = []
        for index in links:
            if index < self.server_links:
                out.append(index + nodes * self.block)
                continue
            link = self.link(index)
            out.append(self._index(self._moved(link.src, nodes), self._moved(link.dst, nodes)))
        return tuple(out)

    def _moved(self, v: tuple, nodes: int) -> tuple:
        if v[0] == NIC:
            return (NIC, v[1] + nodes, v[2])
        level, i = v[1], v[2]
        groups = nodes // self.npl
        if level == 1:
            return (SWITCH, 1, i + groups * self.rails)
        if level == 2 and self.three:
            return (SWITCH, 2, i + (groups * self.rails // self.lpp) * self.spines)
        return v  # 2-level spines and cores serve every leaf alike

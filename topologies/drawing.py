"""A directed graph in the order it was drawn: the part of networkx's ``DiGraph`` that
drawing a cluster and freezing it into links and routes use, without importing networkx
(about 0.16 s of every ``stepsim run``'s start-up; `stepsim topology`'s bisection and
picture still use networkx, converting from this).

Vertices and edges come out in networkx's order, which is what link numbers are:
vertices in the order first added (an edge adds its ends, source first), each vertex's
out-edges in the order they were first added. Adding an edge again updates its data.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any


class Drawing:
    """A directed graph: ``graph[u][v]`` is the data of edge (u, v)."""

    __slots__ = ("_succ",)

    def __init__(self) -> None:
        self._succ: dict[Any, dict[Any, dict[str, Any]]] = {}

    def add_node(self, n: Hashable) -> None:
        if n not in self._succ:
            self._succ[n] = {}

    def add_edge(self, u: Hashable, v: Hashable, **data: Any) -> None:
        succ = self._succ
        if u not in succ:
            succ[u] = {}
        if v not in succ:
            succ[v] = {}
        edge = succ[u].get(v)
        if edge is None:
            succ[u][v] = dict(data)
        else:
            edge.update(data)

    def remove_edges_from(self, edges: Iterable[tuple[Hashable, Hashable]]) -> None:
        """Take these edges out; one that is not there is passed over (as networkx does)."""
        for u, v in edges:
            self._succ.get(u, {}).pop(v, None)

    def __contains__(self, n: object) -> bool:
        return n in self._succ

    def __iter__(self) -> Iterator[Any]:
        return iter(self._succ)

    def __getitem__(self, u: Hashable) -> dict[Any, dict[str, Any]]:
        return self._succ[u]

    def number_of_edges(self) -> int:
        return sum(map(len, self._succ.values()))

    def has_edge(self, u: Hashable, v: Hashable) -> bool:
        return v in self._succ.get(u, ())

    def successors(self, n: Hashable) -> Iterator[Any]:
        return iter(self._succ[n])

    def edges(self, data: bool | str = False) -> Iterator[tuple]:
        """(u, v), (u, v, its data) with ``data=True``, or (u, v, one field or None)
        with ``data="field"``, in drawing order."""
        for u, out in self._succ.items():
            for v, fields in out.items():
                if data is False:
                    yield (u, v)
                elif data is True:
                    yield (u, v, fields)
                else:
                    yield (u, v, fields.get(data))

    def subgraph(self, keep: Iterable[Hashable]) -> Drawing:
        """A copy of the vertices ``keep`` and the edges between them (in this graph's
        order), each edge's data copied."""
        kept = set(keep)
        sub = Drawing()
        for u, out in self._succ.items():
            if u in kept:
                sub._succ[u] = {v: dict(fields) for v, fields in out.items() if v in kept}
        return sub


def descendants(graph: Drawing, source: Hashable) -> set:
    """Every vertex reachable from ``source`` (itself not included)."""
    seen = {source}
    stack = [source]
    while stack:
        for w in graph[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    seen.discard(source)
    return seen


def bfs_predecessors(graph: Drawing, source: Hashable) -> dict[Any, list]:
    """For every vertex reachable from ``source``, its predecessors on the shortest paths
    from it (``source``: none): what ``networkx.predecessor`` gives."""
    pred: dict[Any, list] = {source: []}
    level = {source: 0}
    frontier = [source]
    depth = 0
    while frontier:
        depth += 1
        following = []
        for v in frontier:
            for w in graph[v]:
                at = level.get(w)
                if at is None:
                    level[w] = depth
                    pred[w] = [v]
                    following.append(w)
                elif at == depth:
                    pred[w].append(v)
        frontier = following
    return pred

"""topologies.drawing against networkx, which it stands in for in a run: the same
vertex and edge order (link numbers), edge data, breadth-first predecessors and
descendants, on random directed graphs."""

import random

import networkx as nx
import pytest

from stepsim.topologies.drawing import Drawing, bfs_predecessors, descendants


def _both(seed: int) -> tuple[Drawing, nx.DiGraph]:
    rng = random.Random(seed)
    ours, theirs = Drawing(), nx.DiGraph()
    for _ in range(60):
        if rng.random() < 0.1:
            n = ("v", rng.randrange(30))
            ours.add_node(n)
            theirs.add_node(n)
            continue
        u, v = ("v", rng.randrange(30)), ("v", rng.randrange(30))
        data = {"kind": rng.choice("ab"), "w": rng.random()}
        ours.add_edge(u, v, **data)  # again: its data updated, its place kept
        theirs.add_edge(u, v, **data)
    return ours, theirs


@pytest.mark.parametrize("seed", range(20))
def test_a_drawing_orders_and_answers_as_networkx_does(seed):
    ours, theirs = _both(seed)
    assert list(ours) == list(theirs)
    assert list(ours.edges(data=True)) == list(theirs.edges(data=True))
    assert list(ours.edges(data="kind")) == list(theirs.edges(data="kind"))
    assert ours.number_of_edges() == theirs.number_of_edges()
    for u in theirs:
        assert list(ours.successors(u)) == list(theirs.successors(u))
        assert descendants(ours, u) == nx.descendants(theirs, u)
        pred = bfs_predecessors(ours, u)
        expected = nx.predecessor(theirs, u)
        assert {w: sorted(p) for w, p in pred.items()} == {
            w: sorted(p) for w, p in expected.items()
        }
    keep = [n for n in theirs if n[1] % 2]
    assert sorted(ours.subgraph(keep).edges()) == sorted(theirs.subgraph(keep).edges())
    cut = list(theirs.edges())[:5] + [(("v", 99), ("v", 98))]  # one that is not there
    ours.remove_edges_from(cut)
    theirs.remove_edges_from(cut)
    assert list(ours.edges()) == list(theirs.edges())

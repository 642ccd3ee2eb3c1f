"""Communication as data: point-to-point transfers and NCCL-like collectives.

What this module builds are the network's input types (ir/flows.py): a
`Transfer` is what the network moves in one go, a *coupled flow* of several real
flows (one per ring or tree edge, or one per GPU sending) that progress together,
each carrying ``bytes_per_flow``; ``links`` are the directed links they cross and
``mults`` how many of those real flows cross each link. A `Collective` is a tuple
of transfers run one after the other (phases).

Symmetric replicas: a scenario's tensor-parallel ranks and data-parallel
replicas all do the same thing at the same time, so only a representative
group is simulated. Its flows are charged, link by link, for every congruent
flow of the groups it stands for that crosses the same link (``groups[1:]``).
Links of those other groups that the representative does not touch carry by
symmetry the same load as the representative's own, so leaving them out does
not change any rate (docs/design.md).

Algorithms, as NCCL runs them (message S bytes, n ranks):

- ``ring``: 2(n-1)/n S bytes on every ring edge in 2(n-1) steps (all-reduce;
  reduce-scatter and all-gather are half of it). Like NCCL, a group spread
  over several nodes with k GPUs in each runs k rings (channels), each
  leaving a node through a different GPU, and so a different NIC, and
  arriving at the next node on the same rail; each carries S/k. Inside a node
  with a NVLink mesh, the rings are the edge-disjoint Hamiltonian cycles of the
  NVLink lanes, both directions.
- ``tree``: reduce-scatter inside each node, then per local rank a double
  binary tree over the nodes (each tree carries half of the shard up and down;
  2 x depth steps), then all-gather inside each node. Needs two nodes or more.
- ``hierarchical``: as ``tree`` with a ring over the nodes in the middle.
- ``auto``: what NCCL runs by default: among the algorithms NCCL enables on this
  hardware, whichever is fastest for this message when alone on the network
  (latency + bytes / bottleneck per phase; NCCL's tuner picks the same way, from
  its own cost model). Where the NVSwitch reduces (``Fabric.nvls_efficiency`` > 0)
  they include NVLink SHARP, as NCCL's default (NCCL_NVLS_ENABLE=2) does: NVLS for
  a group inside one node, NVLS_TREE for an all-reduce over nodes (`choices` has
  the rules and their sources).
- ``nvls``: ``auto``, asked for on a node whose NVSwitch reduces (the scenario's rules
  refuse it elsewhere); it also runs NVLS reduce-scatters and all-gathers over more
  than NCCL_MAX_NVLS_ARITY GPUs of a node, which NCCL's default leaves out.

NVLink SHARP (NCCL's NVLS and NVLS_TREE): inside a node of k GPUs the switch reduces:
every GPU's data goes up its NVLink once (multimem.ld_reduce reads chunk j of every GPU
for the GPU owning chunk j), each owner takes its reduced chunk down and stores it back
up (multimem.st), and the switch multicasts it down to every GPU: (k+1)/k S up and down
each GPU's link for an all-reduce (the ring: 2(k-1)/k S), S up and S/k down for a
reduce-scatter, the reverse for an all-gather. Multimem traffic reaches
``nvls_efficiency`` of the link rate (NCCL's nvlsEfficiency), so each byte occupies
1/efficiency of a byte of the link: a flow on the real links that still shares them.
Across nodes (NVLS_TREE): NVLS reduce-scatter in the nodes, double binary trees across,
NVLS all-gather. IB SHARP (CollNet) is not modelled.

Every phase pays a fixed base latency plus, per step, the slowest hop's latency.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from ..ir.flows import Collective, Transfer
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    AUTO,
    HIERARCHICAL,
    NVLS,
    REDUCE_SCATTER,
    RING,
    TREE,
)

Edge = tuple[int, int]


class LayoutError(ValueError):
    """The congruent groups of a layout do not cross the cluster alike, so one group
    cannot stand for the others. Whoever lowers a scenario for a user turns it into
    the user's one-line error (run.run: a ScenarioError)."""


class Pattern(NamedTuple):
    """A cluster known by its pattern (topologies.PatternCluster, TreePatternCluster):
    a copy in other regions (``region_gpus`` GPUs: a server on one switch, a leaf group
    or pod on a tree) shares no link with the representative, and moving every GPU by
    whole servers where ``moves(last_server, servers)`` says so (a multiple of
    ``shift_nodes``, clear of a partly filled group) moves every route alike,
    so a collective of groups moved so is the same collective with its links moved
    (``translate(links, servers)``); placement.StageComm uses both. ``memo`` holds what
    was built once, by where it was built: one lowering's, or shared by the lowerings of
    one scenario that differ only in the number of micro-batches (the fast-forward's),
    whose transfers are the same. ``detoured``: the GPUs
    whose traffic leaves through another NIC of their server (a failed NIC,
    topologies.detour), whose servers are unlike the others'."""

    gpus_per_node: int
    region_gpus: int
    shift_nodes: int
    moves: Callable[[int, int], bool]
    translate: Callable[[Sequence[int], int], tuple[int, ...]]
    memo: dict
    detoured: frozenset[int] = frozenset()


class Fabric(NamedTuple):
    """What collectives need to know about the cluster (see topologies.Cluster)."""

    route: Callable[[int, int], tuple[int, ...]]
    route_latency_s: Callable[[tuple[int, ...]], float]
    node_of: Callable[[int], int]
    intra_node_rings: Callable[[Sequence[int]], list[list[int]]]
    capacities: Sequence[float]
    base_latency_s: float
    pattern: Pattern | None = None  # None: the whole graph, every copy enumerated
    nvls_efficiency: float = 0.0  # > 0: the NVSwitch reduces (NVLS), at this fraction
    links: Sequence | None = None  # the cluster's links (topologies.Link), for their ends
    # a GPU's PCIe link to its NIC and back (topologies.Cluster.pcie_links), which its
    # copies to host memory cross (emit/offload.py); None: the cluster cannot say
    pcie_links: Callable[[int], tuple[int, int]] | None = None
    # `route` without keeping the answer in the cluster's cache (None: `route`)
    route_once: Callable[[int, int], tuple[int, ...]] | None = None
    # a pattern cluster's routes of many edges counted on arrays (PatternCluster.count_routes)
    count_routes: Callable | None = None
    # the slowest route of many edges, one per unit path (PatternCluster.slowest_hop_s)
    slowest_hop_s: Callable[[Sequence[Edge]], float | None] | None = None

    @classmethod
    def of(
        cls,
        cluster,
        base_latency_s: float,
        nvls_efficiency: float = 0.0,
        memo: dict | None = None,
    ) -> Fabric:
        """From a topologies.Cluster or PatternCluster (a pattern's ``memo``: a new one
        unless given)."""
        translate = getattr(cluster, "translate", None)
        return cls(
            route=cluster.route,
            route_latency_s=cluster.route_latency_s,
            node_of=cluster.node_of,
            intra_node_rings=cluster.intra_node_rings,
            capacities=cluster.capacities,
            base_latency_s=base_latency_s,
            pattern=None
            if translate is None
            else Pattern(
                cluster.gpus_per_node,
                cluster.region_nodes * cluster.gpus_per_node,
                cluster.shift_nodes,
                cluster.moves,
                translate,
                {} if memo is None else memo,
                frozenset(cluster.detours),
            ),
            nvls_efficiency=nvls_efficiency,
            links=cluster.links,
            pcie_links=getattr(cluster, "pcie_links", None),
            route_once=getattr(cluster, "route_once", None),
            count_routes=getattr(cluster, "count_routes", None),
            slowest_hop_s=getattr(cluster, "slowest_hop_s", None),
        )


def _coupled(
    edge_sets: Sequence[Sequence[Edge]],
    fabric: Fabric,
    bytes_per_flow: float,
    latency_s: float,
    weights: Sequence[float] | None = None,
) -> Transfer:
    """``edge_sets[0]`` are the representative's edges, the rest congruent copies.
    ``weights``: each edge's (by its index in a set) bytes in units of
    ``bytes_per_flow``, its flow progressing at that multiple of the rate, so that all
    end together (an all-to-all-v); a link's multiplicity is then the sum of the weights
    of the flows crossing it."""
    crossed = _crossed_memo(edge_sets, fabric, weights)
    return Transfer(crossed[0], crossed[1], bytes_per_flow, latency_s)


def _crossed_memo(
    edge_sets: Sequence[Sequence[Edge]], fabric: Fabric, weights: Sequence[float] | None = None
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """`_crossed`, kept in the run's memo for many edges (`_memo_slot`)."""
    slot = _memo_slot(fabric, ("crossed", None if weights is None else tuple(weights)), edge_sets)
    crossed = None if slot is None else slot[0].get(slot[1])
    if crossed is None:
        crossed = _crossed(edge_sets, fabric, weights)
        if slot is not None:
            slot[0][slot[1]] = crossed
    return crossed


# Edge sets of at least this many edges are routed once per run (in the pattern's memo,
# keyed by their GPU numbers): the same groups reduce buckets of several sizes (the
# first, middle and last stages' gradients), and routing a tree over 1,024 servers for
# each of 8 tensor ranks again costs far more than comparing the numbers. Below it the
# key would cost about what it saves.
MEMO_EDGES = 1024


# what a collective's phase over given groups is, whatever its kind and size: counts
# (channels, GPUs per node, nodes, depth), the slowest hop's latency, (links, mults)
_Shape = tuple


def _shaped(
    fabric: Fabric, tag: tuple, groups: Sequence[Sequence[int]], build: Callable[[Fabric], Any]
) -> Any:
    """``build(fabric)``, kept in the run's memo by the groups' GPU numbers when they are
    many (`MEMO_EDGES` GPUs or more): the three bucket sizes of one stage's gradients, and
    both kinds of a two-level all-reduce's phases in the nodes, are one shape."""
    pattern = fabric.pattern
    sizes = tuple(map(len, groups))
    total = sum(sizes)
    if pattern is None or total < MEMO_EDGES:
        return build(fabric)
    numbers = np.fromiter(chain.from_iterable(groups), np.int64, total)
    key = ("shape", *tag, sizes, numbers.tobytes())
    found = pattern.memo.get(key, _MISSING)
    if found is _MISSING:
        found = pattern.memo[key] = build(fabric)
    return found


_MISSING = object()


def _memo_slot(
    fabric: Fabric, tag: tuple, edge_sets: Sequence[Sequence[Edge]]
) -> tuple[dict, tuple] | None:
    """Where in the run's memo what ``edge_sets`` cross is kept, or None (no pattern,
    few edges, or copies of unequal sizes, which `_check_alike` refuses)."""
    pattern = fabric.pattern
    if pattern is None:
        return None
    size = len(edge_sets[0])
    if size * len(edge_sets) < MEMO_EDGES or any(len(e) != size for e in edge_sets):
        return None
    numbers = chain.from_iterable(chain.from_iterable(edge_sets))  # flat: fast to read
    array = np.fromiter(numbers, np.int64, 2 * size * len(edge_sets))
    return pattern.memo, (*tag, len(edge_sets), size, array.tobytes())


def _crossed(
    edge_sets: Sequence[Sequence[Edge]],
    fabric: Fabric,
    weights: Sequence[float] | None,
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """`_coupled`'s links and multiplicities."""
    counted = _counted(edge_sets, fabric, weights)
    if counted is not None:
        return counted
    route, once = fabric.route, fabric.route_once or fabric.route
    # the copies' routes are asked once here: not kept (at DP 1,024, 12 MB of routes)
    routes = [[route(src, dst) for src, dst in edge_sets[0]]]
    routes += [[once(src, dst) for src, dst in edges] for edges in edge_sets[1:]]
    _check_alike(edge_sets, fabric, routes)
    own: Counter[int] = Counter(chain.from_iterable(routes[0]))
    keep = own.__contains__
    mults: Counter[int] = Counter()
    for copy in routes:
        if weights is None:  # each copy's links counted in one call, in order
            mults.update(filter(keep, chain.from_iterable(copy)))
        else:
            # typeshed's Counter holds ints; the weights make these counts fractional
            for index, links in enumerate(copy):
                for link in filter(keep, links):
                    mults[link] += weights[index]  # type: ignore[assignment]  # a float count
    links = tuple(sorted(own))
    return links, tuple(mults[i] for i in links)


def _counted(
    edge_sets: Sequence[Sequence[Edge]],
    fabric: Fabric,
    weights: Sequence[float] | None,
) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """`_crossed` for many copies on a pattern cluster, the copies' routes counted on
    arrays (`PatternCluster.count_routes`) instead of made one by one: the same links,
    multiplicities and check. None where it does not apply (weights, few edges, a
    detoured GPU) or where a copy is unlike the representative (`_crossed` then names
    it, as before)."""
    count = fabric.count_routes
    if count is None or weights is not None or len(edge_sets) < 2:
        return None
    if sum(map(len, edge_sets[1:])) < MEMO_EDGES:
        return None
    route, bandwidth = fabric.route, fabric.capacities.__getitem__
    mine = [route(src, dst) for src, dst in edge_sets[0]]
    own: Counter[int] = Counter(chain.from_iterable(mine))
    links = tuple(sorted(own))
    own_array = np.fromiter(links, np.int64, len(links))
    signature = sorted(map(tuple, map(partial(map, bandwidth), mine)))
    mults = Counter(own)
    for edges in edge_sets[1:]:
        found = count(edges, own_array)
        if found is None:
            return None
        samples, crossed = found
        paths = [(tuple(map(bandwidth, route(*edge))), times) for edge, times in samples]
        if sorted(chain.from_iterable([path] * times for path, times in paths)) != signature:
            return None
        for link, times in crossed:
            mults[link] += times
    return links, tuple(mults[i] for i in links)


def _check_alike(
    edge_sets: Sequence[Sequence[Edge]],
    fabric: Fabric,
    routes: Sequence[Sequence[tuple[int, ...]]] | None = None,
) -> None:
    """The copies must cross links like the representative's, or it cannot stand for them.
    ``routes``: each edge's route, where the caller has them."""
    bandwidth = fabric.capacities.__getitem__

    def signature(k: int) -> list:
        found = routes[k] if routes is not None else [fabric.route(a, b) for a, b in edge_sets[k]]
        return sorted(map(tuple, map(partial(map, bandwidth), found)))

    mine = signature(0)
    for k in range(1, len(edge_sets)):
        if signature(k) != mine:
            (a, b), (c, d) = edge_sets[0][0], edge_sets[k][0]
            raise LayoutError(
                f"GPUs {c}->{d} are connected unlike GPUs {a}->{b}, which stepsim simulates "
                "on their behalf; choose tensor x data parallel sizes that split the nodes "
                "into alike groups (on a hybrid cube-mesh: 1, 4 or 8 GPUs, not pairs across "
                "quads)"
            )


def _hop_latency_s(edges: Sequence[Edge], fabric: Fabric) -> float:
    """The slowest edge's latency (found once per run for many edges: `_memo_slot`)."""
    slot = _memo_slot(fabric, ("hop",), [edges])
    found = None if slot is None else slot[0].get(slot[1])
    if found is None and slot is not None and fabric.slowest_hop_s is not None:
        found = fabric.slowest_hop_s(edges)
    if found is None:
        route, latency_s = fabric.route, fabric.route_latency_s
        found = max(latency_s(route(a, b)) for a, b in edges)
    if slot is not None:
        slot[0][slot[1]] = found
    return found


def _cycle(order: Sequence[int]) -> list[Edge]:
    n = len(order)
    return [(order[i], order[(i + 1) % n]) for i in range(n)] if n > 1 else []


def _by_node(group: Sequence[int], fabric: Fabric) -> list[list[int]]:
    nodes: dict[int, list[int]] = {}
    get = nodes.get
    # a pattern's servers hold gpus_per_node GPUs each, in order (its node_of, inline)
    gpn = None if fabric.pattern is None else fabric.pattern.gpus_per_node
    found = map(fabric.node_of, group) if gpn is None else [gpu // gpn for gpu in group]
    for gpu, node in zip(group, found, strict=True):
        members = get(node)
        if members is None:
            nodes[node] = [gpu]
        else:
            members.append(gpu)
    return list(nodes.values())


def ring_channels(group: Sequence[int], fabric: Fabric) -> list[list[int]]:
    """The rings NCCL would build over a group: inside one node the NVLink rings;
    across nodes one ring per GPU of a node, each leaving every node through a
    different GPU (and so a different NIC). Every other node is walked backwards, so
    that each hop between nodes joins GPUs of the same local index: on a
    rail-optimized fabric it stays on one rail (with an odd number of nodes the hop
    that closes the ring cannot)."""
    nodes = _by_node(group, fabric)
    if len(nodes) == 1:
        return fabric.intra_node_rings(group)
    k = min(len(members) for members in nodes)
    channels = []
    for c in range(k):
        order: list[int] = []
        for i, members in enumerate(nodes):
            rotated = members[c:] + members[:c]  # in at member c, out at member c-1
            order += rotated if i % 2 == 0 else rotated[::-1]
        channels.append(order)
    return channels


def ring(
    kind: str, groups: Sequence[Sequence[int]], message_bytes: float, fabric: Fabric
) -> Collective | None:
    """A ring ``all_reduce``, ``reduce_scatter`` or ``all_gather`` of ``message_bytes``.

    ``groups[0]`` is the representative group (GPU indices in rank order), the
    others the congruent groups it stands for. None for a group of one GPU.
    """
    n = len(groups[0])
    if n == 1:
        return None
    steps_of: dict[str, int] = {ALL_REDUCE: 2 * (n - 1), REDUCE_SCATTER: n - 1, ALL_GATHER: n - 1}
    steps = steps_of[kind]
    channels, hop, crossed = _shaped(fabric, ("ring",), groups, partial(_ring_shape, groups))
    latency = fabric.base_latency_s + steps * hop
    return (Transfer(crossed[0], crossed[1], steps * message_bytes / (n * channels), latency),)


def _ring_shape(groups: Sequence[Sequence[int]], fabric: Fabric) -> _Shape:
    """`ring`'s channels, slowest hop and (links, mults), whatever its kind and size."""
    rings = [ring_channels(g, fabric) for g in groups]
    edge_sets = [[edge for channel in found for edge in _cycle(channel)] for found in rings]
    return len(rings[0]), _hop_latency_s(edge_sets[0], fabric), _crossed_memo(edge_sets, fabric)


def _intra_phase(kind: str, groups, message_bytes: float, fabric: Fabric) -> Transfer | None:
    """Reduce-scatter or all-gather inside every node of the group, all nodes at once."""
    shape = _shaped(fabric, ("intra",), groups, partial(_intra_shape, groups))
    if shape is None:
        return None
    k, channels, hop, crossed = shape
    latency = fabric.base_latency_s + (k - 1) * hop
    bytes_per_flow = (k - 1) * message_bytes / (k * channels)
    return Transfer(crossed[0], crossed[1], bytes_per_flow, latency)


def _intra_shape(groups: Sequence[Sequence[int]], fabric: Fabric) -> _Shape | None:
    """`_intra_phase`'s GPUs per node, channels, slowest hop and (links, mults), the
    same for both kinds and every size; None for one GPU per node."""
    per_node = [_by_node(g, fabric) for g in groups]
    k = len(per_node[0][0])
    if k == 1:
        return None
    edge_sets = [
        [e for members in nodes for ch in fabric.intra_node_rings(members) for e in _cycle(ch)]
        for nodes in per_node
    ]
    channels = len(fabric.intra_node_rings(per_node[0][0]))
    return k, channels, _hop_latency_s(edge_sets[0], fabric), _crossed_memo(edge_sets, fabric)


def _binary_tree_edges(order: Sequence[int]) -> tuple[list[Edge], int]:
    """Heap-shaped binary tree over ``order``: (child -> parent edges, depth)."""
    edges = [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]
    return edges, max(len(order).bit_length() - 1, 1)


def _inter_phase(algorithm: str, groups, message_bytes: float, fabric: Fabric) -> Transfer:
    """All-reduce across nodes of each local rank's shard: rings or double binary trees."""
    shape = _shaped(fabric, ("inter", algorithm), groups, partial(_inter_shape, algorithm, groups))
    k, num_nodes, depth, hop, crossed = shape
    shard_bytes = message_bytes / k
    if algorithm == RING:
        steps = 2 * (num_nodes - 1)
        bytes_per_flow = steps * shard_bytes / num_nodes
    else:
        steps = 2 * depth
        bytes_per_flow = shard_bytes / 2  # each tree carries half, up and then down
    return Transfer(crossed[0], crossed[1], bytes_per_flow, fabric.base_latency_s + steps * hop)


def _inter_shape(algorithm: str, groups: Sequence[Sequence[int]], fabric: Fabric) -> _Shape:
    """`_inter_phase`'s shards, nodes, tree depth, slowest hop and (links, mults),
    whatever the size."""
    shards = [list(zip(*_by_node(g, fabric), strict=True)) for g in groups]  # per local rank
    edge_sets = []
    for lines in shards:
        edges: list[Edge] = []
        for line in lines:
            if algorithm == RING:
                edges += _cycle(line)
            else:  # two trees, the second over the reversed order so leaves become inner nodes
                for order in (line, line[::-1]):
                    up, _ = _binary_tree_edges(order)
                    edges += up + [(b, a) for a, b in up]
        edge_sets.append(edges)
    _, depth = _binary_tree_edges(shards[0][0])
    hop = _hop_latency_s(edge_sets[0], fabric)
    return len(shards[0]), len(shards[0][0]), depth, hop, _crossed_memo(edge_sets, fabric)


def two_level_all_reduce(
    algorithm: str, groups: Sequence[Sequence[int]], message_bytes: float, fabric: Fabric
) -> Collective | None:
    """``tree`` or ``hierarchical``: reduce-scatter in nodes, across nodes, all-gather in
    nodes. None when the group is inside one node or nodes hold unequal shares."""
    nodes = _by_node(groups[0], fabric)
    if len(nodes) == 1 or len({len(m) for m in nodes}) != 1:
        return None
    inter = RING if algorithm == HIERARCHICAL else TREE
    phases = (
        _intra_phase(REDUCE_SCATTER, groups, message_bytes, fabric),
        _inter_phase(inter, groups, message_bytes, fabric),
        _intra_phase(ALL_GATHER, groups, message_bytes, fabric),
    )
    return tuple(p for p in phases if p is not None)


def estimate_s(collective: Collective, capacities: Sequence[float]) -> float:
    """Time of a collective alone on the network: per phase, latency + bytes / bottleneck."""
    total = 0.0
    for phase in collective:
        total += phase.latency_s
        if phase.bytes_per_flow > 0 and phase.links:
            rate = min(capacities[i] / m for i, m in zip(phase.links, phase.mults, strict=True))
            total += phase.bytes_per_flow / rate
    return total


# What `choices` names NVLS over several nodes (NVLS reduce-scatter in the nodes, trees
# across, NVLS all-gather); not a scenario value: `nvls` and `auto` choose it.
NVLS_TREE = "nvls_tree"
# NCCL leaves NVLS out of reduce-scatters and all-gathers with more local ranks than this
# (src/include/device.h NCCL_MAX_NVLS_ARITY; src/enqueue.cc updateCollCostTable)
NVLS_MAX_ARITY = 32


def choices(
    algorithm: str,
    kind: str,
    groups: Sequence[Sequence[int]],
    message_bytes: float,
    fabric: Fabric,
) -> list[tuple[str, Collective]]:
    """The (name, collective) candidates that `collective` chooses among for
    ``algorithm``, the ring first (it wins a tie); empty for a group of one GPU.

    ``ring`` is the ring alone. ``tree`` and ``hierarchical`` are that all-reduce, or
    the ring where it does not apply (a group inside one node or spread unevenly, as
    NCCL falls back). ``auto`` and ``nvls`` are NCCL's own choice, by these rules of
    NCCL 2.30 (NVIDIA/nccl master 5067397):

    - all-reduce: ring, tree (and ``hierarchical``, stepsim's ring over the nodes in
      the middle); NVLS for a group inside one node, NVLS_TREE over several nodes
      (src/graph/tuning.cc ncclTopoTuneModel: "Disable NVLS Tree on a single node",
      NVLS across nodes only with CollNet, i.e. IB SHARP, not modelled);
    - reduce-scatter and all-gather: the ring, and NVLS inside one node (tuning.cc:
      only RING, PAT, NVLS and COLLNET_DIRECT run them, NVLS across nodes only with
      CollNet; PAT, for one GPU per node, is not modelled); under ``auto`` not for more
      than NCCL_MAX_NVLS_ARITY GPUs in the node (src/enqueue.cc updateCollCostTable);
    - NVLS needs two GPUs of the group or more in each node (src/transport/nvls.cc
      ncclNvlsInit: gpuCount < 2) and an NVSwitch that reduces (src/graph/search.cc
      ncclTopoCompute: an NVSwitch and compute capability 9.0 or later; nvls.cc:
      CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED), which `Fabric.nvls_efficiency` > 0
      says (hardware.NVLS_EFFICIENCY by node preset). NCCL_NVLS_ENABLE defaults to 2,
      on wherever supported, so ``auto`` takes NVLS where it applies.

    Among the candidates NCCL's tuner takes the least estimated time (enqueue.cc
    topoGetAlgoInfo over ncclTopoGetAlgoTime: latency + bytes / bandwidth per
    algorithm and protocol); stepsim takes the least `estimate_s` of the flows it
    builds instead (its own latency + bytes / bottleneck), not NCCL's constants."""
    if algorithm in (AUTO, NVLS):
        if len(groups[0]) == 1:
            return []
        found: list[tuple[str, Collective]] = []
        for name, build in _contenders(algorithm, kind, groups, message_bytes, fabric):
            built = build(groups)
            if built is not None:
                found.append((_named(name, built), built))
        return found
    flat = ring(kind, groups, message_bytes, fabric)
    if flat is None:
        return []
    found = [(RING, flat)]
    if algorithm == RING or kind != ALL_REDUCE:
        return found
    other = two_level_all_reduce(algorithm, groups, message_bytes, fabric)
    return found if other is None else [(algorithm, other)]


Build = Callable[[Sequence[Sequence[int]]], "Collective | None"]


def _contenders(
    algorithm: str,
    kind: str,
    groups: Sequence[Sequence[int]],
    message_bytes: float,
    fabric: Fabric,
) -> list[tuple[str, Build]]:
    """``auto``'s and ``nvls``'s candidates (`choices`) in their order, each as a
    function that builds it over the groups given, None where it does not apply (which
    the representative group alone decides); NVLS named by `_named` once built."""

    def two_level(name: str) -> Build:
        return lambda gs: two_level_all_reduce(name, gs, message_bytes, fabric)

    found: list[tuple[str, Build]] = [(RING, lambda gs: ring(kind, gs, message_bytes, fabric))]
    if kind == ALL_REDUCE:
        found += [(name, two_level(name)) for name in (TREE, HIERARCHICAL)]
    else:
        nodes = _by_node(groups[0], fabric)
        if len(nodes) > 1:
            return found  # NVLS reduce-scatters and all-gathers inside a node only
        if algorithm == AUTO and len(nodes[0]) > NVLS_MAX_ARITY:
            return found
    found.append((NVLS, lambda gs: nvls(kind, gs, message_bytes, fabric)))
    return found


def _named(name: str, built: Collective) -> str:
    """A candidate's name once built: NVLS over several nodes is NVLS_TREE."""
    return NVLS_TREE if name == NVLS and len(built) > 1 else name


def chosen(
    algorithm: str,
    kind: str,
    groups: Sequence[Sequence[int]],
    message_bytes: float,
    fabric: Fabric,
) -> tuple[str, Collective] | None:
    """The (name, collective) that ``algorithm`` runs: of `choices`, the least
    estimate alone on the network, the first on a tie; None for a group of one GPU.

    With congruent copies, ``auto`` and ``nvls`` build each candidate first over the
    representative group alone: its estimate is a lower bound of the candidate's with
    the copies (the copies only add multiplicity on the representative's links; links,
    bytes and latency are the representative's). The candidates are then built whole in
    order of that bound, and those whose bound cannot beat the best found (a larger
    bound, or an equal one later in `choices`' order) are left unbuilt: the same
    choice, without building the copies of candidates that lose (data parallelism over
    1,024 servers: the ring and `hierarchical` where the tree wins)."""
    capacities = fabric.capacities
    if algorithm not in (AUTO, NVLS) or len(groups) == 1:
        found = choices(algorithm, kind, groups, message_bytes, fabric)
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        return min(found, key=lambda c: estimate_s(c[1], capacities))  # first on a tie
    if len(groups[0]) == 1:
        return None
    bounds = []
    for order, (name, build) in enumerate(
        _contenders(algorithm, kind, groups, message_bytes, fabric)
    ):
        alone = build(groups[:1])
        if alone is not None:
            bounds.append((estimate_s(alone, capacities), order, name, build))
    best: tuple[float, int, str, Collective] | None = None
    for bound, order, name, build in sorted(bounds, key=lambda b: (b[0], b[1])):
        if best is not None and (bound, order) > (best[0], best[1]):
            break  # neither this nor a later one can win
        built = build(groups)
        assert built is not None  # the representative group decided that it applies
        seconds = estimate_s(built, capacities)
        if best is None or (seconds, order) < (best[0], best[1]):
            best = (seconds, order, name, built)
    assert best is not None  # the ring applies to a group of two GPUs or more
    return _named(best[2], best[3]), best[3]


def all_reduce(
    algorithm: str, groups: Sequence[Sequence[int]], message_bytes: float, fabric: Fabric
) -> Collective | None:
    """An all-reduce by ``algorithm`` (`choices` says among what; `chosen` picks)."""
    return collective(algorithm, ALL_REDUCE, groups, message_bytes, fabric)


def collective(
    algorithm: str,
    kind: str,
    groups: Sequence[Sequence[int]],
    message_bytes: float,
    fabric: Fabric,
) -> Collective | None:
    """A collective of ``kind`` by the scenario's ``algorithm``: what `chosen` picks
    among `choices` (all-reduces by ring, trees or NVLS; reduce-scatters and
    all-gathers by the ring, or NVLS inside a node under ``auto`` and ``nvls`` where the
    NVSwitch reduces)."""
    pick = chosen(algorithm, kind, groups, message_bytes, fabric)
    return None if pick is None else pick[1]


# chunks of S/k each GPU's NVLink carries (up to the switch, down from it) per NVLS kind
_NVLS_CHUNKS: dict[str, Callable[[int], tuple[int, int]]] = {
    ALL_REDUCE: lambda k: (k + 1, k + 1),
    REDUCE_SCATTER: lambda k: (k, 1),
    ALL_GATHER: lambda k: (1, k),
}
_NVLS_STEPS: dict[str, int] = {ALL_REDUCE: 2, REDUCE_SCATTER: 1, ALL_GATHER: 1}


def _nvls_phase(
    kind: str, groups: Sequence[Sequence[int]], message_bytes: float, fabric: Fabric
) -> Transfer | None:
    """One NVLS ``kind`` inside every node of the group at once (all nodes hold k GPUs).

    The real flows are chunks of S/k: each GPU's up link carries ``up`` of them and
    its down link ``down`` (`_NVLS_CHUNKS`), each chunk's bytes divided by the NVLS
    efficiency. Latency: the base plus one GPU -> NVSwitch -> GPU route per step
    (an all-reduce's load-reduce and its multicast store: 2; the others 1). None for
    one GPU per node or where a GPU's peers are not one NVSwitch away."""
    per_node = [_by_node(g, fabric) for g in groups]
    k = len(per_node[0][0])
    if k == 1 or fabric.nvls_efficiency <= 0:
        return None
    up, down = _NVLS_CHUNKS[kind](k)
    routes = [
        [(m, fabric.route(m, ms[(i + 1) % k])) for ms in nodes for i, m in enumerate(ms)]
        for nodes in per_node
    ]
    if any(len(route) != 2 for _, route in routes[0]):
        return None  # not behind one NVSwitch (a mesh): no NVLS
    _check_alike(
        [[(m, ms[(i + 1) % k]) for ms in nodes for i, m in enumerate(ms)] for nodes in per_node],
        fabric,
    )
    own: Counter[int] = Counter()
    for _, (first, last) in routes[0]:
        own[first] += up  # this GPU's link up to the switch
        own[last] += down  # the next GPU's link down from it (each GPU's once)
    mults: Counter[int] = Counter()
    for copy in routes:
        for _, (first, last) in copy:
            mults.update({first: up} if first in own else {})
            mults.update({last: down} if last in own else {})
    links = tuple(sorted(own))
    hop = max(fabric.route_latency_s(route) for _, route in routes[0])
    latency = fabric.base_latency_s + _NVLS_STEPS[kind] * hop
    bytes_per_flow = message_bytes / (k * fabric.nvls_efficiency)
    return Transfer(links, tuple(mults[i] for i in links), bytes_per_flow, latency)


def nvls(
    kind: str, groups: Sequence[Sequence[int]], message_bytes: float, fabric: Fabric
) -> Collective | None:
    """NVLS (NVLink SHARP) for a group inside one node, or NVLS_TREE for an all-reduce
    over nodes holding equal shares of it (NVLS reduce-scatter in the nodes, double
    binary trees of each local rank's shard across, NVLS all-gather). None where it
    does not apply (no NVLS, one GPU per node, unequal shares, a reduce-scatter or
    all-gather across nodes)."""
    nodes = _by_node(groups[0], fabric)
    if len({len(m) for m in nodes}) != 1:
        return None
    if len(nodes) == 1:
        phase = _nvls_phase(kind, groups, message_bytes, fabric)
        return None if phase is None else (phase,)
    if kind != ALL_REDUCE:
        return None
    scatter = _nvls_phase(REDUCE_SCATTER, groups, message_bytes, fabric)
    if scatter is None:
        return None
    across = _inter_phase(TREE, groups, message_bytes, fabric)
    gather = _nvls_phase(ALL_GATHER, groups, message_bytes, fabric)
    assert gather is not None  # the scatter's GPUs and routes: NVLS applies as it did
    return scatter, across, gather


def point_to_point(pairs: Sequence[Edge], message_bytes: float, fabric: Fabric) -> Transfer:
    """``pairs[0]`` sends ``message_bytes`` while the congruent ``pairs`` do the same."""
    src, dst = pairs[0]
    latency = fabric.route_latency_s(fabric.route(src, dst))
    return _coupled([[pair] for pair in pairs], fabric, message_bytes, latency)


def exchange(
    edge_sets: Sequence[Sequence[Edge]],
    message_bytes: float,
    fabric: Fabric,
    collective: bool,
    weights: Sequence[float] | None = None,
) -> Transfer:
    """Every edge of ``edge_sets[0]`` (the representative group's) carries
    ``message_bytes`` at one rate while the congruent sets do the same: one step of a
    ring of sends (context parallelism's K/V ring) or an all-to-all. A ``collective``
    (the all-to-all) pays the fixed launch latency before its slowest route's; a ring
    step, as a pipeline send, only the route's. ``weights``: an all-to-all-v's (_coupled)."""
    latency = _hop_latency_s(edge_sets[0], fabric)
    if collective:
        latency += fabric.base_latency_s
    return _coupled(edge_sets, fabric, message_bytes, latency, weights)

"""Communication as data: point-to-point transfers and ring collectives as coupled flows.

A `Transfer` is what the network moves for one communication op. It is a
*coupled flow*: several real flows (one per ring edge, or one per GPU sending)
that progress together, each carrying ``bytes_per_flow``. ``links`` are the
directed links they cross and ``mults`` how many of those real flows cross
each link; the network gives the coupled flow one rate r and charges ``m x r``
on a link crossed by m of its flows.

Symmetric replicas: a scenario's tensor-parallel ranks and data-parallel
replicas all do the same thing at the same time, so only a representative
group is simulated. Its flows are charged, link by link, for every congruent
flow of the groups it stands for that crosses the same link (``copies``).
Links of those other groups that the representative does not touch carry by
symmetry the same load as the representative's own, so leaving them out does
not change any rate. This is exact for clusters that look the same from every
replica, such as the switch-connected nodes built in topologies/.

A ring all-reduce of S bytes over n ranks sends 2(n-1)/n S bytes on every
ring edge in 2(n-1) steps, each step paying the slowest edge's hop latency;
reduce-scatter and all-gather are each half of that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

Route = Callable[[int, int], tuple[int, ...]]
RouteLatency = Callable[[tuple[int, ...]], float]


class Transfer(NamedTuple):
    links: tuple[int, ...]
    mults: tuple[int, ...]
    bytes_per_flow: float
    latency_s: float


def delay(latency_s: float) -> Transfer:
    """A transfer that only takes time: for abstract schedules with a fixed p2p latency."""
    return Transfer((), (), 0.0, latency_s)


def _coupled(
    edges: Sequence[tuple[int, int]],
    copies: Sequence[Sequence[tuple[int, int]]],
    route: Route,
    bytes_per_flow: float,
    latency_s: float,
) -> Transfer:
    own = Counter()
    for src, dst in edges:
        own.update(route(src, dst))
    mults = Counter()
    for copy in copies:
        for src, dst in copy:
            mults.update(link for link in route(src, dst) if link in own)
    links = tuple(sorted(own))
    # The representative's own edges are among the copies; count them at least once.
    return Transfer(links, tuple(max(mults[i], own[i]) for i in links), bytes_per_flow, latency_s)


def _ring_edges(group: Sequence[int]) -> list[tuple[int, int]]:
    n = len(group)
    return [(group[i], group[(i + 1) % n]) for i in range(n)]


def ring(
    kind: str,
    groups: Sequence[Sequence[int]],
    message_bytes: float,
    route: Route,
    route_latency_s: RouteLatency,
    base_latency_s: float,
) -> Transfer | None:
    """A ring ``all_reduce``, ``reduce_scatter`` or ``all_gather`` of ``message_bytes``.

    ``groups[0]`` is the representative group (GPU indices in ring order); the
    other groups are the congruent ones it stands for. Returns None for a
    group of one GPU, which needs no communication.
    """
    group = groups[0]
    n = len(group)
    if n == 1:
        return None
    steps = {"all_reduce": 2 * (n - 1), "reduce_scatter": n - 1, "all_gather": n - 1}[kind]
    edges = _ring_edges(group)
    hop_latency_s = max(route_latency_s(route(a, b)) for a, b in edges)
    return _coupled(
        edges,
        [_ring_edges(g) for g in groups],
        route,
        bytes_per_flow=steps * message_bytes / n,
        latency_s=base_latency_s + steps * hop_latency_s,
    )


def point_to_point(
    pairs: Sequence[tuple[int, int]],
    message_bytes: float,
    route: Route,
    route_latency_s: RouteLatency,
) -> Transfer:
    """``pairs[0]`` sends ``message_bytes`` while the congruent ``pairs`` do the same."""
    src, dst = pairs[0]
    return _coupled(
        [pairs[0]],
        [[pair] for pair in pairs],
        route,
        bytes_per_flow=message_bytes,
        latency_s=route_latency_s(route(src, dst)),
    )

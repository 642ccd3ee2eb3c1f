"""What the network takes and gives: coupled flows in, constant-rate stretches out.

These types are the network's own: the workload builds `Transfer`s and `Collective`s
(comm/collectives.py) and the network moves them; the link statistics read the
`Interval`s it records. No simpy here, so every layer can import them.
"""

from __future__ import annotations

from typing import NamedTuple, final


@final  # a Collective is a plain tuple of them: `type(t) is Transfer` tells the two apart
class Transfer(NamedTuple):
    """A *coupled flow*: several real flows (one per ring or tree edge, or one per GPU
    sending) that progress together at one rate r, each carrying ``bytes_per_flow``.
    ``links`` are the directed links they cross and ``mults`` how many of those real
    flows cross each link; a link crossed by m of them is charged m x r. The bytes
    start to move once ``latency_s`` has passed. A multiplicity may be fractional: an
    all-to-all-v under skewed routing (cost/routing.py) weights each real flow by
    its share of the busiest flow's bytes, so that all end together."""

    links: tuple[int, ...]
    mults: tuple[float, ...]
    bytes_per_flow: float
    latency_s: float


# A collective: transfers run one after the other (phases).
Collective = tuple[Transfer, ...]


def delay(latency_s: float) -> Transfer:
    """A transfer that only takes time: for abstract schedules with a fixed p2p latency."""
    return Transfer((), (), 0.0, latency_s)


class Interval(NamedTuple):
    """A coupled flow at one rate for a while: ``mults[i] x rate_bytes_per_s`` on ``links[i]``."""

    links: tuple[int, ...]
    mults: tuple[float, ...]  # the transfer's, fractional or not
    rate_bytes_per_s: float
    start_s: float
    end_s: float


# Class mode (comm/classes.py): what a coupled transfer of several exact-mode flows is
# made of, by the identity of its ``links`` tuple: that tuple (kept, so the identity
# stays unique) and, per member flow, its links and its GPUs.
Member = tuple[frozenset[int], tuple[int, ...]]
Members = dict[int, tuple[tuple[int, ...], tuple[Member, ...]]]


class Uncertified(Exception):
    """A coupled transfer of class mode whose members would not all run as one: some hold
    it at its rate (a saturated link of theirs on which no flow is faster: the max-min
    certificate), the others would run otherwise (``violators``; their GPUs), or their
    routes differ in shape. The run is lowered again with the classes split."""

    def __init__(self, holders: frozenset[int], violators: frozenset[int], why: str) -> None:
        super().__init__(why)
        self.holders, self.violators = holders, violators

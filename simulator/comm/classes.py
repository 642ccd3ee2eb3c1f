"""Class mode: exact mode over classes of GPUs that behave alike, certified as it runs.

A what-if that reroutes traffic between switches (a failed leaf-to-spine uplink) makes
a few dozen GPU behaviours in a run of thousands (docs/performance.md, "Issue 34, the
eighth sitting"), but symmetric mode's representative cannot stand for them: its copies
cross links only its own stand for. Class mode simulates exact mode's run with one lane
per *class* of a stage's GPUs instead of one per GPU:

- a `Partition` of the tensor ranks and of the replicas into classes, the same for
  every stage; a class is (rank class, replica class), its GPUs every pair of the two;
- each class's lane is named as exact mode names GPU (rank class, replica class), so
  its rendezvous are exact mode's over the classes: a TP collective meets the lanes of
  its replica class, a data-parallel one those of its rank class, a pipeline send the
  same class at the other stage. Every member of a class reaches each of them when the
  lane does, and each exact-mode group's last member arrives when the class's last lane
  does: the starts are exact mode's;
- each transfer is the coupled flow of its members' exact-mode transfers (`ClassComm`:
  each group's or pair's own, built and chosen as exact mode builds it, then merged),
  every member on its own links: the network sees every link's real load.

What is not exact by construction is the rate: one coupled flow runs its members at one
rate. So the network checks, wherever it gives a class transfer a rate, that every
member is held at that rate by a saturated link of its own on which no flow runs faster
(the max-min certificate; engine/network.py): then the rates are exact mode's
(Bertsekas and Gallager, *Data Networks*, 2nd ed., 1992, Sec. 6.5.2: max-min fair rates
are the only feasible ones with that property). Where a member is not held, the
network notes it (`ir.flows.Uncertified`) and the run goes on (its rates are no longer
exact mode's, but its later failures point at more classes to split); then the
partition is split between the members that held and the others, failure by failure
(`Partition.refined`), and the run starts again (run/iteration.py `_in_classes`). Only
a run with no failure is the result: exact mode's, to rounding. Each split adds a class,
so it ends within T + D runs (at worst a lane per GPU, exact mode itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir.flows import Collective, Member, Members, Transfer, Uncertified
from ..ir.vocabulary import ALL_REDUCE
from ..scenario import Scenario
from . import collectives
from .collectives import Fabric
from .placement import Placement, StageComm, _merged


@dataclass(frozen=True)
class Partition:
    """Classes of the tensor ranks and of the replicas (each sorted, in order of their
    first member); class (a, b) is the GPUs of rank class a and replica class b."""

    ranks: tuple[tuple[int, ...], ...]
    replicas: tuple[tuple[int, ...], ...]

    @classmethod
    def whole(cls, placement: Placement) -> Partition:
        """One class of every GPU of a stage."""
        return cls((tuple(range(placement.tensor)),), (tuple(range(placement.data)),))

    def refined(self, placement: Placement, error: Uncertified) -> Partition:
        """Split so that the members that held their transfer (``error.holders``) and those
        that did not (``error.violators``) fall into other classes. In the first class
        that holds both, its rank class splits between the holders' ranks and the rest,
        and its replica class between their replicas and the rest; where neither splits
        (holders and violators share every rank and replica of it), the first violator's
        replica, else its rank, leaves. No class holds both (a run's later failure that
        its earlier ones split already): the partition as it is."""
        holding: dict[tuple[int, int], list[int]] = {}
        for g in error.holders:
            holding.setdefault(self.class_of(placement, g), []).append(g)
        violating: dict[tuple[int, int], list[int]] = {}
        for g in error.violators:
            violating.setdefault(self.class_of(placement, g), []).append(g)
        both = sorted(set(holding) & set(violating))
        if not both:
            return self
        a, b = both[0]
        held = holding[both[0]]
        ranks = _split(self.ranks, a, {g % placement.tensor for g in held})
        replicas = _split(self.replicas, b, {placement.replica_of(g) for g in held})
        if (ranks, replicas) == (self.ranks, self.replicas):
            first = min(violating[both[0]])
            replicas = _split(self.replicas, b, {placement.replica_of(first)})
            if replicas == self.replicas:
                ranks = _split(self.ranks, a, {first % placement.tensor})
        # a GPU is one member's (a member is a group, a ring or a pair: none shares a
        # tensor rank and replica with another), so a class holding both has two GPUs
        assert (ranks, replicas) != (self.ranks, self.replicas), "a refinement splits a class"
        return Partition(ranks, replicas)

    def class_of(self, placement: Placement, gpu: int) -> tuple[int, int]:
        """The (rank class, replica class) of a GPU of any stage."""
        rank, replica = gpu % placement.tensor, placement.replica_of(gpu)
        return (
            next(i for i, c in enumerate(self.ranks) if rank in c),
            next(i for i, c in enumerate(self.replicas) if replica in c),
        )

    def size(self) -> int:
        """Lanes per stage."""
        return len(self.ranks) * len(self.replicas)


def _split(
    classes: tuple[tuple[int, ...], ...], index: int, part: set[int]
) -> tuple[tuple[int, ...], ...]:
    """Class ``index`` cut into its members in ``part`` and the others (both kept only
    when neither is empty); the classes in order of first member."""
    members = classes[index]
    inside = tuple(m for m in members if m in part)
    outside = tuple(m for m in members if m not in part)
    if not inside or not outside:
        return classes
    return tuple(sorted([*classes[:index], inside, outside, *classes[index + 1 :]]))


class ClassComm(StageComm):
    """A stage's transfers in class mode: the transfer of class (rank class ``j``,
    replica class ``d``) is its members' exact-mode transfers as one coupled flow, each
    on its own links, recorded in ``members`` for the network's certificate."""

    def __init__(
        self,
        scenario: Scenario,
        fabric: Fabric,
        placement: Placement,
        stage: int,
        partition: Partition,
        members: Members,
        built: dict | None = None,
    ) -> None:
        super().__init__(scenario, fabric, placement, stage)
        self.exact = True  # lanes named and met as exact mode's GPU (j, d)
        self.partition = self.classes = partition
        self.members = members
        self._classes: dict[tuple, Collective | None] = {}
        # each member's own transfer by its GPUs, kept across the runs of one refinement
        # (their partitions differ, their members' transfers do not)
        self._built: dict = {} if built is None else built

    def _own(self, kind: str, group: Sequence[int], message_bytes: float) -> Collective | None:
        """Exact mode's collective of one group (its algorithm chosen for it alone)."""
        key = (kind, tuple(group), message_bytes)
        if key not in self._built:
            self._built[key] = self._collective(kind, [group], message_bytes)
        return self._built[key]

    def _pair(self, pair: tuple[int, int], nbytes: float) -> Collective:
        """Exact mode's send of one pair, as a collective of one phase."""
        key = ("pair", pair, nbytes)
        if key not in self._built:
            self._built[key] = (collectives.point_to_point([pair], nbytes, self.fabric),)
        return self._built[key]

    def tp(self, kind: str, d: int) -> Collective | None:
        def parts() -> list[tuple[Sequence[int], Collective | None]]:
            groups = [self.placement.tp_group(r, self.stage) for r in self.classes.replicas[d]]
            return [(g, self._own(kind, g, self.activation_bytes)) for g in groups]

        return self._of(("tp", kind, d), parts)

    def dp(self, kind: str, message_bytes: float, j: int) -> Collective | None:
        def parts() -> list[tuple[Sequence[int], Collective | None]]:
            groups = [self.placement.dp_group(t, self.stage) for t in self.classes.ranks[j]]
            return [(g, self._own(kind, g, message_bytes)) for g in groups]

        return self._of(("dp", kind, message_bytes, j), parts)

    def tied(self, other: int, message_bytes: float, j: int, d: int) -> Collective | None:
        low, high = sorted((self.stage, other))
        gpu = self.placement.gpu

        def parts() -> list[tuple[Sequence[int], Collective | None]]:
            pairs = [
                [gpu(t, r, low), gpu(t, r, high)]
                for r in self.classes.replicas[d]
                for t in self.classes.ranks[j]
            ]
            return [(p, self._own(ALL_REDUCE, p, message_bytes)) for p in pairs]

        return self._of(("tied", other, message_bytes, j, d), parts)

    def between(
        self, src: int, dst: int, j: int, d: int, message_bytes: float | None = None
    ) -> Transfer:
        nbytes = self.shard_bytes if message_bytes is None else message_bytes
        gpu = self.placement.gpu

        def parts() -> list[tuple[Sequence[int], Collective | None]]:
            pairs = [
                (gpu(t, r, src), gpu(t, r, dst))
                for r in self.classes.replicas[d]
                for t in self.classes.ranks[j]
            ]
            return [(p, self._pair(p, nbytes)) for p in pairs]

        merged = self._of(("send", src, dst, nbytes, j, d), parts)
        assert merged is not None  # a pair's transfer is never None
        return merged[0]

    def cp(self, *args, **kwargs):
        raise NotImplementedError("class mode: context parallelism is refused before lowering")

    def expert(self, *args, **kwargs):
        raise NotImplementedError("class mode: experts are refused before lowering")

    def _of(self, key: tuple, parts) -> Collective | None:
        """The members' transfers (``parts()``: each exact-mode group's or pair's GPUs and
        transfer) merged into one coupled flow per phase, once per key."""
        if key not in self._classes:
            self._classes[key] = merged_members(parts(), self.members)
        return self._classes[key]


def _shape(part: Collective | None) -> tuple:
    """What members must share to run as one coupled flow: each phase's bytes per flow
    and latency (so also the algorithm's phases)."""
    return () if part is None else tuple((t.bytes_per_flow, t.latency_s) for t in part)


def merged_members(
    parts: Sequence[tuple[Sequence[int], Collective | None]], members: Members
) -> Collective | None:
    """`placement._merged` of the members' own transfers, each merged phase's members
    recorded by its links (their links and GPUs, for the certificate). Members of unlike
    shapes (another algorithm, latency or size: a rerouted route one hop longer, say)
    cannot run as one: Uncertified, holding the first member's shape against the rest."""
    first = _shape(parts[0][1])
    if any(_shape(p) != first for _, p in parts):
        holders = frozenset(g for gpus, p in parts if _shape(p) == first for g in gpus)
        others = frozenset(g for gpus, p in parts if _shape(p) != first for g in gpus)
        raise Uncertified(holders, others, "members of one class transfer differ in shape")
    merged = _merged([p for _, p in parts])
    if merged is None or len(parts) == 1:
        return merged
    for index, phase in enumerate(merged):
        entry: list[Member] = []
        for gpus, part in parts:
            assert part is not None  # shapes alike: none is None where the first is not
            entry.append((frozenset(part[index].links), tuple(gpus)))
        members[id(phase.links)] = (phase.links, tuple(entry))
    return merged

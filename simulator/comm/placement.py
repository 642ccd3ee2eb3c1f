"""Where each rank sits, and the transfers a pipeline stage's GPUs use.

Placement follows Megatron-LM's rank order, tensor-parallel fastest, then
data-parallel, then pipeline: ``gpu = tp + T * (dp + D * pp)``, so a tensor-parallel
group sits inside a node whenever T divides the node size. With context parallelism
Megatron-Core's order is tp-cp-dp-pp (parallel_state.py `RankGenerator`, order
"tp-cp-ep-dp-pp"): ``gpu = tp + T * (cp + C * (dp + D * pp))``, which is the formula
above with the stage's C x D *replicas* ``r = cp + C * dp`` in place of D. A CP group
is C consecutive replicas (its GPUs T apart), and the gradient group of a tensor rank
is all C x D replicas (Megatron-Core's data-parallel group with context parallelism).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..cost.kernels import BYTES_PER_ELEMENT
from ..ir.flows import Collective, Transfer
from ..ir.vocabulary import ALL_REDUCE, ALL_TO_ALL, RING_SEND
from ..scenario import Scenario
from . import collectives
from .collectives import Edge, Fabric, LayoutError

if TYPE_CHECKING:
    from .classes import Partition
    from .congruent import RankLinks

# StageComm.expert's cache key: (group, kind, message bytes, offset), then the
# all-to-all-v's loads and the flex dispatcher's ("flex", pairs) where given
ExpertKey = tuple[
    str | float | tuple[tuple[float, ...], bool] | tuple[str, tuple[float, float]], ...
]


@dataclass(frozen=True, slots=True)
class Placement:
    tensor: int
    data: int  # replicas of a stage: data-parallel x context-parallel size
    pipeline: int
    context: int = 1  # CP size: a CP group is this many consecutive replicas

    def gpu(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tensor * (dp + self.data * pp)

    def replica_of(self, gpu: int) -> int:
        """The replica (data x context parallel rank) GPU ``gpu`` belongs to."""
        return (gpu // self.tensor) % self.data

    def tp_group(self, dp: int, pp: int) -> list[int]:
        return [self.gpu(j, dp, pp) for j in range(self.tensor)]

    def dp_group(self, tp: int, pp: int) -> list[int]:
        """The gradient group: every replica (data x context parallel) of tensor rank tp."""
        return [self.gpu(tp, d, pp) for d in range(self.data)]

    def cp_group(self, tp: int, replica: int, pp: int) -> list[int]:
        """The context-parallel group of tensor rank ``tp`` of ``replica``, in CP rank order."""
        first = replica - replica % self.context
        return [self.gpu(tp, first + c, pp) for c in range(self.context)]


def expert_groups(stage_gpus: int, ep: int, etp: int) -> dict[str, tuple[list[int], list[int]]]:
    """Megatron-Core's expert groups over a stage's GPUs (parallel_state.py's expert
    `RankGenerator`, order "tp-ep-dp-pp" with CP folded into the data-parallel part: a
    stage's GPU i is expert tensor rank i mod ETP, EP rank (i // ETP) mod EP and expert
    data-parallel rank i // (ETP x EP)). Each group by name: (stage-local GPUs of the
    group holding GPU 0, the offsets that give every other group of its kind). ``ep``:
    the EP group (GPUs ETP apart); ``etp``: the expert tensor-parallel group; ``tpep``:
    EP x ETP consecutive GPUs (the allgather dispatcher's group); ``edp``: the
    expert-data-parallel group (GPUs ETP x EP apart), over which expert gradients meet."""
    span = ep * etp
    edp = stage_gpus // span
    return {
        "ep": (
            [etp * e for e in range(ep)],
            [t + span * d for d in range(edp) for t in range(etp)],
        ),
        "etp": (list(range(etp)), [etp * q for q in range(stage_gpus // etp)]),
        "tpep": (list(range(span)), [span * q for q in range(edp)]),
        "edp": (
            [span * d for d in range(edp)],
            [t + etp * e for e in range(ep) for t in range(etp)],
        ),
    }


def placement_of(scenario: Scenario) -> Placement:
    p = scenario.parallel
    return Placement(
        p.tensor_model_parallel_size,
        p.data_parallel_size * p.cp_size,
        p.pipeline_model_parallel_size,
        p.cp_size,
    )


class StageComm:
    """The transfers one stage uses, built once per stage and shape.

    Symmetric mode: each transfer is the representative GPU's (tensor rank 0 of replica
    0) and carries the flows of every congruent group of the stage. Exact mode: the
    transfer of the group of GPU (tensor rank ``j``, replica ``d``) alone. A layout
    whose congruent groups cross the cluster unlike the representative's raises
    collectives.LayoutError.

    Mixed mode (perturbations in symmetric mode, simulator/run/perturb.py): the
    representative's transfers leave out the copies of the replicas in ``exclude``
    (simulated exactly, each by an exact StageComm whose ``joint`` is this one), and
    every data-parallel collective is the representative's, which all of them join."""

    def __init__(
        self,
        scenario: Scenario,
        fabric: Fabric,
        placement: Placement,
        stage: int,
        *,
        exclude: frozenset[int] = frozenset(),
        split: frozenset[tuple[int, int]] = frozenset(),
        joint: StageComm | None = None,
        group: bool = False,
        ranks: RankLinks | None = None,
    ) -> None:
        self.fabric, self.placement, self.stage = fabric, placement, stage
        # exact mode's congruent TP groups (congruent.py): every whole group's coupled
        # transfer is checked rank by rank as it is built
        self.ranks = ranks
        # group: one lane stands for a whole TP group of an excluded replica
        self.group = group
        self.exact = (not scenario.network.symmetry or joint is not None) and not group
        self.exclude, self.joint = exclude, joint
        # class mode (classes.ClassComm): the lanes' classes of GPUs; None elsewhere
        self.partition: Partition | None = None
        # mixed mode: data-parallel collectives are rendezvous of the representative's
        # lane and the lanes of the excluded replicas; ``split``: the (replica, stage)
        # TP groups of those that have a lane per GPU (the others one lane each)
        self.mixed = bool(exclude) or joint is not None
        self.split: frozenset[tuple[int, int]] = joint.split if joint is not None else split
        self.algorithm = scenario.network.collective_algorithm
        m, b = scenario.model, scenario.training.micro_batch_size
        # a micro-batch's activations on one GPU: its 1/CP share of each sequence
        tokens = b * m.seq_length // placement.context
        self.activation_bytes = tokens * m.hidden_size * BYTES_PER_ELEMENT
        self.shard_bytes = self.activation_bytes / placement.tensor
        # by (kind, replica), (kind, message bytes, tensor rank), (src, dst, bytes, j, d)
        self._tp: dict[tuple[str, int], Collective | None] = {}
        self._dp: dict[tuple[str, float, int], Collective | None] = {}
        self._sends: dict[tuple[int, int, float, int, int], Transfer] = {}
        self._cp: dict[tuple[str, float, tuple[int, int]], Transfer | Collective | None] = {}
        par = scenario.parallel
        self._experts = (
            expert_groups(placement.tensor * placement.data, par.ep_size, par.etp_size)
            if scenario.model.moe
            else {}
        )
        self._expert: dict[ExpertKey, Transfer | Collective | None] = {}

    def tp(self, kind: str, d: int) -> Collective | None:
        """A tensor-parallel collective (a vocabulary collective kind) of one
        micro-batch's activations in replica ``d``; None for one tensor rank."""
        key = (kind, d if self.exact or self.group else 0)
        if key not in self._tp:
            placement = self.placement
            if self.exact or self.group:
                self._tp[key] = self._collective(
                    kind, [placement.tp_group(d, self.stage)], self.activation_bytes
                )
            else:

                def build(stage: int) -> Collective | None:
                    rep = placement.tp_group(0, stage)
                    offsets = [placement.tensor * r for r in self._replicas()]
                    groups = [[g + o for g in rep] for o in self._kept(rep, offsets)]
                    return self._collective(kind, groups, self.activation_bytes)

                self._tp[key] = self._shared(("tp", kind, *self.exclude), self.stage, build)
        return self._tp[key]

    def cp(self, kind: str, message_bytes: float, j: int, d: int) -> Transfer | Collective | None:
        """Context parallelism's exchange in the CP group of tensor rank ``j`` of replica
        ``d`` (symmetric: rank 0's and the congruent groups of every tensor rank and
        replica): one ring
        step (``RING_SEND``, each member sends ``message_bytes`` to the next), an
        all-to-all (each member sends ``message_bytes`` / C to every other) or a ring
        all-gather / reduce-scatter of ``message_bytes`` in all."""
        group = (j, d // self.placement.context) if self.exact else (0, 0)
        key = (kind, message_bytes, group)
        if key not in self._cp:
            placement = self.placement
            if self.exact:
                groups = [placement.cp_group(j, d, self.stage)]
                self._cp[key] = self._context(kind, groups, message_bytes)
            else:

                def build(stage: int) -> Transfer | Collective | None:
                    rep = placement.cp_group(0, 0, stage)
                    span = placement.tensor * placement.context
                    offsets = [
                        t + span * r
                        for r in range(placement.data // placement.context)
                        for t in range(placement.tensor)
                    ]
                    groups = [[g + o for g in rep] for o in self._kept(rep, offsets)]
                    return self._context(kind, groups, message_bytes)

                self._cp[key] = self._shared(("cp", kind, message_bytes), self.stage, build)
        return self._cp[key]

    def expert(
        self,
        group: str,
        kind: str,
        message_bytes: float,
        j: int = 0,
        d: int = 0,
        loads: tuple[tuple[float, ...], bool] | None = None,
        pairs: tuple[float, float] | None = None,
    ) -> Transfer | Collective | None:
        """A collective over an expert group (``group``: a name of `expert_groups`): in
        symmetric mode the representative GPU's, carrying every congruent group of the
        stage; in exact mode the group of tensor rank ``j`` of replica ``d``. An
        all-to-all (each member sends ``message_bytes`` / size to every other) or a ring
        all-gather / reduce-scatter / all-reduce of ``message_bytes``; None for a group
        of one GPU. ``loads``: an all-to-all-v (routing skew, cost/routing.py): each
        member's load factor, in group order, and whether it weighs the flows it sends
        (the combine) or those it receives (the dispatch). ``pairs``: the flex
        dispatcher's two hops instead (cost/deepep.py): each member sends
        ``message_bytes`` x the first weight to the member of the same index in each other
        node, x the second to each other member of its node."""
        offset = self.expert_offset(group, j, d) if self.exact else 0
        key: ExpertKey = (group, kind, message_bytes, offset)
        key += (loads,) if loads is not None else ()
        key += (("flex", pairs),) if pairs is not None else ()
        if key not in self._expert:
            base, offsets = self._experts[group]
            stage_gpus = self.placement.tensor * self.placement.data
            if len(base) == 1:
                self._expert[key] = None
                return None
            if self.exact:
                members = [g + offset + stage_gpus * self.stage for g in base]
                self._expert[key] = (
                    self._flex([members], message_bytes, pairs)
                    if pairs is not None
                    else self._context(kind, [members], message_bytes, loads)
                )
                return self._expert[key]

            def build(stage: int) -> Transfer | Collective | None:
                rep = [g + stage_gpus * stage for g in base]
                groups = [[g + o for g in rep] for o in self._kept(rep, offsets)]
                if pairs is not None:
                    return self._flex(groups, message_bytes, pairs)
                return self._context(kind, groups, message_bytes, loads)

            self._expert[key] = self._shared(("expert", *key), self.stage, build)
        return self._expert[key]

    def expert_offset(self, group: str, j: int, d: int) -> int:
        """Which group of kind ``group`` tensor rank ``j`` of replica ``d`` is in: the
        offset of that group from the representative's (its name in exact mode)."""
        base, offsets = self._experts[group]
        local = j + self.placement.tensor * d
        return next(o for o in offsets if local - o in base)

    def _flex(self, groups, message_bytes: float, pairs: tuple[float, float]) -> Transfer | None:
        """DeepEP's dispatch or combine over ``groups`` (StageComm.expert's ``pairs``): the
        RDMA hop between same-index members of different nodes, the NVLink hop inside a
        node, one coupled flow; None when no pair carries bytes."""
        rdma, nvlink = pairs
        edge_sets: list[list[Edge]] = []
        weights: list[float] = []
        for g in groups:
            nodes = [self.fabric.node_of(x) for x in g]
            seen: dict[int, int] = {}
            index = []
            for node in nodes:
                index.append(seen.get(node, 0))
                seen[node] = index[-1] + 1
            edges, weights = [], []
            for a, b in itertools.permutations(range(len(g)), 2):
                w = nvlink if nodes[a] == nodes[b] else rdma if index[a] == index[b] else 0.0
                if w > 0:
                    edges.append((g[a], g[b]))
                    weights.append(w)
            edge_sets.append(edges)
        if not edge_sets[0]:
            return None
        return collectives.exchange(edge_sets, message_bytes, self.fabric, True, weights)

    def _context(
        self, kind: str, groups, message_bytes: float, loads=None
    ) -> Transfer | Collective | None:
        if loads is not None and kind == ALL_TO_ALL:  # all-to-all-v: flows weighted
            factors, by_sender = loads
            n = len(groups[0])
            pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
            edge_sets = [[(g[a], g[b]) for a, b in pairs] for g in groups]
            weights = [factors[a] if by_sender else factors[b] for a, b in pairs]
            return collectives.exchange(edge_sets, message_bytes / n, self.fabric, True, weights)
        if kind == RING_SEND:
            edge_sets = [[(g[c], g[(c + 1) % len(g)]) for c in range(len(g))] for g in groups]
            return collectives.exchange(edge_sets, message_bytes, self.fabric, False)
        if kind == ALL_TO_ALL:
            edge_sets = [[(a, b) for a in g for b in g if a != b] for g in groups]
            share = message_bytes / len(groups[0])
            return collectives.exchange(edge_sets, share, self.fabric, True)
        return self._collective(kind, groups, message_bytes)

    def dp(self, kind: str, message_bytes: float, j: int) -> Collective | None:
        """A collective over the data-parallel group of tensor rank ``j`` (and, symmetric,
        the congruent groups of the others); None for one replica."""
        if self.joint is not None:  # mixed mode: the representative's, joined
            return self.joint.dp(kind, message_bytes, 0)
        key = (kind, message_bytes, j if self.exact else 0)
        if key not in self._dp:
            placement = self.placement
            if self.mixed:
                # every tensor rank's group on its own links, one coupled flow: the
                # representative's links alone would miss the exact replicas' own

                def merged(stage: int) -> Collective | None:
                    groups = [placement.dp_group(t, stage) for t in range(placement.tensor)]
                    parts = [self._collective(kind, [g], message_bytes) for g in groups]
                    if self.ranks is not None:
                        self.ranks.check(parts)
                    return _merged(parts, self._near_touched(stage, parts, groups))

                key_mixed = ("dp-mixed", kind, message_bytes, *self.exclude)
                self._dp[key] = self._shared(key_mixed, self.stage, merged)
            elif self.exact:
                self._dp[key] = self._collective(
                    kind, [placement.dp_group(j, self.stage)], message_bytes
                )
            else:

                def build(stage: int) -> Collective | None:
                    rep = placement.dp_group(0, stage)
                    offsets = self._kept(rep, range(placement.tensor))
                    groups = [[g + o for g in rep] for o in offsets]
                    return self._collective(kind, groups, message_bytes)

                self._dp[key] = self._shared(("dp", kind, message_bytes), self.stage, build)
        return self._dp[key]

    def tied(self, other: int, message_bytes: float, j: int, d: int) -> Collective | None:
        """An all-reduce between this stage and pipeline rank ``other`` of each (tensor
        rank, replica) pair: the tied embedding's gradient (symmetric: every pair's)."""
        placement = self.placement
        low, high = sorted((self.stage, other))
        if self.group:  # the tied ends of a whole TP group are whole groups too
            pairs = [
                [placement.gpu(t, d, low), placement.gpu(t, d, high)]
                for t in range(placement.tensor)
            ]
            if self.ranks is not None:  # each rank's own, checked, as one coupled flow
                parts = [self._collective(ALL_REDUCE, [pair], message_bytes) for pair in pairs]
                self.ranks.check(parts)
                return _merged(parts)
            return self._collective(ALL_REDUCE, pairs, message_bytes)
        if self.exact:
            pair = [placement.gpu(j, d, low), placement.gpu(j, d, high)]
            return self._collective(ALL_REDUCE, [pair], message_bytes)

        def build(stage: int) -> Collective | None:
            rep = [placement.gpu(0, 0, stage), placement.gpu(0, 0, stage + high - low)]
            groups = [[g + o for g in rep] for o in self._kept(rep, self._every_rank())]
            return self._collective(ALL_REDUCE, groups, message_bytes)

        key = ("tied", high - low, message_bytes, *self.exclude)
        return self._shared(key, low, build, high - low + 1)

    def send_to(self, other: int, j: int, d: int, message_bytes: float | None = None) -> Transfer:
        """Activations or gradients of one micro-batch to pipeline rank ``other``, each
        tensor rank sending ``message_bytes`` (default: its 1/T shard)."""
        return self.between(self.stage, other, j, d, message_bytes)

    def between(
        self, src: int, dst: int, j: int, d: int, message_bytes: float | None = None
    ) -> Transfer:
        """Pipeline rank ``src`` to ``dst``, each tensor rank sending ``message_bytes``
        (default: its 1/T shard); the receiver of a blocking p2p builds the same transfer
        as its sender."""
        nbytes = self.shard_bytes if message_bytes is None else message_bytes
        if self.group:
            return self.replica_between(src, dst, d, nbytes)
        key = (src, dst, nbytes, *((j, d) if self.exact else (0, 0)))
        if key not in self._sends:
            placement = self.placement
            if self.exact:
                pair = (placement.gpu(j, d, src), placement.gpu(j, d, dst))
                self._sends[key] = collectives.point_to_point([pair], nbytes, self.fabric)
            else:
                low = min(src, dst)

                def build(stage: int) -> Transfer:
                    a = placement.gpu(0, 0, stage + src - low)
                    b = placement.gpu(0, 0, stage + dst - low)
                    offsets = self._kept([a, b], self._every_rank())
                    pairs = [(a + o, b + o) for o in offsets]
                    return collectives.point_to_point(pairs, nbytes, self.fabric)

                self._sends[key] = self._shared(
                    ("send", src - low, dst - low, nbytes, *self.exclude),
                    low,
                    build,
                    abs(dst - src) + 1,
                )
        return self._sends[key]

    def _near_touched(self, stage: int, parts: Sequence[Collective | None], groups):
        """Which links the joint data-parallel flow of ``stage`` keeps: tensor rank 0's
        group's (the representative's links, where every rank's rings add their
        multiplicities, as symmetric mode counts its copies), every link of a group
        with a detoured GPU (its rings leave its node unlike rank 0's) and every link
        with an end in a node of a touched replica's GPU of the stage. The other ranks'
        links away from those nodes carry, by symmetry, what rank 0's carry: leaving
        them out changes no rate and spares the fair-share recomputes thousands of
        links."""
        links, placement, pattern = self.fabric.links, self.placement, self.fabric.pattern
        if links is None or parts[0] is None or pattern is None:
            return None
        gpn = pattern.gpus_per_node
        nodes = {
            placement.gpu(t, d, stage) // gpn for d in self.exclude for t in range(placement.tensor)
        }
        own = {
            link
            for part, group in zip(parts, groups, strict=True)
            if part is not None and (part is parts[0] or pattern.detoured.intersection(group))
            for phase in part
            for link in phase.links
        }

        def near(vertex: tuple) -> bool:
            if vertex[0] == "gpu":
                return vertex[1] // gpn in nodes
            return vertex[0] in ("nic", "nvswitch") and vertex[1] in nodes

        def keep(link: int) -> bool:
            if link in own:
                return True
            ends = links[link]
            return near(ends.src) or near(ends.dst)

        return keep

    def replica_between(self, src: int, dst: int, d: int, nbytes: float) -> Transfer:
        """Mixed mode: every tensor rank of replica ``d`` sending ``nbytes`` from pipeline
        rank ``src`` to ``dst``, one coupled flow (a whole TP group's sends, or those
        between a whole group and a group of lanes per GPU)."""
        key = (src, dst, nbytes, -1, d)
        if key not in self._sends:
            placement = self.placement
            # every pair on its own links (a touched GPU's NIC is in one of them)
            pairs = [
                (collectives.point_to_point([(a, b)], nbytes, self.fabric),)
                for a, b in (
                    (placement.gpu(t, d, src), placement.gpu(t, d, dst))
                    for t in range(placement.tensor)
                )
            ]
            if self.ranks is not None:
                self.ranks.check(pairs)
            merged = _merged(pairs)
            assert merged is not None  # each part is a transfer, never None
            self._sends[key] = merged[0]
        return self._sends[key]

    # -- symmetric mode: the congruent copies, and the stages alike ----------------------

    def _replicas(self) -> list[int]:
        """The replicas the representative stands for: all, less those simulated
        exactly in mixed mode."""
        return [r for r in range(self.placement.data) if r not in self.exclude]

    def _every_rank(self) -> list[int]:
        """GPU offsets of every (tensor rank, replica) pair's copy, replica-major."""
        placement = self.placement
        return [t + placement.tensor * r for r in self._replicas() for t in range(placement.tensor)]

    def _kept(self, rep: Sequence[int], offsets) -> list[int]:
        """The copies (``rep`` moved by each offset, in order) that can change the
        representative's transfer. On a pattern cluster a copy in regions of its own
        shares no link with ``rep`` (on one switch a region is a server: every link is
        one server's, the switch port included; on a tree a leaf group or pod), and if
        an earlier copy lies a whole number of regions away it is wired alike (the same
        link bandwidths along its routes): leaving it out changes neither the
        multiplicities nor the check that the copies are alike, nor which copy that
        check would name. Without a pattern every copy is kept."""
        pattern = self.fabric.pattern
        if pattern is None:
            return list(offsets)
        gpn = pattern.region_gpus  # GPUs of a region: below, "server" reads "region"
        servers = {g // gpn for g in rep}
        if len(offsets) > _ARRAY_OFFSETS and len(rep) <= _ARRAY_REP:
            return _kept_on_arrays(rep, offsets, gpn, servers)
        first, last, low, high = min(servers), max(servers), min(rep), max(rep)
        seen: set[int] = set()
        kept = []
        for o in offsets:
            if o % gpn not in seen:
                seen.add(o % gpn)
                kept.append(o)
            elif (
                (low + o) // gpn <= last
                and (high + o) // gpn >= first
                and any((g + o) // gpn in servers for g in rep)
            ):
                kept.append(o)
        return kept

    def _shared(self, key: tuple, low: int, build, stages: int = 1):
        """``build(low)``, the transfer(s) of the copies of pipeline ranks ``low`` to
        ``low + stages - 1``. On a pattern cluster, built once per position modulo the
        cluster's ``shift_nodes`` servers, at the lowest stage of that position (where
        the routes of the stages before were found already), and moved: when the stages
        lie whole servers apart and the cluster says moving by that many moves every
        route alike (same multiplicities, latencies and choice of algorithm). A layout
        error is raised as building at ``low`` raises it (naming its GPUs)."""
        pattern = self.fabric.pattern
        stage_gpus = self.placement.tensor * self.placement.data
        if pattern is None or (low * stage_gpus) % pattern.gpus_per_node:
            return build(low)
        gpn, shift = pattern.gpus_per_node, pattern.shift_nodes
        nodes = low * stage_gpus // gpn
        first = next(
            c
            for c in range(low + 1)
            if (c * stage_gpus) % gpn == 0 and (c * stage_gpus // gpn - nodes) % shift == 0
        )
        at = first * stage_gpus // gpn
        last = nodes + (stages * stage_gpus - 1) // gpn  # the moved groups' last server
        if nodes != at and (
            not pattern.moves(last, nodes - at)
            or _detoured_in(pattern, at, last - nodes + at)
            or _detoured_in(pattern, nodes, last)
        ):
            return build(low)
        slot = (key, first)
        if slot not in pattern.memo:
            try:
                pattern.memo[slot] = build(first)
            except LayoutError:
                return build(low)
        if nodes == at:
            return pattern.memo[slot]
        return _moved(pattern.memo[slot], nodes - at, pattern.translate)

    def _collective(
        self, kind: str, groups: Sequence[Sequence[int]], message_bytes: float
    ) -> Collective | None:
        """A collective by the scenario's algorithm (collectives.collective)."""
        return collectives.collective(self.algorithm, kind, groups, message_bytes, self.fabric)


# `StageComm._kept` on arrays from this many offsets (every tensor rank and replica of a
# large run: 8,192 at DP 1,024), for a representative of a few GPUs (a TP group, a p2p
# pair); fewer offsets cost less in its loop
_ARRAY_OFFSETS = 256
_ARRAY_REP = 64


def _kept_on_arrays(rep: Sequence[int], offsets, gpn: int, servers: set[int]) -> list[int]:
    """`StageComm._kept`'s loop on arrays: the first offset of each residue modulo
    ``gpn``, and a later one where it moves a GPU of ``rep`` into one of its servers."""
    moved = np.asarray(offsets, dtype=np.int64)
    kept = np.zeros(len(moved), dtype=bool)
    kept[np.unique(moved % gpn, return_index=True)[1]] = True
    near = np.flatnonzero(~kept)
    own = np.fromiter(servers, np.int64, len(servers))
    hit = np.zeros(len(near), dtype=bool)
    for gpu in rep:
        hit |= np.isin((gpu + moved[near]) // gpn, own)
    kept[near[hit]] = True
    return moved[kept].tolist()


def _detoured_in(pattern, first: int, last: int) -> bool:
    """Whether servers ``first`` to ``last`` hold a detoured GPU (their routes are not
    the other servers' moved)."""
    gpn = pattern.gpus_per_node
    return any(first <= g // gpn <= last for g in pattern.detoured)


def _merged(parts: Sequence[Collective | None], keep=None) -> Collective | None:
    """Collectives of one shape (phases of the same bytes per flow) as one: each phase's
    flows of every part coupled, their multiplicities added link by link; a phase's
    latency is the largest of the parts'. ``keep(link)``, if given, says which links
    the coupled flow keeps."""
    if parts[0] is None:
        return None
    phases = []
    for same in zip(*parts, strict=True):
        mults: dict[int, int] = {}
        for t in same:
            for link, m in zip(t.links, t.mults, strict=True):
                if keep is None or keep(link):
                    mults[link] = mults.get(link, 0) + m
        links = tuple(sorted(mults))
        first = same[0]
        if any(t.bytes_per_flow != first.bytes_per_flow for t in same):
            raise LayoutError("mixed mode: the data-parallel groups' collectives differ in shape")
        latency = max(t.latency_s for t in same)
        counts = tuple(mults[i] for i in links)
        phases.append(Transfer(links, counts, first.bytes_per_flow, latency))
    return tuple(phases)


def _moved(result, nodes: int, translate):
    """A transfer or collective moved by ``nodes`` whole servers."""
    if result is None:
        return None
    if isinstance(result, Transfer):
        return result._replace(links=translate(result.links, nodes))
    return tuple(t._replace(links=translate(t.links, nodes)) for t in result)

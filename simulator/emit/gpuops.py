"""The ops of one simulated GPU: its compute lane's work and the collectives it joins.

Both the stage lowering (lowering.py) and the data-parallel strategies
(dataparallel.py) add ops through it, so a collective is numbered the same way
whichever of them adds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..comm.placement import StageComm
from ..cost.kernels import Work
from ..ir.keys import OpKey, RendezvousKey, Who
from ..ir.ops import WorkloadBuilder
from ..ir.vocabulary import BARRIER, COMPUTE_STREAM, CP_COMM, DP_SYNC, TP_COMM


class GpuOps:
    """Tensor rank ``j`` of replica ``d`` of pipeline stage ``comm.stage``. Symmetric mode
    lowers only (0, 0), standing for the stage's T x D GPUs; exact mode lowers every
    GPU, and its collectives are rendezvous named by the group and a running count."""

    def __init__(self, builder: WorkloadBuilder, comm: StageComm, j: int, d: int) -> None:
        placement = comm.placement
        self.builder, self.comm, self.stage = builder, comm, comm.stage
        self.j, self.d = j, d
        self.who: Who = (j, d)
        self.exact = comm.exact
        self.gpu = placement.gpu(j, d, self.stage)
        self.stands_for = (
            1
            if self.exact
            else placement.tensor
            if comm.group
            else placement.tensor * (placement.data - len(comm.exclude))
        )
        # exact mode's congruent TP group (congruent.py): one lane, T GPUs reported
        self.copies = 1
        if comm.group and comm.ranks is not None:
            self.stands_for, self.copies = 1, placement.tensor
        partition = comm.partition
        if partition is not None:  # class mode (classes.py): (rank class j, replica class d)
            ranks, replicas = partition.ranks[j], partition.replicas[d]
            self.gpu = placement.gpu(ranks[0], replicas[0], self.stage)
            self.stands_for = len(ranks) * len(replicas)
        self._num_collectives: dict[str, int] = {}  # by op kind: TP_COMM, DP_SYNC
        self.lane = self.new_lane(COMPUTE_STREAM)

    def ep_rank(self, scenario) -> int | None:
        """Exact mode: this GPU's expert-parallel rank (placement.expert_groups' layout);
        None in symmetric mode, whose representative stands for the busiest (routing.py)."""
        if not self.exact:
            return None
        par = scenario.parallel
        local = self.j + self.comm.placement.tensor * self.d
        return (local // par.etp_size) % par.ep_size

    def peers(self, stage: int) -> list[Who]:
        """The (tensor rank, replica) names of the GPUs of pipeline rank ``stage`` whose
        pipeline ops this GPU's meet: its own, but in mixed mode a whole TP group's lane
        meets every GPU of a group with a lane per GPU, and such a GPU the whole group's."""
        comm = self.comm
        if comm.joint is None or stage == self.stage:
            return [self.who]
        split = (self.d, stage) in comm.split
        if comm.group:
            return [(t, self.d) for t in range(comm.placement.tensor)] if split else [self.who]
        return [self.who] if split else [(0, self.d)]

    def coupled_with(self, stage: int) -> bool:
        """Mixed mode: whether a blocking p2p call with pipeline rank ``stage`` is one
        coupled flow of the whole TP group's sends (a whole group at either end)."""
        comm = self.comm
        return comm.joint is not None and (comm.group or (self.d, stage) not in comm.split)

    def new_lane(self, stream: str) -> int:
        """A lane of this GPU on ``stream`` (the compute lane is made first)."""
        return self.builder.lane(
            gpu=self.gpu,
            stream=stream,
            stage=self.stage,
            stands_for=self.stands_for,
            copies=self.copies,
        )

    def work(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        """Compute on the compute lane; nothing when there is nothing to do or wait for."""
        if w.duration_s == 0 and w.flops == 0 and not deps:
            return
        self.builder.add(
            self.lane, kind, label, microbatch=mb, duration_s=w.duration_s, flops=w.flops, deps=deps
        )

    def barrier(self, label: str, deps: Sequence[object], mb: int = -1) -> None:
        """The compute lane waits for ``deps``, nothing else."""
        self.builder.add(self.lane, BARRIER, label, microbatch=mb, deps=deps)

    def collective(self, lane: int, kind: str, label: str, transfer, **fields) -> None:
        """A collective op (TP_COMM or DP_SYNC); in exact mode a rendezvous of the group."""
        joined = self.exact or (self.comm.mixed and kind == DP_SYNC)
        rendezvous = self.rendezvous(kind) if joined else None
        self.builder.add(lane, kind, label, transfer=transfer, rendezvous=rendezvous, **fields)

    def rendezvous(self, kind: str, group: object = None) -> RendezvousKey:
        """Exact mode: the name of this GPU's next collective of ``kind`` (TP_COMM or
        DP_SYNC), which every member of its group gives the same; ``group`` names the
        group where the kind does not say it (the expert groups: moe_ops.py, overlap.py)."""
        count = self._num_collectives[kind] = self._num_collectives.get(kind, 0) + 1
        if group is not None:
            return RendezvousKey(kind, self.stage, group, count)
        if kind == DP_SYNC and self.comm.mixed:  # the representative's lane and the exact ones
            return RendezvousKey(kind, self.stage, "joint", count)
        # a TP group is the replica's tensor ranks, a DP group the tensor rank's replicas,
        # a CP group the tensor rank's replicas of one context-parallel group
        group = self.d if kind == TP_COMM else self.j
        if kind == CP_COMM:
            group = (self.j, self.d // self.comm.placement.context)
        return RendezvousKey(kind, self.stage, group, count)

    def last_key(self, lane: int) -> OpKey:
        """A key for the last op added to ``lane``."""
        return self.builder.last_key(lane)

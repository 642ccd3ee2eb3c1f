"""Where each rank sits, and the transfers a pipeline stage's GPUs use.

Placement follows Megatron-LM's rank order, tensor-parallel fastest, then
data-parallel, then pipeline: ``gpu = tp + T * (dp + D * pp)``, so a tensor-parallel
group sits inside a node whenever T divides the node size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..engine.flows import Collective, Transfer
from ..scenario import Scenario
from ..vocabulary import ALL_REDUCE
from . import collectives
from .collectives import Fabric
from .compute import BYTES_PER_ELEMENT


@dataclass(frozen=True, slots=True)
class Placement:
    tensor: int
    data: int
    pipeline: int

    def gpu(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tensor * (dp + self.data * pp)

    def tp_group(self, dp: int, pp: int) -> list[int]:
        return [self.gpu(j, dp, pp) for j in range(self.tensor)]

    def dp_group(self, tp: int, pp: int) -> list[int]:
        return [self.gpu(tp, d, pp) for d in range(self.data)]


def placement_of(scenario: Scenario) -> Placement:
    p = scenario.parallel
    return Placement(
        p.tensor_model_parallel_size, p.data_parallel_size, p.pipeline_model_parallel_size
    )


class StageComm:
    """The transfers one stage uses, built once per stage and shape.

    Symmetric mode: each transfer is the representative GPU's (tensor rank 0 of replica
    0) and carries the flows of every congruent group of the stage. Exact mode: the
    transfer of the group of GPU (tensor rank ``j``, replica ``d``) alone. A layout
    whose congruent groups cross the cluster unlike the representative's raises
    collectives.LayoutError."""

    def __init__(
        self, scenario: Scenario, fabric: Fabric, placement: Placement, stage: int
    ) -> None:
        self.fabric, self.placement, self.stage = fabric, placement, stage
        self.exact = not scenario.network.symmetry
        self.algorithm = scenario.network.collective_algorithm
        m, b = scenario.model, scenario.training.micro_batch_size
        self.activation_bytes = b * m.seq_length * m.hidden_size * BYTES_PER_ELEMENT
        self.shard_bytes = self.activation_bytes / placement.tensor
        # by (kind, replica), (kind, message bytes, tensor rank), (src, dst, bytes, j, d)
        self._tp: dict[tuple[str, int], Collective | None] = {}
        self._dp: dict[tuple[str, float, int], Collective | None] = {}
        self._sends: dict[tuple[int, int, float, int, int], Transfer] = {}

    def tp(self, kind: str, d: int) -> Collective | None:
        """A tensor-parallel collective (a vocabulary collective kind) of one
        micro-batch's activations in replica ``d``; None for one tensor rank."""
        key = (kind, d if self.exact else 0)
        if key not in self._tp:
            replicas = [d] if self.exact else range(self.placement.data)
            groups = [self.placement.tp_group(r, self.stage) for r in replicas]
            self._tp[key] = self._collective(kind, groups, self.activation_bytes)
        return self._tp[key]

    def dp(self, kind: str, message_bytes: float, j: int) -> Collective | None:
        """A collective over the data-parallel group of tensor rank ``j`` (and, symmetric,
        the congruent groups of the others); None for one replica."""
        key = (kind, message_bytes, j if self.exact else 0)
        if key not in self._dp:
            ranks = [j] if self.exact else range(self.placement.tensor)
            groups = [self.placement.dp_group(t, self.stage) for t in ranks]
            self._dp[key] = self._collective(kind, groups, message_bytes)
        return self._dp[key]

    def tied(self, other: int, message_bytes: float, j: int, d: int) -> Collective:
        """An all-reduce between this stage and pipeline rank ``other`` of each (tensor
        rank, replica) pair: the tied embedding's gradient (symmetric: every pair's)."""
        placement = self.placement
        if self.exact:
            ranks = [(j, d)]
        else:
            ranks = [(t, r) for r in range(placement.data) for t in range(placement.tensor)]
        low, high = sorted((self.stage, other))
        groups = [[placement.gpu(t, r, low), placement.gpu(t, r, high)] for t, r in ranks]
        return self._collective(ALL_REDUCE, groups, message_bytes)

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
        key = (src, dst, nbytes, *((j, d) if self.exact else (0, 0)))
        if key not in self._sends:
            placement = self.placement
            if self.exact:
                ranks = [(j, d)]
            else:
                ranks = [(t, r) for r in range(placement.data) for t in range(placement.tensor)]
            pairs = [(placement.gpu(t, r, src), placement.gpu(t, r, dst)) for t, r in ranks]
            self._sends[key] = collectives.point_to_point(pairs, nbytes, self.fabric)
        return self._sends[key]

    def _collective(
        self, kind: str, groups: Sequence[Sequence[int]], message_bytes: float
    ) -> Collective | None:
        """An all-reduce by the scenario's algorithm; a ring for the other kinds."""
        if kind == ALL_REDUCE:
            return collectives.all_reduce(self.algorithm, groups, message_bytes, self.fabric)
        return collectives.ring(kind, groups, message_bytes, self.fabric)

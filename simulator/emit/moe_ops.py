"""An MoE layer's MLP block as ops (docs/moe.md): moe.py's work on the compute lane
between the token dispatcher's collectives (alltoall, allgather, flex) on the real links
of the stage's expert groups, forward and backward; `expert_collective` is also the
expert-data-parallel gradient sync's (dataparallel.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..cost.compute import ComputeModel
from ..cost.deepep import flex_traffic, row_bytes
from ..cost.kernels import Work
from ..cost.moe import busiest_rank, dispatch_bytes, moe_block_work
from ..cost.routing import rank_loads, skewed
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_TO_ALL,
    BACKWARD,
    EP_COMM,
    MOE_ALLTOALL,
    MOE_FLEX,
    REDUCE_SCATTER,
)

if TYPE_CHECKING:
    from .lowering import _Stage


class MoeBlock:
    """Lowers an MoE layer's MLP block for a stage (lowering._Stage calls it in place of
    the dense MLP block): compute on the lane, the dispatcher's collectives as blocking
    `ep_comm` ops on the real links of the stage's expert groups."""

    def __init__(self, cm: ComputeModel, rank: int | None = None) -> None:
        """``rank``: the GPU's EP rank (exact mode); None: symmetric mode's
        representative, standing for the busiest rank (routing.py)."""
        self.work = moe_block_work(cm, rank)
        self.bytes = dispatch_bytes(cm, busiest_rank(cm) if rank is None else rank)
        self.alltoall = cm.training.moe_dispatcher == MOE_ALLTOALL
        # flex (DeepEP, deepep.py): the pair weights, the tokens' bytes in 16-bit rows and
        # in the forward dispatch's rows (FP8 under FP8)
        self.flex: tuple[tuple[float, float], float, float] | None = None
        if cm.training.moe_dispatcher == MOE_FLEX:
            traffic = flex_traffic(cm)
            local = cm.tokens / cm.parallel.tensor_model_parallel_size
            self.flex = (
                (traffic.rdma, traffic.nvlink),
                local * row_bytes(cm, False),
                local * row_bytes(cm, cm.fp8 is not None),
            )
        # the all-to-all-v's per-rank weights under skew (None: a plain all-to-all)
        self.loads = rank_loads(cm.model, cm.parallel.ep_size) if skewed(cm.model) else None

    def _comm(
        self,
        stage: _Stage,
        label: str,
        mb: int,
        group: str,
        kind: str,
        nbytes: float,
        by_sender: bool = False,
    ):
        gpu = stage.gpu
        loads = (self.loads, by_sender) if group == "ep" and self.loads is not None else None
        transfer = gpu.comm.expert(group, kind, nbytes, gpu.j, gpu.d, loads)
        if transfer is not None:
            expert_collective(gpu, EP_COMM, group, label, transfer, microbatch=mb)

    def flex_transfer(self, gpu, into: bool, forward: bool):
        """The flex dispatcher's one coupled transfer (RDMA and NVLink hops together) of
        the forward dispatch (``into`` and ``forward``: FP8 rows under FP8) or of the
        other three exchanges (16-bit). Only under the flex dispatcher (``flex`` set)."""
        assert self.flex is not None  # the callers ask only when it is set
        pairs, unit, unit_fp8 = self.flex
        nbytes = unit_fp8 if into and forward else unit
        return gpu.comm.expert("ep", ALL_TO_ALL, nbytes, gpu.j, gpu.d, pairs=pairs)

    def exchange(
        self, stage: _Stage, label: str, mb: int, into: bool, forward: bool = False
    ) -> None:
        """Tokens to their experts (``into``) or back: the dispatch and the combine, and
        in the backward their duals (the combine's dual moves tokens into the experts)."""
        b = self.bytes
        if self.flex is not None:
            transfer = self.flex_transfer(stage.gpu, into, forward)
            if transfer is not None:
                expert_collective(stage.gpu, EP_COMM, "ep", label, transfer, microbatch=mb)
            return
        if not self.alltoall:
            kind = ALL_GATHER if into else REDUCE_SCATTER
            self._comm(stage, label, mb, "tpep", kind, b.gather_bytes)
            return
        if into:  # to the experts: weighted by the receiving rank's load
            self._comm(stage, label, mb, "ep", ALL_TO_ALL, b.alltoall_bytes)
            self._comm(stage, label, mb, "etp", ALL_GATHER, b.etp_bytes)
        else:  # back: by the sending rank's
            self._comm(stage, label, mb, "etp", REDUCE_SCATTER, b.etp_bytes)
            self._comm(stage, label, mb, "ep", ALL_TO_ALL, b.alltoall_bytes, by_sender=True)

    def forward(self, stage: _Stage, kind: str, label: str, mb: int, deps: Sequence[object]):
        w, gpu = self.work, stage.gpu
        gpu.work(kind, label, mb, w.pre, deps)
        if self.alltoall:  # the token counts, before the all-to-all can be sized
            self._comm(stage, label, mb, "tpep", ALL_GATHER, self.bytes.count_bytes)
        self.exchange(stage, label, mb, True, forward=True)
        gpu.work(kind, label, mb, w.experts)
        self.exchange(stage, label, mb, False)
        gpu.work(kind, label, mb, w.post)
        self.shared(stage, kind, label, mb, w.shared)
        gpu.work(kind, label, mb, w.tail)

    def shared(self, stage: _Stage, kind: str, label: str, mb: int, work: Work) -> None:
        if work.duration_s == 0:
            return
        stage.tp(label, mb, ALL_GATHER, ())
        stage.gpu.work(kind, label, mb, work)
        stage.tp(label, mb, REDUCE_SCATTER, ())

    def backward(self, stage: _Stage, label: str, mb: int, deps: Sequence[object]) -> None:
        """The block's backward; under a split schedule without its weight gradients
        (`weight`, in the W pass)."""
        w, gpu = self.work, stage.gpu
        split = stage.split
        gpu.work(BACKWARD, label, mb, w.tail_b, deps)
        self.shared(stage, BACKWARD, label, mb, w.shared_b - w.shared_w if split else w.shared_b)
        gpu.work(BACKWARD, label, mb, w.post_b)
        self.exchange(stage, label, mb, True)  # the combine's dual: gradients to the experts
        gpu.work(BACKWARD, label, mb, w.experts_b - w.experts_w if split else w.experts_b)
        self.exchange(stage, label, mb, False)
        gpu.work(BACKWARD, label, mb, w.pre_b - w.pre_w if split else w.pre_b)


def expert_collective(
    gpu, kind: str, group: str, label: str, transfer, microbatch: int = -1
) -> None:
    """A collective over an expert group that the compute lane waits for; in exact mode a
    rendezvous named by the group (StageComm.expert_offset) and the kind's count. The
    dispatcher's (EP_COMM) is launched non-blocking with a barrier on it: the same wait,
    and its transfer then shows on the expert-parallel stream of the trace and timeline."""
    rendezvous = None
    if gpu.exact:
        rendezvous = gpu.rendezvous(kind, (group, gpu.comm.expert_offset(group, gpu.j, gpu.d)))
    blocking = kind != EP_COMM
    sent = gpu.builder.add(
        gpu.lane,
        kind,
        label,
        transfer=transfer,
        rendezvous=rendezvous,
        microbatch=microbatch,
        blocking=blocking,
    )
    if not blocking:
        gpu.barrier(label, [sent], microbatch)

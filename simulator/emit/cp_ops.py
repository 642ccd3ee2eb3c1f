"""Context-parallel attention as ops: context.py's steps of the attention core on a
compute lane (a ring step's send launched beside its compute, a blocking all-gather,
reduce-scatter or all-to-all), and the attention block's compute around them."""

from __future__ import annotations

from collections.abc import Sequence

from ..cost.compute import ComputeModel
from ..cost.context import ContextAttention, CoreSplit, core_split
from ..cost.kernels import Work
from ..ir.vocabulary import BACKWARD, CP_COMM
from .gpuops import GpuOps


class ContextOps:
    """The attention core of one layer on one CP rank as ops (``steps``: its plan, the
    cost model's `ContextAttention`); ``overlap_tp`` and ``split`` say what of the block
    around the core runs elsewhere (the projection with its TP collective, the deferred
    weight gradients of a zero-bubble schedule)."""

    def __init__(self, cm: ComputeModel, overlap_tp: bool = False, split: bool = False) -> None:
        self.steps = ContextAttention(cm)
        self._split = (overlap_tp, split)
        self._cm = cm
        self._core_split: CoreSplit | None = None

    def lower_block(
        self, gpu: GpuOps, kind: str, label: str, mb: int, w: Work, deps: Sequence[object]
    ) -> None:
        """The attention block's compute ``w`` between its TP collectives, with the core's
        steps in place of the core: what comes before it, the steps, what follows."""
        if self._core_split is None:
            self._core_split = core_split(self._cm, *self._split)
        split = self._core_split
        backward = kind == BACKWARD
        core = self.steps.core(backward)
        if backward:
            before = split.backward_head
            after = w - before - core
        else:
            after = split.forward_tail
            before = w - core - after
        gpu.work(kind, label, mb, before, deps)
        self.lower(gpu, kind, label, mb, ())
        gpu.work(kind, label, mb, after)

    def lower(self, gpu: GpuOps, kind: str, label: str, mb: int, deps) -> None:
        """The core's ops on ``gpu``'s compute lane (``kind``: forward, recompute or
        backward), its first op waiting for ``deps``: a ring step is its send launched
        alongside the step's compute and a barrier on both; a blocking collective holds
        the lane. In exact mode each transfer is a rendezvous of the CP group."""
        builder, lane = gpu.builder, gpu.lane
        steps = self.steps
        for step in steps.backward if kind == BACKWARD else steps.forward:
            if step.kind is None:
                gpu.work(kind, label, mb, step.work, deps)
                deps = ()
                continue
            transfer = gpu.comm.cp(step.kind, step.message_bytes, gpu.j, gpu.d)
            rendezvous = gpu.rendezvous(CP_COMM) if gpu.exact else None
            sent = builder.add(
                lane,
                CP_COMM,
                label,
                microbatch=mb,
                transfer=transfer,
                blocking=not step.overlapped,
                deps=deps,
                rendezvous=rendezvous,
            )
            deps = ()
            if step.overlapped:
                gpu.work(kind, label, mb, step.work)
                gpu.barrier(label, [sent], mb)

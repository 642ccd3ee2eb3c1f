"""F&B pairs run overlapped: the forward of one micro-batch and the backward of another
interleaved on the compute stream, their expert all-to-alls on a communication stream
(`training.overlap_moe_expert_parallel_comm`; docs/moe.md).

DeepSeek-V3 (technical report 3.2.2, DualPipe's `overlapped_forward_backward`) and
Megatron-Core's combined 1F1B split a layer into attention, dispatch, MLP (the experts)
and combine, and run one micro-batch's compute while the other's all-to-all is on the
wire. Here a pair's two passes are generators (lowering._Stage.forward_steps,
backward_steps) advanced in turn: each runs its compute up to an all-to-all, launches
it on the GPU's communication lane (stream ``ep``: it starts once the compute that
produced its tokens has ended, and its collectives run one after another), and pauses;
the other pass then computes; on resuming, the pass waits for its all-to-all (a
barrier: what is left of it is exposed `ep_comm`) and goes on. Per MoE layer:

    forward:  attention, router + permute | dispatch | experts | combine | unpermute, ...
    backward: ..., unpermute's dual | combine's dual | experts | dispatch's dual | router,
              attention

A dense layer is one part (it pauses after it). Pipeline sends stay non-blocking ops.

SMs. The communication kernels hold a share f of the SMs (`training.moe_comm_sm_fraction`,
by default DeepSeek's 20 of 132 when the overlap is on) for as long as pairs run, as
DeepSeek partitions them: every kernel of a pair's layers runs on the other
round(SMs x (1 - f)) SMs. GEMMs take that through the wave model (the kernel constants'
`num_sms`, as --tp-comm-overlap's GEMMs do on the SMs userbuffers leave); memory-bound
kernels keep their time (HBM, not SMs, bounds them). The all-to-all's own time does not
change (links bound it). Passes outside pairs run on every SM.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Generator
from typing import TYPE_CHECKING, TypeVar

from ..cost.compute import ComputeModel
from ..cost.kernels import Work
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_TO_ALL,
    BACKWARD,
    EP_COMM,
    EP_STREAM,
    FORWARD,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
)
from .moe_ops import MoeBlock

if TYPE_CHECKING:
    from ..scenario import Scenario
    from .gpuops import GpuOps
    from .lowering import _Stage

T = TypeVar("T")


def sharing_compute(compute: ComputeModel, fraction: float) -> ComputeModel:
    """The compute model on the SMs that communication holding ``fraction`` leaves."""
    if fraction <= 0:
        return compute
    c = compute.constants
    shared = copy.copy(compute)
    left = max(1, round(c.num_sms * (1.0 - fraction)))
    shared.constants = dataclasses.replace(c, num_sms=left)
    return shared


class Pairing:
    """One simulated GPU's overlapped pairs: its communication lane and the kernels on
    the SMs the communication leaves."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        shared = sharing_compute(compute, scenario.training.comm_sm_fraction)
        self.works = shared.layer()
        # the GPU's own EP rank in exact mode (the busiest's in symmetric), as lowering's
        self.moe = MoeBlock(shared, gpu.ep_rank(scenario)) if scenario.model.moe else None
        self.lane = gpu.new_lane(EP_STREAM)
        self.delay_wgrad = bool(scenario.training.delay_wgrad_compute)
        self.backward_first = scenario.training.schedule not in ("dualpipe", "dualpipev")

    def pair(
        self, forward: Generator[None, None, T], backward: Generator[None, None, object]
    ) -> T | None:
        """An F&B pair's two passes interleaved, in the order its schedule runs them;
        the forward's value. Megatron-Core's combined 1F1B (`interleaved`, one-stage
        `1f1b`) starts each layer with the backward: TransformerLayerSchedulePlan.run
        (megatron/core/models/common/model_chunk_schedule_plan.py) launches the backward's
        combine dual, then runs the forward's attention under it, so its communication
        stream runs combine-dual, dispatch, dispatch-dual, combine. DualPipe's pairs start
        with the forward, as before."""
        if self.backward_first:
            return self.interleave(forward, backward, lead=backward)
        return self.interleave(forward, backward)

    @staticmethod
    def interleave(
        first: Generator[None, None, T],
        second: Generator[None, None, object],
        lead: Generator[None, None, object] | None = None,
    ) -> T | None:
        """Advance two passes in turn, a part each, until both end, ``lead`` (default the
        first) first; the first's value."""
        value: T | None = None
        running: list[Generator[None, None, object]] = [first, second]
        if lead is second:
            running.reverse()
        while running:
            for steps in list(running):
                try:
                    next(steps)
                except StopIteration as stop:
                    running.remove(steps)
                    if steps is first:
                        value = stop.value
        return value

    # -- a layer as parts -----------------------------------------------------------------

    def layer(
        self, stage: _Stage, kind: str, label: str, mb: int, deps: list[object], index: int
    ) -> Generator[None]:
        flags = stage.moe_flags
        moe = self.moe if flags is not None and flags[index] else None
        layer = self.works
        if kind == "F":
            stage.block(FORWARD, label, mb, layer.attention_forward, layer.attention_overlap, deps)
            if moe is not None:
                yield from self.moe_forward(stage, moe, label, mb)
            else:
                stage.block(FORWARD, label, mb, layer.mlp_forward, layer.mlp_overlap)
                yield
            return
        mlp, attention = layer.mlp_backward, layer.attention_backward
        if stage.split:
            mlp, attention = mlp - layer.mlp_weight, attention - layer.attention_weight
        if stage.recompute == RECOMPUTE_SELECTIVE:  # full is refused with the overlap
            # the selected modules on the compute lane (`moe` is refused with the overlap)
            deps = stage.selective(label, mb, deps, moe is not None)
        if moe is not None:
            yield from self.moe_backward(stage, moe, label, mb, deps)
        else:
            stage.backward_block(label, mb, mlp, layer.mlp_last_weight, layer.mlp_overlap, deps)
            yield
        stage.backward_block(
            label, mb, attention, layer.attention_last_weight, layer.attention_overlap, ()
        )

    def moe_forward(self, stage: _Stage, moe: MoeBlock, label: str, mb: int) -> Generator[None]:
        w, gpu = moe.work, stage.gpu
        gpu.work(FORWARD, label, mb, w.pre)
        yield from self.exchange(stage, moe, label, mb, True, forward=True)
        gpu.work(FORWARD, label, mb, w.experts)
        yield from self.exchange(stage, moe, label, mb, False)
        gpu.work(FORWARD, label, mb, w.post)
        moe.shared(stage, FORWARD, label, mb, w.shared)
        gpu.work(FORWARD, label, mb, w.tail)

    def moe_backward(
        self, stage: _Stage, moe: MoeBlock, label: str, mb: int, deps: list[object]
    ) -> Generator[None]:
        w, gpu, split = moe.work, stage.gpu, stage.split
        gpu.work(BACKWARD, label, mb, w.tail_b, deps)
        shared = w.shared_b - w.shared_w if split else w.shared_b
        moe.shared(stage, BACKWARD, label, mb, shared)
        gpu.work(BACKWARD, label, mb, w.post_b)
        yield from self.exchange(stage, moe, label, mb, True)  # the combine's dual
        if self.delay_wgrad and not split:
            # the experts' weight gradients under the dispatch's dual (Transformer Engine's
            # wgrad store, run by backward_dw once the all-to-all is launched)
            gpu.work(BACKWARD, label, mb, w.experts_b - w.experts_w)
            yield from self.exchange(stage, moe, label, mb, False, during=w.experts_w)
        else:
            gpu.work(BACKWARD, label, mb, w.experts_b - w.experts_w if split else w.experts_b)
            yield from self.exchange(stage, moe, label, mb, False)  # the dispatch's dual
        gpu.work(BACKWARD, label, mb, w.pre_b - w.pre_w if split else w.pre_b)

    def exchange(
        self,
        stage: _Stage,
        moe: MoeBlock,
        label: str,
        mb: int,
        into: bool,
        forward: bool = False,
        during: Work | None = None,
    ) -> Generator[None]:
        """Tokens to their experts (``into``) or back, on the communication lane once the
        compute before has ended (the all-to-all, with ETP > 1 its all-gather after or
        reduce-scatter before); ``during``, compute that runs while it is under way;
        pauses for the other pass, then waits for it."""
        gpu, b = stage.gpu, moe.bytes
        # (group, collective, bytes), None: the flex dispatcher's coupled transfer
        steps: list[tuple[str, str, float | None]]
        steps = [("ep", ALL_TO_ALL, b.alltoall_bytes), ("etp", ALL_GATHER, b.etp_bytes)]
        if not into:
            steps = [("etp", REDUCE_SCATTER, b.etp_bytes), ("ep", ALL_TO_ALL, b.alltoall_bytes)]
        if moe.flex is not None:  # DeepEP's one transfer (deepep.py)
            steps = [("ep", ALL_TO_ALL, None)]
        elif into and forward and moe.alltoall:  # the token counts first (MoeBlock.forward)
            steps.insert(0, ("tpep", ALL_GATHER, b.count_bytes))
        ready = [gpu.last_key(gpu.lane)]
        sent = None
        for group, kind, nbytes in steps:
            if nbytes is None:
                transfer = moe.flex_transfer(gpu, into, forward)
            else:
                # under skew an all-to-all-v weighted as MoeBlock._comm weighs it
                loads = (moe.loads, not into) if group == "ep" and moe.loads is not None else None
                transfer = gpu.comm.expert(group, kind, nbytes, gpu.j, gpu.d, loads)
            if transfer is None:
                continue
            rendezvous = None
            if gpu.exact:
                offset = gpu.comm.expert_offset(group, gpu.j, gpu.d)
                rendezvous = gpu.rendezvous(EP_COMM, (group, offset))
            sent = gpu.builder.add(
                self.lane,
                EP_COMM,
                label,
                transfer=transfer,
                rendezvous=rendezvous,
                microbatch=mb,
                deps=ready,
            )
            ready = []
        if during is not None:
            gpu.work(BACKWARD, label, mb, during)
        yield
        if sent is not None:
            gpu.barrier(label, [sent], mb)

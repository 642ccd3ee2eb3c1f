"""From a scenario to a workload: Megatron-style TP/PP/DP as ops on lanes.

One lane per pipeline stage is simulated: tensor rank 0 of replica 0 (placement.py
says where ranks sit). Every GPU of the stage does the same work at the same time,
and each communication op carries the flows of all the groups the lane stands for
(see collectives.py), so the network sees the whole cluster's traffic. Exact mode
(``network.symmetry = false``) lowers every GPU instead.

Per micro-batch and stage (Megatron-LM):
- forward: [embedding] then per layer: attention block, TP all-reduce, MLP
  block, TP all-reduce; [logits + loss]; send activations to the next stage;
- backward: [loss + logits backward] then per layer, last first: [recompute
  the layer's forward (full) or its attention core (selective)], MLP backward,
  TP all-reduce, attention backward, TP all-reduce; [embedding backward]; send
  gradients to the previous stage;
- with sequence parallelism each all-reduce becomes an all-gather before the
  block and a reduce-scatter after it, with layernorm and dropout sharded.

Pipeline sends are b*s*h elements per stage boundary, split across the tensor
ranks (each sends its 1/T shard over its own NIC, Megatron's scatter-gather
optimisation; the all-gather that follows on NVLink is left out). How gradients
meet across data-parallel replicas, and the optimizer step, is the data-parallel
strategy's (dataparallel.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from schedules import Step, holder_of, peak_inflight, stage_of, step_label
from schedules import build as build_schedule

from ..scenario import Scenario
from ..units import us_to_s
from ..vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    FORWARD,
    PP_SEND,
    RECOMPUTE,
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
    TP_COMM,
    WEIGHT,
)
from .collectives import Fabric
from .compute import ComputeModel, Work
from .dataparallel import strategy_for
from .gpuops import GpuOps
from .keys import AsyncTpKey, PipelineKey
from .ops import Workload, WorkloadBuilder
from .placement import StageComm, placement_of


def stage_orders(scenario: Scenario) -> list[list[Step]]:
    """Each pipeline rank's op order under the scenario's schedule."""
    par, tr = scenario.parallel, scenario.training
    if tr.custom_orders is not None:
        return [list(order) for order in tr.custom_orders]
    return build_schedule(
        tr.schedule,
        par.pipeline_model_parallel_size,
        scenario.num_microbatches,
        par.virtual_pipeline_model_parallel_size,
        tr.microbatch_group_size_per_vp_stage,
    )


def lower(scenario: Scenario, cluster) -> Workload:
    """Build the ops of one training iteration: one compute lane per pipeline stage
    (symmetric mode) or per GPU (exact mode, ``network.symmetry = false``). Raises
    collectives.LayoutError when the layout's congruent groups are not alike."""
    placement = placement_of(scenario)
    fabric = Fabric.of(cluster, us_to_s(scenario.cluster.collective_base_latency_us))
    compute = ComputeModel(scenario)
    builder = WorkloadBuilder()
    orders = stage_orders(scenario)
    if scenario.network.symmetry:
        ranks = [(0, 0)]
    else:
        ranks = [(j, d) for d in range(placement.data) for j in range(placement.tensor)]
    for stage, order in enumerate(orders):
        comm = StageComm(scenario, fabric, placement, stage)
        for j, d in ranks:
            _Stage(GpuOps(builder, comm, j, d), scenario, compute).lower(order)
    return builder.build()


class _Stage:
    """The ops of one simulated GPU of a pipeline stage, pass by pass in its schedule's
    order: compute, tensor-parallel collectives and pipeline hand-overs here; the
    gradient sync and (FSDP) parameter gathers by its data-parallel strategy
    (dataparallel.py), called around each pass, each layer and at the end.

    With v chunks per rank, chunk k holds virtual stage ``stage_of(rank, k)`` and
    ``scenario.chunk_layers[rank][k]`` layers (L / (p v), or Megatron-Core's uneven
    split, stages.stage_layers); a chunk sends to the rank holding the next virtual stage, or,
    when that is itself (the turn of ZB-V's V), hands over with no transfer."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        self.gpu, self.stage, self.who = gpu, gpu.stage, gpu.who
        self.pipeline = gpu.comm.placement.pipeline
        training, p = scenario.training, self.pipeline
        v = scenario.parallel.virtual_pipeline_model_parallel_size
        self.num_chunks, self.num_virtual = v, p * v
        self.placement = training.placement
        self.split = training.split_backward
        self.virtual = [stage_of(self.stage, k, p, self.placement) for k in range(v)]
        counts = scenario.chunk_layers[self.stage]
        # rank-local layer indices: chunk k's follow chunk k-1's
        self.chunk_starts = [sum(counts[:k]) for k in range(v + 1)]
        self.sequence_parallel = scenario.parallel.sequence_parallel
        self.recompute = training.recompute_granularity
        # the async TP all-reduce needs the weight gradient right after the input's
        self.async_tp = training.async_tensor_model_parallel_allreduce and not self.split
        self.async_count = 0
        self.layer, self.extras = compute.layer(), compute.extras()
        self.dp = strategy_for(gpu, scenario, compute)

    # -- small builders -----------------------------------------------------------------

    def tp(self, label: str, mb: int, kind: str, deps: Sequence[object]) -> Sequence[object]:
        """A TP collective if the group has more than one GPU; returns deps not yet used."""
        transfer = self.gpu.comm.tp(kind, self.gpu.d)
        if transfer is None:
            return deps
        self.gpu.collective(self.gpu.lane, TP_COMM, label, transfer, microbatch=mb, deps=deps)
        return ()

    def block(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        """A block and its TP collective (an all-gather before it under SP). ``deps`` go
        on the block's first op, so nothing starts before its input arrives."""
        if self.sequence_parallel:
            deps = self.tp(label, mb, ALL_GATHER, deps)
        self.gpu.work(kind, label, mb, w, deps)
        self.tp(label, mb, REDUCE_SCATTER if self.sequence_parallel else ALL_REDUCE, ())

    def backward_block(self, label: str, mb: int, w: Work, last_weight: Work, deps) -> None:
        """A block's backward. With the async TP all-reduce, the input gradient's
        collective runs while the weight gradient of the block's first GEMM computes,
        and what follows waits for it (an all-gather under SP stays in front)."""
        kind = REDUCE_SCATTER if self.sequence_parallel else ALL_REDUCE
        transfer = self.gpu.comm.tp(kind, self.gpu.d)
        if not self.async_tp or transfer is None:
            self.block(BACKWARD, label, mb, w, deps)
            return
        if self.sequence_parallel:
            deps = self.tp(label, mb, ALL_GATHER, deps)
        gpu = self.gpu
        gpu.work(BACKWARD, label, mb, w - last_weight, deps)
        self.async_count += 1
        key = AsyncTpKey(self.who, self.stage, self.async_count)
        gpu.collective(gpu.lane, TP_COMM, label, transfer, microbatch=mb, blocking=False, key=key)
        gpu.work(BACKWARD, label, mb, last_weight)
        gpu.barrier(label, [key], mb)

    def hand_over(self, label: str, mb: int, kind: str, virtual: int, to: int) -> None:
        """Make this pass's output available to virtual stage ``to``: a pipeline send, or
        nothing but a name when this rank holds that stage too."""
        gpu = self.gpu
        key = PipelineKey(self.who, virtual, kind, mb)
        other = holder_of(to, self.pipeline, self.placement)[0]
        if other == self.stage:
            gpu.builder.name_last(gpu.lane, key)
            return
        gpu.builder.add(
            gpu.lane,
            PP_SEND,
            label,
            microbatch=mb,
            transfer=gpu.comm.send_to(other, gpu.j, gpu.d),
            blocking=False,
            key=key,
        )

    def layers(self, chunk: int) -> list[int]:
        """The rank-local indices of a chunk's layers, in forward order."""
        return list(range(self.chunk_starts[chunk], self.chunk_starts[chunk + 1]))

    # -- the stage ----------------------------------------------------------------------

    def lower(self, order: Sequence[Step]) -> None:
        grad = "W" if self.split else "B"
        last_grad = {s.chunk: i for i, s in enumerate(order) if s.kind == grad}
        for position, step in enumerate(order):
            last = last_grad[step.chunk] == position
            if step.kind == "F":
                self.forward(step)
            elif step.kind == "B":
                self.backward(step, last)
            else:
                self.weight(step, last)
        self.dp.finish()

    def forward(self, step: Step) -> None:
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        first, last = virtual == 0, virtual == self.num_virtual - 1
        recv: list[object] = [] if first else [PipelineKey(self.who, virtual - 1, "F", mb)]
        layers = self.layers(step.chunk)
        dp = self.dp.forward_pass(label, mb, step.chunk, layers)
        if first:
            self.gpu.work(FORWARD, label, mb, self.extras.embedding_forward, recv + dp.first())
            recv = []
        for n, index in enumerate(layers):
            self.block(
                FORWARD, label, mb, self.layer.attention_forward, recv + dp.before_layer(index)
            )
            self.block(FORWARD, label, mb, self.layer.mlp_forward)
            dp.after_layer(n, index)
            recv = []
        if last:
            self.gpu.work(FORWARD, label, mb, self.extras.output_forward)
        else:
            self.hand_over(label, mb, "F", virtual, virtual + 1)

    def backward(self, step: Step, last_microbatch: bool) -> None:
        """The backward pass, or under a split schedule its input-gradient part (B)."""
        mb, virtual, layer = step.microbatch, self.virtual[step.chunk], self.layer
        label = step_label(step, self.num_chunks)
        first, last = virtual == 0, virtual == self.num_virtual - 1
        recv: list[object] = [] if last else [PipelineKey(self.who, virtual + 1, "B", mb)]
        order = list(reversed(self.layers(step.chunk)))
        dp = self.dp.backward_pass(label, mb, step.chunk, order, last_microbatch)
        split = self.split
        if last:
            output = self.extras.output_backward
            if split:
                output = output - self.extras.output_weight
            self.gpu.work(BACKWARD, label, mb, output, recv + dp.first())
            recv = []
        mlp, attention = layer.mlp_backward, layer.attention_backward
        if split:
            mlp, attention = mlp - layer.mlp_weight, attention - layer.attention_weight
        for n, index in enumerate(order):
            recv = recv + dp.before_layer(index)
            if self.recompute == RECOMPUTE_FULL:
                self.block(RECOMPUTE, label, mb, layer.attention_forward, recv)
                self.block(RECOMPUTE, label, mb, layer.mlp_forward)
                recv = []
            elif self.recompute == RECOMPUTE_SELECTIVE:
                self.gpu.work(RECOMPUTE, label, mb, layer.attention_core_forward, recv)
                recv = []
            self.backward_block(label, mb, mlp, layer.mlp_last_weight, recv)
            self.backward_block(label, mb, attention, layer.attention_last_weight, ())
            dp.after_layer(n, index)
            recv = []
        if first and not split:
            self.gpu.work(BACKWARD, label, mb, self.extras.embedding_backward)
        dp.end()
        if not first:
            self.hand_over(label, mb, "B", virtual, virtual - 1)

    def weight(self, step: Step, last_microbatch: bool) -> None:
        """The weight-gradient part (W) of a split backward: no communication but what
        the data-parallel strategy adds after each layer."""
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        if virtual == self.num_virtual - 1:
            self.gpu.work(WEIGHT, label, mb, self.extras.output_weight)
        order = list(reversed(self.layers(step.chunk)))
        dp = self.dp.weight_pass(label, mb, step.chunk, order, last_microbatch)
        for n, index in enumerate(order):
            self.gpu.work(WEIGHT, label, mb, self.layer.mlp_weight)
            self.gpu.work(WEIGHT, label, mb, self.layer.attention_weight)
            if virtual == 0 and n == len(order) - 1:
                self.gpu.work(WEIGHT, label, mb, self.extras.embedding_weight)
            dp.after_layer(n, index)


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak forwards whose activations each stage holds under the schedule: released
    by the backward, or by the weight gradient when the schedule splits it."""
    return [peak_inflight(order, "W") for order in stage_orders(scenario)]

"""From a scenario to a workload: Megatron-style TP/PP/DP as ops on lanes.

Placement follows Megatron-LM's rank order, tensor-parallel fastest, then
data-parallel, then pipeline: ``gpu = tp + T * (dp + D * pp)``, so a
tensor-parallel group sits inside a node whenever T divides the node size.

One lane per pipeline stage is simulated: tensor rank 0 of replica 0. Every
GPU of the stage does the same work at the same time, and each communication
op carries the flows of all the groups the lane stands for (see
collectives.py), so the network sees the whole cluster's traffic.

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
optimisation; the all-gather that follows on NVLink is left out). After its
last backward each stage all-reduces its gradients across data-parallel
replicas, or, with ``overlap_grad_reduce``, one bucket per layer as soon as
that layer's last backward is done; then the optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedules import Step, holder_of, peak_inflight, stage_of, step_label
from schedules import build as build_schedule

from ..engine.flows import Collective, Transfer
from ..scenario.spec import Scenario
from ..units import us_to_s
from ..vocabulary import (
    BACKWARD,
    BARRIER,
    COMPUTE_STREAM,
    DP_SYNC,
    FORWARD,
    OPTIMIZER,
    PP_SEND,
    RECOMPUTE,
    STREAM_OF_COMM,
    TP_COMM,
    WEIGHT,
)
from . import collectives
from .collectives import Fabric
from .compute import BYTES_PER_ELEMENT, ComputeModel, Work
from .memory import GRADIENT_BYTES_PER_PARAM, layer_params_per_rank, stage_params_per_rank
from .ops import Workload, WorkloadBuilder


@dataclass(frozen=True, slots=True)
class Layout:
    tensor: int
    data: int
    pipeline: int

    def gpu(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tensor * (dp + self.data * pp)

    def tp_group(self, dp: int, pp: int) -> list[int]:
        return [self.gpu(j, dp, pp) for j in range(self.tensor)]

    def dp_group(self, tp: int, pp: int) -> list[int]:
        return [self.gpu(tp, d, pp) for d in range(self.data)]


def layout_of(scenario: Scenario) -> Layout:
    p = scenario.parallel
    return Layout(
        p.tensor_model_parallel_size, p.data_parallel_size, p.pipeline_model_parallel_size
    )


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


class _StageComm:
    """The transfers one stage uses, built once per stage and shape.

    Symmetric mode: each transfer is the representative GPU's (tensor rank 0 of replica
    0) and carries the flows of every congruent group of the stage. Exact mode: the
    transfer of the group of GPU (tensor rank ``j``, replica ``d``) alone."""

    def __init__(self, scenario: Scenario, fabric: Fabric, layout: Layout, stage: int) -> None:
        self.fabric, self.layout, self.stage = fabric, layout, stage
        self.exact = not scenario.network.symmetry
        self.algorithm = scenario.network.collective_algorithm
        m, b = scenario.model, scenario.training.micro_batch_size
        self.activation_bytes = b * m.seq_length * m.hidden_size * BYTES_PER_ELEMENT
        self.shard_bytes = self.activation_bytes / layout.tensor
        self._cache: dict[tuple, Transfer | Collective | None] = {}

    def tp(self, kind: str, d: int) -> Transfer | Collective | None:
        """A tensor-parallel ``all_reduce``, ``reduce_scatter`` or ``all_gather`` of one
        micro-batch's activations in replica ``d``; None for one tensor rank."""
        key = ("tp", kind, d if self.exact else 0)
        if key not in self._cache:
            layout = self.layout
            replicas = [d] if self.exact else range(layout.data)
            groups = [layout.tp_group(r, self.stage) for r in replicas]
            if kind == "all_reduce":
                made = collectives.all_reduce(
                    self.algorithm, groups, self.activation_bytes, self.fabric
                )
            else:
                made = collectives.ring(kind, groups, self.activation_bytes, self.fabric)
            self._cache[key] = made
        return self._cache[key]

    def send_to(self, other: int, j: int, d: int) -> Transfer:
        """Activations or gradients of one micro-batch to pipeline rank ``other``."""
        key = ("send", other, *((j, d) if self.exact else (0, 0)))
        if key not in self._cache:
            layout = self.layout
            if self.exact:
                ranks = [(j, d)]
            else:
                ranks = [(t, r) for r in range(layout.data) for t in range(layout.tensor)]
            pairs = [(layout.gpu(t, r, self.stage), layout.gpu(t, r, other)) for t, r in ranks]
            self._cache[key] = collectives.point_to_point(pairs, self.shard_bytes, self.fabric)
        return self._cache[key]

    def dp_collective(self, kind: str, message_bytes: float, j: int) -> Collective | None:
        """``all-reduce``, ``reduce-scatter`` or ``all-gather`` over the data-parallel
        group of tensor rank ``j`` (and, symmetric, the congruent groups of the others)."""
        key = ("dp", kind, message_bytes, j if self.exact else 0)
        if key not in self._cache:
            layout = self.layout
            ranks = [j] if self.exact else range(layout.tensor)
            groups = [layout.dp_group(t, self.stage) for t in ranks]
            if kind == "all-reduce":
                made = collectives.all_reduce(self.algorithm, groups, message_bytes, self.fabric)
            else:
                ring_kind = {"reduce-scatter": "reduce_scatter", "all-gather": "all_gather"}[kind]
                made = collectives.ring(ring_kind, groups, message_bytes, self.fabric)
            self._cache[key] = made
        return self._cache[key]


def lower(scenario: Scenario, cluster) -> Workload:
    """Build the ops of one training iteration: one compute lane per pipeline stage
    (symmetric mode) or per GPU (exact mode, ``network.symmetry = false``)."""
    layout = layout_of(scenario)
    fabric = Fabric.of(cluster, us_to_s(scenario.cluster.collective_base_latency_us))
    compute = ComputeModel(scenario)
    builder = WorkloadBuilder()
    orders = stage_orders(scenario)
    if scenario.network.symmetry:
        ranks = [(0, 0)]
    else:
        ranks = [(j, d) for d in range(layout.data) for j in range(layout.tensor)]
    for stage, order in enumerate(orders):
        comm = _StageComm(scenario, fabric, layout, stage)
        for j, d in ranks:
            _Stage(builder, scenario, comm, compute, stage, j, d).lower(order)
    return builder.build()


class _Stage:
    """The ops of one GPU of a pipeline stage (tensor rank ``j`` of replica ``d``): its
    compute lane and, under fully sharded data parallelism, a second lane (stream "dp")
    for the parameter all-gathers and gradient reduce-scatters, which FSDP runs one at
    a time on its own stream. Symmetric mode lowers only (0, 0), standing for the
    stage's T x D GPUs; exact mode lowers every GPU, and its collectives are
    rendezvous named by the group and a running count (every member lowers the same
    ops in the same order, so the counts agree).

    With v chunks per rank, chunk k holds virtual stage ``stage_of(rank, k)`` and
    L / (p v) layers; a chunk sends to the rank holding the next virtual stage, or,
    when that is itself (the turn of ZB-V's V), hands over with no transfer."""

    def __init__(self, builder, scenario, comm: _StageComm, compute, stage, j, d) -> None:
        layout = comm.layout
        self.b, self.stage, self.layout = builder, stage, layout
        self.j, self.d, self.who = j, d, (j, d)
        self.exact = comm.exact
        self.num_collectives = {"tp": 0, "dp": 0}
        p, v = layout.pipeline, scenario.parallel.virtual_pipeline_model_parallel_size
        self.num_chunks, self.num_virtual = v, p * v
        placement = scenario.training.placement
        self.split = scenario.training.split_backward
        self.virtual = [stage_of(stage, k, p, placement) for k in range(v)]
        self.placement = placement
        self.layers_per_chunk = scenario.model.num_layers // (p * v)
        self.sequence_parallel = scenario.parallel.sequence_parallel
        self.recompute = scenario.training.recompute_granularity
        sharded = layout.data > 1
        self.sharding = scenario.training.data_parallel_sharding if sharded else "none"
        self.overlap = scenario.training.overlap_grad_reduce and sharded
        # the async TP all-reduce needs the weight gradient right after the input's
        self.async_tp = scenario.training.async_tensor_model_parallel_allreduce and not self.split
        self.async_count = 0
        self.comm = comm
        self.layer, self.extras, self.compute = compute.layer(), compute.extras(), compute
        self.layer_params = layer_params_per_rank(scenario)
        self.params = stage_params_per_rank(scenario, stage)
        self.rest_params = self.params - v * self.layers_per_chunk * self.layer_params
        # the chunk whose passes carry the embedding/output weights (FSDP gathers them)
        self.rest_chunk = 0 if stage == 0 else v - 1
        gpu = layout.gpu(j, d, stage)
        stands_for = 1 if self.exact else layout.tensor * layout.data
        self.lane = builder.lane(gpu=gpu, stream=COMPUTE_STREAM, stage=stage, stands_for=stands_for)
        self.side = None
        if self.sharding == "full":
            self.side = builder.lane(
                gpu=gpu, stream=STREAM_OF_COMM[DP_SYNC], stage=stage, stands_for=stands_for
            )

    # -- small builders -----------------------------------------------------------------

    def work(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        if w.duration_s == 0 and w.flops == 0 and not deps:
            return
        self.b.add(
            self.lane, kind, label, microbatch=mb, duration_s=w.duration_s, flops=w.flops, deps=deps
        )

    def collective(self, lane: int, kind: str, label: str, transfer, **fields) -> None:
        """A collective op (TP_COMM or DP_SYNC); in exact mode a rendezvous of the group."""
        group = "tp" if kind == TP_COMM else "dp"
        rendezvous = None
        if self.exact:
            n = self.num_collectives[group] = self.num_collectives[group] + 1
            # a TP group is the replica's tensor ranks, a DP group the tensor rank's replicas
            rendezvous = (group, self.stage, self.d if group == "tp" else self.j, n)
        self.b.add(lane, kind, label, transfer=transfer, rendezvous=rendezvous, **fields)

    def tp(self, label: str, mb: int, kind: str, deps: Sequence[object]) -> Sequence[object]:
        """A TP collective if the group has more than one GPU; returns deps not yet used."""
        transfer = self.comm.tp(kind, self.d)
        if transfer is None:
            return deps
        self.collective(self.lane, TP_COMM, label, transfer, microbatch=mb, deps=deps)
        return ()

    def block(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        """A block and its TP collective (an all-gather before it under SP). ``deps`` go
        on the block's first op, so nothing starts before its input arrives."""
        if self.sequence_parallel:
            deps = self.tp(label, mb, "all_gather", deps)
        self.work(kind, label, mb, w, deps)
        self.tp(label, mb, "reduce_scatter" if self.sequence_parallel else "all_reduce", ())

    def backward_block(self, label: str, mb: int, w: Work, last_weight: Work, deps) -> None:
        """A block's backward. With the async TP all-reduce, the input gradient's
        collective runs while the weight gradient of the block's first GEMM computes,
        and what follows waits for it (an all-gather under SP stays in front)."""
        kind = "reduce_scatter" if self.sequence_parallel else "all_reduce"
        transfer = self.comm.tp(kind, self.d)
        if not self.async_tp or transfer is None:
            self.block(BACKWARD, label, mb, w, deps)
            return
        if self.sequence_parallel:
            deps = self.tp(label, mb, "all_gather", deps)
        self.work(BACKWARD, label, mb, w - last_weight, deps)
        self.async_count += 1
        key = ("tp async", self.who, self.stage, self.async_count)
        self.collective(self.lane, TP_COMM, label, transfer, microbatch=mb, blocking=False, key=key)
        self.work(BACKWARD, label, mb, last_weight)
        self.b.add(self.lane, BARRIER, label, microbatch=mb, deps=[key])

    def hand_over(self, label: str, mb: int, kind: str, virtual: int, to: int) -> None:
        """Make this pass's output available to virtual stage ``to``: a pipeline send, or
        nothing but a name when this rank holds that stage too."""
        key = ("pp", self.who, virtual, kind, mb)
        other = holder_of(to, self.layout.pipeline, self.placement)[0]
        if other == self.stage:
            self.b.name_last(self.lane, key)
            return
        self.b.add(
            self.lane,
            PP_SEND,
            label,
            microbatch=mb,
            transfer=self.comm.send_to(other, self.j, self.d),
            blocking=False,
            key=key,
        )

    def shard_op(self, kind: str, label: str, mb: int, index: int, deps, rest: bool) -> tuple:
        """A parameter all-gather or gradient reduce-scatter of one layer on the side lane;
        with ``rest`` it also carries the stage's embedding/output weights."""
        key = ("fsdp", self.who, self.stage, label, kind, index)
        params = self.layer_params + (self.rest_params if rest else 0.0)
        self.collective(
            self.side,
            DP_SYNC,
            f"{label} {kind} layer {index}",
            self.comm.dp_collective(kind, params * GRADIENT_BYTES_PER_PARAM, self.j),
            microbatch=mb,
            deps=deps,
            key=key,
        )
        return key

    def layers(self, chunk: int) -> list[int]:
        """The rank-local indices of a chunk's layers, in forward order."""
        return list(range(chunk * self.layers_per_chunk, (chunk + 1) * self.layers_per_chunk))

    # -- the stage ----------------------------------------------------------------------

    def lower(self, order: Sequence[Step]) -> None:
        grad = "W" if self.split else "B"
        last_grad = {s.chunk: i for i, s in enumerate(order) if s.kind == grad}
        buckets: list[tuple] = []
        for position, step in enumerate(order):
            last = last_grad[step.chunk] == position
            if step.kind == "F":
                self.forward(step)
            elif step.kind == "B":
                buckets += self.backward(step, last)
            else:
                buckets += self.weight(step, last)
        self.finish(buckets)

    def forward(self, step: Step) -> None:
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        first, last = virtual == 0, virtual == self.num_virtual - 1
        recv: list[object] = [] if first else [("pp", self.who, virtual - 1, "F", mb)]
        rest = step.chunk == self.rest_chunk
        gathers = _Gathers(self, label, mb, self.layers(step.chunk), rest)
        for n in range(self.layers_per_chunk):
            gathers.queue(n)
        if first:
            self.work(FORWARD, label, mb, self.extras.embedding_forward, recv + gathers.first())
            recv = []
        for index in self.layers(step.chunk):
            self.block(FORWARD, label, mb, self.layer.attention_forward, recv + gathers.deps(index))
            self.block(FORWARD, label, mb, self.layer.mlp_forward)
            self.b.name_last(self.lane, ("layer", self.who, self.stage, label, index))
            recv = []
        if last:
            self.work(FORWARD, label, mb, self.extras.output_forward)
        else:
            self.hand_over(label, mb, "F", virtual, virtual + 1)

    def backward(self, step: Step, last_microbatch: bool) -> list[tuple]:
        """The backward pass, or under a split schedule its input-gradient part (B)."""
        mb, virtual, layer = step.microbatch, self.virtual[step.chunk], self.layer
        label = step_label(step, self.num_chunks)
        first, last = virtual == 0, virtual == self.num_virtual - 1
        recv: list[object] = [] if last else [("pp", self.who, virtual + 1, "B", mb)]
        order = list(reversed(self.layers(step.chunk)))
        gathers = _Gathers(self, label, mb, order, step.chunk == self.rest_chunk)
        gathers.queue(0)
        gathers.queue(1)
        split = self.split
        if last:
            output = self.extras.output_backward
            if split:
                output = output - self.extras.output_weight
            self.work(BACKWARD, label, mb, output, recv + gathers.first())
            recv = []
        mlp, attention = layer.mlp_backward, layer.attention_backward
        if split:
            mlp, attention = mlp - layer.mlp_weight, attention - layer.attention_weight
        buckets = []
        for n, index in enumerate(order):
            recv = recv + gathers.deps(index)
            if self.recompute == "full":
                self.block(RECOMPUTE, label, mb, layer.attention_forward, recv)
                self.block(RECOMPUTE, label, mb, layer.mlp_forward)
                recv = []
            elif self.recompute == "selective":
                self.work(RECOMPUTE, label, mb, layer.attention_core_forward, recv)
                recv = []
            self.backward_block(label, mb, mlp, layer.mlp_last_weight, recv)
            self.backward_block(label, mb, attention, layer.attention_last_weight, ())
            self.b.name_last(self.lane, ("layer", self.who, self.stage, label, index))
            recv = []
            if self.side is not None and not split and n < len(order) - 1:
                # FSDP's order: this layer's reduce-scatter, then the gather two ahead
                self.shard_op(
                    "reduce-scatter",
                    label,
                    mb,
                    index,
                    [("layer", self.who, self.stage, label, index)],
                    False,
                )
            elif self.overlap and last_microbatch and not split:
                buckets.append(self.bucket(f"grads layer {index}", mb, self.layer_params))
            gathers.queue(n + 2)
        if first and not split:
            self.work(BACKWARD, label, mb, self.extras.embedding_backward)
        if self.side is not None and not split:
            # the last layer's gradients, with the embedding/output ones, once all are done
            self.shard_op(
                "reduce-scatter",
                label,
                mb,
                order[-1],
                [self.b.last_key(self.lane)],
                step.chunk == self.rest_chunk,
            )
        if not first:
            self.hand_over(label, mb, "B", virtual, virtual - 1)
        return buckets

    def weight(self, step: Step, last_microbatch: bool) -> list[tuple]:
        """The weight-gradient part (W) of a split backward: no communication but the
        gradient reduce-scatters of FSDP and, after the last micro-batch, the buckets."""
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        rest = step.chunk == self.rest_chunk
        if virtual == self.num_virtual - 1:
            self.work(WEIGHT, label, mb, self.extras.output_weight)
        order = list(reversed(self.layers(step.chunk)))
        buckets = []
        for n, index in enumerate(order):
            self.work(WEIGHT, label, mb, self.layer.mlp_weight)
            self.work(WEIGHT, label, mb, self.layer.attention_weight)
            if virtual == 0 and n == len(order) - 1:
                self.work(WEIGHT, label, mb, self.extras.embedding_weight)
            if self.side is not None:
                last_layer = n == len(order) - 1
                self.shard_op(
                    "reduce-scatter",
                    label,
                    mb,
                    index,
                    [self.b.last_key(self.lane)],
                    rest and last_layer,
                )
            elif self.overlap and last_microbatch:
                buckets.append(self.bucket(f"grads layer {index}", mb, self.layer_params))
        return buckets

    def bucket(self, label: str, mb: int, num_params: float) -> tuple:
        """An overlapped gradient bucket: all-reduced, or reduce-scattered under ZeRO-1."""
        key = ("dp", self.who, self.stage, label)
        kind = "reduce-scatter" if self.sharding == "optimizer" else "all-reduce"
        self.collective(
            self.lane,
            DP_SYNC,
            label,
            self.comm.dp_collective(kind, num_params * GRADIENT_BYTES_PER_PARAM, self.j),
            microbatch=mb,
            blocking=False,
            key=key,
        )
        return key

    def finish(self, buckets: list[tuple]) -> None:
        """Gradient sync, optimizer step, and the parameter all-gather of ZeRO-1."""
        params, data = self.params, self.layout.data
        message = params * GRADIENT_BYTES_PER_PARAM
        if self.sharding == "full":
            self.b.add(
                self.lane,
                BARRIER,
                "wait for gradient reduce-scatters",
                deps=[self.b.last_key(self.side)],
            )
        elif self.overlap:
            buckets.append(self.bucket("grads embedding/output", -1, self.rest_params))
            self.b.add(self.lane, BARRIER, "wait for gradient buckets", deps=buckets)
        elif data > 1:
            kind = "reduce-scatter" if self.sharding == "optimizer" else "all-reduce"
            self.collective(
                self.lane, DP_SYNC, f"grads {kind}", self.comm.dp_collective(kind, message, self.j)
            )
        sharded = self.sharding in ("optimizer", "full")
        self.work(
            OPTIMIZER, "optimizer", -1, self.compute.optimizer(params / data if sharded else params)
        )
        if self.sharding == "optimizer":
            self.collective(
                self.lane,
                DP_SYNC,
                "params all-gather",
                self.comm.dp_collective("all-gather", message, self.j),
            )


class _Gathers:
    """FSDP's parameter all-gathers for one pass over a chunk's layers, in ``order``.

    The n-th gather waits until the layer two before it in the pass is done, so one
    gather runs ahead of compute; with ``rest`` the first gather of a pass also brings
    the stage's embedding/output weights, which the pass needs first (or, for the
    last stage's forward, holds until its end)."""

    def __init__(self, stage: _Stage, label: str, mb: int, order: list[int], rest: bool) -> None:
        self.stage, self.label, self.mb, self.order, self.rest = stage, label, mb, order, rest
        self.keys: dict[int, tuple] = {}

    def queue(self, n: int) -> None:
        if self.stage.side is None or n >= len(self.order):
            return
        deps = (
            [("layer", self.stage.who, self.stage.stage, self.label, self.order[n - 2])]
            if n >= 2
            else []
        )
        self.keys[self.order[n]] = self.stage.shard_op(
            "all-gather",
            self.label,
            self.mb,
            self.order[n],
            deps,
            rest=self.rest and n == 0,
        )

    def deps(self, index: int) -> list[object]:
        return [self.keys[index]] if self.stage.side is not None else []

    def first(self) -> list[object]:
        """What the pass's embedding or output work waits for: the first gather."""
        return self.deps(self.order[0])


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak forwards whose activations each stage holds under the schedule: released
    by the backward, or by the weight gradient when the schedule splits it."""
    return [peak_inflight(order, "W") for order in stage_orders(scenario)]

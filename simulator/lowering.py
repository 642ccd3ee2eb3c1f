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

from schedules import Step, peak_inflight
from schedules import build as build_schedule

from . import collectives
from .collectives import Collective, Fabric, Transfer
from .compute import BYTES_PER_ELEMENT, ComputeModel, Work
from .memory import GRADIENT_BYTES_PER_PARAM, layer_params_per_rank, stage_params_per_rank
from .spec import Scenario
from .units import us_to_s
from .workload import (
    BACKWARD,
    BARRIER,
    DP_SYNC,
    FORWARD,
    OPTIMIZER,
    PP_SEND,
    RECOMPUTE,
    TP_COMM,
    Workload,
    WorkloadBuilder,
)


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
    return build_schedule(
        scenario.training.schedule,
        scenario.parallel.pipeline_model_parallel_size,
        scenario.num_microbatches,
    )


class _StageComm:
    """The transfers one stage uses, built once per stage."""

    def __init__(self, scenario: Scenario, fabric: Fabric, layout: Layout, stage: int) -> None:
        self.fabric, self.layout, self.stage = fabric, layout, stage
        self.algorithm = scenario.network.collective_algorithm
        m, b = scenario.model, scenario.training.micro_batch_size
        activation_bytes = b * m.seq_length * m.hidden_size * BYTES_PER_ELEMENT
        tp_groups = [layout.tp_group(d, stage) for d in range(layout.data)]
        self.tp = {
            kind: collectives.ring(kind, tp_groups, activation_bytes, fabric)
            for kind in ("reduce_scatter", "all_gather")
        }
        self.tp["all_reduce"] = collectives.all_reduce(
            self.algorithm, tp_groups, activation_bytes, fabric
        )
        shard_bytes = activation_bytes / layout.tensor
        self.send_next = self._p2p(stage + 1, shard_bytes)
        self.send_prev = self._p2p(stage - 1, shard_bytes)

    def _p2p(self, other: int, message_bytes: float) -> Transfer | None:
        if not 0 <= other < self.layout.pipeline:
            return None
        pairs = [
            (self.layout.gpu(j, d, self.stage), self.layout.gpu(j, d, other))
            for d in range(self.layout.data)
            for j in range(self.layout.tensor)
        ]
        return collectives.point_to_point(pairs, message_bytes, self.fabric)

    def dp_collective(self, kind: str, message_bytes: float) -> Collective | None:
        """``all-reduce``, ``reduce-scatter`` or ``all-gather`` over this stage's
        data-parallel groups (one per tensor rank)."""
        groups = [self.layout.dp_group(j, self.stage) for j in range(self.layout.tensor)]
        if kind == "all-reduce":
            return collectives.all_reduce(self.algorithm, groups, message_bytes, self.fabric)
        ring_kind = {"reduce-scatter": "reduce_scatter", "all-gather": "all_gather"}[kind]
        return collectives.ring(ring_kind, groups, message_bytes, self.fabric)


def lower(scenario: Scenario, cluster) -> Workload:
    """Build the ops of one training iteration, one compute lane per pipeline stage."""
    layout = layout_of(scenario)
    fabric = Fabric.of(cluster, us_to_s(scenario.cluster.collective_base_latency_us))
    compute = ComputeModel(scenario)
    builder = WorkloadBuilder()
    orders = stage_orders(scenario)
    for stage, order in enumerate(orders):
        _Stage(builder, scenario, fabric, layout, compute, stage).lower(order)
    return builder.build()


class _Stage:
    """The ops of one pipeline stage: its compute lane and, under fully sharded data
    parallelism, a second lane (stream "dp") for the parameter all-gathers and
    gradient reduce-scatters, which FSDP runs one at a time on its own stream."""

    def __init__(self, builder, scenario, fabric, layout, compute, stage) -> None:
        self.b, self.stage, self.layout = builder, stage, layout
        p = layout.pipeline
        self.first, self.last = stage == 0, stage == p - 1
        self.num_layers = scenario.model.num_layers // p
        self.sequence_parallel = scenario.parallel.sequence_parallel
        self.recompute = scenario.training.recompute_granularity
        sharded = layout.data > 1
        self.sharding = scenario.training.data_parallel_sharding if sharded else "none"
        self.overlap = scenario.training.overlap_grad_reduce and sharded
        self.comm = _StageComm(scenario, fabric, layout, stage)
        self.layer, self.extras, self.compute = compute.layer(), compute.extras(), compute
        self.layer_params = layer_params_per_rank(scenario)
        self.params = stage_params_per_rank(scenario, stage)
        self.rest_params = self.params - self.num_layers * self.layer_params  # embedding, output
        gpu = layout.gpu(0, 0, stage)
        stands_for = layout.tensor * layout.data
        self.lane = builder.lane(gpu=gpu, stream="compute", stage=stage, stands_for=stands_for)
        self.side = None
        if self.sharding == "full":
            self.side = builder.lane(gpu=gpu, stream="dp", stage=stage, stands_for=stands_for)

    # -- small builders -----------------------------------------------------------------

    def work(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        self.b.add(
            self.lane, kind, label, microbatch=mb, duration_s=w.duration_s, flops=w.flops, deps=deps
        )

    def tp(self, label: str, mb: int, kind: str, deps: Sequence[object]) -> Sequence[object]:
        """A TP collective if the group has more than one GPU; returns deps not yet used."""
        transfer = self.comm.tp[kind]
        if transfer is None:
            return deps
        self.b.add(self.lane, TP_COMM, label, microbatch=mb, transfer=transfer, deps=deps)
        return ()

    def block(self, kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        """A block and its TP collective (an all-gather before it under SP). ``deps`` go
        on the block's first op, so nothing starts before its input arrives."""
        if self.sequence_parallel:
            deps = self.tp(label, mb, "all_gather", deps)
        self.work(kind, label, mb, w, deps)
        self.tp(label, mb, "reduce_scatter" if self.sequence_parallel else "all_reduce", ())

    def send(self, label: str, mb: int, transfer, key: tuple) -> None:
        self.b.add(
            self.lane, PP_SEND, label, microbatch=mb, transfer=transfer, blocking=False, key=key
        )

    def shard_op(self, kind: str, label: str, mb: int, index: int, deps, rest: bool) -> tuple:
        """A parameter all-gather or gradient reduce-scatter of one layer on the side lane;
        with ``rest`` it also carries the stage's embedding/output weights."""
        key = ("fsdp", self.stage, label, kind, index)
        params = self.layer_params + (self.rest_params if rest else 0.0)
        self.b.add(
            self.side,
            DP_SYNC,
            f"{label} {kind} layer {index}",
            microbatch=mb,
            transfer=self.comm.dp_collective(kind, params * GRADIENT_BYTES_PER_PARAM),
            deps=deps,
            key=key,
        )
        return key

    # -- the stage ----------------------------------------------------------------------

    def lower(self, order: Sequence[Step]) -> None:
        last_backward = max(i for i, s in enumerate(order) if s.kind == "B")
        buckets: list[tuple] = []
        for position, step in enumerate(order):
            if step.kind == "F":
                self.forward(step.microbatch)
            else:
                buckets += self.backward(step.microbatch, position == last_backward)
        self.finish(buckets)

    def forward(self, mb: int) -> None:
        label, stage = f"F{mb}", self.stage
        recv: list[object] = [] if self.first else [("pp", stage - 1, "F", mb)]
        gathers = _Gathers(self, label, mb, list(range(self.num_layers)))
        for n in range(self.num_layers):
            gathers.queue(n)
        if self.first:
            self.work(FORWARD, label, mb, self.extras.embedding_forward, recv + gathers.deps(0))
            recv = []
        for index in range(self.num_layers):
            self.block(FORWARD, label, mb, self.layer.attention_forward, recv + gathers.deps(index))
            self.block(FORWARD, label, mb, self.layer.mlp_forward)
            self.b.name_last(self.lane, ("layer", stage, label, index))
            recv = []
        if self.last:
            self.work(FORWARD, label, mb, self.extras.output_forward)
        else:
            self.send(label, mb, self.comm.send_next, ("pp", stage, "F", mb))

    def backward(self, mb: int, last_microbatch: bool) -> list[tuple]:
        label, stage, layer = f"B{mb}", self.stage, self.layer
        recv: list[object] = [] if self.last else [("pp", stage + 1, "B", mb)]
        order = list(reversed(range(self.num_layers)))
        gathers = _Gathers(self, label, mb, order)
        gathers.queue(0)
        gathers.queue(1)
        if self.last:
            self.work(
                BACKWARD, label, mb, self.extras.output_backward, recv + gathers.deps(order[0])
            )
            recv = []
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
            self.block(BACKWARD, label, mb, layer.mlp_backward, recv)
            self.block(BACKWARD, label, mb, layer.attention_backward)
            self.b.name_last(self.lane, ("layer", stage, label, index))
            recv = []
            if self.side is not None and n < len(order) - 1:
                # FSDP's order: this layer's reduce-scatter, then the gather two ahead
                self.shard_op(
                    "reduce-scatter", label, mb, index, [("layer", stage, label, index)], rest=False
                )
                gathers.queue(n + 2)
            elif self.overlap and last_microbatch:
                buckets.append(self.bucket(f"grads layer {index}", mb, self.layer_params))
        if self.first:
            self.work(BACKWARD, label, mb, self.extras.embedding_backward)
        if self.side is not None:
            # the last layer's gradients, with the embedding/output ones, once all are done
            self.shard_op(
                "reduce-scatter", label, mb, order[-1], [self.b.last_key(self.lane)], rest=True
            )
        if not self.first:
            self.send(label, mb, self.comm.send_prev, ("pp", stage, "B", mb))
        return buckets

    def bucket(self, label: str, mb: int, num_params: float) -> tuple:
        """An overlapped gradient bucket: all-reduced, or reduce-scattered under ZeRO-1."""
        key = ("dp", self.stage, label)
        kind = "reduce-scatter" if self.sharding == "optimizer" else "all-reduce"
        self.b.add(
            self.lane,
            DP_SYNC,
            label,
            microbatch=mb,
            blocking=False,
            key=key,
            transfer=self.comm.dp_collective(kind, num_params * GRADIENT_BYTES_PER_PARAM),
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
            self.b.add(
                self.lane, DP_SYNC, f"grads {kind}", transfer=self.comm.dp_collective(kind, message)
            )
        sharded = self.sharding in ("optimizer", "full")
        self.work(
            OPTIMIZER, "optimizer", -1, self.compute.optimizer(params / data if sharded else params)
        )
        if self.sharding == "optimizer":
            self.b.add(
                self.lane,
                DP_SYNC,
                "params all-gather",
                transfer=self.comm.dp_collective("all-gather", message),
            )


class _Gathers:
    """FSDP's parameter all-gathers for one pass over a stage's layers, in ``order``.

    The n-th gather waits until the layer two before it in the pass is done, so one
    gather runs ahead of compute; the first gather of a pass also brings the stage's
    embedding/output weights, which the pass needs first (or, for the last stage's
    forward, holds until its end)."""

    def __init__(self, stage: _Stage, label: str, mb: int, order: list[int]) -> None:
        self.stage, self.label, self.mb, self.order = stage, label, mb, order
        self.keys: dict[int, tuple] = {}

    def queue(self, n: int) -> None:
        if self.stage.side is None or n >= len(self.order):
            return
        layer_done = ("layer", self.stage.stage, self.label, self.order[n - 2])
        self.keys[self.order[n]] = self.stage.shard_op(
            "all-gather",
            self.label,
            self.mb,
            self.order[n],
            [layer_done] if n >= 2 else [],
            rest=n == 0,
        )

    def deps(self, index: int) -> list[object]:
        return [self.keys[index]] if self.stage.side is not None else []


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak micro-batches whose activations each stage holds under the schedule."""
    return [peak_inflight(order) for order in stage_orders(scenario)]

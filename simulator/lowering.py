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

from schedules import SCHEDULES, Step, peak_inflight

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
    schedule = SCHEDULES[scenario.training.schedule]
    return schedule(scenario.parallel.pipeline_model_parallel_size, scenario.num_microbatches)


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

    def dp_all_reduce(self, num_params: float) -> Collective | None:
        groups = [self.layout.dp_group(j, self.stage) for j in range(self.layout.tensor)]
        message_bytes = num_params * GRADIENT_BYTES_PER_PARAM
        return collectives.all_reduce(self.algorithm, groups, message_bytes, self.fabric)


def lower(scenario: Scenario, cluster) -> Workload:
    """Build the ops of one training iteration, one compute lane per pipeline stage."""
    layout = layout_of(scenario)
    fabric = Fabric.of(cluster, us_to_s(scenario.cluster.collective_base_latency_us))
    compute = ComputeModel(scenario)
    builder = WorkloadBuilder()
    orders = stage_orders(scenario)
    for stage, order in enumerate(orders):
        _lower_stage(builder, scenario, fabric, layout, compute, stage, order)
    return builder.build()


def _lower_stage(
    builder: WorkloadBuilder,
    scenario: Scenario,
    fabric: Fabric,
    layout: Layout,
    compute: ComputeModel,
    stage: int,
    order: Sequence[Step],
) -> None:
    p = layout.pipeline
    first, last = stage == 0, stage == p - 1
    num_layers = scenario.model.num_layers // p
    sequence_parallel = scenario.parallel.sequence_parallel
    recompute = scenario.training.recompute_granularity
    overlap = scenario.training.overlap_grad_reduce and layout.data > 1
    comm = _StageComm(scenario, fabric, layout, stage)
    layer = compute.layer()
    extras = compute.extras()
    lane = builder.lane(
        gpu=layout.gpu(0, 0, stage),
        stream="compute",
        stage=stage,
        stands_for=layout.tensor * layout.data,
    )
    last_backward = max(i for i, s in enumerate(order) if s.kind == "B")
    bucket_keys: list[tuple] = []

    def work(kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        builder.add(
            lane, kind, label, microbatch=mb, duration_s=w.duration_s, flops=w.flops, deps=deps
        )

    def tp(label: str, mb: int, kind: str, deps: Sequence[object] = ()) -> Sequence[object]:
        """Add a TP collective if the group has more than one GPU; return deps not yet used."""
        transfer = comm.tp[kind]
        if transfer is None:
            return deps
        builder.add(lane, TP_COMM, label, microbatch=mb, transfer=transfer, deps=deps)
        return ()

    def block(kind: str, label: str, mb: int, w: Work, deps: Sequence[object] = ()) -> None:
        """A block followed by its TP collective (preceded by an all-gather under SP).
        ``deps`` go on the block's first op, so nothing starts before its input arrives."""
        if sequence_parallel:
            deps = tp(label, mb, "all_gather", deps)
        work(kind, label, mb, w, deps)
        tp(label, mb, "reduce_scatter" if sequence_parallel else "all_reduce")

    for position, step in enumerate(order):
        mb = step.microbatch
        label = f"{step.kind}{mb}"
        if step.kind == "F":
            recv = [("pp", stage - 1, "F", mb)] if not first else []
            if first:
                work(FORWARD, label, mb, extras.embedding_forward, recv)
                recv = []
            for _ in range(num_layers):
                block(FORWARD, label, mb, layer.attention_forward, recv)
                block(FORWARD, label, mb, layer.mlp_forward)
                recv = []
            if last:
                work(FORWARD, label, mb, extras.output_forward)
            else:
                builder.add(
                    lane,
                    PP_SEND,
                    label,
                    microbatch=mb,
                    transfer=comm.send_next,
                    blocking=False,
                    key=("pp", stage, "F", mb),
                )
            continue

        recv = [("pp", stage + 1, "B", mb)] if not last else []
        if last:
            work(BACKWARD, label, mb, extras.output_backward, recv)
            recv = []
        for index in reversed(range(num_layers)):
            if recompute == "full":
                block(RECOMPUTE, label, mb, layer.attention_forward, recv)
                block(RECOMPUTE, label, mb, layer.mlp_forward)
                recv = []
            elif recompute == "selective":
                work(RECOMPUTE, label, mb, layer.attention_core_forward, recv)
                recv = []
            block(BACKWARD, label, mb, layer.mlp_backward, recv)
            block(BACKWARD, label, mb, layer.attention_backward)
            recv = []
            if overlap and position == last_backward:
                key = ("dp", stage, index)
                builder.add(
                    lane,
                    DP_SYNC,
                    f"grads layer {index}",
                    microbatch=mb,
                    transfer=comm.dp_all_reduce(layer_params_per_rank(scenario)),
                    blocking=False,
                    key=key,
                )
                bucket_keys.append(key)
        if first:
            work(BACKWARD, label, mb, extras.embedding_backward)
        else:
            builder.add(
                lane,
                PP_SEND,
                label,
                microbatch=mb,
                transfer=comm.send_prev,
                blocking=False,
                key=("pp", stage, "B", mb),
            )

    params = stage_params_per_rank(scenario, stage)
    if overlap:
        rest = params - num_layers * layer_params_per_rank(scenario)  # embedding, output, norms
        key = ("dp", stage, "rest")
        builder.add(
            lane,
            DP_SYNC,
            "grads embedding/output",
            transfer=comm.dp_all_reduce(rest),
            blocking=False,
            key=key,
        )
        builder.add(lane, BARRIER, "wait for gradient buckets", deps=[*bucket_keys, key])
    elif layout.data > 1:
        builder.add(lane, DP_SYNC, "grads", transfer=comm.dp_all_reduce(params))
    work(OPTIMIZER, "optimizer", -1, compute.optimizer(params))


def inflight_per_stage(scenario: Scenario) -> list[int]:
    """Peak micro-batches whose activations each stage holds under the schedule."""
    return [peak_inflight(order) for order in stage_orders(scenario)]

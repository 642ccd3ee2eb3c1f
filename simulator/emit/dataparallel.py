"""Data-parallel strategies: how a stage's gradients meet across replicas.

Each ``training.data_parallel_sharding`` mode is one class behind one interface, which
the stage lowering (lowering.py) calls at fixed points:

- ``forward_pass``, ``backward_pass``, ``weight_pass`` before a pass over a chunk's
  layers; the `Pass` each returns is asked what the pass's first op and each layer's
  first op wait for, and told when a layer's ops and the pass's compute are added;
- ``finish`` at the end of the stage: the gradient sync still outstanding, then the
  optimizer step.

The modes (strategy.py's `strategy_for` picks one):

- `DataParallel` itself: one replica, nothing to synchronise;
- `AllReduceAfterFlush`: one blocking gradient all-reduce after the last backward;
- `OverlappedBuckets` (``overlap_grad_reduce``): a non-blocking all-reduce per layer as
  soon as its last weight gradient is done;
- `DistributedOptimizer` (ZeRO-1): gradients reduce-scattered (after the flush, or per
  layer when overlapped), the optimizer step on 1/D of the parameters, then the
  parameters all-gathered;
- `ShardedGradients` (ZeRO-2): as ZeRO-1, but every micro-batch's gradients are
  reduce-scattered per layer as soon as its backward is done (a gradient is not kept
  whole to accumulate over micro-batches);
- `FullySharded` (ZeRO-3/FSDP, in fsdp.py): a second lane per GPU (stream "dp") runs,
  one at a time as FSDP's stream does, each layer's parameter all-gather before its forward and
  backward and each layer's gradient reduce-scatter; the embedding and output weights
  ride with the gathers and reduce-scatters of the chunk that holds them.

Gradient collectives move ``training.communication_bytes`` per parameter (the
accumulation dtype unless ``communication_data_type`` says otherwise), parameter
all-gathers 2 (1 per linear weight with ``fp8_param_gather``: memory.gathered_param_bytes).
After the flush a stage's gradients go in calls of at most ``reduce_bucket_size``
elements, ZeRO-1's parameters in
max(1, N // ``allgather_bucket_size``) calls (DeepSpeed's buckets; 0: one call). ZeRO-1
reduce-scatters (Megatron-LM's distributed optimizer) or, with ``zero_grad_collective =
"all-reduce"``, all-reduces the gradients and keeps its 1/D (DeepSpeed's stage 1).

With ``share_embeddings_and_output_weights`` and the output layer on another rank than
the embedding, those two ranks all-reduce the word embedding's gradient (V/T x h
elements of the gradient buffer's dtype) per (tensor rank, replica), as a rendezvous of
the two stages' lanes, before or after the data-parallel collective as
``tied_grad_reduce_order`` says (docs/frameworks.md §3-§6).
"""

from __future__ import annotations

import math

from stepsim.schedules import DUAL

from ..cost.compute import ComputeModel
from ..cost.memory import WEIGHT_BYTES_PER_PARAM, gathered_param_bytes, optimizer_sharded
from ..cost.params import (
    layer_params_of,
    layer_params_per_rank,
    output_rank,
    stage_expert_params_per_rank,
    stage_params_per_rank,
)
from ..ir.keys import BucketKey, CopiesKey, CopiesReadyKey, ShardKey, TiedKey, TiedReadyKey
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    COLLECTIVE_LABELS,
    DP_SYNC,
    OPTIMIZER,
    REDUCE_SCATTER,
    STREAM_OF_COMM,
    TIED_AFTER_DP,
    TIED_BEFORE_DP,
    ZERO_ALL_REDUCE,
)
from ..scenario import Scenario
from .gpuops import GpuOps
from .moe_ops import expert_collective


class Pass:
    """What a strategy adds around one pass over a chunk's layers; this one adds nothing.

    The stage lowering calls ``first()`` for the deps of the pass's embedding or output
    work, ``before_layer(index)`` for those of a layer's first op, ``after_layer(n,
    index)`` once the ops of the pass's n-th layer (rank-local index ``index``) are
    added, and ``end()`` after the pass's last compute op."""

    def first(self) -> list[object]:
        return []

    def before_layer(self, index: int) -> list[object]:
        return []

    def after_layer(self, n: int, index: int) -> None:
        pass

    def end(self) -> None:
        pass


NO_PASS = Pass()


class DataParallel:
    """One replica (data_parallel_size = 1): no gradient sync, the optimizer step on the
    stage's parameters. The modes below override the hooks they need."""

    gradient_kind = ALL_REDUCE  # how gradients meet; ZeRO-1 reduce-scatters them

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        par = scenario.parallel
        v = par.virtual_pipeline_model_parallel_size
        self.gpu, self.compute = gpu, compute
        self.data = par.gradient_group_size  # data x context parallel replicas
        self.num_chunks = v
        self.split = scenario.training.split_backward
        self.layer_params = layer_params_per_rank(scenario)
        self.params = stage_params_per_rank(scenario, gpu.stage)
        # the embedding/output weights of the stage, if it has any
        self.rest_params = self.params - scenario.rank_layers(gpu.stage) * self.layer_params
        # mixture of experts: the routed experts' parameters meet over the expert-data-
        # parallel group (`sync_experts`); ``params`` and the layers' buckets are the rest
        self.expert_params = stage_expert_params_per_rank(scenario, gpu.stage)
        self.layer_dense: list[float] = []
        if self.expert_params:
            self.params -= self.expert_params
            self.layer_dense = [dense for dense, _ in layer_params_of(scenario, gpu.stage)]
            self.rest_params = self.params - sum(self.layer_dense)
            self.expert_data = par.expert_data_parallel_size
            self.experts_sharded = optimizer_sharded(scenario)
        self.buckets: list[BucketKey] = []
        training = scenario.training
        self.grad_bytes = training.communication_bytes  # per parameter, DP collectives
        self.reduce_bucket = training.mechanism("reduce_bucket_size")
        self.gather_bucket = training.mechanism("allgather_bucket_size")
        self.tied_order = training.mechanism("tied_grad_reduce_order")
        # the tied embedding's gradient all-reduce: the rank with the embedding and the
        # one with the output layer, when they differ; elements of the gradient buffer
        m, out = scenario.model, output_rank(scenario)
        self.tied_with: int | None = None
        if training.share_embeddings_and_output_weights and out != 0 and gpu.stage in (0, out):
            self.tied_with = out if gpu.stage == 0 else 0
        t = par.tensor_model_parallel_size
        self.tied_bytes = m.vocab_size * m.hidden_size / t * training.gradient_bytes
        # DualPipe: rank r and rank p - 1 - r hold the same stages of the two copies
        p = par.pipeline_model_parallel_size
        self.copy_with = p - 1 - gpu.stage if training.placement == DUAL else None

    # -- hooks --------------------------------------------------------------------------

    def forward_pass(self, label: str, mb: int, chunk: int, order: list[int]) -> Pass:
        return NO_PASS

    def backward_pass(
        self, label: str, mb: int, chunk: int, order: list[int], last_microbatch: bool
    ) -> Pass:
        """The backward, or under a split schedule its input-gradient part.
        ``last_microbatch``: this pass completes the chunk's weight gradients."""
        return NO_PASS

    def weight_pass(
        self, label: str, mb: int, chunk: int, order: list[int], last_microbatch: bool
    ) -> Pass:
        """The weight-gradient part of a split backward."""
        return NO_PASS

    def finish(self) -> None:
        """At the end of the stage: the gradient sync still to do (and the tied
        embedding's all-reduce, before or after it), the optimizer step."""
        self.sum_copies()
        if self.tied_with is not None:
            self.gpu.builder.name_last(self.gpu.lane, TiedReadyKey(self.gpu.who, self.gpu.stage))
        tied_first = self.tied_order == TIED_BEFORE_DP or (
            self.tied_order != TIED_AFTER_DP and self.reduce_scatters_after_flush
        )
        if tied_first:
            self.tie()
        self.sync()
        if not tied_first:
            self.tie()
        self.sync_experts()
        self.step()
        self.step_experts()

    # a blocking reduce-scatter after the flush (Megatron-LM 2022's distributed
    # optimizer, which all-reduces the tied gradient before it)
    reduce_scatters_after_flush = False

    def tie(self) -> None:
        """The tied embedding's gradient all-reduce with the other end of the pipeline: a
        rendezvous of the two ranks' compute lanes. Each first waits for the other's last
        pass (a barrier, so the wait is pipeline idle, not communication)."""
        if self.tied_with is None:
            return
        gpu = self.gpu
        other = TiedReadyKey(gpu.who, self.tied_with)
        gpu.barrier(f"wait for stage {self.tied_with} (tied embedding)", [other])
        transfer = gpu.comm.tied(self.tied_with, self.tied_bytes, gpu.j, gpu.d)
        gpu.builder.add(
            gpu.lane,
            DP_SYNC,
            f"tied embedding grads {COLLECTIVE_LABELS[ALL_REDUCE]}",
            transfer=transfer,
            rendezvous=TiedKey(gpu.who),
        )

    def sum_copies(self) -> None:
        """DualPipe's two model copies: rank r's gradients (both its chunks, experts
        included) all-reduced with rank p - 1 - r's, which holds the same stages of the
        other copy, once both are done, before the data-parallel sync (each then holds
        the sum for both copies). A rendezvous of the two ranks' lanes; the wait for the
        other's last pass counts as pipeline idle."""
        if self.copy_with is None:
            return
        gpu = self.gpu
        gpu.builder.name_last(gpu.lane, CopiesReadyKey(gpu.who, gpu.stage))
        other = CopiesReadyKey(gpu.who, self.copy_with)
        gpu.barrier(f"wait for stage {self.copy_with} (DualPipe's other copy)", [other])
        nbytes = (self.params + self.expert_params) * self.grad_bytes
        transfer = gpu.comm.tied(self.copy_with, nbytes, gpu.j, gpu.d)
        gpu.builder.add(
            gpu.lane,
            DP_SYNC,
            f"DualPipe copies' grads {COLLECTIVE_LABELS[ALL_REDUCE]}",
            transfer=transfer,
            rendezvous=CopiesKey(gpu.who, min(gpu.stage, self.copy_with)),
        )

    def sync(self) -> None:
        pass

    def step(self) -> None:
        self.optimize(self.params)

    def layer_params_at(self, index: int) -> float:
        """The parameters of rank-local layer ``index`` that meet over data x context
        parallel (an MoE layer's: all but its routed experts)."""
        return self.layer_dense[index] if self.layer_dense else self.layer_params

    def sync_experts(self) -> None:
        """The routed experts' gradients over the expert-data-parallel group, after the
        flush, blocking, in the strategy's collective (reduce-scatter under ZeRO) and
        reduce_bucket_size calls: not overlapped with the backward (docs/moe.md)."""
        if not self.expert_params or self.expert_data == 1:
            return
        kind = self.gradient_kind if self.experts_sharded else ALL_REDUCE
        params = self.expert_params
        calls = 1 if self.reduce_bucket == 0 else math.ceil(params / self.reduce_bucket)
        label = f"expert grads {COLLECTIVE_LABELS[kind]}"
        gpu = self.gpu
        transfer = gpu.comm.expert("edp", kind, params * self.grad_bytes / calls, gpu.j, gpu.d)
        for n in range(calls):
            name = label if calls == 1 else f"{label} {n + 1}/{calls}"
            expert_collective(gpu, DP_SYNC, "edp", name, transfer)

    def step_experts(self) -> None:
        """The routed experts' optimizer step: on 1 / EDP of them under ZeRO, whose
        all-gather over the expert-data-parallel group follows (16-bit weights)."""
        if not self.expert_params:
            return
        sharded = self.experts_sharded and self.expert_data > 1
        self.optimize(self.expert_params / (self.expert_data if sharded else 1))
        if sharded:
            nbytes = self.expert_params * WEIGHT_BYTES_PER_PARAM
            gpu = self.gpu
            transfer = gpu.comm.expert("edp", ALL_GATHER, nbytes, gpu.j, gpu.d)
            label = f"expert params {COLLECTIVE_LABELS[ALL_GATHER]}"
            expert_collective(gpu, DP_SYNC, "edp", label, transfer)

    # -- what the modes share -----------------------------------------------------------

    def optimize(self, num_params: float) -> None:
        self.gpu.work(OPTIMIZER, OPTIMIZER, -1, self.compute.optimizer(num_params))

    def collective(self, lane: int, label: str, kind: str, message_bytes: float, **fields) -> None:
        """A collective of ``kind`` over the GPU's data-parallel group."""
        transfer = self.gpu.comm.dp(kind, message_bytes, self.gpu.j)
        self.gpu.collective(lane, DP_SYNC, label, transfer, **fields)

    def reduce_after_flush(self) -> None:
        """Every gradient of the stage in blocking collectives of at most
        ``reduce_bucket_size`` elements each, one after the other (one with 0)."""
        kind = self.gradient_kind
        calls = 1 if self.reduce_bucket == 0 else math.ceil(self.params / self.reduce_bucket)
        label = f"grads {COLLECTIVE_LABELS[kind]}"
        self.in_calls(label, kind, self.params * self.grad_bytes, calls)

    def in_calls(self, label: str, kind: str, message_bytes: float, calls: int) -> None:
        """One blocking collective of ``message_bytes``, or ``calls`` equal ones in turn."""
        for n in range(calls):
            name = label if calls == 1 else f"{label} {n + 1}/{calls}"
            self.collective(self.gpu.lane, name, kind, message_bytes / calls)

    def bucket(self, label: str, mb: int, num_params: float) -> None:
        """A non-blocking gradient collective on the compute lane, kept in ``buckets``."""
        key = BucketKey(self.gpu.who, self.gpu.stage, label)
        self.collective(
            self.gpu.lane,
            label,
            self.gradient_kind,
            num_params * self.grad_bytes,
            microbatch=mb,
            blocking=False,
            key=key,
        )
        self.buckets.append(key)

    def layer_bucket(self, mb: int, index: int) -> None:
        self.bucket(f"grads layer {index}", mb, self.layer_params_at(index))


class AllReduceAfterFlush(DataParallel):
    """Replicas all-reduce every gradient in one blocking collective once the last
    backward is done, then each runs the whole optimizer step."""

    def sync(self) -> None:
        self.reduce_after_flush()


class _Buckets(Pass):
    """A pass whose every layer's weight gradients are now final: one bucket each."""

    def __init__(self, strategy: DataParallel, mb: int) -> None:
        self.strategy, self.mb = strategy, mb

    def after_layer(self, n: int, index: int) -> None:
        self.strategy.layer_bucket(self.mb, index)


class OverlappedBuckets(DataParallel):
    """Gradients reduced per layer during the last backward, in a non-blocking bucket as
    soon as the layer's weight gradients are final (after the fused backward, or the W
    of a split one, of the chunk's last micro-batch), the embedding/output weights' at
    the end; the optimizer step waits for every bucket."""

    overlap = True

    def backward_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        if self.overlap and last_microbatch and not self.split:
            return _Buckets(self, mb)
        return NO_PASS

    def weight_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        if self.overlap and last_microbatch:
            return _Buckets(self, mb)
        return NO_PASS

    def sync(self) -> None:
        self.bucket("grads embedding/output", -1, self.rest_params)
        self.gpu.barrier("wait for gradient buckets", self.buckets)


class DistributedOptimizer(OverlappedBuckets):
    """ZeRO-1: gradients reduce-scattered (or all-reduced, DeepSpeed's stage 1), per
    layer in buckets when ``overlap`` (as `OverlappedBuckets` does), else after the last
    backward; each replica steps the optimizer on its 1/D of the parameters, then
    all-gathers them."""

    def __init__(
        self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel, *, overlap: bool
    ) -> None:
        super().__init__(gpu, scenario, compute)
        self.overlap = overlap
        all_reduce = scenario.training.mechanism("zero_grad_collective") == ZERO_ALL_REDUCE
        self.gradient_kind = ALL_REDUCE if all_reduce else REDUCE_SCATTER
        self.reduce_scatters_after_flush = not overlap and not all_reduce
        # --overlap-param-gather: the gathers on a side lane ahead of each chunk's first
        # forward (_GatherAhead) instead of blocking after the step
        self.gather_ahead = scenario.training.overlap_param_gather
        self.gathered: set[int] = set()  # chunks whose first forward has its gathers
        if self.gather_ahead:
            self.side = gpu.new_lane(STREAM_OF_COMM[DP_SYNC])
            self.rest_chunk = 0 if gpu.stage == 0 else self.num_chunks - 1

    def forward_pass(self, label, mb, chunk, order) -> Pass:
        if not self.gather_ahead or chunk in self.gathered:
            return NO_PASS
        self.gathered.add(chunk)
        return _GatherAhead(self, label, mb, order, chunk == self.rest_chunk)

    def sync(self) -> None:
        if self.overlap:
            super().sync()
        else:
            self.reduce_after_flush()

    def step(self) -> None:
        self.optimize(self.params / self.data)
        if self.gather_ahead:
            return  # gathered during the (next) iteration's first forward
        layers = self.compute.scenario.rank_layers(self.gpu.stage)
        message_bytes = gathered_param_bytes(self.compute.scenario, self.params, layers)
        label = f"params {COLLECTIVE_LABELS[ALL_GATHER]}"
        calls = 1 if self.gather_bucket == 0 else max(1, int(self.params // self.gather_bucket))
        self.in_calls(label, ALL_GATHER, message_bytes, calls)


class ShardedGradients(DistributedOptimizer):
    """ZeRO-2 (DeepSpeed's stage 2; Megatron-FSDP's ``optim_grads``): the optimizer
    states and the gradients sharded over the replicas, the parameters whole. A replica
    keeps only its 1/D of the accumulated gradients, so each micro-batch's backward
    reduce-scatters every layer's gradients in a non-blocking bucket once the layer's
    weight gradients are done (the W pass under a split schedule), whatever
    ``overlap_grad_reduce`` says; the embedding/output weights' gradients go once, after
    the last backward. The step and the parameter all-gather are ZeRO-1's."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        super().__init__(gpu, scenario, compute, overlap=True)
        self.gradient_kind = REDUCE_SCATTER

    def backward_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        return NO_PASS if self.split else _Buckets(self, mb)

    def weight_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        return _Buckets(self, mb)

    def layer_bucket(self, mb: int, index: int) -> None:
        self.bucket(f"grads layer {index} micro-batch {mb}", mb, self.layer_params_at(index))


class _GatherAhead(Pass):
    """Megatron-Core's ``--overlap-param-gather`` around a chunk's first forward of the
    iteration (megatron/core/optimizer/distrib_optimizer.py, 2024): the first bucket's
    all-gather is dispatched at the iteration's start (``zero_grad``) and each forward
    pre-hook waits for its bucket's and dispatches the next, one in flight at a time, in
    the forward's order across the model chunks. As the CPU runs ahead of the GPU the
    gathers go back to back on a communication stream (a CPU held at a pipeline receive
    would start them later: not modelled), one per layer as stepsim's gradient buckets
    are; the first brings the stage's embedding/output weights. Each layer's first
    forward waits for its own gather. In steady state the gathers follow the previous
    iteration's optimizer step, so the iteration starts with them."""

    def __init__(self, zero: DistributedOptimizer, label, mb, order, rest: bool) -> None:
        self.gathered: dict[int, ShardKey] = {}
        for n, index in enumerate(order):
            key = ShardKey(zero.gpu.who, zero.gpu.stage, label, ALL_GATHER, index)
            params = zero.layer_params_at(index) + (zero.rest_params if rest and n == 0 else 0.0)
            zero.collective(
                zero.side,
                f"params {COLLECTIVE_LABELS[ALL_GATHER]} layer {index}",
                ALL_GATHER,
                gathered_param_bytes(zero.compute.scenario, params, 1),
                microbatch=mb,
                key=key,
            )
            self.gathered[index] = key
        self.order = order

    def first(self) -> list[object]:
        return self.before_layer(self.order[0])

    def before_layer(self, index: int) -> list[object]:
        return [self.gathered[index]]

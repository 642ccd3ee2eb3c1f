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
- `ShardedGradients` (ZeRO-2, Megatron-FSDP's ``optim_grads``): as ZeRO-1, but every
  micro-batch's gradients are reduce-scattered per layer as soon as its backward is
  done, the embedding/output weights' too (a gradient is not kept whole to accumulate
  over micro-batches); `DeepSpeedStage2` (DeepSpeed's ZeRO stage 2): every
  micro-batch's gradients reduced in buckets of ``reduce_bucket_size`` elements as
  they fill, blocking unless overlapped;
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

from stepsim.schedules import DUAL, pipeline_ends, stage_of

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


def _rest_at(gpu: GpuOps, scenario: Scenario) -> tuple[int, bool] | None:
    """Where a rank's embedding/output weights' gradients are done in each micro-batch's
    backward: (its chunk holding the embedding, at the end of the pass), else (its chunk
    holding the output layer, before the first layer); None on a rank holding neither."""
    par, placement = scenario.parallel, scenario.training.placement
    p, v = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    ends = [pipeline_ends(stage_of(gpu.stage, k, p, placement), p, v, placement) for k in range(v)]
    embedding = [k for k, (first, _) in enumerate(ends) if first]
    if embedding:
        return embedding[0], True
    output = [k for k, (_, last) in enumerate(ends) if last]
    return (output[0], False) if output else None


class _PerMicroBatch(DistributedOptimizer):
    """ZeRO-2's shape, whichever framework: gradients reduce-scattered during every
    micro-batch's backward (the W pass under a split schedule), the embedding/output
    weights' among them (`_rest_at`); the optimizer step on 1/D of the parameters and
    the parameter all-gather are ZeRO-1's. The subclasses say how the buckets form."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        super().__init__(gpu, scenario, compute, overlap=True)
        self.gradient_kind = REDUCE_SCATTER
        self.rest_at = _rest_at(gpu, scenario)

    def backward_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        return NO_PASS if self.split else self.micro_batch(mb, chunk, order, weight=False)

    def weight_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        return self.micro_batch(mb, chunk, order, weight=True)

    def micro_batch(self, mb: int, chunk: int, order: list[int], weight: bool) -> Pass:
        rest = self.rest_at if self.rest_at is not None and self.rest_at[0] == chunk else None
        if weight and not order:  # a W pass over no layers: no hook will be called
            if rest is not None:
                self.rest_done(mb)
            self.pass_done(mb)
            return NO_PASS
        return _MicroBatch(self, mb, order, None if rest is None else rest[1], weight)

    # what a micro-batch's pass tells the strategy, in backward order
    def layer_done(self, mb: int, index: int) -> None:
        raise NotImplementedError

    def rest_done(self, mb: int) -> None:
        raise NotImplementedError

    def pass_done(self, mb: int) -> None:
        pass

    def sync(self) -> None:
        if self.rest_at is None:  # a rank without embedding or output weights: as ZeRO-1
            self.bucket("grads embedding/output", -1, self.rest_params)
        self.gpu.barrier("wait for gradient buckets", self.buckets)


class _MicroBatch(Pass):
    """A micro-batch's backward (or W) pass under `_PerMicroBatch`: each layer when its
    weight gradients are done, the embedding/output weights before the first layer
    (``rest_at_end`` False), after the last (True) or not at all (None). A W pass calls
    neither ``before_layer`` nor ``end``: its output weights' gradient (computed before
    its layers) is told with its first layer, its embedding's (computed before its last
    layer's bucket) with its last."""

    def __init__(
        self,
        strategy: _PerMicroBatch,
        mb: int,
        order: list[int],
        rest_at_end: bool | None,
        weight: bool,
    ) -> None:
        self.strategy, self.mb, self.last = strategy, mb, order[-1] if order else None
        self.rest_at_end, self.weight = rest_at_end, weight
        self.started = False

    def _start(self) -> None:
        if not self.started and self.rest_at_end is False:
            self.strategy.rest_done(self.mb)
        self.started = True

    def before_layer(self, index: int) -> list[object]:
        self._start()
        return []

    def after_layer(self, n: int, index: int) -> None:
        self._start()
        self.strategy.layer_done(self.mb, index)
        if self.weight and index == self.last:
            self._finish()

    def end(self) -> None:
        if not self.weight:
            self._start()  # a pass without layers
            self._finish()

    def _finish(self) -> None:
        if self.rest_at_end:
            self.strategy.rest_done(self.mb)
        self.strategy.pass_done(self.mb)


class ShardedGradients(_PerMicroBatch):
    """ZeRO-2 as Megatron-FSDP's ``optim_grads`` runs it: the optimizer states and the
    gradients sharded over the replicas, the parameters whole. It reduces gradients on
    every backward ("grad_reduce_every_bprop"), not on the last micro-batch only: each
    parameter's gradient is copied into an unsharded bucket, and once every parameter of
    a bucket has one the bucket is reduce-scattered asynchronously and its shard added
    to the sharded gradient buffer (megatron/core/distributed/fsdp/src/megatron_fsdp/
    megatron_fsdp.py `_process_post_backward_gradients`, `_grad_acc`,
    `_root_post_backward`; param_and_grad_buffer.py `GradReducePipeline.reduce_gradients`,
    `_bucket_group_gradient_reduce`; NVIDIA/Megatron-LM d98e8a6, and so from the first
    custom FSDP, d165a85 `custom_fsdp/fully_sharded_data_parallel.py` `param_hook`).
    ``no_sync`` does not hold it back ("For grads shard mode there will actually always
    be gradient sync happening"), and ``overlap_grad_reduce`` is forced on.

    So each micro-batch's backward reduce-scatters every layer's gradients in a
    non-blocking bucket once the layer's weight gradients are done, and the
    embedding/output weights' with it: on the rank holding the embedding after the
    pass's last layer (a tied weight's gradient is whole only then: the root
    post-backward hook reduces shared parameters), on a rank holding the output layer
    alone before its first layer (its gradient comes first). The tied embedding's
    all-reduce between the end ranks moves the local shard of its gradient, 1/D of it
    (finalize_model_grads.py `_allreduce_embedding_grad`: the main gradient's
    ``_local_tensor`` under Megatron-FSDP)."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        super().__init__(gpu, scenario, compute)
        self.tied_bytes /= self.data

    def layer_done(self, mb: int, index: int) -> None:
        self.bucket(f"grads layer {index} micro-batch {mb}", mb, self.layer_params_at(index))

    def rest_done(self, mb: int) -> None:
        self.bucket(f"grads embedding/output micro-batch {mb}", mb, self.rest_params)


class DeepSpeedStage2(_PerMicroBatch):
    """ZeRO-2 as DeepSpeed's stage 2 runs it (``framework = "deepspeed"``): on every
    backward, not only at the gradient-accumulation boundary ("ZeRO stage 2
    communicates during non gradient accumulation boundaries as well"), each gradient
    goes into an independent-partition bucket as its hook fires; when the next one would
    take the bucket past ``reduce_bucket_size`` elements the bucket is reduced first
    (each rank's slice reduced to the rank owning it), and what is left is reduced at the
    end of the backward (deepspeed/runtime/engine.py `allreduce_gradients`;
    runtime/zero/stage2.py `reduce_independent_p_g_buckets_and_remove_grads`,
    `reduce_ipg_grads`, `average_tensor`, `independent_gradient_partition_epilogue`;
    microsoft/DeepSpeed v0.5.4 bc7778e). Without ``overlap_comm`` (DeepSpeed's default;
    stepsim reads ``overlap_grad_reduce`` for it) the reductions run on the compute
    stream, each blocking the backward; with it on a side stream, but ``average_tensor``
    synchronises the device before each bucket and the epilogue after the last, so one
    bucket is in flight at a time and each backward ends with its last.

    Gradients arrive by layer here (DeepSpeed's hooks fire by parameter): the
    embedding/output weights' where `ShardedGradients` has them, a layer whole into a
    bucket, a bucket reduced before the layer that would overflow it (a layer larger
    than a bucket goes alone); ``reduce_bucket_size = 0`` is one bucket per backward.
    A bucket is a reduce-scatter of its gradients (DeepSpeed's ``dist.reduce`` of each
    rank's slice to that rank moves the same bytes per rank). DeepSpeed's pipeline
    engine refuses ZeRO-2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism", runtime/pipe/engine.py), so this is its data-parallel engine's."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        super().__init__(gpu, scenario, compute)
        self.overlap_comm = scenario.training.overlap_grad_reduce
        self.filling: list[str] = []  # what the open bucket holds (for its label)
        self.elements = 0.0  # and its parameters
        self.count = 0  # buckets so far in this pass

    def layer_done(self, mb: int, index: int) -> None:
        self.add(mb, f"layer {index}", self.layer_params_at(index))

    def rest_done(self, mb: int) -> None:
        self.add(mb, "embedding/output", self.rest_params)

    def add(self, mb: int, what: str, params: float) -> None:
        if self.filling and self.reduce_bucket and self.elements + params > self.reduce_bucket:
            self.reduce(mb)
        self.filling.append(what)
        self.elements += params

    def pass_done(self, mb: int) -> None:
        if self.filling:
            self.reduce(mb)
        if self.overlap_comm and self.buckets:
            self.gpu.barrier("wait for gradient bucket (epilogue)", [self.buckets[-1]])
        self.count = 0

    def reduce(self, mb: int) -> None:
        """The open bucket: blocking on the compute lane, or with ``overlap_comm`` in
        the background once the previous one is done."""
        held = (
            self.filling[0]
            if len(self.filling) == 1
            else f"{self.filling[0]} to {self.filling[-1]}"
        )
        label = f"grads {held} micro-batch {mb}"
        message_bytes = self.elements * self.grad_bytes
        if self.overlap_comm:
            if self.count and self.buckets:
                self.gpu.barrier("wait for gradient bucket", [self.buckets[-1]])
            key = BucketKey(self.gpu.who, self.gpu.stage, label)
            self.collective(
                self.gpu.lane,
                label,
                REDUCE_SCATTER,
                message_bytes,
                microbatch=mb,
                blocking=False,
                key=key,
            )
            self.buckets.append(key)
        else:
            self.collective(self.gpu.lane, label, REDUCE_SCATTER, message_bytes, microbatch=mb)
        self.count += 1
        self.filling, self.elements = [], 0.0

    def sync(self) -> None:
        if self.rest_at is None and self.rest_params:
            label = f"grads embedding/output {COLLECTIVE_LABELS[REDUCE_SCATTER]}"
            self.collective(
                self.gpu.lane, label, REDUCE_SCATTER, self.rest_params * self.grad_bytes
            )


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

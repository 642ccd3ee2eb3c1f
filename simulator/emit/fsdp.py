"""ZeRO-3 / FSDP (``data_parallel_sharding = "full"``): one of the data-parallel
strategies of `dataparallel`, kept in its own module to keep each small;
`strategy.strategy_for` picks it."""

from __future__ import annotations

from collections.abc import Sequence

from ..cost.compute import ComputeModel
from ..cost.memory import WEIGHT_BYTES_PER_PARAM
from ..ir.keys import LayerKey, ShardKey
from ..ir.vocabulary import ALL_GATHER, COLLECTIVE_LABELS, DP_SYNC, REDUCE_SCATTER, STREAM_OF_COMM
from ..scenario import Scenario
from .dataparallel import DataParallel, Pass
from .gpuops import GpuOps


class FullySharded(DataParallel):
    """ZeRO-3/FSDP: parameters, gradients and optimizer state sharded over the replicas.
    A side lane (stream "dp") gathers each layer's parameters before its forward and
    backward and reduce-scatters its gradients after; the optimizer step, on 1/D of the
    parameters, waits for the last reduce-scatter.

    ``stray_buckets`` (``overlap_grad_reduce``, which FSDP does not use otherwise): the
    fused backward of a chunk's last micro-batch also all-reduces the gradients of the
    pass's last layer (the chunk's first) in a bucket that nothing waits for. This is
    how stepsim has always lowered the combination, kept so that its results do not
    change."""

    def __init__(
        self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel, *, stray_buckets: bool
    ) -> None:
        super().__init__(gpu, scenario, compute)
        self.side = gpu.new_lane(STREAM_OF_COMM[DP_SYNC])
        self.stray_buckets = stray_buckets
        # the tied embedding's gradient all-reduce is not modelled under FSDP (its
        # sharded gradient and the other stage's do not pair up as whole tensors)
        self.tied_with = None
        # the chunk whose passes carry the embedding/output weights
        self.rest_chunk = 0 if gpu.stage == 0 else self.num_chunks - 1

    def forward_pass(self, label, mb, chunk, order) -> Pass:
        sharded = _ShardedPass(self, label, mb, order, chunk == self.rest_chunk)
        for n in range(len(order)):
            sharded.gather(n)
        return sharded

    def backward_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        stray = self.stray_buckets and last_microbatch
        sharded = _ShardedBackward(self, label, mb, order, chunk == self.rest_chunk, stray)
        sharded.gather(0)
        sharded.gather(1)
        return sharded

    def weight_pass(self, label, mb, chunk, order, last_microbatch) -> Pass:
        return _ShardedWeight(self, label, mb, order, chunk == self.rest_chunk)

    def sync(self) -> None:
        self.gpu.barrier("wait for gradient reduce-scatters", [self.gpu.last_key(self.side)])

    def step(self) -> None:
        self.optimize(self.params / self.data)

    def shard(
        self, kind: str, label: str, mb: int, index: int, deps: Sequence[object], rest: bool
    ) -> ShardKey:
        """A parameter all-gather or gradient reduce-scatter of one layer on the side lane;
        with ``rest`` it also carries the stage's embedding/output weights."""
        key = ShardKey(self.gpu.who, self.gpu.stage, label, kind, index)
        params = self.layer_params + (self.rest_params if rest else 0.0)
        per_param = WEIGHT_BYTES_PER_PARAM if kind == ALL_GATHER else self.grad_bytes
        self.collective(
            self.side,
            f"{label} {COLLECTIVE_LABELS[kind]} layer {index}",
            kind,
            params * per_param,
            microbatch=mb,
            deps=deps,
            key=key,
        )
        return key

    def layer_key(self, label: str, index: int) -> LayerKey:
        return LayerKey(self.gpu.who, self.gpu.stage, label, index)


class _ShardedPass(Pass):
    """FSDP around one pass over a chunk's layers (``order``: their rank-local indices
    in the pass's order); as it is, the forward pass. The n-th parameter gather waits
    until the layer two before it in the pass is done, so one gather runs ahead of
    compute; with ``rest`` the first gather also brings the embedding/output weights,
    which the pass needs first (or, for the last stage's forward, holds until its
    end)."""

    def __init__(
        self, fsdp: FullySharded, label: str, mb: int, order: list[int], rest: bool
    ) -> None:
        self.fsdp, self.label, self.mb, self.order, self.rest = fsdp, label, mb, order, rest
        self.gathered: dict[int, ShardKey] = {}

    def gather(self, n: int) -> None:
        if n >= len(self.order):
            return
        order = self.order
        deps = [self.fsdp.layer_key(self.label, order[n - 2])] if n >= 2 else []
        rest = self.rest and n == 0
        self.gathered[order[n]] = self.fsdp.shard(
            ALL_GATHER, self.label, self.mb, order[n], deps, rest
        )

    def first(self) -> list[object]:
        return self.before_layer(self.order[0])

    def before_layer(self, index: int) -> list[object]:
        return [self.gathered[index]]

    def after_layer(self, n: int, index: int) -> None:
        self.fsdp.gpu.builder.name_last(self.fsdp.gpu.lane, self.fsdp.layer_key(self.label, index))


class _ShardedBackward(_ShardedPass):
    """FSDP around a backward pass, in FSDP's order on the side lane: the first two
    gathers, then per layer its gradient reduce-scatter (when the pass computes weight
    gradients, not under a split schedule) and the gather two layers ahead. The last
    layer's reduce-scatter, with the embedding/output gradients, waits for the pass's
    end."""

    def __init__(self, fsdp, label, mb, order, rest, stray_bucket: bool) -> None:
        super().__init__(fsdp, label, mb, order, rest)
        self.stray_bucket = stray_bucket

    def after_layer(self, n: int, index: int) -> None:
        super().after_layer(n, index)
        if not self.fsdp.split:
            if n < len(self.order) - 1:
                deps = [self.fsdp.layer_key(self.label, index)]
                self.fsdp.shard(REDUCE_SCATTER, self.label, self.mb, index, deps, False)
            elif self.stray_bucket:
                self.fsdp.layer_bucket(self.mb, index)
        self.gather(n + 2)

    def end(self) -> None:
        if not self.fsdp.split:
            last = self.fsdp.gpu.last_key(self.fsdp.gpu.lane)
            self.fsdp.shard(REDUCE_SCATTER, self.label, self.mb, self.order[-1], [last], self.rest)


class _ShardedWeight(_ShardedPass):
    """FSDP after each layer's weight gradients (split schedules; no gathers): its
    reduce-scatter, the last one with the embedding/output gradients."""

    def after_layer(self, n: int, index: int) -> None:
        last_layer = n == len(self.order) - 1
        deps = [self.fsdp.gpu.last_key(self.fsdp.gpu.lane)]
        rest = self.rest and last_layer
        self.fsdp.shard(REDUCE_SCATTER, self.label, self.mb, index, deps, rest)

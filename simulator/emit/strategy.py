"""Which data-parallel strategy a simulated GPU runs: dataparallel.py's modes (none,
after the flush, overlapped buckets, ZeRO-1, ZeRO-2 as Megatron-FSDP or DeepSpeed runs
it) or fsdp.py's ZeRO-3 / FSDP."""

from __future__ import annotations

from stepsim.schedules import DUAL

from ..cost.compute import ComputeModel
from ..ir.vocabulary import SHARD_FULL, SHARD_GRADIENTS, SHARD_OPTIMIZER
from ..scenario import Scenario
from ..scenario.frameworks import DEEPSPEED
from .dataparallel import (
    AllReduceAfterFlush,
    DataParallel,
    DeepSpeedStage2,
    DistributedOptimizer,
    OverlappedBuckets,
    ShardedGradients,
)
from .fsdp import FullySharded
from .gpuops import GpuOps


def strategy_for(gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> DataParallel:
    """The data-parallel mode of the scenario, for one simulated GPU."""
    training = scenario.training
    # DualPipe: the copies' sum comes first, after the flush, so no bucket starts earlier
    overlap = training.overlap_grad_reduce and training.placement != DUAL
    if scenario.parallel.gradient_group_size == 1:
        return DataParallel(gpu, scenario, compute)
    if training.data_parallel_sharding == SHARD_FULL:
        return FullySharded(gpu, scenario, compute, stray_buckets=overlap)
    if training.data_parallel_sharding == SHARD_GRADIENTS and training.framework == DEEPSPEED:
        return DeepSpeedStage2(gpu, scenario, compute)
    if training.data_parallel_sharding == SHARD_GRADIENTS:
        return ShardedGradients(gpu, scenario, compute)
    if training.data_parallel_sharding == SHARD_OPTIMIZER:
        return DistributedOptimizer(gpu, scenario, compute, overlap=overlap)
    if overlap:
        return OverlappedBuckets(gpu, scenario, compute)
    return AllReduceAfterFlush(gpu, scenario, compute)

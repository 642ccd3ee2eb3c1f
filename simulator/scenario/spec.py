"""Frozen specifications: what a scenario file loads into, and the Python API.

Units live in the field names (see design notes). Human units (`_gbps`, `_us`,
`_gbytes_per_s`) appear only here, at the edge; `simulator.units` converts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import schedules

RecomputeGranularity = Literal["none", "selective", "full"]
NetworkModelName = Literal["fair-share", "analytical"]


class ScenarioError(ValueError):
    """A scenario a user wrote is not valid; the message says why in one line."""


SCHEDULES: tuple[str, ...] = (*schedules.SCHEDULES, "custom")  # custom: from a file


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelConstants:
    """What the compute model needs to know about a GPU beyond its datasheet
    (simulator.workload.compute explains each). Every GpuSpec carries its own; a
    calibration file (``--calibration``) holds one set, measured on a real GPU."""

    gpu: str
    num_sms: int
    tile_m: int  # output tile of the GEMM kernels, rows x columns
    tile_n: int
    gemm_efficiency: float  # fraction of the tensor peak a large, well-shaped GEMM reaches
    gemm_k_half: float  # inner dimension at which a GEMM reaches half of that
    memory_efficiency: float  # fraction of the HBM bandwidth element-wise kernels stream at
    source: str  # where the numbers came from: fitted, measured, or uncalibrated


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU: everything stepsim needs of it in one record, so that a GPU preset
    cannot lack a number (tests/test_presets.py checks every one is complete).

    The SM count and the provenance of the kernel constants live in ``kernels`` (a
    calibration file carries them too, for the GPU it was measured on) and are read
    here through ``num_sms`` and ``kernel_provenance``."""

    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core peak (FP16 on GPUs without BF16)
    peak_tflops_fp8: float | None  # dense FP8 tensor-core peak; None: no FP8 tensor cores
    memory_gib: float
    hbm_gbytes_per_s: float
    kernels: KernelConstants  # the compute model's constants for this GPU (gpu == name)

    @property
    def num_sms(self) -> int:
        return self.kernels.num_sms

    @property
    def kernel_provenance(self) -> str:
        """How the kernel constants were obtained: fitted, or uncalibrated and from where."""
        return self.kernels.source


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    preset: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    gpu: GpuSpec
    node: str | None  # the node preset the values came from, if any
    num_nodes: int
    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float  # line rate of one NIC, one direction, 10^9 bit/s
    nvlink_gbytes_per_s: float  # one GPU's NVLink bandwidth into the switch, one direction
    pcie_gbytes_per_s: float  # GPU <-> NIC path, one direction
    nvlink_latency_us: float  # one hop GPU <-> NVSwitch
    pcie_latency_us: float  # one hop GPU <-> NIC
    ib_latency_us: float  # one hop NIC <-> switch
    collective_base_latency_us: float  # fixed software cost of launching one collective
    # the fraction of the line rate NCCL's transfers reach (measured bus bandwidth /
    # datasheet rate); the links are built at line rate x efficiency
    nvlink_efficiency: float = 1.0
    nic_efficiency: float = 1.0
    nvlink_topology: str = "nvswitch"  # "nvswitch", "all-to-all", "hybrid-cube-mesh"
    fabric: str = "switch"  # "switch", "fat-tree", "rail-optimized"
    fabric_levels: int = 2  # fat-tree: 2 or 3
    nodes_per_leaf: int = 16
    leaves_per_pod: int = 8  # 3-level fat-tree
    spine_switches: int = 4  # switches above each leaf (and above each pod)
    oversubscription: float = 1.0  # bandwidth below a switch level / bandwidth above it

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """The GPUs one NVLink fabric joins (topologies.node explains the domain).
        Every node type today is its own NVLink domain; a rack-scale domain such as a
        GB200 NVL72 (72 GPUs over 18 servers) would become a cluster key here."""
        return self.gpus_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    data_parallel_size: int
    virtual_pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False

    @property
    def num_gpus(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.data_parallel_size
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    micro_batch_size: int
    global_batch_size: int
    schedule: str = "1f1b"  # a name in schedules.SCHEDULES, or "custom"
    # Megatron-LM's micro-batch group for interleaved schedules (None: the pipeline size)
    microbatch_group_size_per_vp_stage: int | None = None
    # a custom schedule: the file it came from, its chunk placement, and its orders
    schedule_file: str | None = None
    schedule_placement: str | None = None  # "looped" (default) or "v"; named ones fix theirs
    custom_orders: tuple[tuple[schedules.Step, ...], ...] | None = None
    recompute_granularity: RecomputeGranularity = "none"
    overlap_grad_reduce: bool = False
    # Megatron-LM's --async-tensor-model-parallel-allreduce: in a block's backward the
    # input gradient's all-reduce (reduce-scatter under SP) runs during the weight
    # gradient of the block's first GEMM instead of before it
    async_tensor_model_parallel_allreduce: bool = False
    data_parallel_sharding: str = "none"  # "none", "optimizer" (ZeRO-1), "full" (ZeRO-3/FSDP)

    @property
    def split_backward(self) -> bool:
        """Whether the schedule runs B (input gradient) and W (weight gradient) apart."""
        if self.custom_orders is not None:
            return any(step.kind == "W" for order in self.custom_orders for step in order)
        return schedules.SCHEDULES[self.schedule].split_backward

    @property
    def placement(self) -> str:
        """Which virtual stages a rank's chunks hold (schedules.stage_of)."""
        if self.custom_orders is not None:
            return self.schedule_placement or "looped"
        return schedules.SCHEDULES[self.schedule].placement


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    model: NetworkModelName = "fair-share"
    collective_algorithm: str = "auto"  # all-reduce: "ring", "tree", "hierarchical", "auto"
    # True: one lane per pipeline stage stands for its TP x DP GPUs (flows weighted);
    # False: exact mode, every GPU its own lanes and flows
    symmetry: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelConfig
    training: TrainingConfig
    network: NetworkConfig
    calibration: KernelConstants | None = None  # None: the GPU's own (cluster.gpu.kernels)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each pipeline runs per iteration."""
        per_replica = self.training.global_batch_size // self.parallel.data_parallel_size
        return per_replica // self.training.micro_batch_size

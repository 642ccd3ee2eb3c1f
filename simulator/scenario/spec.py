"""Frozen specifications: what a scenario file loads into, and the Python API.

The specs are the schema. Each field a scenario file can set is declared with `key`,
which records its help line, unit, range and choices as field metadata;
`simulator.scenario.fields` reads them back (`keys_of`) and `simulator.scenario.schema`
gathers them for the loader's type, range and choice checks, its defaults and required
keys, the resolved-TOML writer and the key tables of scenarios/README.md. Adding a key
is one `key(...)` line here plus its use. Cross-field rules live in
`simulator.scenario.rules`; every spec runs the rules it can check alone when it is
built, and `Scenario` runs the rest, so a scenario built in Python is checked exactly
as one read from a file.

Units live in the field names (see design notes). Human units (`_gbps`, `_us`,
`_gbytes_per_s`) appear only here, at the edge; `simulator.units` converts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepsim.topologies import FABRICS, NVLINK_TOPOLOGIES, FabricShape

from ..ir.units import gbytes_per_s_to_bytes_per_s, us_to_s
from ..ir.vocabulary import (
    AUTO,
    COLLECTIVE_ALGORITHMS,
    CP_COMM_TYPES,
    CP_P2P,
    FAIR_SHARE,
    NETWORK_MODELS,
)
from . import rules
from .errors import ScenarioError
from .fields import KeyRange, KeyUnitRange, check_values, key
from .fitted import MeasuredFit
from .gpu import GpuSpec, KernelConstants
from .hardware import HOST_LINK_GBYTES_PER_S, NVLS_EFFICIENCY
from .model import ModelSpec
from .perturbation import PerturbationSpec
from .presets import GPUS, NODES
from .stages import virtual_stage_layers
from .training import SCHEDULES, RecomputeGranularity, TrainingConfig

NetworkModelName = Literal["fair-share", "analytical"]


__all__ = [
    "SCHEDULES",
    "ModelSpec",
    "RecomputeGranularity",
    "ScenarioError",
    "TrainingConfig",
    "key",
]


_LATENCY_RANGE: KeyUnitRange = {
    "unit": "us",
    "low": 0.0,
    "high": 1e6,
    "may_be_zero": True,
    "preset": True,
}
_BANDWIDTH_RANGE: KeyRange = {"low": 1e-3, "high": 1e7, "preset": True}
_EFFICIENCY_RANGE: KeyRange = {"low": 0.01, "high": 1.0, "preset": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    node: str | None = key(
        "the node preset: fills every key whose default reads 'from `node`', which the "
        "table may still override",
        default=None,
        choices=tuple(NODES),
    )
    gpu: GpuSpec = key(
        "a GPU preset name; its peak TFLOP/s, memory and HBM bandwidth cannot be set as keys",
        choices=tuple(GPUS),
        preset=True,
        toml_type=str,
    )
    num_nodes: int = key(
        "nodes in the cluster; GPUs = num_nodes x gpus_per_node", low=1, high=100_000
    )
    gpus_per_node: int = key("GPUs in one node", preset=True)
    nics_per_node: int = key(
        "InfiniBand NICs in one node; <= `gpus_per_node` and must divide it (every NIC "
        "serves the same number of GPUs)",
        preset=True,
    )
    nic_gbps: float = key(
        "line rate of one NIC, per direction", unit="10^9 bit/s", **_BANDWIDTH_RANGE
    )
    nvlink_gbytes_per_s: float = key(
        "one GPU's NVLink bandwidth (all its lanes), per direction",
        unit="10^9 byte/s",
        **_BANDWIDTH_RANGE,
    )
    pcie_gbytes_per_s: float = key(
        "GPU <-> NIC path, per direction", unit="10^9 byte/s", **_BANDWIDTH_RANGE
    )
    nvlink_latency_us: float = key(
        "one NVLink hop (GPU <-> NVSwitch, or GPU <-> GPU on a direct link)", **_LATENCY_RANGE
    )
    pcie_latency_us: float = key("one hop GPU <-> NIC", **_LATENCY_RANGE)
    ib_latency_us: float = key(
        "one InfiniBand hop, NIC <-> switch or switch <-> switch", **_LATENCY_RANGE
    )
    collective_base_latency_us: float = key(
        "fixed software cost of launching one collective", **_LATENCY_RANGE
    )
    # the links are built at line rate x efficiency
    nvlink_efficiency: float = key(
        "fraction of the NVLink line rate transfers reach (NCCL's measured bus bandwidth / "
        "line rate: 0.77 on DGX A100, 0.82 on DGX H100, 0.80 on DGX H200, 0.68 on DGX B200, "
        "0.75 on GB200 NVL72, 0.81 on V100 nodes)",
        default=1.0,
        **_EFFICIENCY_RANGE,
    )
    nic_efficiency: float = key(
        "the same for the NICs (0.96 on DGX A100 and V100 nodes, 0.95 on DGX H100/H200)",
        default=1.0,
        **_EFFICIENCY_RANGE,
    )
    nvlink_topology: str = key(
        "how a node's GPUs are joined, see below (`hybrid-cube-mesh` needs "
        "`gpus_per_node = 8`, `all-to-all` at most 7)",
        default="nvswitch",
        choices=NVLINK_TOPOLOGIES,
        preset=True,
    )
    nvls_efficiency: float | None = key(
        "fraction of the NVLink rate that NVLink SHARP (NVLS) in-switch reductions reach "
        "(NCCL's nvlsEfficiency: 0.85 Hopper, 0.74 Blackwell); 0: the NVSwitch cannot "
        "reduce (as NCCL_NVLS_ENABLE=0); unset: the `node` preset's (0 without one); read by "
        "`network.collective_algorithm` `auto` and `nvls`",
        default=None,
        low=0.0,
        high=1.0,
        may_be_zero=True,
    )
    host_link_gbytes_per_s: float | None = key(
        "a GPU's own link to host memory, per direction, which activation offloading "
        "(`training.cpu_offloading`) copies over: NVLink-C2C on Grace superchips; unset: "
        "the `node` preset's (197, measured, on gb200-nvl72 and gb300-nvl72), else none, and the "
        "copies cross the GPU's PCIe link (`pcie_gbytes_per_s`) beside its NIC traffic",
        default=None,
        unit="10^9 byte/s",
        low=1e-3,
        high=1e7,
    )
    fabric: str = key(
        "how the nodes' NICs are joined, see below", default="switch", choices=FABRICS
    )
    fabric_levels: int = key("switch levels; used by `fat-tree` only", default=2, low=2, high=3)
    fabric_planes: int | None = key(
        "planes of a `multi-plane` fabric (NIC k of a node on plane k mod this); must "
        "divide `nics_per_node`; unset: one plane per NIC",
        default=None,
        low=1,
        high=1024,
    )
    nodes_per_leaf: int = key(
        "nodes (with all their NICs) under one leaf switch; for `rail-optimized` and "
        "`multi-plane`, nodes per group of rail or plane leaves; for `rail-only`, the nodes "
        "one rail switch holds (its ports: the cluster's most nodes)",
        default=16,
    )
    leaves_per_pod: int = key("leaves per pod; 3-level `fat-tree` only", default=8)
    spine_switches: int = key(
        "switches above the leaves (and, with 3 levels, above each pod)",
        default=4,
        low=1,
        high=1024,
    )
    oversubscription: float = key(
        "bandwidth below a switch level / bandwidth of its uplinks; `fat-tree`, "
        "`rail-optimized` and `multi-plane`",
        default=1.0,
        low=1.0,
        high=1000.0,
    )

    def __post_init__(self) -> None:
        check_values(self, "cluster")
        rules.check_cluster(self)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """The GPUs one NVLink fabric joins (topologies.node explains the domain).
        Every node type today is its own NVLink domain; the NVL72 racks are nodes of 72
        GPUs with a NIC each. A domain over servers that share NICs would become a
        cluster key here."""
        return self.gpus_per_node

    @property
    def host_link_bytes_per_s(self) -> float | None:
        """A GPU's own link to host memory (`host_link_gbytes_per_s`, or the node
        preset's: hardware.HOST_LINK_GBYTES_PER_S); None: host copies cross its PCIe link."""
        gbytes = self.host_link_gbytes_per_s
        if gbytes is None and self.node is not None:
            gbytes = HOST_LINK_GBYTES_PER_S.get(self.node)
        return None if gbytes is None else gbytes_per_s_to_bytes_per_s(gbytes)

    @property
    def nvls_fraction(self) -> float:
        """What NVLS reaches of the NVLink rate: `nvls_efficiency`, or when unset the
        node preset's (hardware.NVLS_EFFICIENCY: NVSwitch generation 3 and later); 0
        where the NVSwitch cannot reduce or the GPUs are not on an NVSwitch."""
        if self.nvls_efficiency is not None:
            return self.nvls_efficiency
        if self.nvlink_topology != "nvswitch":
            return 0.0
        return 0.0 if self.node is None else NVLS_EFFICIENCY.get(self.node, 0.0)

    def fabric_shape(self) -> FabricShape:
        """The fabric keys as topologies takes them (the latency converted to seconds)."""
        return FabricShape(
            kind=self.fabric,
            levels=self.fabric_levels,
            nodes_per_leaf=self.nodes_per_leaf,
            leaves_per_pod=self.leaves_per_pod,
            spines=self.spine_switches,
            oversubscription=self.oversubscription,
            latency_s=us_to_s(self.ib_latency_us),
            planes=self.fabric_planes or 0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    tensor_model_parallel_size: int = key(
        "must divide `model.num_attention_heads` and `model.ffn_hidden_size`; see the layout "
        "rules below",
        default=1,
    )
    pipeline_model_parallel_size: int = key(
        "must divide `model.num_layers`, unless the four keys below split it unevenly",
        default=1,
    )
    data_parallel_size: int = key(
        "TP x CP x PP x DP must be <= the GPU count; see the layout rules below",
        derived="GPU count / (TP x CP x PP)",
    )
    virtual_pipeline_model_parallel_size: int = key(
        "chunks per pipeline rank; >= 2 for `interleaved`, `looped_bfs`, `interleaved_zb`, "
        "exactly 2 for `zbv`, `dualpipev` and `dualpipe`, 1 for the others; it must divide "
        "every stage's layers",
        default=1,
        derived="1; 2 for chunked schedules; a custom file's chunks",
    )
    sequence_parallel: bool = key(
        "Megatron sequence parallelism within the TP group", default=False
    )
    # None (not set) reads as 1 and `p2p`: a scenario without CP writes neither key
    context_parallel_size: int | None = key(
        "Megatron-Core's context parallelism: each sequence split over this many GPUs (2 x "
        "this chunks, two per GPU, for causal balance); `model.seq_length` must be a "
        "multiple of 2 x it, and it needs flash or fused attention; TP x CP x PP x DP GPUs",
        default=None,
        derived="1 (no context parallelism)",
        low=1,
        high=4096,
    )
    cp_comm_type: str | None = key(
        "how the context-parallel attention exchanges K/V (Transformer Engine's "
        "`cp_comm_type`): `p2p` (a ring, each step's send overlapped with a block's "
        "attention), `all_gather` (K/V gathered before attention; Megatron's `allgather`), "
        "`a2a` (Ulysses: all-to-all of Q, K, V and the output; heads and query groups per "
        "TP rank divisible by CP)",
        default=None,
        derived="`p2p`",
        choices=CP_COMM_TYPES,
    )
    # expert parallelism (MoE models; docs/moe.md); None reads as 1 and as TP
    expert_model_parallel_size: int | None = key(
        "Megatron-Core's expert parallelism: each MoE layer's experts split over this many "
        "GPUs, folded over the stage's TP x CP x DP GPUs (rank order tp-ep-dp for experts); "
        "must divide `model.num_experts`",
        default=None,
        derived="1",
        low=1,
        high=65536,
    )
    expert_tensor_parallel_size: int | None = key(
        "tensor parallelism inside each expert (Megatron-Core's "
        "`--expert-tensor-parallel-size`); EP x this must divide TP x CP x DP; 1 or TP",
        default=None,
        derived="TP (Megatron-Core's default)",
        low=1,
        high=4096,
    )
    decoder_first_pipeline_num_layers: int | None = key(
        "Megatron-Core's `--decoder-first-pipeline-num-layers`: transformer layers on the "
        "first pipeline stage; the stages not set by this or the next key share the rest "
        "evenly; not with the `account_for_*` keys (see uneven stages below)",
        default=None,
        derived="none: an even split",
    )
    decoder_last_pipeline_num_layers: int | None = key(
        "Megatron-Core's `--decoder-last-pipeline-num-layers`: the same for the last stage",
        default=None,
        derived="none: an even split",
    )
    # None (not set) reads as false; the resolved TOML leaves an unset flag out
    account_for_embedding_in_pipeline_split: bool | None = key(
        "Megatron-Core's flag: the embedding counts as one layer in the split, so the first "
        "virtual stage holds one transformer layer fewer",
        default=None,
        derived="`false`",
    )
    account_for_loss_in_pipeline_split: bool | None = key(
        "Megatron-Core's flag: the output layer and loss count as one layer, so the last "
        "virtual stage holds one transformer layer fewer",
        default=None,
        derived="`false`",
    )
    pipeline_model_parallel_layout: str | None = key(
        "Megatron-Core's `--pipeline-model-parallel-layout`: the layers of each virtual "
        'stage in order, `|` between stages, e.g. "Et*3|(tt|)*29,m|L": `E` embedding, `t` '
        "transformer layer, `m` multi-token-prediction layer, `L` loss, `(...)*n` and `x*n` "
        "repeat, commas ignored; p x v stages; not with the other uneven-split keys",
        default=None,
        derived="none",
    )

    def __post_init__(self) -> None:
        check_values(self, "parallel")

    @property
    def cp_size(self) -> int:
        """Context-parallel size in effect: `context_parallel_size`, or 1."""
        return self.context_parallel_size or 1

    @property
    def cp_comm(self) -> str:
        """`cp_comm_type` in effect: as given, or `p2p` (Megatron-Core's default)."""
        return self.cp_comm_type or CP_P2P

    @property
    def ep_size(self) -> int:
        """Expert-parallel size in effect: `expert_model_parallel_size`, or 1."""
        return self.expert_model_parallel_size or 1

    @property
    def etp_size(self) -> int:
        """Expert tensor-parallel size in effect: as given, or TP (Megatron-Core)."""
        if self.expert_tensor_parallel_size is None:
            return self.tensor_model_parallel_size
        return self.expert_tensor_parallel_size

    @property
    def expert_data_parallel_size(self) -> int:
        """GPUs an expert's gradient is reduced over: TP x CP x DP / (EP x ETP)
        (Megatron-Core's expert-data-parallel group)."""
        stage = self.tensor_model_parallel_size * self.gradient_group_size
        return max(1, stage // (self.ep_size * self.etp_size))

    @property
    def gradient_group_size(self) -> int:
        """GPUs a gradient is reduced (and ZeRO shards) over: data x context parallel,
        Megatron-Core's data-parallel group with context parallelism."""
        return self.data_parallel_size * self.cp_size

    @property
    def num_gpus(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.cp_size
            * self.pipeline_model_parallel_size
            * self.data_parallel_size
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    model: NetworkModelName = key(
        "`fair-share`: concurrent transfers share every link max-min fairly; `analytical`: "
        "each transfer runs as if alone (latency + bytes / its bottleneck)",
        default=FAIR_SHARE,
        choices=NETWORK_MODELS,
    )
    collective_algorithm: str = key(
        "collective algorithm, see below: `auto` is NCCL's default choice (NVLS inside a "
        "node whose NVSwitch reduces); reduce-scatters and all-gathers are rings, or NVLS "
        "inside a node under `auto` and `nvls`",
        default=AUTO,
        choices=COLLECTIVE_ALGORITHMS,
    )
    symmetry: bool = key(
        "`true`: one GPU per pipeline stage is simulated and stands for the stage's TP x DP "
        "GPUs, its flows weighted by the flows they stand for (fast; exact when replicas are "
        "identical, which every scenario stepsim can express is); `false`: exact mode, every "
        "GPU has its own lanes and flows and a collective starts when the last member GPU "
        "reaches it (slower by about DP, or TP x DP where a perturbation or the links tell a "
        "TP group's ranks apart; see docs/performance.md)",
        default=True,
    )
    fast_forward: bool | None = key(
        "`false`: simulate every micro-batch; unset or `true`: a long pipeline's repeating "
        "steady state may be simulated for a few periods and the rest added, where a check "
        "proves the state repeats (docs/design.md; the summary says when it was used)",
        default=None,
    )

    def __post_init__(self) -> None:
        check_values(self, "network")


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A whole scenario. Building one runs every cross-field rule
    (`rules.check_scenario`), so a scenario edited with `dataclasses.replace` is
    checked as the loader checks a file, with the same one-line errors."""

    name: str = key("what the scenario is called (reports and tables show it); non-empty")
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelConfig
    training: TrainingConfig
    network: NetworkConfig
    calibration: KernelConstants | None = None  # None: the GPU's own (cluster.gpu.kernels)
    # a fit on measured iterations (`stepsim calibrate`, scenario/fitted.py) applied by the
    # loader (loader.apply_fit): its other multipliers are in the constants and the cluster
    # already; the attention multiplier and the host overhead are read from here
    measured: MeasuredFit | None = None
    # [[perturbation]] tables in file order (scenario/perturbation.py); () for a clean run
    perturbations: tuple[PerturbationSpec, ...] = ()

    def __post_init__(self) -> None:
        rules.check_scenario(self)

    @property
    def kernel_constants(self) -> KernelConstants:
        """The compute model's constants: the scenario's own calibration (a
        ``--calibration`` file), or its GPU's record's."""
        if self.calibration is not None:
            return self.calibration
        return self.cluster.gpu.kernels

    @property
    def attention_scale(self) -> float:
        """The attention core's matmul rate relative to the model's (1: as modelled)."""
        return 1.0 if self.measured is None else self.measured.attention

    @property
    def instruction_overhead_s(self) -> float:
        """Host seconds before each pipeline instruction's compute (0: none)."""
        return 0.0 if self.measured is None else self.measured.overhead_s

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each pipeline runs per iteration."""
        return rules.microbatches_per_pipeline(self.parallel, self.training)

    @property
    def chunk_layers(self) -> tuple[tuple[int, ...], ...]:
        """Transformer layers of chunk k of pipeline rank r, ``[r][k]``: L / (p v) each,
        or as the uneven-split keys say (stages.stage_layers)."""
        return virtual_stage_layers(self.model, self.parallel, self.training.placement)

    def rank_layers(self, rank: int) -> int:
        """Transformer layers on one pipeline rank, all its chunks together."""
        return sum(self.chunk_layers[rank])

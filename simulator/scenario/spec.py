"""Frozen specifications: what a scenario file loads into, and the Python API.

The specs are the schema. Each field a scenario file can set is declared with `key`,
which records its help line, unit, range and choices as field metadata;
`simulator.scenario.schema` reads them back (`dataclasses.fields`) for the loader's
type, range and choice checks, its defaults and required keys, the resolved-TOML
writer and the key tables of scenarios/README.md. Adding a key is one `key(...)` line
here plus its use. Cross-field rules live in `simulator.scenario.rules`; every spec
runs the rules it can check alone when it is built, and `Scenario` runs the rest, so
a scenario built in Python is checked exactly as one read from a file.

Units live in the field names (see design notes). Human units (`_gbps`, `_us`,
`_gbytes_per_s`) appear only here, at the edge; `simulator.units` converts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

import schedules
from topologies import FABRICS, NVLINK_TOPOLOGIES

from ..vocabulary import (
    ALL_REDUCE_ALGORITHMS,
    ATTENTION_KERNELS,
    AUTO,
    COMMUNICATION_DTYPES,
    DATA_PARALLEL_SHARDING,
    DTYPE_BYTES,
    FAIR_SHARE,
    NETWORK_MODELS,
    NO_SHARDING,
    PARAMS_DTYPES,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_NONE,
    TIED_GRAD_ORDERS,
    ZERO_GRAD_COLLECTIVES,
)
from . import frameworks, rules
from .errors import ScenarioError
from .stages import virtual_stage_layers

RecomputeGranularity = Literal["none", "selective", "full"]
NetworkModelName = Literal["fair-share", "analytical"]

SCHEDULES: tuple[str, ...] = (*schedules.SCHEDULES, rules.CUSTOM)  # custom: from a file

__all__ = ["SCHEDULES", "ScenarioError", "key"]


def key(
    help: str,
    *,
    default: Any = MISSING,
    unit: str | None = None,
    low: float | None = None,
    high: float | None = None,
    may_be_zero: bool = False,
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
    preset: bool = False,
    derived: str | None = None,
    toml_type: type | None = None,
    compare: bool = True,
) -> Any:
    """A scenario key: a dataclass field whose metadata the schema reads.

    ``help`` is one line for the README table. ``unit`` is shown beside it (the name
    carries it too). Numbers must be positive, or >= 0 with ``may_be_zero``, and lie
    in [``low``, ``high``] (default: 0 to 10^9). ``choices`` is the tuple of allowed
    strings, or a function giving it when the tuple lives in a module that imports
    this one (the presets). ``preset``: the section's preset (model.preset,
    cluster.node) may fill the key. ``derived``: how the loader fills a key the file
    leaves out although the spec requires it (README wording). ``toml_type``: the
    key's type in the file when it differs from the field's (cluster.gpu is a preset
    name that the loader turns into a GpuSpec). A field without ``key`` metadata is
    not a scenario key (TrainingConfig.custom_orders, Scenario.calibration).
    ``compare=False``: equality ignores the key as given (the framework's mechanism
    keys compare by their resolved values, `TrainingConfig.resolved`).
    """
    metadata = {
        "help": help,
        "unit": unit,
        "low": low,
        "high": high,
        "may_be_zero": may_be_zero,
        "choices": choices,
        "preset": preset,
        "derived": derived,
        "toml_type": toml_type,
    }
    return field(default=default, metadata=metadata, compare=compare)


def _mechanism(help: str, **metadata: Any) -> Any:
    """A framework mechanism key (frameworks.py): None means the framework's default;
    scenarios compare by the resolved value (`TrainingConfig.resolved`)."""
    return key(help, default=None, compare=False, **{"derived": "the framework's", **metadata})


def _presets(table: str) -> Callable[[], tuple[str, ...]]:
    """The names of a preset table, looked up when the schema asks (presets imports
    this module, so the names cannot be read at import time)."""

    def names() -> tuple[str, ...]:
        from . import presets

        return tuple(getattr(presets, table))

    return names


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

    def __post_init__(self) -> None:
        rules.check_kernel_constants(self)


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
    # tensor-core FLOPs an SM does in the time its special-function units do one
    # exponential: what flash attention's softmax costs in matmul time (workload.attention)
    tensor_flops_per_exp: float
    kernels: KernelConstants  # the compute model's constants for this GPU (gpu == name)

    @property
    def num_sms(self) -> int:
        return self.kernels.num_sms

    @property
    def kernel_provenance(self) -> str:
        """How the kernel constants were obtained: fitted, or uncalibrated and from where."""
        return self.kernels.source


_LATENCY_RANGE = {"unit": "us", "low": 0.0, "high": 1e6, "may_be_zero": True, "preset": True}
_BANDWIDTH_RANGE = {"low": 1e-3, "high": 1e7, "preset": True}
_EFFICIENCY_RANGE = {"low": 0.01, "high": 1.0, "preset": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    preset: str | None = key(
        "fills the keys below, which the table may still override",
        default=None,
        choices=_presets("MODELS"),
    )
    num_layers: int = key("transformer layers", preset=True)
    hidden_size: int = key("must be divisible by `num_attention_heads`", preset=True)
    num_attention_heads: int = key("must divide `hidden_size`", preset=True)
    ffn_hidden_size: int = key("width of the MLP's inner layer", derived="4 x `hidden_size`")
    seq_length: int = key("tokens per sample", unit="tokens", preset=True)
    vocab_size: int = key("vocabulary entries (embedding and output layer rows)", preset=True)

    def __post_init__(self) -> None:
        rules.check_values(self, "model")
        rules.check_model(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    node: str | None = key(
        "the node preset: fills every key whose default reads 'from `node`', which the "
        "table may still override",
        default=None,
        choices=_presets("NODES"),
    )
    gpu: GpuSpec = key(
        "a GPU preset name; its peak TFLOP/s, memory and HBM bandwidth cannot be set as keys",
        choices=_presets("GPUS"),
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
        "line rate: 0.77 on DGX A100, 0.82 on DGX H100/H200, 0.81 on V100 nodes)",
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
    fabric: str = key(
        "how the nodes' NICs are joined, see below", default="switch", choices=FABRICS
    )
    fabric_levels: int = key("switch levels; used by `fat-tree` only", default=2, low=2, high=3)
    nodes_per_leaf: int = key(
        "nodes (with all their NICs) under one leaf switch; for `rail-optimized`, nodes per "
        "group of rail leaves; `fat-tree` and `rail-optimized`",
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
        "bandwidth below a switch level / bandwidth of its uplinks; `fat-tree` and "
        "`rail-optimized`",
        default=1.0,
        low=1.0,
        high=1000.0,
    )

    def __post_init__(self) -> None:
        rules.check_values(self, "cluster")
        rules.check_cluster(self)

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
        "TP x PP x DP must be <= the GPU count; see the layout rules below",
        derived="GPU count / (TP x PP)",
    )
    virtual_pipeline_model_parallel_size: int = key(
        "chunks per pipeline rank; >= 2 for `interleaved`, `looped_bfs`, `interleaved_zb`, "
        "exactly 2 for `zbv`, 1 for the others; it must divide every stage's layers",
        default=1,
        derived="1; 2 for chunked schedules; a custom file's chunks",
    )
    sequence_parallel: bool = key(
        "Megatron sequence parallelism within the TP group", default=False
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

    def __post_init__(self) -> None:
        rules.check_values(self, "parallel")

    @property
    def num_gpus(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.data_parallel_size
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    micro_batch_size: int = key("samples per micro-batch", unit="samples", default=1)
    global_batch_size: int = key(
        "samples per iteration; divisible by `micro_batch_size x data_parallel_size`",
        unit="samples",
    )
    schedule: str = key(
        "pipeline schedule (see [docs/schedules.md](../docs/schedules.md)), or `custom` "
        "(from `schedule_file`)",
        default=schedules.ONE_F_ONE_B,
        choices=SCHEDULES,
    )
    microbatch_group_size_per_vp_stage: int | None = key(
        "interleaved schedules only (Megatron-LM's key): micro-batches per group going "
        "through one chunk; the micro-batch count must be a multiple of it, and it must be "
        ">= PP size or equal to the micro-batch count (smaller groups deadlock)",
        default=None,
        derived="PP size",
    )
    schedule_file: str | None = key(
        "`custom` only, required there: per-rank op orders, one line per rank "
        "(`F0 F1 B0 W0 ...`, `F3.1` for chunk 1), relative to the scenario file; checked "
        "for missing, repeated and misordered ops and for deadlock; its ranks, chunks and "
        "micro-batches must match the scenario",
        default=None,
    )
    schedule_placement: str | None = key(
        "`custom` only: chunk k of rank r holds stage k x PP + r (`looped`) or, with 2 "
        "chunks, stages r and 2 PP - 1 - r (`v`); named schedules fix theirs",
        default=None,
        choices=schedules.PLACEMENTS,
        derived=f'`"{schedules.LOOPED}"`',
    )
    # a custom schedule's per-rank orders, read from schedule_file (not a key)
    custom_orders: tuple[tuple[schedules.Step, ...], ...] | None = None
    recompute_granularity: RecomputeGranularity = key(
        "`selective` recomputes the attention core, `full` each layer's forward",
        default=RECOMPUTE_NONE,
        choices=RECOMPUTE_GRANULARITIES,
    )
    overlap_grad_reduce: bool = key(
        "all-reduce gradients per layer as soon as that layer's last backward is done, "
        "instead of once after the last backward (reduce-scatter under "
        '`data_parallel_sharding = "optimizer"`; no effect under `"full"` or with DP 1)',
        default=False,
    )
    async_tensor_model_parallel_allreduce: bool = key(
        "Megatron-LM's `--async-tensor-model-parallel-allreduce`: in each block's backward, "
        "the all-reduce (reduce-scatter under SP) of the input gradient runs while the "
        "weight gradient of the block's first GEMM (QKV, fc1) computes; not with schedules "
        "that split the backward",
        default=False,
    )
    tp_comm_overlap: bool = key(
        "Megatron-Core's `--tp-comm-overlap` (Transformer Engine userbuffers), with sequence "
        "parallelism: each SP all-gather runs pipelined with the GEMM it feeds (QKV, fc1; "
        "backward: projection and fc2 dX), each forward reduce-scatter with the GEMM "
        "producing it, which then runs on 16 fewer SMs; exposed only where longer than "
        "the GEMM. The backward reduce-scatter overlaps the weight gradient as with "
        "`async_tensor_model_parallel_allreduce`",
        default=False,
    )
    data_parallel_sharding: str = key(
        "`optimizer` is ZeRO-1, `full` ZeRO-3 / FSDP; no effect with DP 1",
        default=NO_SHARDING,
        choices=DATA_PARALLEL_SHARDING,
    )
    # -- the gradient path (docs/frameworks.md §3-§6, §8) ---------------------------------
    params_dtype: str = key(
        "16-bit type of weights and activations (`--fp16` / `--bf16`); bf16 needs an A100 or newer",
        default="fp16",
        choices=PARAMS_DTYPES,
    )
    accumulate_allreduce_grads_in_fp32: bool | None = key(
        "Megatron-LM's flag: gradients accumulate (and, unless `communication_data_type` "
        "says otherwise, are reduced) in an fp32 buffer, 4 bytes per parameter, instead of "
        "the params dtype; bf16 requires it (Megatron forces it, DeepSpeed's BF16_Optimizer "
        "always accumulates in fp32)",
        default=None,
        derived="`true` with bf16, else `false`",
    )
    communication_data_type: str | None = key(
        "dtype of the data-parallel gradient collectives (DeepSpeed's key); bf16 "
        "DeepSpeed sends `bf16` although it accumulates in fp32",
        default=None,
        choices=COMMUNICATION_DTYPES,
        derived="the accumulation dtype",
    )
    zero_grad_collective: str = key(
        '`data_parallel_sharding = "optimizer"` only: `reduce-scatter` (Megatron-LM\'s '
        "distributed optimizer) or `all-reduce` of every gradient, each replica then "
        "keeping its 1/DP (DeepSpeed ZeRO-1 and BF16_Optimizer with the pipeline engine)",
        default="reduce-scatter",
        choices=ZERO_GRAD_COLLECTIVES,
    )
    reduce_bucket_size: int = key(
        "elements per data-parallel gradient collective after the flush (DeepSpeed's "
        "`reduce_bucket_size`, 5e8); 0: one call for the whole stage",
        unit="elements",
        default=0,
        may_be_zero=True,
        high=10**12,
    )
    allgather_bucket_size: int = key(
        "elements per parameter all-gather after a ZeRO-1 step (DeepSpeed's "
        "`allgather_bucket_size`, 5e8); 0: one call",
        unit="elements",
        default=0,
        may_be_zero=True,
        high=10**12,
    )
    share_embeddings_and_output_weights: bool = key(
        "the output layer reuses the word embedding: with the two on different pipeline "
        "stages their gradients are all-reduced between the first and the last stage, "
        "V/TP x h elements per (TP rank, replica)",
        default=True,
    )
    tied_grad_reduce_order: str = key(
        "when the tied embedding's all-reduce runs: `after-dp` every data-parallel gradient "
        "collective (Megatron-LM 2021, Megatron-Core), `before-reduce-scatter` after an "
        "all-reduce but before the distributed optimizer's blocking reduce-scatter "
        "(Megatron-LM 2022), `before-dp` every one (DeepSpeed's ReduceTiedGrads)",
        default="after-dp",
        choices=TIED_GRAD_ORDERS,
    )
    gradient_accumulation_fusion: bool = key(
        "Megatron-LM's fusion: each weight-gradient GEMM accumulates into the gradient "
        "buffer (reads and writes it); `false`: a separate add kernel per layer and "
        "micro-batch reads the 2-byte gradient and the buffer and writes the buffer",
        default=True,
    )
    attention_kernel: str = key(
        "the attention core: `unfused` (Megatron-LM's GEMMs, softmax and dropout with the "
        "s x s scores through HBM) or `flash` (one fused kernel, FlashAttention-2 / cuDNN "
        "through Transformer Engine, as Megatron-Core runs it: no s x s tensors, the "
        "backward recomputes the scores; see docs/calibration.md)",
        default="unfused",
        choices=ATTENTION_KERNELS,
    )
    masked_softmax_fusion: bool = key(
        "`unfused` attention only: Megatron's fused scale-mask-softmax kernel where its "
        "shape rule allows (heads per TP rank x micro-batch divisible by 4, sequence "
        "length limits; docs/frameworks.md §9), else PyTorch's fp32 softmax; `false` is "
        "`--no-masked-softmax-fusion`",
        default=True,
    )

    framework: str = key(
        "the training framework whose pipeline engine the run used; each mechanism key "
        "below that the scenario leaves out takes this framework's default "
        "(simulator/scenario/frameworks.py, [docs/frameworks.md](../docs/frameworks.md))",
        default="megatron",
        choices=frameworks.FRAMEWORKS,
    )
    framework_version: str | None = key(
        "the framework's version: megatron `2021` (v2.5/v2.6), `2022` (e1c334b), `2024` "
        "(Megatron-Core r0.8.0); deepspeed `0.5.0` (v0.5.0-v0.5.3), `0.5.4` (v0.5.4-v0.7.7)",
        default=None,
        choices=frameworks.ALL_VERSIONS,
        derived="megatron `2021`, deepspeed `0.5.4`",
        compare=False,
    )
    pipeline_p2p: str | None = _mechanism(
        "`overlapped`: a non-blocking send when the pass ends; `batched-blocking` "
        "(Megatron): one blocking op per p2p call site holding its sends and receives, each "
        "transfer starting when both stages reach theirs; `sequential-blocking` "
        "(DeepSpeed): one per send or receive in TrainSchedule order, partitioned tensors "
        "after a meta message; blocking: 1f1b (both), gpipe (batched)",
        choices=frameworks.PIPELINE_P2P_MODES,
        derived="the framework's (overlapped where its mode is not modelled)",
    )
    scatter_gather_tensors_in_pipeline: bool | None = _mechanism(
        "TP > 1: each tensor rank sends 1/TP of a pipeline tensor, the receiver all-gathers "
        "it over TP (blocking); `false`: each sends all of it; no effect under sequence "
        "parallelism (the tensor already is 1/TP, no all-gather)"
    )
    pipeline_grads_partitioned: bool | None = _mechanism(
        "gradients between stages go scattered like activations (with "
        "`scatter_gather_tensors_in_pipeline`); `false`: whole, from every tensor rank"
    )
    pipeline_regather_output: bool | None = _mechanism(
        "DeepSpeed: a stage frees its partitioned output once sent and all-gathers it over "
        "TP again before the backward (before the gradient's receive if gradients go whole)"
    )
    # the framework's version and every mechanism key as resolved (not keys): set when
    # built, compared instead of the keys as given
    resolved: tuple[tuple[str, Any], ...] = field(init=False, default=())
    framework_note: str = field(init=False, default="", compare=False)

    def __post_init__(self) -> None:
        rules.check_values(self, "training")
        given = {name: getattr(self, name) for name in frameworks.MECHANISMS}
        version = self.framework_version
        rules.check_framework(self.framework, version, given, self.schedule)
        version, values, note = frameworks.resolve(self.framework, version, given, self.schedule)
        resolved = (("framework_version", version), *values.items())
        object.__setattr__(self, "resolved", resolved)
        object.__setattr__(self, "framework_note", note)
        rules.check_training_alone(self)

    def mechanism(self, name: str) -> Any:
        """A mechanism key (or ``framework_version``) as resolved."""
        return dict(self.resolved)[name]

    @property
    def engine_label(self) -> str:
        """e.g. "megatron 2021" (reports name the engine by it)."""
        return frameworks.label(self.framework, self.mechanism("framework_version"))

    @property
    def split_backward(self) -> bool:
        """Whether the schedule runs B (input gradient) and W (weight gradient) apart."""
        if self.custom_orders is not None:
            return any(step.kind == "W" for order in self.custom_orders for step in order)
        return schedules.SCHEDULES[self.schedule].split_backward

    @property
    def accumulates_in_fp32(self) -> bool:
        """Whether gradients accumulate in an fp32 buffer (derived: with bf16)."""
        if self.accumulate_allreduce_grads_in_fp32 is None:
            return self.params_dtype == "bf16"
        return self.accumulate_allreduce_grads_in_fp32

    @property
    def gradient_bytes(self) -> int:
        """Bytes per parameter of the gradient buffer (g in docs/frameworks.md)."""
        return DTYPE_BYTES["fp32" if self.accumulates_in_fp32 else self.params_dtype]

    @property
    def communication_bytes(self) -> int:
        """Bytes per parameter of a data-parallel gradient collective (c)."""
        if self.communication_data_type is None:
            return self.gradient_bytes
        return DTYPE_BYTES[self.communication_data_type]

    @property
    def placement(self) -> str:
        """Which virtual stages a rank's chunks hold (schedules.stage_of)."""
        if self.custom_orders is not None:
            return self.schedule_placement or schedules.LOOPED
        return schedules.SCHEDULES[self.schedule].placement


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    model: NetworkModelName = key(
        "`fair-share`: concurrent transfers share every link max-min fairly; `analytical`: "
        "each transfer runs as if alone (latency + bytes / its bottleneck)",
        default=FAIR_SHARE,
        choices=NETWORK_MODELS,
    )
    collective_algorithm: str = key(
        "all-reduce algorithm (TP and DP all-reduces; reduce-scatters and all-gathers are "
        "always rings), see below",
        default=AUTO,
        choices=ALL_REDUCE_ALGORITHMS,
    )
    symmetry: bool = key(
        "`true`: one GPU per pipeline stage is simulated and stands for the stage's TP x DP "
        "GPUs, its flows weighted by the flows they stand for (fast; exact when replicas are "
        "identical, which every scenario stepsim can express is); `false`: exact mode, every "
        "GPU has its own lanes and flows and a collective starts when the last member GPU "
        "reaches it (slower by about TP x DP, see docs/performance.md)",
        default=True,
    )

    def __post_init__(self) -> None:
        rules.check_values(self, "network")


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

"""One vocabulary for what runs and where the time goes.

Op kinds, the waits the engine records, streams, collective kinds, data-parallel
sharding modes and the breakdown categories are named here once (schedule names and
chunk placements in the `schedules` package, which owns them); the
lowering, the engine, the metrics, the text and figures, the CSV files and the traces
all read them from this module. A new kind of communication is one row in each table
below (its op kind, its wait, its stream, its category).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

# The kinds are StrEnums: each member is its string ("forward" == OpKind.FORWARD, with
# the same hash), so spans, tables, CSV and JSON read as before, and the module-level
# names (FORWARD, ...) are the members, which every room imports.


# -- op kinds: compute kinds hold the GPU, communication kinds move bytes ---------------
class OpKind(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"  # the whole backward, or its input-gradient part when split
    WEIGHT = "weight"  # the weight-gradient part of a split backward
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"
    TP_COMM = "tp_comm"
    PP_SEND = "pp_send"
    DP_SYNC = "dp_sync"
    CP_COMM = "cp_comm"  # context-parallel attention's K/V exchange (cost/context.py)
    EP_COMM = "ep_comm"  # expert parallelism's token dispatch and combine (emit/moe_ops.py)
    OFFLOAD = "offload"  # activations copied to host memory and back (emit/offload.py)
    BARRIER = "barrier"  # waits for its dependencies, nothing else


FORWARD, BACKWARD, WEIGHT = OpKind.FORWARD, OpKind.BACKWARD, OpKind.WEIGHT
RECOMPUTE, OPTIMIZER = OpKind.RECOMPUTE, OpKind.OPTIMIZER
TP_COMM, PP_SEND, DP_SYNC = OpKind.TP_COMM, OpKind.PP_SEND, OpKind.DP_SYNC
CP_COMM, EP_COMM, BARRIER = OpKind.CP_COMM, OpKind.EP_COMM, OpKind.BARRIER
OFFLOAD = OpKind.OFFLOAD

COMPUTE_KINDS = frozenset({FORWARD, BACKWARD, WEIGHT, RECOMPUTE, OPTIMIZER})
# a schedule's passes (F, B, W), drawn as boxes in the schedule study's pictures and trace
PASS_KINDS: tuple[str, ...] = (FORWARD, BACKWARD, WEIGHT)
# what counts as model work (MFU): the passes; recomputation and the optimizer do not
MODEL_KINDS = frozenset(PASS_KINDS)
# the communication kinds are the keys of WAIT_OF_COMM and STREAM_OF_COMM below


# -- waits the engine records on a lane (engine.core explains when each applies) --------
class WaitKind(StrEnum):
    IDLE = "idle"
    PP_WAIT = "pp_wait"
    DP_WAIT = "dp_wait"
    TP_WAIT = "tp_wait"
    CP_WAIT = "cp_wait"
    EP_WAIT = "ep_wait"
    OFFLOAD_WAIT = "offload_wait"


IDLE, PP_WAIT, DP_WAIT = WaitKind.IDLE, WaitKind.PP_WAIT, WaitKind.DP_WAIT
TP_WAIT, CP_WAIT, EP_WAIT = WaitKind.TP_WAIT, WaitKind.CP_WAIT, WaitKind.EP_WAIT
OFFLOAD_WAIT = WaitKind.OFFLOAD_WAIT
WAIT_OF_COMM: dict[str, str] = {
    PP_SEND: PP_WAIT,
    DP_SYNC: DP_WAIT,
    TP_COMM: TP_WAIT,
    CP_COMM: CP_WAIT,
    EP_COMM: EP_WAIT,
    OFFLOAD: OFFLOAD_WAIT,
}
COMM_WAITS = frozenset(WAIT_OF_COMM.values())  # a lane waiting on a transfer in flight


# -- streams: a GPU's compute stream, and the bands its non-blocking transfers run in --
class Stream(StrEnum):
    COMPUTE = "compute"
    ITERATION = "iteration"  # a job's barriers between iterations (run/multijob.py)
    PP = "pp"
    DP = "dp"
    TP = "tp"
    CP = "cp"
    EP = "ep"
    OFFLOAD = "offload"  # Transformer Engine's offload stream: host copies in order


COMPUTE_STREAM, ITERATION_STREAM = Stream.COMPUTE, Stream.ITERATION
PP_STREAM, DP_STREAM, TP_STREAM = Stream.PP, Stream.DP, Stream.TP
CP_STREAM, EP_STREAM, OFFLOAD_STREAM = Stream.CP, Stream.EP, Stream.OFFLOAD
STREAM_OF_COMM: dict[str, str] = {
    PP_SEND: PP_STREAM,
    DP_SYNC: DP_STREAM,
    TP_COMM: TP_STREAM,
    CP_COMM: CP_STREAM,
    EP_COMM: EP_STREAM,
    OFFLOAD: OFFLOAD_STREAM,
}
# trace threads
STREAM_ORDER: dict[str, int] = {
    COMPUTE_STREAM: 0,
    PP_STREAM: 1,
    DP_STREAM: 2,
    TP_STREAM: 3,
    CP_STREAM: 4,
    EP_STREAM: 5,
    OFFLOAD_STREAM: 6,
}


# -- collective kinds (comm/collectives.py builds them) ---------------------------------
class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"  # context parallelism's a2a, expert dispatch / combine
    RING_SEND = "ring_send"  # one step of a ring: every member sends to the next (CP)


ALL_REDUCE, REDUCE_SCATTER = CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER
ALL_GATHER, ALL_TO_ALL = CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL
RING_SEND = CollectiveKind.RING_SEND

# how the lowering names a data-parallel collective in op labels ("grads all-reduce")
COLLECTIVE_LABELS: dict[str, str] = {
    ALL_REDUCE: "all-reduce",
    REDUCE_SCATTER: "reduce-scatter",
    ALL_GATHER: "all-gather",
    ALL_TO_ALL: "all-to-all",
    RING_SEND: "ring send",
}

# -- choices a scenario makes -----------------------------------------------------------
RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = "none", "selective", "full"
RECOMPUTE_GRANULARITIES: tuple[str, ...] = (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL)
# Megatron-Core's --recompute-modules names (transformer_config.py), under `selective`
RECOMPUTE_MODULES: tuple[str, ...] = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)
ATTENTION_UNFUSED, ATTENTION_FLASH = "unfused", "flash"  # cost/attention.py's two cores
ATTENTION_KERNELS: tuple[str, ...] = (ATTENTION_UNFUSED, ATTENTION_FLASH)
# Megatron-Core's --attention-backend names; `fused` (cuDNN fused attention through
# Transformer Engine) runs flash's mechanism (cost/attention.py)
ATTENTION_FUSED = "fused"
ATTENTION_BACKENDS: tuple[str, ...] = (ATTENTION_FLASH, ATTENTION_FUSED, ATTENTION_UNFUSED)
# model.normalization and model.position_embedding_type (Megatron-Core's values)
LAYER_NORM, RMS_NORM = "LayerNorm", "RMSNorm"
NORMALIZATIONS: tuple[str, ...] = (LAYER_NORM, RMS_NORM)
LEARNED_ABSOLUTE, ROPE = "learned_absolute", "rope"
POSITION_EMBEDDINGS: tuple[str, ...] = (LEARNED_ABSOLUTE, ROPE)
FAIR_SHARE, ANALYTICAL = "fair-share", "analytical"  # engine.network's two models
NETWORK_MODELS: tuple[str, ...] = (FAIR_SHARE, ANALYTICAL)
# replicated, ZeRO-1 (the optimizer state sharded), ZeRO-3/FSDP (everything sharded)
NO_SHARDING, SHARD_OPTIMIZER, SHARD_FULL = "none", "optimizer", "full"
SHARD_GRADIENTS = "gradients"  # ZeRO-2: the optimizer states and the gradients
DATA_PARALLEL_SHARDING: tuple[str, ...] = (
    NO_SHARDING,
    SHARD_OPTIMIZER,
    SHARD_GRADIENTS,
    SHARD_FULL,
)
SHARDING_NAMES = {  # in tables
    NO_SHARDING: "-",
    SHARD_OPTIMIZER: "ZeRO-1",
    SHARD_GRADIENTS: "ZeRO-2",
    SHARD_FULL: "FSDP",
}
# parallel.cp_comm_type: Transformer Engine's context-parallel attention (cost/context.py)
CP_P2P, CP_ALL_GATHER, CP_A2A = "p2p", "all_gather", "a2a"
CP_COMM_TYPES: tuple[str, ...] = (CP_P2P, CP_ALL_GATHER, CP_A2A)
# training.moe_token_dispatcher_type: Megatron-Core's token dispatchers (cost/moe.py)
MOE_ALLGATHER, MOE_ALLTOALL, MOE_FLEX = "allgather", "alltoall", "flex"
MOE_DISPATCHERS: tuple[str, ...] = (MOE_ALLGATHER, MOE_ALLTOALL, MOE_FLEX)
RING, TREE, HIERARCHICAL, AUTO = "ring", "tree", "hierarchical", "auto"  # collectives.all_reduce
ALL_REDUCE_ALGORITHMS: tuple[str, ...] = (RING, TREE, HIERARCHICAL, AUTO)
# NVLink SHARP (in-switch reduction): `auto`'s choice with NVLS among the candidates
NVLS = "nvls"
COLLECTIVE_ALGORITHMS: tuple[str, ...] = (*ALL_REDUCE_ALGORITHMS, NVLS)
# the gradient path (docs/frameworks.md §4-§6): dtypes and their bytes, how ZeRO-1's
# gradients meet, when the tied embedding's gradient all-reduce runs
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
PARAMS_DTYPES: tuple[str, ...] = ("fp16", "bf16")
COMMUNICATION_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")
# Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer, TE's
# FusedAdam): the dtypes it may keep its state in (training/arguments.py choices)
MAIN_PARAMS_DTYPES: tuple[str, ...] = ("fp32", "fp16")
MAIN_GRADS_DTYPES: tuple[str, ...] = ("fp32", "bf16")
ADAM_STATE_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8")
STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# FP8 training through Transformer Engine: Megatron-Core's --fp8-format and --fp8-recipe
# (megatron/core/transformer/transformer_config.py: fp8, fp8_recipe)
FP8_HYBRID, FP8_E4M3 = "hybrid", "e4m3"
FP8_FORMATS: tuple[str, ...] = (FP8_HYBRID, FP8_E4M3)
FP8_DELAYED, FP8_TENSORWISE = "delayed", "tensorwise"
FP8_BLOCKWISE, FP8_MXFP8 = "blockwise", "mxfp8"
FP8_RECIPES: tuple[str, ...] = (FP8_DELAYED, FP8_TENSORWISE, FP8_BLOCKWISE, FP8_MXFP8)
ZERO_REDUCE_SCATTER, ZERO_ALL_REDUCE = "reduce-scatter", "all-reduce"
ZERO_GRAD_COLLECTIVES: tuple[str, ...] = (ZERO_REDUCE_SCATTER, ZERO_ALL_REDUCE)
TIED_AFTER_DP, TIED_BEFORE_DP = "after-dp", "before-dp"
TIED_BEFORE_REDUCE_SCATTER = "before-reduce-scatter"
TIED_GRAD_ORDERS: tuple[str, ...] = (TIED_AFTER_DP, TIED_BEFORE_REDUCE_SCATTER, TIED_BEFORE_DP)


# -- the breakdown of a GPU's iteration -------------------------------------------------
class Category(NamedTuple):
    key: str  # in metrics.json (breakdown_s) and CSV columns (breakdown_s.KEY)
    label: str  # in the summary and the breakdown figure
    color: str  # in the breakdown figure
    kinds: tuple[str, ...]  # the span kinds on a compute stream it counts; idle: the rest
    short: str  # in narrow tables (stepsim search): the column SHORT%


# category keys (the communication ones share their op kind's name)
COMPUTE_TIME, PP_P2P_TIME, IDLE_TIME = "compute", "pp_p2p", IDLE  # idle: what the rest leave

# context-parallel communication: a category of the runs that have it (CP > 1) only, so
# that a run without CP reports the six categories below, as before CP existed
CP_CATEGORY = Category(
    CP_COMM, "context-parallel comm (exposed)", "#8172B3", (CP_COMM, CP_WAIT), "cp"
)
# expert-parallel communication (token dispatch and combine): likewise only in MoE runs
# with expert parallelism
EP_CATEGORY = Category(
    EP_COMM, "expert-parallel comm (exposed)", "#64B5CD", (EP_COMM, EP_WAIT), "ep"
)
# activation offloading (training.cpu_offloading): the compute stream waiting for a copy
# to or from host memory; likewise only in runs that offload
OFFLOAD_CATEGORY = Category(
    OFFLOAD, "activation offload (exposed)", "#8C8C3C", (OFFLOAD, OFFLOAD_WAIT), "offload"
)
CATEGORIES: tuple[Category, ...] = (
    Category(COMPUTE_TIME, "compute", "#4C72B0", (FORWARD, BACKWARD, WEIGHT, RECOMPUTE), "compute"),
    Category(TP_COMM, "tensor-parallel comm (exposed)", "#55A868", (TP_COMM, TP_WAIT), "tp"),
    Category(PP_P2P_TIME, "pipeline p2p (exposed)", "#C44E52", (PP_WAIT,), "pp"),
    Category(DP_SYNC, "data-parallel sync (exposed)", "#937860", (DP_SYNC, DP_WAIT), "dp"),
    Category(OPTIMIZER, "optimizer step", "#222222", (OPTIMIZER,), "optim"),
    Category(IDLE_TIME, "idle (pipeline bubble)", "#BBBBBB", (IDLE,), "idle"),
)
BREAKDOWN_KEYS: tuple[str, ...] = tuple(c.key for c in CATEGORIES)
# every category, CP's, EP's and offloading's after TP's: what a run with all would report
ALL_CATEGORIES: tuple[Category, ...] = (
    *CATEGORIES[:2],
    CP_CATEGORY,
    EP_CATEGORY,
    OFFLOAD_CATEGORY,
    *CATEGORIES[2:],
)
ALL_BREAKDOWN_KEYS: tuple[str, ...] = tuple(c.key for c in ALL_CATEGORIES)
CATEGORY_OF_KIND: dict[str, str] = {kind: c.key for c in ALL_CATEGORIES for kind in c.kinds}
EXPOSED_COMM_KEYS: tuple[str, ...] = (TP_COMM, PP_P2P_TIME, DP_SYNC)  # and CP's, EP's if any


def breakdown_keys(
    context_parallel: bool, expert_parallel: bool = False, offload: bool = False
) -> tuple[str, ...]:
    """The breakdown's keys of a run with or without context and expert parallelism and
    activation offloading."""
    return tuple(
        k
        for k in ALL_BREAKDOWN_KEYS
        if (k != CP_COMM or context_parallel)
        and (k != EP_COMM or expert_parallel)
        and (k != OFFLOAD or offload)
    )


def categories_of(breakdown) -> tuple[Category, ...]:
    """The categories a breakdown (a dict by key) has, in order."""
    return tuple(c for c in ALL_CATEGORIES if c.key in breakdown)


BREAKDOWN_COLUMN = "breakdown_s.{}"  # a category's column in sweep.csv and search.csv


# -- how span kinds are drawn in the timeline: colour, and the legend entry --------------
class KindStyle(NamedTuple):
    color: str
    legend: str | None  # None: shares the legend entry of the kind it waits for


KIND_STYLES: dict[str, KindStyle] = {
    FORWARD: KindStyle("#4C72B0", "forward"),
    BACKWARD: KindStyle("#DD8452", "backward (input gradient when split)"),
    WEIGHT: KindStyle("#CCB974", "weight gradient"),
    RECOMPUTE: KindStyle("#DA8BC3", "recompute"),  # pink: apart from forward's blue
    TP_COMM: KindStyle("#55A868", "tensor-parallel comm"),
    TP_WAIT: KindStyle("#55A868", None),
    CP_COMM: KindStyle("#8172B3", "context-parallel comm"),
    CP_WAIT: KindStyle("#8172B3", None),
    EP_COMM: KindStyle("#64B5CD", "expert-parallel comm (dispatch / combine)"),
    EP_WAIT: KindStyle("#64B5CD", None),
    OFFLOAD: KindStyle("#8C8C3C", "activation offload (host copies / exposed wait)"),
    OFFLOAD_WAIT: KindStyle("#8C8C3C", None),
    PP_SEND: KindStyle("#C44E52", "pipeline p2p (send / exposed wait)"),
    PP_WAIT: KindStyle("#C44E52", None),
    DP_SYNC: KindStyle("#937860", "data-parallel grad sync"),
    DP_WAIT: KindStyle("#937860", None),
    OPTIMIZER: KindStyle("#222222", "optimizer"),
    IDLE: KindStyle("#EEEEEE", "idle (bubble)"),
}

"""What each training framework does by default, per version: one table.

`[training] framework` and `framework_version` name the software a run used; each
mechanism key of `[training]` that the scenario leaves out (None) takes the value
below for that framework and version. The sources are in docs/frameworks.md (file,
commit and version for every entry); a short pointer sits beside each row.

Adding a mechanism is one row of `MECHANISMS` (its value for every version, in the
order of `VERSIONS`) plus its `key(...)` field in `spec.TrainingConfig` with
``default=None``; resolution, the resolved TOML, the run summary and metrics.json
follow (a test checks that every row has its field).

Versions: Megatron-LM "2021" is tags v2.5/v2.6 (Aug 2021), "2022" main at e1c334b
(Dec 2022), "2024" Megatron-Core r0.8.0 (what the H100 calibration set ran), "2025"
Megatron-Core from core_r0.12.1: what differs from r0.8.0 is a row of its own
(`moe_probs_in_experts`); the other rows keep r0.8.0's values, not re-verified.
DeepSpeed "0.5.0" is the PipelineEngine of v0.5.0-v0.5.3, "0.5.4" that of v0.5.4
(e2fdd25, "Big science related changes") to v0.7.7, both as Megatron-DeepSpeed
drives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepsim.schedules import SCHEDULES

MEGATRON, DEEPSPEED = "megatron", "deepspeed"
FRAMEWORKS: tuple[str, ...] = (MEGATRON, DEEPSPEED)

# (framework, version), the columns of every row below, in this order
VERSIONS: tuple[tuple[str, str], ...] = (
    (MEGATRON, "2021"),
    (MEGATRON, "2022"),
    (MEGATRON, "2024"),
    (MEGATRON, "2025"),
    (DEEPSPEED, "0.5.0"),
    (DEEPSPEED, "0.5.4"),
)
# A scenario that names no version runs the newest one the table models: what a run
# planned today uses (Megatron-Core "2025"; DeepSpeed's 0.5.4-0.7.7 PipelineEngine).
# Historical scenarios pin theirs: Megatron 2021 for the A100 (Narayanan et al. 2021)
# and V100 calibration sets and the GPT-3-shaped scenario, DeepSpeed 0.5.4 (the first
# version with BigScience's changes, PR #1407) for MT-NLG's and BLOOM's
# Megatron-DeepSpeed (the exact commits are not in any source read, docs/frameworks.md
# "Not verified").
DEFAULT_VERSION: dict[str, str] = {framework: version for framework, version in VERSIONS}
# Versions whose runs leave out `params_dtype` train in bf16 (on GPUs that have it):
# Megatron-Core's examples of today train with --bf16 (examples/llama/
# train_llama3_8b_h100_fp8.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh,
# examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh at d98e8a6), while its GPT
# example still passed --fp16 at core_r0.8.0 (examples/gpt3/
# train_gpt3_175b_distributed.sh), as Megatron-LM's 2021/2022 scripts and DeepSpeed's
# pipeline-engine runs did.
BF16_DEFAULT_VERSIONS: frozenset[str] = frozenset({"2025"})

OVERLAPPED, BATCHED_BLOCKING, SEQUENTIAL_BLOCKING = (
    "overlapped",
    "batched-blocking",
    "sequential-blocking",
)
PIPELINE_P2P_MODES: tuple[str, ...] = (OVERLAPPED, BATCHED_BLOCKING, SEQUENTIAL_BLOCKING)
# the schedules whose p2p call sites each blocking mode models (others: a rule refuses
# an explicit blocking mode; a framework default falls back to `overlapped`, labelled)
BLOCKING_SCHEDULES: dict[str, tuple[str, ...]] = {
    # Megatron's call sites, from the op order (interleaved: schedules.p2p, all ranks)
    BATCHED_BLOCKING: ("1f1b", "gpipe", "interleaved"),
    SEQUENTIAL_BLOCKING: ("1f1b",),  # DeepSpeed's TrainSchedule is 1F1B
}

# mechanism key: (value per VERSIONS column), source (docs/frameworks.md section)
MECHANISMS: dict[str, tuple[tuple[Any, ...], str]] = {
    # Megatron p2p_communication.py `_communicate`: batch_isend_irecv + wait +
    # cuda.synchronize (v2.5 e269e20, e1c334b; Megatron-Core r0.8.0 batch_p2p_comm and
    # batch_p2p_sync default on); DeepSpeed pipe/p2p.py blocking send/recv, one per
    # TrainSchedule instruction (v0.5.0 f284324, v0.7.7 2076bf2). frameworks.md §1.
    "pipeline_p2p": (
        (BATCHED_BLOCKING,) * 4 + (SEQUENTIAL_BLOCKING,) * 2,
        "Megatron p2p_communication.py _communicate; DeepSpeed pipe/p2p.py, pipe/schedule.py",
    ),
    # Megatron --scatter-gather-tensors-in-pipeline default on since 27fc468 (2021-02);
    # 2024 kept as 2022 (not verified for Megatron-Core; moot under SP); DeepSpeed
    # is_pipe_partitioned = is_model_parallel, every version. §2.
    "scatter_gather_tensors_in_pipeline": (
        (True,) * 6,
        "Megatron arguments.py, p2p_communication.py; DeepSpeed pipe/engine.py __init__",
    ),
    # Megatron scatters gradients like activations; DeepSpeed is_grad_partitioned False
    # up to v0.5.3, = is_model_parallel from v0.5.4 (e2fdd25). §2(b).
    "pipeline_grads_partitioned": (
        (True,) * 4 + (False, True),
        "Megatron p2p_communication.py; DeepSpeed pipe/engine.py (v0.5.0 vs v0.5.10)",
    ),
    # DeepSpeed frees a stage's partitioned output after sending it and all-gathers it
    # again for the backward (_exec_recv_grads up to v0.5.3, _exec_backward_pass from
    # v0.5.4); Megatron keeps it. §2(b).
    "pipeline_regather_output": (
        (False,) * 4 + (True, True),
        "DeepSpeed pipe/engine.py _exec_forward_pass, _exec_backward_pass, _exec_recv_grads",
    ),
    # Megatron-LM --async-tensor-model-parallel-allreduce: on main from 2021-09 (6e1bde1),
    # not in tags v2.5/v2.6; on in 2022 (e1c334b) and Megatron-Core; Megatron-DeepSpeed's
    # layers use the synchronous copy_to_tensor_model_parallel_region. §8.
    "async_tensor_model_parallel_allreduce": (
        (False, True, True, True, False, False),
        "Megatron mpu/layers.py (6e1bde1, e1c334b); Megatron-DeepSpeed mpu/layers.py (497aa1b)",
    ),
    # Megatron-LM gradient-accumulation fusion from 2022-02 (9c5a830); DeepSpeed
    # accumulates by autograd (fp16) or BF16_Optimizer's cast + add. §8.
    "gradient_accumulation_fusion": (
        (False, True, True, True, False, False),
        "Megatron core/tensor_parallel/layers.py (9c5a830, e1c334b); DeepSpeed bf16_optimizer.py",
    ),
    # Megatron-LM's distributed optimizer reduce-scatters the grad buffer (d07d29d,
    # e1c334b); DeepSpeed ZeRO-1 with the pipeline engine all-reduces each bucket and
    # keeps its partition (stage_1_and_2.py buffered_reduce_fallback). §5.
    "zero_grad_collective": (
        ("reduce-scatter",) * 4 + ("all-reduce",) * 2,
        "Megatron optimizer/distrib_optimizer.py; DeepSpeed zero/stage_1_and_2.py reduce_ipg_grads",
    ),
    # DeepSpeed's 5e8-element buckets (MEMORY_OPT_ALLREDUCE_SIZE, reduce_bucket_size,
    # allgather_bucket_size defaults); Megatron one call per buffer. §3, §5.
    "reduce_bucket_size": (
        (0, 0, 0, 0, 500_000_000, 500_000_000),
        "DeepSpeed runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE, zero/constants.py",
    ),
    "allgather_bucket_size": (
        (0, 0, 0, 0, 500_000_000, 500_000_000),
        "DeepSpeed zero/constants.py, runtime/utils.py all_gather_dp_groups",
    ),
    # Megatron-LM 2021 all-reduces the tied embedding after the DP all-reduce (training.py
    # v2.5), 2022 before the distributed optimizer's reduce-scatter (optimizer.py
    # e1c334b), Megatron-Core after the DP sync (finalize_model_grads.py); DeepSpeed's
    # ReduceTiedGrads runs before ReduceGrads (pipe/engine.py). §6.
    "tied_grad_reduce_order": (
        ("after-dp", "before-reduce-scatter", "after-dp", "after-dp", "before-dp", "before-dp"),
        "Megatron training.py, optimizer/optimizer.py, finalize_model_grads.py; "
        "DeepSpeed pipe/engine.py _exec_reduce_tied_grads",
    ),
    # Megatron-Core r0.8.0 builds GPT layers with Transformer Engine by default
    # (training/arguments.py --transformer-impl transformer_engine): TEDotProductAttention,
    # a fused (flash / cuDNN) attention kernel; Megatron-LM 2021/2022 and Megatron-DeepSpeed
    # run the unfused core with the fused softmax (§9, docs/calibration.md).
    "attention_kernel": (
        ("unfused", "unfused", "flash", "flash", "unfused", "unfused"),
        "Megatron-Core training/arguments.py (core_r0.8.0); Megatron model/transformer.py",
    ),
    # Megatron-Core from core_r0.12.1 permutes the router probabilities with the tokens
    # (moe/token_dispatcher.py dispatch_preprocess: permute(..., probs=probs), their own
    # all-to-all) and weights the experts' activation with them (moe/experts.py), so the
    # unpermute merges unweighted rows; r0.8.0 weighted after the experts and kept the
    # product's rows for the probabilities' gradient (docs/memory.md). DeepSpeed's
    # engines here run no MoE layer.
    "moe_probs_in_experts": (
        (False, False, False, True, False, False),
        "Megatron-Core moe/token_dispatcher.py, moe/experts.py (core_r0.12.1 on)",
    ),
}

# The fused-softmax availability rule (scenario/softmax.py) each version runs:
# Megatron-LM v2.5/v2.6 the 2021 rule, main from 2022 the 2022 rule (Megatron-Core
# keeps the same check for its local path), Megatron-DeepSpeed's fork the 2021 rule
# (bigscience-workshop/Megatron-DeepSpeed megatron/model/fused_softmax.py, 497aa1b).
SOFTMAX_RULE: dict[tuple[str, str], str] = {
    (MEGATRON, "2021"): "2021",
    (MEGATRON, "2022"): "2022",
    (MEGATRON, "2024"): "2022",
    (MEGATRON, "2025"): "2022",
    (DEEPSPEED, "0.5.0"): "2021",
    (DEEPSPEED, "0.5.4"): "2021",
}


def versions(framework: str) -> tuple[str, ...]:
    """The versions the table knows for a framework, oldest first."""
    return tuple(v for f, v in VERSIONS if f == framework)


ALL_VERSIONS: tuple[str, ...] = tuple(v for _, v in VERSIONS)


def defaults(framework: str, version: str) -> dict[str, Any]:
    """Every mechanism key's value for this framework and version."""
    column = VERSIONS.index((framework, version))
    return {name: values[column] for name, (values, _source) in MECHANISMS.items()}


def p2p_modelled(mode: str, schedule: str) -> bool:
    """Whether the lowering models this p2p mode's call sites for the schedule."""
    return mode == OVERLAPPED or schedule in BLOCKING_SCHEDULES[mode]


def resolve(
    framework: str,
    version: str | None,
    given: Mapping[str, Any],
    schedule: str,
    split_backward: bool | None = None,
) -> tuple[str, dict[str, Any], str]:
    """(version, every mechanism key's value, a note) for a scenario that sets
    ``given`` (None: not set). A framework's blocking p2p default on a schedule whose
    call sites are not modelled falls back to `overlapped`; the async TP all-reduce is
    off on a schedule that splits the backward (``split_backward``; None: as the named
    schedule does), given or not: with the weight gradient deferred there is no GEMM to
    hide it behind, and the zero-bubble code issues the all-reduce synchronously
    (sail-sg/zero-bubble-pipeline-parallelism megatron/core/tensor_parallel/layers.py,
    ``async_op=wgrad_compute``, False under ``WeightGradStore.split_bw()``; 3664da6).
    The note says what was changed ("; " between two)."""
    version = version or DEFAULT_VERSION[framework]
    table = defaults(framework, version)
    values = {name: table[name] if given.get(name) is None else given[name] for name in table}
    notes = []
    if given.get("pipeline_p2p") is None and not p2p_modelled(values["pipeline_p2p"], schedule):
        notes.append(f"{values['pipeline_p2p']} p2p not modelled for {schedule}: overlapped")
        values["pipeline_p2p"] = OVERLAPPED
    if split_backward is None:
        info = SCHEDULES.get(schedule)
        split_backward = info is not None and info.split_backward
    if split_backward and values["async_tensor_model_parallel_allreduce"]:
        notes.append(
            f"async TP all-reduce off for {schedule}: it splits the backward, so the "
            "input gradient's all-reduce has no weight gradient to overlap"
        )
        values["async_tensor_model_parallel_allreduce"] = False
    return version, values, "; ".join(notes)


def label(framework: str, version: str) -> str:
    """How reports name the engine, e.g. "megatron 2021"."""
    return f"{framework} {version}"


def markdown_table() -> str:
    """The table as scenarios/README.md shows it (``python -m stepsim.scenario``)."""
    head = " | ".join(f"{f} {v}" for f, v in VERSIONS)
    lines = [f"| Key | {head} | Source |", "|---" * (len(VERSIONS) + 2) + "|"]
    for name, (values, source) in MECHANISMS.items():
        cells = " | ".join(f"`{str(v).lower() if isinstance(v, bool) else v}`" for v in values)
        lines.append(f"| `{name}` | {cells} | {source} |")
    return "\n".join(lines)

"""The rules a scenario's values must keep together, as plain functions over specs.

Each spec runs the rules it can check on its own when it is built (its keys'
`fields.check_values`, then `check_model`, `check_cluster`, `check_training_alone`);
`Scenario` runs `check_scenario`, the rules across specs. So a scenario read from a
file and one built or edited in Python (`dataclasses.replace`) go through the same
rules and fail with the same one-line `ScenarioError`. The loader adds only what a
file needs besides: types, ranges and choices of what the user typed (`schema`),
presets, derived defaults and reading a custom schedule's file.

Where several rules fail, the first in this order is reported: the model, the
cluster, the training keys alone, then the cluster's size (`check_cluster_size`: it
depends on the network mode), the name (`check_name`), the untied output layer
against the tied one (`check_tied_embeddings`), context parallelism's needs
(`check_context_parallel`), the layout
(`check_layout`), the batch and schedule (`check_schedule`), the size of the
simulation (`check_size`) and the GPU of the kernel constants (`check_calibration`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepsim.schedules import DUAL, LOOPED, V_SHAPE
from stepsim.schedules import SCHEDULES as SCHEDULE_INFO
from stepsim.schedules import check as schedule_problem
from stepsim.schedules.custom import check_orders, sizes_of
from stepsim.topologies import PLANAR  # drawn whole in symmetric mode too (run.build_cluster)

from ..ir.vocabulary import (
    RECOMPUTE_MODULES,
    RECOMPUTE_SELECTIVE,
    SHARD_GRADIENTS,
    SHARD_OPTIMIZER,
)
from . import frameworks, limits
from .cluster_rules import check_cluster as check_cluster  # ClusterSpec calls it here
from .cluster_rules import check_nvls
from .errors import ScenarioError
from .model_rules import attention_kernel_of as attention_kernel_of  # spec and training call
from .model_rules import check_context_parallel, check_query_groups_split, check_tied_embeddings
from .model_rules import check_distributed_optimizer as check_distributed_optimizer
from .model_rules import check_model as check_model  # these through rules
from .moe_rules import check_expert_parallel
from .offload_rules import check_offloading
from .overlap_rules import check_overlap
from .perturbation import check_targets
from .precision import check_fp8
from .softmax import SOURCE as SOFTMAX_SOURCE
from .softmax import scenario_softmax_path
from .stages import check_dual, stage_layers

if TYPE_CHECKING:
    from .spec import (
        ClusterSpec,
        ModelSpec,
        ParallelConfig,
        Scenario,
        TrainingConfig,
    )

OPS_PER_LAYER_AND_MICROBATCH = 12  # about a dozen ops per layer and micro-batch
CUSTOM = "custom"  # training.schedule of a schedule read from a file
CUSTOM_SCHEDULE_KEYS = ("schedule_file", "schedule_placement")  # custom schedules only


def check_training_alone(training: TrainingConfig) -> None:
    """A custom schedule needs its orders, and they must be able to run (the checks a
    schedule file gets, `schedules.custom.check_orders`); its file, placement and
    orders suit it alone; bf16 gradients accumulate in fp32."""
    if training.schedule != CUSTOM:
        for name in CUSTOM_SCHEDULE_KEYS:
            value = getattr(training, name)
            if value is not None:
                raise ScenarioError(
                    key=f"training.{name}",
                    value=value,
                    rule="applies to training.schedule='custom' only",
                )
        if training.custom_orders is not None:
            raise ScenarioError(
                key="training.schedule",
                value=training.schedule,
                rule="must be 'custom' to run the per-rank orders given as "
                "TrainingConfig.custom_orders",
            )
    elif training.custom_orders is None:
        raise ScenarioError(
            "missing key training.schedule_file (per-rank op orders) for "
            "training.schedule='custom'",
            key="training.schedule_file",
            rule="required for training.schedule='custom'",
        )
    else:
        _check_orders(training)
    check_precision(training)


def check_precision(training: TrainingConfig) -> None:
    """bf16 gradients accumulate in fp32: Megatron-LM's arguments.py forces
    accumulate_allreduce_grads_in_fp32 with --bf16, and DeepSpeed's BF16_Optimizer keeps
    an fp32 gradient buffer (docs/frameworks.md §4)."""
    if (
        training.params_dtype == "bf16"
        and training.accumulate_allreduce_grads_in_fp32 is False
        and training.main_grads_dtype == "fp32"
    ):
        raise ScenarioError(
            key="training.accumulate_allreduce_grads_in_fp32",
            value=False,
            rule="must be true with training.params_dtype='bf16' (Megatron-LM forces it)",
            fix='leave it out or set it true (bf16 gradients: training.main_grads_dtype = "bf16")',
        )


def check_tp_comm_overlap(parallel: ParallelConfig, training: TrainingConfig) -> None:
    """Userbuffers overlap the SP all-gather and reduce-scatter; without SP there are
    none (Megatron-Core's TE layers take the overlap only with sequence parallelism)."""
    if (
        training.tp_comm_overlap
        and parallel.tensor_model_parallel_size > 1
        and not parallel.sequence_parallel
    ):
        raise ScenarioError(
            key="training.tp_comm_overlap",
            value=True,
            rule="overlaps sequence parallelism's all-gather and reduce-scatter",
            fix="set parallel.sequence_parallel = true",
        )


def check_param_gather(parallel: ParallelConfig, training: TrainingConfig) -> None:
    """Overlapping the parameter all-gather is the distributed optimizer's (Megatron-LM
    arguments.py: --overlap-param-gather only with --use-distributed-optimizer)."""
    sharding = training.data_parallel_sharding
    if training.overlap_param_gather and sharding not in (SHARD_OPTIMIZER, SHARD_GRADIENTS):
        raise ScenarioError(
            key="training.overlap_param_gather",
            value=True,
            rule="overlaps the distributed optimizer's parameter all-gather",
            fix='set training.data_parallel_sharding = "optimizer"',
        )


def check_framework(framework: str, version: str | None, given: dict, schedule: str) -> None:
    """The version must be one of the framework's; a blocking p2p mode asked for
    explicitly needs a schedule whose call sites it models (frameworks.py)."""
    if version is not None and version not in frameworks.versions(framework):
        raise ScenarioError(
            key="training.framework_version",
            value=version,
            rule=f"must be one of {framework}'s: {', '.join(frameworks.versions(framework))}",
        )
    mode = given.get("pipeline_p2p")
    if mode is not None and not frameworks.p2p_modelled(mode, schedule):
        raise ScenarioError(
            key="training.pipeline_p2p",
            value=mode,
            rule=f"is modelled for training.schedule in "
            f"{', '.join(frameworks.BLOCKING_SCHEDULES[mode])} only (found {schedule!r})",
            fix='use "overlapped" or one of those schedules',
        )


def _check_orders(training: TrainingConfig) -> None:
    """The custom orders run every op once, in an order that can run, without deadlock.
    A file's orders were checked when read (files.read_schedule_file), under the name
    the user wrote; this is for orders built in Python."""
    assert training.custom_orders is not None  # check_training_alone calls it only with orders
    try:
        check_orders(training.custom_orders, training.placement)
        return
    except ValueError as exc:
        problem = str(exc)
    file = training.schedule_file
    raise ScenarioError(
        f"training.schedule_file={file!r}: {problem}",
        key="training.schedule_file",
        value=file,
        rule=problem,
    )


def check_name(name: object) -> None:
    """A scenario is called something: reports and tables show its name."""
    if not isinstance(name, str) or not name:
        raise ScenarioError(key="name", value=name, rule="must be a non-empty string")


def check_calibration(scenario: Scenario) -> None:
    """Kernel constants hold for the GPU they were measured on (KernelConstants.gpu)."""
    calibration, gpu = scenario.calibration, scenario.cluster.gpu.name
    if calibration is not None and calibration.gpu != gpu:
        raise ScenarioError(
            key="calibration.gpu",
            value=calibration.gpu,
            rule=f"must be the scenario's cluster.gpu={gpu!r} (kernel constants hold for "
            "the GPU they were measured on)",
        )


def check_recompute_modules(scenario: Scenario) -> None:
    """`training.recompute_modules`: Megatron-Core's names, under `selective`, each once,
    and what each needs of the model (transformer_config.py's checks, and what stepsim
    models)."""
    training, model = scenario.training, scenario.model
    given = training.recompute_modules
    if given is None:
        return
    key = "training.recompute_modules"
    names = [name.strip() for name in given.split(",")]
    problem = None
    if training.recompute_granularity != RECOMPUTE_SELECTIVE:
        problem = 'applies with training.recompute_granularity = "selective" only'
    elif not all(names):
        problem = "must name modules, comma-separated"
    elif unknown := [name for name in names if name not in RECOMPUTE_MODULES]:
        problem = f"has {unknown[0]!r}; each must be one of {', '.join(RECOMPUTE_MODULES)}"
    elif len(set(names)) < len(names):
        problem = "names a module twice"
    elif "mla_up_proj" in names and not model.mla:
        problem = "has mla_up_proj, which needs model.multi_latent_attention"
    elif {"moe", "moe_act", "shared_experts"} & set(names) and not model.moe:
        problem = "has an MoE module (moe, moe_act, shared_experts), which needs an MoE model"
    elif "shared_experts" in names and not model.shared_expert_ffn:
        problem = "has shared_experts, which needs model.moe_shared_expert_intermediate_size"
    elif "moe" in names and "moe_act" in names:
        problem = "has moe and moe_act: moe already repeats the whole MoE layer"
    elif "moe" in names and training.moe_overlap:
        problem = (
            "has moe, not modelled with training.overlap_moe_expert_parallel_comm (its "
            "recomputed all-to-alls would leave the pairs' communication lane)"
        )
    if problem:
        raise ScenarioError(key=key, value=given, rule=problem)


def check_deepspeed_stage2(scenario: Scenario) -> None:
    """DeepSpeed's pipeline engine refuses ZeRO stage 2 (deepspeed/runtime/pipe/engine.py:
    "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")."""
    training = scenario.training
    if (
        training.framework == "deepspeed"
        and training.data_parallel_sharding == SHARD_GRADIENTS
        and scenario.parallel.pipeline_model_parallel_size > 1
    ):
        raise ScenarioError(
            key="training.data_parallel_sharding",
            value=SHARD_GRADIENTS,
            rule="cannot go with framework = deepspeed and pipeline_model_parallel_size > 1 "
            "(DeepSpeed's pipeline engine refuses ZeRO-2)",
        )


def check_scenario(scenario: Scenario) -> None:
    """Every rule across specs, in the order the errors are reported."""
    check_cluster_size(scenario)
    check_name(scenario.name)
    check_bf16(scenario)
    check_precision_aware_optimizer(scenario)
    check_fp8_input_store(scenario)
    check_recompute_modules(scenario)
    check_deepspeed_stage2(scenario)
    check_tied_embeddings(scenario.model, scenario.training)
    check_context_parallel(scenario.model, scenario.parallel, scenario.training)
    check_expert_parallel(scenario)
    check_overlap(scenario)
    check_offloading(scenario)
    check_layout(scenario.model, scenario.parallel, scenario.cluster, scenario.training.placement)
    check_schedule(scenario.model, scenario.parallel, scenario.training)
    check_size(scenario.model, scenario.parallel, scenario.training)
    check_softmax(scenario)
    check_tp_comm_overlap(scenario.parallel, scenario.training)
    check_param_gather(scenario.parallel, scenario.training)
    check_fp8(scenario)
    check_calibration(scenario)
    check_nvls(scenario)
    check_targets(scenario.perturbations, scenario.cluster)


def check_bf16(scenario: Scenario) -> None:
    """bf16 tensor cores arrived with compute capability 8.0 (the A100)."""
    gpu = scenario.cluster.gpu
    if scenario.training.params_dtype == "bf16" and gpu.compute_capability < (8, 0):
        raise ScenarioError(
            key="training.params_dtype",
            value="bf16",
            rule=f"needs an A100 or newer; the {gpu.name} has no bf16 tensor cores",
            fix='set training.params_dtype = "fp16"',
        )


def check_cluster_size(scenario: Scenario) -> None:
    """The cluster's GPUs and links within their limits, counting what the run builds:
    a symmetric run builds its repeating unit and counts its switches, not a graph per
    GPU (run.build_cluster; drawing the whole graph checks the whole of it)."""
    whole = not scenario.network.symmetry or scenario.cluster.fabric in PLANAR
    limits.check_cluster(scenario.cluster, whole=whole)


def check_softmax(scenario: Scenario) -> None:
    """A shape Megatron's fused-softmax check lets through but its kernel rejects (the
    2022 rule's causal sequence above 2048) stops the run: say so rather than simulate."""
    path = scenario_softmax_path(scenario)
    if path.aborts:
        raise ScenarioError(
            key="training.masked_softmax_fusion",
            value=True,
            rule=f"{path.reason}; Megatron stops on the assertion ({SOFTMAX_SOURCE})",
            fix="set training.masked_softmax_fusion = false or attention_kernel = 'flash'",
        )


def check_model_split(model: ModelSpec, parallel: ParallelConfig, placement: str = LOOPED) -> None:
    """Tensor parallelism splits heads and the MLP evenly; pipeline stages and chunks
    split the layers evenly, or as Megatron-Core's four uneven-split keys say
    (`stages.stage_layers`)."""
    tp = parallel.tensor_model_parallel_size
    tp_key = "parallel.tensor_model_parallel_size"
    for what, size in (
        ("num_attention_heads", model.num_attention_heads),
        ("ffn_hidden_size", model.ffn_hidden_size),
    ):
        if size % tp:
            raise ScenarioError(key=tp_key, value=tp, rule=f"must divide model.{what}={size}")
    check_query_groups_split(model, tp)
    stage_layers(model, parallel, placement)


def check_layout(
    model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec, placement: str = LOOPED
) -> None:
    """The model splits evenly, the layout fits in the cluster, and sits in it alike."""
    check_model_split(model, parallel, placement)
    tp, dp = parallel.tensor_model_parallel_size, parallel.data_parallel_size
    cp = parallel.cp_size
    if parallel.num_gpus > cluster.num_gpus:
        sizes = "tensor x context x pipeline x data" if cp > 1 else "tensor x pipeline x data"
        raise ScenarioError(
            f"parallel.data_parallel_size={dp} asks for {sizes} = "
            f"{parallel.num_gpus} GPUs but the cluster has {cluster.num_gpus} "
            f"(cluster.num_nodes={cluster.num_nodes} x gpus_per_node={cluster.gpus_per_node})",
            key="parallel.data_parallel_size",
            value=dp,
            rule="tensor x pipeline x data must be <= the cluster's GPUs",
        )
    check_symmetric(tp, tp * cp * dp, cluster, cp)


def check_symmetric(tp: int, stage_gpus: int, cluster: ClusterSpec, cp: int = 1) -> None:
    """One GPU per stage is simulated for all its TP ranks and DP replicas, which needs
    every one of them to sit in the cluster the same way (docs/design.md); with context
    parallelism, every CP group too (its TP x CP consecutive GPUs)."""
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    if gpn % nics:
        raise ScenarioError(
            key="cluster.nics_per_node",
            value=nics,
            rule=f"must divide cluster.gpus_per_node={gpn} "
            "(every NIC serves the same number of GPUs)",
        )
    per_nic = gpn // nics
    context = (
        [("parallel.context_parallel_size", f"tensor x context parallel size={tp * cp}", tp * cp)]
        if cp > 1
        else []
    )
    for key, name, size in (
        ("parallel.tensor_model_parallel_size", f"parallel.tensor_model_parallel_size={tp}", tp),
        *context,
        (
            "tensor x data parallel size",
            f"tensor x data parallel size={stage_gpus} (the GPUs of one pipeline stage)",
            stage_gpus,
        ),
    ):
        if gpn % size and size % gpn:
            rule = f"must divide or be a multiple of cluster.gpus_per_node={gpn}"
            raise ScenarioError(
                f"{name} {rule}, so that every group sits in the nodes the same way",
                key=key,
                value=size,
                rule=rule,
            )
        if (
            cluster.nvlink_topology == "hybrid-cube-mesh"
            and size < gpn
            and size not in (1, gpn // 2)
        ):
            rule = f"must be 1, {gpn // 2} or a multiple of {gpn} on a hybrid cube-mesh node"
            raise ScenarioError(
                f"{name} {rule}, whose smaller GPU groups are not alike",
                key=key,
                value=size,
                rule=rule,
            )
        if size < gpn and per_nic % size and size % per_nic:
            rule = f"must divide or be a multiple of the {per_nic} GPUs that share a NIC"
            raise ScenarioError(
                f"{name} {rule} (cluster.gpus_per_node={gpn} / nics_per_node={nics})",
                key=key,
                value=size,
                rule=rule,
            )


def microbatches_per_pipeline(parallel: ParallelConfig, training: TrainingConfig) -> int:
    """global_batch_size / (micro_batch_size x data_parallel_size), rounded down (the
    rules refuse a batch that does not divide; Scenario.num_microbatches)."""
    return training.global_batch_size // (training.micro_batch_size * parallel.data_parallel_size)


def check_schedule(model: ModelSpec, parallel: ParallelConfig, training: TrainingConfig) -> None:
    """The batch splits into whole micro-batches, and the schedule can run them."""
    gbs, mbs = training.global_batch_size, training.micro_batch_size
    dp = parallel.data_parallel_size
    if gbs % (mbs * dp):
        raise ScenarioError(
            key="training.global_batch_size",
            value=gbs,
            rule=f"must be divisible by micro_batch_size x data_parallel_size={mbs} x {dp}"
            f"={mbs * dp}",
        )
    if training.custom_orders is not None:
        _check_custom(parallel, training)
    else:
        _check_named(parallel, training)


def _check_custom(parallel: ParallelConfig, training: TrainingConfig) -> None:
    """A custom file's orders match the layout: ranks, chunks and micro-batches."""
    group = training.microbatch_group_size_per_vp_stage
    if group is not None:
        raise ScenarioError(
            key="training.microbatch_group_size_per_vp_stage",
            value=group,
            rule="does not apply to training.schedule='custom' (the file fixes the order)",
        )
    file = training.schedule_file
    assert training.custom_orders is not None  # check_schedule calls this only with orders
    ranks, microbatches, chunks, _ = sizes_of(training.custom_orders)
    for what, unit, wanted, found in (
        ("pipeline_model_parallel_size", "ranks", parallel.pipeline_model_parallel_size, ranks),
        (
            "virtual_pipeline_model_parallel_size",
            "chunks per rank",
            parallel.virtual_pipeline_model_parallel_size,
            chunks,
        ),
    ):
        if wanted != found:
            raise ScenarioError(
                key="training.schedule_file",
                value=file,
                rule=f"has {found} {unit} but parallel.{what}={wanted}",
            )
    m = microbatches_per_pipeline(parallel, training)
    if microbatches != m:
        raise ScenarioError(
            key="training.schedule_file",
            value=file,
            rule=f"has {microbatches} micro-batches but the scenario runs {m} per pipeline "
            "(global_batch_size / (micro_batch_size x data_parallel_size))",
        )


def _check_named(parallel: ParallelConfig, training: TrainingConfig) -> None:
    """A named schedule's chunks, group and micro-batch count (schedules.check)."""
    schedule, group = training.schedule, training.microbatch_group_size_per_vp_stage
    p, v = parallel.pipeline_model_parallel_size, parallel.virtual_pipeline_model_parallel_size
    v_key = "parallel.virtual_pipeline_model_parallel_size"
    info = SCHEDULE_INFO[schedule]
    chunked = [name for name, i in SCHEDULE_INFO.items() if i.chunked]
    if not info.chunked and v != 1:
        raise ScenarioError(
            key=v_key,
            value=v,
            rule=f"needs a schedule with chunks ({', '.join(chunked)}); "
            f"training.schedule={schedule!r} runs one per stage",
        )
    if info.placement == V_SHAPE and v != 2:
        raise ScenarioError(
            key=v_key,
            value=v,
            rule=f"must be 2 for training.schedule={schedule!r} (two chunks in a V)",
        )
    if info.placement == DUAL and v != 2:
        raise ScenarioError(
            key=v_key,
            value=v,
            rule=f"must be 2 for training.schedule={schedule!r} (two model copies)",
        )
    if info.placement == DUAL:
        check_dual(training)
    if info.chunked and v < 2:
        raise ScenarioError(
            key=v_key, value=v, rule=f"must be at least 2 for training.schedule={schedule!r}"
        )
    if group is not None and not info.grouped:
        raise ScenarioError(
            key="training.microbatch_group_size_per_vp_stage",
            value=group,
            rule=f"applies to interleaved schedules only, not training.schedule={schedule!r}",
        )
    m = microbatches_per_pipeline(parallel, training)
    problem = schedule_problem(schedule, p, m, v, group)
    if problem:
        raise ScenarioError(
            f"training.schedule={schedule!r} with {m} micro-batches per pipeline "
            f"(global_batch_size / (micro_batch_size x data_parallel_size)): {problem}",
            key="training.schedule",
            value=schedule,
            rule=problem,
        )


def check_size(model: ModelSpec, parallel: ParallelConfig, training: TrainingConfig) -> None:
    """Small enough to simulate in reasonable time (the limit: scenario/limits.py)."""
    ops = microbatches_per_pipeline(parallel, training) * model.num_layers
    ops *= OPS_PER_LAYER_AND_MICROBATCH
    limits.check(
        "simulated_ops",
        ops,
        f"with model.num_layers={model.num_layers} means",
        "training.global_batch_size",
        training.global_batch_size,
    )
    limits.check_buckets(model, parallel, training)


PRECISION_AWARE_KEYS = (
    "main_params_dtype",
    "main_grads_dtype",
    "exp_avg_dtype",
    "exp_avg_sq_dtype",
)


def check_precision_aware_optimizer(scenario: Scenario) -> None:
    """Megatron-Core's rules for the precision-aware optimizer (d98e8a6):
    optimizer_config.py refuses a non-fp32 state dtype without it, optimizer/__init__.py
    the optimizer without the distributed optimizer, arguments.py fp32 accumulation with
    bf16 main gradients. stepsim models it for Megatron-Core 2025 (the version it
    arrived in is not among the modelled ones before)."""
    training = scenario.training
    if not training.use_precision_aware_optimizer:
        for name in PRECISION_AWARE_KEYS:
            value = getattr(training, name)
            if value != "fp32":
                raise ScenarioError(
                    key=f"training.{name}",
                    value=value,
                    rule="can only be fp32 without the precision-aware optimizer",
                    fix="set training.use_precision_aware_optimizer = true",
                )
        return
    version = training.mechanism("framework_version")
    if training.framework != frameworks.MEGATRON or version != "2025":
        raise ScenarioError(
            key="training.use_precision_aware_optimizer",
            value=True,
            rule=f"is Megatron-Core's (megatron 2025); found {training.engine_label}",
        )
    if training.data_parallel_sharding != SHARD_OPTIMIZER:
        raise ScenarioError(
            key="training.use_precision_aware_optimizer",
            value=True,
            rule="only supported with the distributed optimizer "
            f"(training.data_parallel_sharding = {SHARD_OPTIMIZER!r}; "
            f"found {training.data_parallel_sharding!r})",
        )
    if training.main_grads_dtype == "bf16" and training.accumulate_allreduce_grads_in_fp32:
        raise ScenarioError(
            key="training.accumulate_allreduce_grads_in_fp32",
            value=True,
            rule="must be false with training.main_grads_dtype='bf16' (Megatron-LM's "
            "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 "
            "is set)",
        )


def check_fp8_input_store(scenario: Scenario) -> None:
    """Megatron-Core transformer_config.py: "Storing activation input in FP8 is
    supported only for SwiGLU."."""
    if scenario.training.activation_func_fp8_input_store and not scenario.model.gated:
        raise ScenarioError(
            key="training.activation_func_fp8_input_store",
            value=True,
            rule="is supported only for SwiGLU (model.swiglu = true)",
        )

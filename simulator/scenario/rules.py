"""The rules a scenario's values must keep together, as plain functions over specs.

Each spec runs the rules it can check on its own when it is built (`check_values`,
`check_model`, `check_cluster`, `check_training_alone`); `Scenario` runs `check_scenario`, the rules
across specs. So a scenario read from a file and one built or edited in Python
(`dataclasses.replace`) go through the same rules and fail with the same one-line
`ScenarioError`. The loader adds only what a file needs besides: types, ranges and
choices of what the user typed (`schema`), presets, derived defaults and reading a
custom schedule's file.

Where several rules fail, the first in this order is reported: the model, the
cluster, the training keys alone, then the layout (`check_layout`), the batch and
schedule (`check_schedule`) and the size of the simulation (`check_size`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedules import SCHEDULES as SCHEDULE_INFO
from schedules import check as schedule_problem
from schedules import holder_of
from schedules.custom import sizes_of

from . import limits
from .errors import ScenarioError

if TYPE_CHECKING:
    from .spec import ClusterSpec, ModelSpec, ParallelConfig, Scenario, TrainingConfig

OPS_PER_LAYER_AND_MICROBATCH = 12  # about a dozen ops per layer and micro-batch
CUSTOM = "custom"  # training.schedule of a schedule read from a file
CUSTOM_SCHEDULE_KEYS = ("schedule_file", "schedule_placement")  # custom schedules only


def check_values(spec: object, section: str) -> None:
    """Each key's type, range and choices (`schema.check_value`), as the loader checks
    a file's: a spec built in Python cannot hold what a file could not. (The loader
    checks what the user typed before it looks up presets and derives defaults, so a
    loaded value passes this check twice; it is cheap.)"""
    from . import schema  # schema reads the specs, which call this when built

    for key in schema.keys()[section].values():
        value = getattr(spec, key.name)
        if key.by_name or (value is None and key.default is None):
            continue
        schema.check_value(key, value)


def check_model(model: ModelSpec) -> None:
    if model.hidden_size % model.num_attention_heads:
        raise ScenarioError(
            key="model.num_attention_heads",
            value=model.num_attention_heads,
            rule=f"must divide model.hidden_size={model.hidden_size}",
        )


def check_cluster(cluster: ClusterSpec) -> None:
    gpn, topology = cluster.gpus_per_node, cluster.nvlink_topology
    if topology == "all-to-all" and gpn > 7:
        raise ScenarioError(
            key="cluster.gpus_per_node",
            value=gpn,
            rule="must be <= 7 for cluster.nvlink_topology='all-to-all' (6 NVLink lanes per GPU)",
        )
    if topology == "hybrid-cube-mesh" and gpn != 8:
        raise ScenarioError(
            key="cluster.gpus_per_node",
            value=gpn,
            rule="must be 8 for cluster.nvlink_topology='hybrid-cube-mesh'",
        )
    limits.check_cluster(cluster)
    if cluster.nics_per_node > gpn:
        raise ScenarioError(
            key="cluster.nics_per_node",
            value=cluster.nics_per_node,
            rule=f"must be <= cluster.gpus_per_node={gpn}",
        )


def check_training_alone(training: TrainingConfig) -> None:
    """A custom schedule needs its orders; its file and placement suit it alone."""
    if training.schedule != CUSTOM:
        for name in CUSTOM_SCHEDULE_KEYS:
            value = getattr(training, name)
            if value is not None:
                raise ScenarioError(
                    key=f"training.{name}",
                    value=value,
                    rule="applies to training.schedule='custom' only",
                )
    elif training.custom_orders is None:
        raise ScenarioError(
            "missing key training.schedule_file (per-rank op orders) for "
            "training.schedule='custom'",
            key="training.schedule_file",
            rule="required for training.schedule='custom'",
        )


def check_scenario(scenario: Scenario) -> None:
    """Every rule across specs, in the order the errors are reported."""
    check_layout(scenario.model, scenario.parallel, scenario.cluster)
    check_schedule(scenario.model, scenario.parallel, scenario.training)
    check_size(scenario.model, scenario.parallel, scenario.training)


def check_model_split(model: ModelSpec, parallel: ParallelConfig) -> None:
    """Tensor parallelism splits heads and the MLP evenly; pipeline stages and chunks
    split the layers evenly, or as Megatron-Core's four uneven-split keys say
    (`stage_layers`)."""
    tp = parallel.tensor_model_parallel_size
    tp_key = "parallel.tensor_model_parallel_size"
    for what, size in (
        ("num_attention_heads", model.num_attention_heads),
        ("ffn_hidden_size", model.ffn_hidden_size),
    ):
        if size % tp:
            raise ScenarioError(key=tp_key, value=tp, rule=f"must divide model.{what}={size}")
    stage_layers(model, parallel)


FIRST_KEY = "parallel.decoder_first_pipeline_num_layers"
LAST_KEY = "parallel.decoder_last_pipeline_num_layers"


def is_uneven(parallel: ParallelConfig) -> bool:
    """Whether any of the four uneven-split keys is set."""
    return (
        parallel.decoder_first_pipeline_num_layers is not None
        or parallel.decoder_last_pipeline_num_layers is not None
        or bool(parallel.account_for_embedding_in_pipeline_split)
        or bool(parallel.account_for_loss_in_pipeline_split)
    )


def stage_layers(model: ModelSpec, parallel: ParallelConfig) -> tuple[tuple[int, ...], ...]:
    """Layers per virtual stage as Megatron-Core splits them, checked.

    Returns, for each pipeline rank r, a tuple of v counts: ``[r][k]`` is what chunk k of
    rank r holds, counting the embedding and the loss as one layer each where the
    ``account_for_*`` flags say so; `virtual_stage_layers` takes those off the chunks
    that hold virtual stages 0 and p v - 1 (which depends on the placement).

    Megatron-Core (megatron/core/transformer/transformer_block.py
    ``get_num_layers_to_build`` and transformer_layer.py ``get_transformer_layer_offset``,
    checked in transformer_config.py ``__post_init__``, 2024-2025):

    - none of the keys: L / p per rank, L / (p v) per chunk; p and p v must divide L;
    - ``decoder_first/last_pipeline_num_layers`` F, Z: the first (last) rank holds F (Z);
      the other ranks share the rest evenly; each rank's count is split evenly over its
      v chunks (F, Z and the middle count must be divisible by v); not together with
      the ``account_for_*`` flags;
    - ``account_for_embedding/loss_in_pipeline_split``: the embedding and the loss each
      count as one layer: (L + e + l) / (p v) per virtual stage, one fewer on virtual
      stage 0 (embedding) and on p v - 1 (loss); p must divide L + e + l and v the result.

    stepsim also needs every virtual stage to hold at least one layer (Megatron-Core allows
    an embedding-only stage; stepsim lowers the embedding with the first layer).
    """
    L, p = model.num_layers, parallel.pipeline_model_parallel_size
    v = parallel.virtual_pipeline_model_parallel_size
    first, last = (
        parallel.decoder_first_pipeline_num_layers,
        parallel.decoder_last_pipeline_num_layers,
    )
    embedding = bool(parallel.account_for_embedding_in_pipeline_split)
    loss = bool(parallel.account_for_loss_in_pipeline_split)
    v_key = "parallel.virtual_pipeline_model_parallel_size"
    p_key = "parallel.pipeline_model_parallel_size"
    if first is not None or last is not None:
        edge_key, edge = (FIRST_KEY, first) if first is not None else (LAST_KEY, last)
        if embedding or loss:
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule="cannot be set together with parallel.account_for_embedding_in_pipeline_"
                "split or account_for_loss_in_pipeline_split (Megatron-Core refuses the mix)",
            )
        if p < 2:
            raise ScenarioError(key=edge_key, value=edge, rule=f"needs {p_key} > 1 (found {p})")
        for name, count in ((FIRST_KEY, first), (LAST_KEY, last)):
            if count is not None and count % v:
                raise ScenarioError(key=name, value=count, rule=f"must be divisible by {v_key}={v}")
        middle_ranks = p - (first is not None) - (last is not None)
        rest = L - (first or 0) - (last or 0)
        if middle_ranks == 0 and rest != 0:
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule=f"plus {LAST_KEY}={last} must equal model.num_layers={L} with "
                f"{p_key}={p} (no stage left between them)",
            )
        if middle_ranks and (rest < middle_ranks or rest % middle_ranks):
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule=f"leaves {rest} of model.num_layers={L} for the other {middle_ranks} "
                f"of {p_key}={p} stages, which must split them evenly, at least one each",
            )
        middle = rest // middle_ranks if middle_ranks else 0
        if middle % v:
            raise ScenarioError(
                key=v_key,
                value=v,
                rule=f"must divide the {middle} layers of each middle pipeline stage",
            )
        per_rank = [middle] * p
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        return tuple((count // v,) * v for count in per_rank)
    counted = L + embedding + loss
    if embedding or loss:
        extra = " + ".join(
            what
            for what, on in (("1 for the embedding", embedding), ("1 for the loss", loss))
            if on
        )
        if counted % p:
            raise ScenarioError(
                key=p_key,
                value=p,
                rule=f"must divide model.num_layers + {extra} = {counted} "
                "(account_for_*_in_pipeline_split)",
            )
        if counted // p % v:
            raise ScenarioError(
                key=v_key,
                value=v,
                rule=f"must divide the {counted // p} layers per pipeline stage counted with "
                f"account_for_*_in_pipeline_split",
            )
        if p * v > 1 and counted // (p * v) < 2:
            raise ScenarioError(
                key=p_key,
                value=p,
                rule=f"leaves a virtual stage without a transformer layer: {counted} counted "
                f"layers over {p * v} virtual stages, one fewer on the first and/or last",
            )
        per_chunk = counted // (p * v)
        return tuple((per_chunk,) * v for _ in range(p))
    if L % p:
        raise ScenarioError(
            key=p_key,
            value=p,
            rule=f"must divide model.num_layers={L}",
        )
    if L % (p * v):
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={v} x "
            f"pipeline_model_parallel_size={p} must divide model.num_layers={L} "
            "(every chunk holds the same number of layers)",
            key=v_key,
            value=v,
            rule="x pipeline_model_parallel_size must divide model.num_layers",
        )
    return tuple((L // (p * v),) * v for _ in range(p))


def virtual_stage_layers(
    model: ModelSpec, parallel: ParallelConfig, placement: str
) -> tuple[tuple[int, ...], ...]:
    """`stage_layers` with the embedding's and the loss's layer taken off the chunks that
    hold virtual stages 0 and p v - 1 under ``placement`` (schedules.holder_of):
    ``[r][k]`` is the transformer layers of chunk k of rank r."""
    counts = [list(chunks) for chunks in stage_layers(model, parallel)]
    p = parallel.pipeline_model_parallel_size
    v = parallel.virtual_pipeline_model_parallel_size
    if parallel.account_for_embedding_in_pipeline_split:
        rank, chunk = holder_of(0, p, placement)
        counts[rank][chunk] -= 1
    if parallel.account_for_loss_in_pipeline_split:
        rank, chunk = holder_of(p * v - 1, p, placement)
        counts[rank][chunk] -= 1
    return tuple(tuple(chunks) for chunks in counts)


def check_layout(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> None:
    """The model splits evenly, the layout fits in the cluster, and sits in it alike."""
    check_model_split(model, parallel)
    tp, dp = parallel.tensor_model_parallel_size, parallel.data_parallel_size
    if parallel.num_gpus > cluster.num_gpus:
        raise ScenarioError(
            f"parallel.data_parallel_size={dp} asks for tensor x pipeline x data = "
            f"{parallel.num_gpus} GPUs but the cluster has {cluster.num_gpus} "
            f"(cluster.num_nodes={cluster.num_nodes} x gpus_per_node={cluster.gpus_per_node})",
            key="parallel.data_parallel_size",
            value=dp,
            rule="tensor x pipeline x data must be <= the cluster's GPUs",
        )
    check_symmetric(tp, tp * dp, cluster)


def check_symmetric(tp: int, stage_gpus: int, cluster: ClusterSpec) -> None:
    """One GPU per stage is simulated for all its TP ranks and DP replicas, which needs
    every one of them to sit in the cluster the same way (docs/design.md)."""
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    if gpn % nics:
        raise ScenarioError(
            key="cluster.nics_per_node",
            value=nics,
            rule=f"must divide cluster.gpus_per_node={gpn} "
            "(every NIC serves the same number of GPUs)",
        )
    per_nic = gpn // nics
    for key, name, size in (
        ("parallel.tensor_model_parallel_size", f"parallel.tensor_model_parallel_size={tp}", tp),
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
    if info.placement == "v" and v != 2:
        raise ScenarioError(
            key=v_key,
            value=v,
            rule=f"must be 2 for training.schedule={schedule!r} (two chunks in a V)",
        )
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

"""The model keys' rules (GQA, tied or untied output layer, the attention
backend, what context parallelism needs of the model and attention, the distributed
optimizer's switch), apart from `rules` to keep each module small; `rules` runs them in
its order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.vocabulary import ATTENTION_FLASH, ATTENTION_UNFUSED, CP_A2A, NO_SHARDING
from .errors import ScenarioError
from .moe_rules import check_moe_model

if TYPE_CHECKING:
    from .spec import ModelSpec, ParallelConfig, TrainingConfig


def check_model(model: ModelSpec) -> None:
    if model.kv_channels is None and model.hidden_size % model.num_attention_heads:
        raise ScenarioError(
            key="model.num_attention_heads",
            value=model.num_attention_heads,
            rule=f"must divide model.hidden_size={model.hidden_size} (or set model.kv_channels)",
        )
    groups = model.num_query_groups
    if groups is not None and model.num_attention_heads % groups:
        raise ScenarioError(
            key="model.num_query_groups",
            value=groups,
            rule=f"must divide model.num_attention_heads={model.num_attention_heads} "
            "(each K/V head serves the same number of query heads)",
        )
    check_mla(model)
    check_moe_model(model)


_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def check_mla(model: ModelSpec) -> None:
    """MLA's keys go with `multi_latent_attention`; its K and V are per head (no GQA
    groups, no kv_channels) and its linear layers have no biases, as DeepSeek's."""
    if not model.mla:
        for name in _MLA_KEYS:
            if getattr(model, name) is not None:
                raise ScenarioError(
                    key=f"model.{name}",
                    value=getattr(model, name),
                    rule="needs model.multi_latent_attention = true",
                )
        return
    for name, value in (
        ("num_query_groups", model.num_query_groups),
        ("kv_channels", model.kv_channels),
    ):
        if value is not None:
            raise ScenarioError(
                key=f"model.{name}",
                value=value,
                rule="cannot be set with model.multi_latent_attention (its K and V are per "
                "head, their widths MLA's qk_head_dim and v_head_dim)",
            )
    if model.linear_bias or model.qkv_bias:
        raise ScenarioError(
            key="model.add_bias_linear",
            value=model.add_bias_linear,
            rule="must be false with model.multi_latent_attention (MLA's linear layers have "
            "no biases here, as DeepSeek's)",
        )


def attention_kernel_of(backend: str | None, kernel: str | None) -> str | None:
    """The attention kernel training.attention_backend asks for (`fused`, cuDNN's fused
    attention, runs flash's mechanism), or attention_kernel as given; both given must
    agree."""
    if backend is None:
        return kernel
    wanted = ATTENTION_UNFUSED if backend == ATTENTION_UNFUSED else ATTENTION_FLASH
    if kernel is not None and kernel != wanted:
        raise ScenarioError(
            key="training.attention_backend",
            value=backend,
            rule=f"contradicts training.attention_kernel={kernel!r}; give one of them",
        )
    return wanted


def check_tied_embeddings(model: ModelSpec, training: TrainingConfig) -> None:
    """One source of truth: model.untie_embeddings_and_output_weights, when given, is
    the negation of training.share_embeddings_and_output_weights (the loader derives
    the training key from it; in Python both must agree)."""
    untie = model.untie_embeddings_and_output_weights
    if untie is not None and untie == training.share_embeddings_and_output_weights:
        raise ScenarioError(
            key="model.untie_embeddings_and_output_weights",
            value=untie,
            rule="contradicts training.share_embeddings_and_output_weights="
            f"{str(training.share_embeddings_and_output_weights).lower()}; give one of them",
        )


def check_query_groups_split(model: ModelSpec, tp: int) -> None:
    """Megatron-Core shards the K/V heads over TP and requires TP | num_query_groups
    (TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py:
    "num_query_groups must be a multiple of tensor_model_parallel_size")."""
    if model.query_groups % tp:
        raise ScenarioError(
            key="parallel.tensor_model_parallel_size",
            value=tp,
            rule=f"must divide model.num_query_groups={model.query_groups} (Megatron-Core "
            "shards the K/V heads over TP)",
        )


def check_distributed_optimizer(use: bool | None, sharding: str) -> None:
    """Megatron-Core's `--use-distributed-optimizer` is stepsim's
    data_parallel_sharding = "optimizer" (or "full", which shards the optimizer too);
    the loader derives the sharding from it, and both given must agree."""
    if use is None or use == (sharding != NO_SHARDING):
        return
    raise ScenarioError(
        key="training.use_distributed_optimizer",
        value=use,
        rule=f"contradicts training.data_parallel_sharding={sharding!r}; give one of them",
    )


def check_context_parallel(
    model: ModelSpec, parallel: ParallelConfig, training: TrainingConfig
) -> None:
    """Context parallelism as Megatron-Core and Transformer Engine allow it: the sequence
    splits into 2 x CP equal chunks (Megatron-LM megatron/training/utils.py
    `get_batch_on_this_cp_rank`),
    the attention is Transformer Engine's (Megatron-Core's local DotProductAttention,
    megatron/core/transformer/dot_product_attention.py, asserts "Context parallelism is
    only supported by TEDotProductAttention!"), and `a2a` splits every TP rank's heads and
    query groups over CP (TE context_parallel.py `AttnFuncWithCPAndQKVOA2A`)."""
    cp = parallel.cp_size
    if cp == 1:
        return
    key = "parallel.context_parallel_size"
    if model.mla:
        raise ScenarioError(
            key=key,
            value=cp,
            rule="must be 1 with model.multi_latent_attention (MLA under context "
            "parallelism is not modelled)",
        )
    if model.seq_length % (2 * cp):
        raise ScenarioError(
            key=key,
            value=cp,
            rule=f"must split model.seq_length={model.seq_length} into 2 x {cp} equal chunks "
            "(two per rank, for causal load balance)",
        )
    if training.mechanism("attention_kernel") != ATTENTION_FLASH:
        raise ScenarioError(
            key=key,
            value=cp,
            rule="needs Transformer Engine's attention: training.attention_backend = "
            "'flash' or 'fused' (found unfused)",
        )
    if parallel.cp_comm == CP_A2A:
        tp = parallel.tensor_model_parallel_size
        for what, heads in (
            ("num_attention_heads", model.num_attention_heads),
            ("num_query_groups", model.query_groups),
        ):
            if (heads // tp) % cp:
                raise ScenarioError(
                    key=key,
                    value=cp,
                    rule=f"must divide model.{what} per TP rank={heads // tp} with "
                    "parallel.cp_comm_type = 'a2a' (heads are split over CP)",
                )

"""The model spec, `[model]`: the transformer's shape (the Llama-family keys and the
mixture-of-experts keys included). A part of the schema kept apart from
`spec` to keep each module small; `spec` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.vocabulary import NORMALIZATIONS, POSITION_EMBEDDINGS, RMS_NORM, ROPE
from . import rules
from .fields import check_values, key
from .moe_rules import AUX_LOSS_MAX_VIOLATION, LOSS_FREE_MAX_VIOLATION, MOE_ROUTINGS
from .presets import MODELS


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    preset: str | None = key(
        "fills the keys below, which the table may still override",
        default=None,
        choices=tuple(MODELS),
    )
    hf_config: str | None = key(
        "a Hugging Face config.json (relative to the scenario's folder) that fills the keys "
        "below as `preset` does, which the table may still override; not with `preset`; "
        "`seq_length` stays required (scenarios/README.md, 'Hugging Face configs')",
        default=None,
    )
    num_layers: int = key("transformer layers", preset=True)
    hidden_size: int = key("must be divisible by `num_attention_heads`", preset=True)
    num_attention_heads: int = key("must divide `hidden_size`", preset=True)
    ffn_hidden_size: int = key("width of the MLP's inner layer", derived="4 x `hidden_size`")
    seq_length: int = key("tokens per sample", unit="tokens", preset=True)
    vocab_size: int = key("vocabulary entries (embedding and output layer rows)", preset=True)
    # Megatron-Core's names (TransformerConfig, megatron/core/transformer/transformer_config.py);
    # None: not set, GPT's shape (the properties below give the value in effect)
    num_query_groups: int | None = key(
        "grouped-query attention: K/V heads, each shared by heads / groups query heads; "
        "must divide `num_attention_heads`, and TP must divide it (Megatron-Core)",
        default=None,
        derived="`num_attention_heads` (no GQA)",
        preset=True,
    )
    kv_channels: int | None = key(
        "size of one attention head (Q, K and V); the projection maps heads x this back to "
        "`hidden_size`",
        default=None,
        derived="`hidden_size` / `num_attention_heads`",
        preset=True,
    )
    swiglu: bool | None = key(
        "gated MLP: fc1 is 2 x `ffn_hidden_size` wide (gate and up) and a SwiGLU "
        "element-wise kernel replaces bias-GeLU (three MLP matrices)",
        default=None,
        derived="`false` (GeLU)",
        preset=True,
    )
    normalization: str | None = key(
        "the layers' and the final norm: `LayerNorm` (weight and bias) or `RMSNorm` "
        "(weight only, no mean)",
        default=None,
        choices=NORMALIZATIONS,
        derived="`LayerNorm`",
        preset=True,
    )
    position_embedding_type: str | None = key(
        "`learned_absolute` (a seq_length x hidden table added to the embedding) or `rope` "
        "(rotary: no table, an element-wise kernel on Q and K in every layer)",
        default=None,
        choices=POSITION_EMBEDDINGS,
        derived="`learned_absolute`",
        preset=True,
    )
    untie_embeddings_and_output_weights: bool | None = key(
        "the output layer has its own vocab x hidden weights; sets "
        "`training.share_embeddings_and_output_weights` to its negation (giving both "
        "contradicting is an error)",
        default=None,
        derived="`not training.share_embeddings_and_output_weights`",
        preset=True,
    )
    add_bias_linear: bool | None = key(
        "biases on the four linear layers (QKV, projection, fc1, fc2) and their bias-add "
        "bytes in the fused kernels",
        default=None,
        derived="`true`",
        preset=True,
    )
    add_qkv_bias: bool | None = key(
        "a bias on the QKV layer alone (Qwen2), whatever `add_bias_linear` says",
        default=None,
        derived="`add_bias_linear`",
        preset=True,
    )

    # multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's MLATransformerConfig,
    # megatron/core/transformer/transformer_config.py; docs/moe.md); None: not MLA
    multi_latent_attention: bool | None = key(
        "multi-head latent attention (DeepSeek-V2/V3): Q and K/V through low-rank latents, "
        "a rotary part of Q and K apart (cost/mla.py); replaces QKV",
        default=None,
        derived="`false`",
        preset=True,
    )
    q_lora_rank: int | None = key(
        "MLA: the query latent's width (Q down-projection h -> it, RMSNorm, up-projection)",
        default=None,
        derived="512 (Megatron-Core's MLATransformerConfig)",
        preset=True,
    )
    kv_lora_rank: int | None = key(
        "MLA: the key/value latent's width",
        default=None,
        derived="512 (Megatron-Core's)",
        preset=True,
    )
    qk_head_dim: int | None = key(
        "MLA: a Q/K head's width without its rotary part",
        default=None,
        derived="128 (Megatron-Core's)",
        preset=True,
    )
    qk_pos_emb_head_dim: int | None = key(
        "MLA: the rotary part of a Q/K head (K's is one per token, shared by the heads)",
        default=None,
        derived="64 (Megatron-Core's)",
        preset=True,
    )
    v_head_dim: int | None = key(
        "MLA: a V head's width (the projection maps heads x it back to `hidden_size`)",
        default=None,
        derived="128 (Megatron-Core's)",
        preset=True,
    )

    mtp_num_layers: int | None = key(
        "multi-token prediction (DeepSeek-V3's; Megatron-Core's `--mtp-num-layers`): this "
        "many extra prediction depths, each an embedding of the next tokens, two RMSNorms, "
        "a 2h -> h projection, one transformer layer like the model's last and the output "
        "layer's logits and loss again, on the last pipeline stage (docs/moe.md)",
        default=None,
        derived="none",
        preset=True,
        low=1,
        high=16,
    )

    # mixture of experts (Megatron-Core's --num-experts, --moe-*; docs/moe.md); None: dense
    num_experts: int | None = key(
        "mixture of experts: routed experts per MoE layer (Megatron-Core's `--num-experts`); "
        "unset: a dense model",
        default=None,
        derived="none (dense)",
        preset=True,
        low=1,
        high=65536,
    )
    moe_router_topk: int | None = key(
        "experts each token is routed to (`--moe-router-topk`); <= `num_experts`",
        default=None,
        derived="2 (Megatron-Core's default)",
        preset=True,
        low=1,
        high=65536,
    )
    moe_ffn_hidden_size: int | None = key(
        "one routed expert's inner MLP width (`--moe-ffn-hidden-size`; gated as `swiglu` says)",
        default=None,
        derived="`ffn_hidden_size`",
        preset=True,
    )
    moe_shared_expert_intermediate_size: int | None = key(
        "the shared experts' inner width, all of them together, run on every token "
        "(`--moe-shared-expert-intermediate-size`); unset: none",
        default=None,
        derived="none",
        preset=True,
    )
    moe_layer_freq: int | None = key(
        "every this-many-th layer is an MoE layer, from layer 0 (Megatron-Core's integer "
        "`--moe-layer-freq`: layer i is MoE when i mod it is 0); the others dense",
        default=None,
        derived="1 (every layer)",
        preset=True,
        low=1,
        high=100_000,
    )
    first_k_dense_replace: int | None = key(
        "the first this-many layers are dense, MoE layers follow as `moe_layer_freq` says "
        "(DeepSeek's config.json name; Megatron-Core's list form of `--moe-layer-freq`, "
        'e.g. "([0]*3+[1]*58)", is this with 3)',
        default=None,
        derived="0",
        preset=True,
        may_be_zero=True,
        high=100_000,
    )
    moe_expert_capacity_factor: float | None = key(
        "token dropping: each expert takes at most this x its balanced share of tokens "
        "(`--moe-expert-capacity-factor`); unset: dropless",
        default=None,
        derived="none (dropless)",
        low=0.01,
        high=1000.0,
    )

    moe_router_num_groups: int | None = key(
        "group-limited routing (`--moe-router-num-groups`): the experts split into this "
        "many equal groups of consecutive experts, a token's experts in at most "
        "`moe_router_group_topk` of them (DeepSeek-V3's node-limited routing: one group per "
        "node of its EP group); unset: any experts",
        default=None,
        derived="none",
        low=1,
        high=65536,
    )
    moe_router_group_topk: int | None = key(
        "group-limited routing (`--moe-router-group-topk`): the groups a token's experts may "
        "lie in, with `moe_router_num_groups`",
        default=None,
        derived="none",
        low=1,
        high=65536,
    )

    moe_routing: str | None = key(
        "how the tokens spread over the routed experts: `imbalanced` (the imbalance a "
        "balancing router leaves, `moe_expert_load_max_violation`; the busiest EP rank is "
        "the expected busiest of a random placement), `balanced` (the same share each), "
        "`zipf` (expert i's share ~ 1/(i+1)^`moe_routing_zipf_exponent`, at most 1/top-k) "
        "or `shares` (`moe_routing_shares_file`); experts sit in order on the EP ranks (rank "
        "r holds experts r E/EP on, as Megatron-Core places them), so zipf's hottest sit on "
        "EP rank 0; the busiest rank and link decide the time (docs/moe.md)",
        default=None,
        choices=MOE_ROUTINGS,
        derived="`imbalanced`",
    )
    moe_expert_load_max_violation: float | None = key(
        "`moe_routing = \"imbalanced\"`: the busiest expert's tokens over the mean expert's, "
        "minus 1 (MaxVio, Wang et al. 2024, arXiv 2408.15664); the experts' loads spread "
        "evenly between 1 - it and 1 + it times the mean. Your own measurement belongs here",
        default=None,
        may_be_zero=True,
        high=1.0,
        derived="0.52 (auxiliary-loss balancing, Wang et al. 2024 Table 2, their 3B model); "
        "0.04 with `moe_router_enable_expert_bias`",
    )
    moe_router_enable_expert_bias: bool | None = key(
        "Megatron-Core's `--moe-router-enable-expert-bias`: auxiliary-loss-free balancing "
        "(a per-expert bias on the routing scores, DeepSeek-V3's), which leaves far less "
        "imbalance than an auxiliary loss (`moe_expert_load_max_violation`)",
        default=None,
        derived="false",
        preset=True,
    )
    moe_routing_zipf_exponent: float | None = key(
        'the exponent x of `moe_routing = "zipf"` (0: balanced)',
        default=None,
        derived="1.0",
        may_be_zero=True,
        high=100.0,
    )
    moe_routing_shares_file: str | None = key(
        '`moe_routing = "shares"`: a text file of the experts\' token shares, one number '
        "per line in expert order (# comments; normalized to sum 1; none above 1/top-k), "
        "relative to the scenario's folder",
        default=None,
    )
    # the shares, read from moe_routing_shares_file (not a key; Python may give them)
    moe_routing_shares: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_values(self, "model")
        rules.check_model(self)

    # -- the shape in effect (the keys above with their defaults) --------------------------

    @property
    def query_groups(self) -> int:
        """K/V heads: `num_query_groups`, or one per query head (no GQA)."""
        return self.num_attention_heads if self.num_query_groups is None else self.num_query_groups

    @property
    def head_size(self) -> int:
        """`kv_channels`, or hidden / heads."""
        if self.kv_channels is None:
            return self.hidden_size // self.num_attention_heads
        return self.kv_channels

    @property
    def gated(self) -> bool:
        return bool(self.swiglu)

    @property
    def rms_norm(self) -> bool:
        return self.normalization == RMS_NORM

    @property
    def rope(self) -> bool:
        return self.position_embedding_type == ROPE

    @property
    def linear_bias(self) -> bool:
        return self.add_bias_linear is not False

    @property
    def qkv_bias(self) -> bool:
        return self.linear_bias if self.add_qkv_bias is None else self.add_qkv_bias

    @property
    def qkv_width(self) -> int:
        """Columns of the QKV weight: (heads + 2 x groups) x head size."""
        return (self.num_attention_heads + 2 * self.query_groups) * self.head_size

    @property
    def attention_width(self) -> int:
        """Rows of the projection weight: heads x head size (MLA: x V's head width)."""
        return self.num_attention_heads * (self.v_dim if self.mla else self.head_size)

    # -- multi-head latent attention (None: not MLA; cost/mla.py) --------------------

    @property
    def mla(self) -> bool:
        return bool(self.multi_latent_attention)

    @property
    def q_lora(self) -> int:
        return 512 if self.q_lora_rank is None else self.q_lora_rank

    @property
    def kv_lora(self) -> int:
        return 512 if self.kv_lora_rank is None else self.kv_lora_rank

    @property
    def rope_dim(self) -> int:
        """MLA: the rotary part of a Q/K head."""
        return 64 if self.qk_pos_emb_head_dim is None else self.qk_pos_emb_head_dim

    @property
    def qk_dim(self) -> int:
        """A Q/K head's width in the scores: MLA's qk_head_dim + its rotary part, else the
        head size."""
        if not self.mla:
            return self.head_size
        return (128 if self.qk_head_dim is None else self.qk_head_dim) + self.rope_dim

    @property
    def v_dim(self) -> int:
        """A V head's width: MLA's v_head_dim, else the head size."""
        if not self.mla:
            return self.head_size
        return 128 if self.v_head_dim is None else self.v_head_dim

    @property
    def fc1_width(self) -> int:
        """Columns of fc1: 2 x ffn for SwiGLU's gate and up halves, else ffn."""
        return (2 if self.gated else 1) * self.ffn_hidden_size

    # -- mixture of experts (None: dense; cost.moe) ------------------------------------

    @property
    def moe(self) -> bool:
        return self.num_experts is not None

    @property
    def router_topk(self) -> int:
        return 2 if self.moe_router_topk is None else self.moe_router_topk

    @property
    def expert_ffn(self) -> int:
        """One routed expert's inner width."""
        return (
            self.ffn_hidden_size if self.moe_ffn_hidden_size is None else self.moe_ffn_hidden_size
        )

    @property
    def expert_fc1_width(self) -> int:
        return (2 if self.gated else 1) * self.expert_ffn

    @property
    def expert_load_violation(self) -> float:
        """`moe_expert_load_max_violation` in effect (cost/routing.py, docs/moe.md): as
        given, else what Wang et al. 2024 (arXiv 2408.15664, Table 2) measured on their
        3B DeepSeekMoE model: MaxVio_global 0.52 under an auxiliary loss, 0.04 with
        Loss-Free Balancing (the expert bias)."""
        if self.moe_expert_load_max_violation is not None:
            return self.moe_expert_load_max_violation
        if self.moe_router_enable_expert_bias:
            return LOSS_FREE_MAX_VIOLATION
        return AUX_LOSS_MAX_VIOLATION

    @property
    def shared_expert_ffn(self) -> int:
        return self.moe_shared_expert_intermediate_size or 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (0-based) is an MoE layer (Megatron-Core's
        integer `moe_layer_freq`: ``layer % freq == 0``), after the first
        `first_k_dense_replace` layers (dense; Hugging Face's DeepSeek rule)."""
        if layer < (self.first_k_dense_replace or 0):
            return False
        return self.moe and layer % (self.moe_layer_freq or 1) == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

"""Named GPUs, nodes and models that scenario files can refer to.

The GPU and node records, with their sources, are in simulator.scenario.hardware and
re-exported here; the model shapes follow, each with its source.
"""

from __future__ import annotations

from .hardware import CALIBRATED_GPU, CALIBRATED_GPUS, EXPONENTIALS_PER_SM_CLOCK, GPUS, NODES

__all__ = [
    "CALIBRATED_GPU",
    "CALIBRATED_GPUS",
    "EXPONENTIALS_PER_SM_CLOCK",
    "FAMILY_SEQ_LENGTH",
    "FAMILY_VOCAB_SIZE",
    "GPUS",
    "MODELS",
    "MODEL_FAMILIES",
    "NODES",
]

# Model shapes. GPT-3 175B: Brown et al. 2020, Table 2.1 (vocabulary padded to
# 51200 as Megatron-LM does). MT-NLG 530B: Smith et al. 2022, Sec 3.
# The Llama-family shapes (rope, RMSNorm, SwiGLU, untied output layer, no biases) are
# each model's published config.json (its Hugging Face model card) and paper; the
# published parameter counts they are tested against are in tests/test_models.py.
_LLAMA = {
    "swiglu": True,
    "normalization": "RMSNorm",
    "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True,
    "add_bias_linear": False,
}
MODELS: dict[str, dict[str, object]] = {
    "gpt3-175b": {
        "num_layers": 96,
        "hidden_size": 12288,
        "num_attention_heads": 96,
        "seq_length": 2048,
        "vocab_size": 51200,
    },
    "mt-nlg-530b": {
        "num_layers": 105,
        "hidden_size": 20480,
        "num_attention_heads": 128,
        "seq_length": 2048,
        "vocab_size": 50272,
    },
    # Llama 2: Touvron et al. 2023 (arXiv 2307.09288) Table 1 (context 4k, GQA for 70B)
    # and meta-llama/Llama-2-{7b,13b,70b}-hf config.json (hidden_size,
    # intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers,
    # vocab_size 32000).
    "llama2-7b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "ffn_hidden_size": 11008,
        "seq_length": 4096,
        "vocab_size": 32000,
        **_LLAMA,
    },
    "llama2-13b": {
        "num_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "ffn_hidden_size": 13824,
        "seq_length": 4096,
        "vocab_size": 32000,
        **_LLAMA,
    },
    "llama2-70b": {
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 28672,
        "seq_length": 4096,
        "vocab_size": 32000,
        **_LLAMA,
    },
    # Llama 3: Dubey et al. 2024 (The Llama 3 Herd of Models, arXiv 2407.21783) Table 3
    # (layers, model and FFN dimension, heads, 8 KV heads, vocabulary 128K; pre-training
    # sequence 8,192, Sec 3.4) and meta-llama/Meta-Llama-3-{8B,70B} and
    # Llama-3.1-405B config.json (vocab_size 128256).
    "llama3-8b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 14336,
        "seq_length": 8192,
        "vocab_size": 128256,
        **_LLAMA,
    },
    "llama3-70b": {
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 28672,
        "seq_length": 8192,
        "vocab_size": 128256,
        **_LLAMA,
    },
    "llama3.1-405b": {
        "num_layers": 126,
        "hidden_size": 16384,
        "num_attention_heads": 128,
        "num_query_groups": 8,
        "ffn_hidden_size": 53248,
        "seq_length": 8192,
        "vocab_size": 128256,
        **_LLAMA,
    },
    # Mistral 7B: Jiang et al. 2023 (arXiv 2310.06825) Table 1 (dim 4096, 32 layers,
    # head_dim 128, hidden_dim 14336, 32 heads, 8 kv_heads, context_len 8192,
    # vocab_size 32000) and mistralai/Mistral-7B-v0.1 config.json. Its sliding window
    # (4096) is not modelled: attention is full causal over the 8192 tokens.
    "mistral-7b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 14336,
        "seq_length": 8192,
        "vocab_size": 32000,
        **_LLAMA,
    },
    # Qwen2.5-72B: Qwen/Qwen2.5-72B config.json (hidden_size 8192, intermediate_size
    # 29568, 80 layers, 64 heads, 8 key-value heads, vocab_size 152064,
    # tie_word_embeddings false) and the Qwen2.5 technical report (arXiv 2412.15115:
    # QKV bias, pre-training at 4,096 tokens before the long-context stage at 32,768).
    "qwen2.5-72b": {
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 29568,
        "seq_length": 4096,
        "vocab_size": 152064,
        **_LLAMA,
        "add_qkv_bias": True,
    },
    # Mixtures of experts (docs/moe.md). Mixtral: Jiang et al. 2024 (arXiv 2401.04088)
    # Table 1 and mistralai/Mixtral-8x7B-v0.1 / Mixtral-8x22B-v0.1 config.json
    # (num_local_experts 8, num_experts_per_tok 2, intermediate_size per expert, no
    # biases, untied). seq_length 4096 is a training length of our choosing (Megatron-LM's
    # Mixtral examples use it; the models take 32k / 64k); the sliding window is not
    # modelled.
    "mixtral-8x7b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 14336,
        "seq_length": 4096,
        "vocab_size": 32000,
        **_LLAMA,
        "num_experts": 8,
        "moe_router_topk": 2,
    },
    "mixtral-8x22b": {
        "num_layers": 56,
        "hidden_size": 6144,
        "num_attention_heads": 48,
        "num_query_groups": 8,
        "ffn_hidden_size": 16384,
        "seq_length": 4096,
        "vocab_size": 32768,
        **_LLAMA,
        "num_experts": 8,
        "moe_router_topk": 2,
    },
    # Qwen3-235B-A22B: Qwen/Qwen3-235B-A22B config.json (hidden_size 4096, 94 layers, 64
    # heads, 4 key-value heads, head_dim 128, num_experts 128, num_experts_per_tok 8,
    # moe_intermediate_size 1536, decoder_sparse_step 1, no mlp_only_layers, vocab_size
    # 151936, untied) and the Qwen3 technical report (arXiv 2505.09388: pre-training at
    # 4,096 tokens, no shared experts). Its per-head Q/K RMSNorm (2 x 128 weights per
    # layer) is not modelled.
    "qwen3-235b-a22b": {
        "num_layers": 94,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_query_groups": 4,
        "kv_channels": 128,
        "ffn_hidden_size": 12288,
        "seq_length": 4096,
        "vocab_size": 151936,
        **_LLAMA,
        "num_experts": 128,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 1536,
    },
    # DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json (61 layers, hidden_size 7168, 128
    # heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim
    # 64, v_head_dim 128, n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
    # moe_intermediate_size 2048, intermediate_size 18432 for the first_k_dense_replace 3
    # dense layers, moe_layer_freq 1, vocab_size 129280, untied, no attention bias) and
    # the DeepSeek-V3 report (arXiv 2412.19437: 671B parameters, 37B activated per token;
    # pre-training at 4K tokens). Left out: the multi-token-prediction module
    # (num_nextn_predict_layers 1, the 14B of the 685B checkpoint beyond the 671B), the
    # router's sigmoid scoring, group-limited routing and bias (its per-expert correction
    # bias is 256 numbers a layer), YaRN (a rope variant: the same kernel here).
    "deepseek-v3": {
        "num_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "ffn_hidden_size": 18432,
        "seq_length": 4096,
        "vocab_size": 129280,
        **_LLAMA,
        "multi_latent_attention": True,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_head_dim": 128,
        "qk_pos_emb_head_dim": 64,
        "v_head_dim": 128,
        "num_experts": 256,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 2048,
        "moe_shared_expert_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        # auxiliary-loss-free balancing (the report's Sec 2.1.2: a bias per expert)
        "moe_router_enable_expert_bias": True,
        # one multi-token-prediction depth (config.json num_nextn_predict_layers = 1)
        "mtp_num_layers": 1,
    },
    # gpt-oss-120b: openai/gpt-oss-120b config.json (36 layers, hidden_size 2880, 64
    # heads, 8 key-value heads, head_dim 64, num_local_experts 128, experts_per_token 4,
    # intermediate_size 2880, attention_bias true, vocab_size 201088,
    # initial_context_length 4096, untied) and OpenAI's gpt-oss model card (116.8B
    # parameters, 5.1B active). Approximations: its alternating 128-token sliding-window
    # layers are full causal here, its attention sinks, the router's bias and the
    # clamped SwiGLU's extras are not modelled (SwiGLU's cost stands in).
    "gpt-oss-120b": {
        "num_layers": 36,
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "kv_channels": 64,
        "ffn_hidden_size": 2880,
        "seq_length": 4096,
        "vocab_size": 201088,
        **_LLAMA,
        "add_bias_linear": True,
        "num_experts": 128,
        "moe_router_topk": 4,
    },
}

# Model families for `stepsim plan fit`: (name, layers, hidden, heads), smallest first;
# the feed-forward width is 4 x hidden, sequence 2048 and vocabulary 51200 in both.
# "gpt3": Brown et al. 2020 (arXiv 2005.14165) Table 2.1. Two rows do not multiply
# out: XL (1.3B) prints 24 heads of 128 for d_model 2048, and 13B prints d_model 5140
# for 40 heads of 128. Kept here: the head size 128 (16 heads for XL) and d_model 5120.
# "megatron": Narayanan et al. 2021 (arXiv 2104.04473) Table 1, the weak-scaling
# models 1.7B to 1T (the same rows as scenarios/validation/megatron_2021_table1.csv).
MODEL_FAMILIES: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    "gpt3": (
        ("gpt3-125m", 12, 768, 12),
        ("gpt3-350m", 24, 1024, 16),
        ("gpt3-760m", 24, 1536, 16),
        ("gpt3-1.3b", 24, 2048, 16),
        ("gpt3-2.7b", 32, 2560, 32),
        ("gpt3-6.7b", 32, 4096, 32),
        ("gpt3-13b", 40, 5120, 40),
        ("gpt3-175b", 96, 12288, 96),
    ),
    "megatron": (
        ("gpt-1.7b", 24, 2304, 24),
        ("gpt-3.6b", 30, 3072, 32),
        ("gpt-7.5b", 36, 4096, 32),
        ("gpt-18.4b", 40, 6144, 48),
        ("gpt-39.1b", 48, 8192, 64),
        ("gpt-76.1b", 60, 10240, 80),
        ("gpt-145.6b", 80, 12288, 96),
        ("gpt-310.1b", 96, 16384, 128),
        ("gpt-529.6b", 105, 20480, 128),
        ("gpt-1008b", 128, 25600, 160),
    ),
}
FAMILY_SEQ_LENGTH = 2048
FAMILY_VOCAB_SIZE = 51200

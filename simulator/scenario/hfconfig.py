"""A Hugging Face ``config.json`` read into `[model]` keys (`model.hf_config`).

The families stepsim models, by ``architectures[0]`` (else ``model_type``): Llama,
Mistral, Qwen2, Qwen3 (dense and MoE), Mixtral, DeepSeek-V3, gpt-oss, GPT-2 and
GPT-NeoX. Each family's reader names the config.json fields it takes, the field names
of its `transformers` configuration class (``LlamaConfig``, ``DeepseekV3Config``, ...);
a field the class gives a default is read with that default when the file leaves it
out (``num_key_value_heads``: the heads; ``tie_word_embeddings``: false, GPT-2's true),
any other field the family needs is required, and its absence is a one-line error
naming it. What a family has that stepsim does not model is either refused (a
``decoder_sparse_step`` other than 1, MLA without a query latent) or left out and
listed in scenarios/README.md (sliding windows, Q/K norms, attention sinks, GPT-NeoX's
partial rotary and parallel residual).

The keys come out as the presets write them: a key whose value is what stepsim reads
when it is unset (``num_query_groups`` equal to the heads, ``kv_channels`` equal to
hidden / heads, ``moe_layer_freq`` 1, no dense first layers) is left out, so the
cited config.json of a preset's model gives exactly the preset's keys (tests/
test_hfconfig.py). ``seq_length`` is not one of them: a config.json holds the longest
sequence the model takes (``max_position_embeddings``), not the one it is trained on,
so the scenario gives it (the loader says so when it does not).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..ir.vocabulary import RMS_NORM, ROPE
from . import schema
from .errors import ScenarioError
from .fields import check_value
from .files import read_text
from .suggest import did_you_mean

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "model_keys"]

_REQUIRED = object()  # a field the family needs from the file


def _shown(value: Any, most: int = 80) -> str:
    """A value from the file for a one-line message, cut short."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


class _Reader:
    """One config.json being read: its fields, the keys taken from them so far, and
    which field each key came from (for the errors)."""

    def __init__(self, doc: Mapping[str, Any], name: str, architecture: str) -> None:
        self.doc = doc
        self.name = name
        self.architecture = architecture
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def field(self, field: str, default: Any = _REQUIRED, kind: type = int) -> Any:
        """The field's value (``default`` when the file leaves it out or null), of
        ``kind`` (int: a JSON integer, not a boolean; bool; str; list)."""
        value = self.doc.get(field)
        if value is None:
            if default is _REQUIRED:
                raise ScenarioError(
                    f"{self.name} has no field {field!r}, which a {self.architecture} "
                    "config.json must give",
                    key="model.hf_config",
                    value=field,
                    rule="missing field",
                )
            return default
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            rule = {int: "an integer", bool: "true or false", str: "a string", list: "a list"}
            raise ScenarioError(
                f"{self.name}: field {field!r}={_shown(value)} must be {rule[kind]}",
                key="model.hf_config",
                value=value,
                rule=f"{field} must be {rule[kind]}",
            )
        return value

    def take(self, key: str, field: str, default: Any = _REQUIRED, kind: type = int) -> Any:
        """The field's value as model key ``key`` (left out when it is None)."""
        value = self.field(field, default, kind)
        self.put(key, value, field)
        return value

    def put(self, key: str, value: Any, source: str) -> None:
        if value is not None:
            self.values[key] = value
            self.sources[key] = source

    def refuse(self, field: str, value: Any, why: str) -> ScenarioError:
        return ScenarioError(
            f"{self.name}: {field}={_shown(value)} {why}",
            key="model.hf_config",
            value=value,
            rule=f"{field} {why}",
        )


# -- the pieces families share ------------------------------------------------------------


def _dense(r: _Reader, ffn: bool = True) -> None:
    """Layers, width, heads, FFN width and vocabulary under their usual names."""
    r.take("num_layers", "num_hidden_layers")
    r.take("hidden_size", "hidden_size")
    r.take("num_attention_heads", "num_attention_heads")
    if ffn:
        r.take("ffn_hidden_size", "intermediate_size")
    r.take("vocab_size", "vocab_size")


def _groups(r: _Reader) -> None:
    """GQA: ``num_key_value_heads`` (default: the heads, as the classes set it)."""
    heads = r.values["num_attention_heads"]
    groups = r.field("num_key_value_heads", heads)
    r.put("num_query_groups", groups if groups != heads else None, "num_key_value_heads")


def _head_dim(r: _Reader, required: bool = False) -> None:
    """``head_dim`` as kv_channels, left out when it is hidden / heads. Llama's and
    Mistral's classes default it to that; Qwen3's (128) and gpt-oss's (64) do not, so
    their files must give it."""
    dim = r.field("head_dim", _REQUIRED if required else None)
    hidden, heads = r.values["hidden_size"], r.values["num_attention_heads"]
    if dim is not None and (hidden % heads or dim != hidden // heads):
        r.put("kv_channels", dim, "head_dim")


def _llama_shape(r: _Reader, tie_default: bool = False) -> None:
    """SwiGLU, RMSNorm, rope; untied unless ``tie_word_embeddings`` (default false)."""
    r.values.update(swiglu=True, normalization=RMS_NORM, position_embedding_type=ROPE)
    tied = r.field("tie_word_embeddings", tie_default, bool)
    r.put("untie_embeddings_and_output_weights", not tied, "tie_word_embeddings")


def _llama_bias(r: _Reader) -> None:
    """``attention_bias`` and ``mlp_bias`` (both default false): both give biases on all
    four linear layers; attention's alone the QKV bias (its projection's h biases left
    out); the MLP's alone biases on all four (the projection's and QKV's added)."""
    attention = r.field("attention_bias", False, bool)
    mlp = r.field("mlp_bias", False, bool)
    r.put("add_bias_linear", mlp, "mlp_bias")
    if attention and not mlp:
        r.put("add_qkv_bias", True, "attention_bias")


def _top_k(r: _Reader, *fields: str) -> None:
    """The experts a token is routed to, under the first of ``fields`` the file has."""
    for field in fields:
        if r.doc.get(field) is not None:
            r.take("moe_router_topk", field)
            return
    r.field(fields[0])  # the error names the usual one


# -- the families -------------------------------------------------------------------------


def _llama(r: _Reader) -> None:
    """LlamaForCausalLM, MistralForCausalLM (Mistral's sliding window not modelled)."""
    _dense(r)
    _groups(r)
    _head_dim(r)
    _llama_shape(r)
    _llama_bias(r)


def _qwen2(r: _Reader) -> None:
    """Qwen2ForCausalLM: Llama's shape with a bias on Q, K and V (its attention's
    fixed layout; no field says so)."""
    _dense(r)
    _groups(r)
    _head_dim(r)
    _llama_shape(r)
    r.put("add_bias_linear", False, "architectures")
    r.put("add_qkv_bias", True, "architectures")


def _qwen3(r: _Reader) -> None:
    """Qwen3ForCausalLM: Llama's shape with ``head_dim`` given (its per-head Q/K
    RMSNorm not modelled)."""
    _dense(r)
    _groups(r)
    _head_dim(r, required=True)
    _llama_shape(r)
    _llama_bias(r)


def _qwen3_moe(r: _Reader) -> None:
    """Qwen3MoeForCausalLM: Qwen3's layers with routed experts (no shared one). Its
    dense layers are ``mlp_only_layers`` (layers 0 .. k-1 only: first_k_dense_replace)
    and every layer i with (i + 1) mod ``decoder_sparse_step`` != 0, which Megatron-Core's
    i mod freq cannot express for a step other than 1 (refused)."""
    _qwen3(r)
    r.take("num_experts", "num_experts")
    _top_k(r, "num_experts_per_tok")
    r.take("moe_ffn_hidden_size", "moe_intermediate_size")
    step = r.field("decoder_sparse_step", 1)
    if step != 1:
        raise r.refuse(
            "decoder_sparse_step",
            step,
            "is not modelled (MoE layers every step-th from layer "
            "step - 1; stepsim's are every model.moe_layer_freq-th from layer 0)",
        )
    dense = r.field("mlp_only_layers", [], list)
    if [type(i) for i in dense] != [int] * len(dense) or dense != list(range(len(dense))):
        raise r.refuse(
            "mlp_only_layers",
            dense,
            "is not modelled (only the first layers may be dense: "
            "[0, 1, ..., k-1], model.first_k_dense_replace = k)",
        )
    r.put("first_k_dense_replace", len(dense) or None, "mlp_only_layers")


def _mixtral(r: _Reader) -> None:
    """MixtralForCausalLM: Mistral's layers, every MLP ``num_local_experts`` experts of
    width ``intermediate_size``."""
    _llama(r)
    r.take("num_experts", "num_local_experts")
    _top_k(r, "num_experts_per_tok")


def _deepseek_v3(r: _Reader) -> None:
    """DeepseekV3ForCausalLM: multi-head latent attention, ``first_k_dense_replace``
    dense layers of ``intermediate_size``, then MoE layers (every ``moe_layer_freq``-th)
    of ``n_routed_experts`` experts of ``moe_intermediate_size`` and ``n_shared_experts``
    shared ones; group-limited routing (``n_group``, ``topk_group``), the expert bias
    of ``topk_method`` noaux_tc (the class's only method), multi-token prediction
    (``num_nextn_predict_layers``). The router's sigmoid scoring is not modelled."""
    _dense(r)
    _llama_shape(r)
    r.put("add_bias_linear", False, "attention_bias")
    if r.field("attention_bias", False, bool):
        raise r.refuse("attention_bias", True, "is not modelled with multi-latent attention")
    r.put("multi_latent_attention", True, "architectures")
    if r.doc.get("q_lora_rank", 0) is None:
        raise r.refuse("q_lora_rank", None, "(no query latent, DeepSeek-V2-Lite's) is not modelled")
    r.take("q_lora_rank", "q_lora_rank")
    r.take("kv_lora_rank", "kv_lora_rank")
    r.take("qk_head_dim", "qk_nope_head_dim")
    r.take("qk_pos_emb_head_dim", "qk_rope_head_dim")
    r.take("v_head_dim", "v_head_dim")
    r.take("num_experts", "n_routed_experts")
    _top_k(r, "num_experts_per_tok")
    width = r.take("moe_ffn_hidden_size", "moe_intermediate_size")
    shared = r.field("n_shared_experts", 0)
    r.put("moe_shared_expert_intermediate_size", shared * width or None, "n_shared_experts")
    r.put(
        "first_k_dense_replace",
        r.field("first_k_dense_replace", 0) or None,
        "first_k_dense_replace",
    )
    freq = r.field("moe_layer_freq", 1)
    r.put("moe_layer_freq", freq if freq != 1 else None, "moe_layer_freq")
    groups = r.field("n_group", 1)
    if groups > 1:
        r.put("moe_router_num_groups", groups, "n_group")
        r.take("moe_router_group_topk", "topk_group")
    method = r.field("topk_method", "noaux_tc", str)
    r.put("moe_router_enable_expert_bias", method == "noaux_tc" or None, "topk_method")
    depths = r.field("num_nextn_predict_layers", 0)
    r.put("mtp_num_layers", depths or None, "num_nextn_predict_layers")


def _gpt_oss(r: _Reader) -> None:
    """GptOssForCausalLM: ``num_local_experts`` experts of ``intermediate_size`` in every
    layer, GQA with ``head_dim``, biases on every linear layer (``attention_bias``; the
    experts' own always). Its sliding-window layers (full causal here), attention sinks
    and the clamped SwiGLU's extras are not modelled."""
    _dense(r)
    _groups(r)
    _head_dim(r, required=True)
    _llama_shape(r)
    r.put("add_bias_linear", r.field("attention_bias", True, bool), "attention_bias")
    r.take("num_experts", "num_local_experts")
    _top_k(r, "num_experts_per_tok", "experts_per_token")


def _gpt2(r: _Reader) -> None:
    """GPT2LMHeadModel: GPT's shape (learned positions, LayerNorm, GeLU, biases), the
    output layer tied unless ``tie_word_embeddings`` is false; FFN ``n_inner``, else
    4 x hidden (the loader's default)."""
    r.take("num_layers", "n_layer")
    r.take("hidden_size", "n_embd")
    r.take("num_attention_heads", "n_head")
    r.take("ffn_hidden_size", "n_inner", None)
    r.take("vocab_size", "vocab_size")
    tied = r.field("tie_word_embeddings", True, bool)
    r.put("untie_embeddings_and_output_weights", not tied, "tie_word_embeddings")


def _gpt_neox(r: _Reader) -> None:
    """GPTNeoXForCausalLM: LayerNorm, GeLU, rotary positions, biases (QKV's as
    ``attention_bias`` says, default true), untied by default. Its partial rotary
    (``rotary_pct``: the kernel runs over whole heads here) and parallel residual are
    not modelled."""
    _dense(r)
    r.put("position_embedding_type", ROPE, "architectures")
    if not r.field("attention_bias", True, bool):
        r.put("add_qkv_bias", False, "attention_bias")
    tied = r.field("tie_word_embeddings", False, bool)
    r.put("untie_embeddings_and_output_weights", not tied, "tie_word_embeddings")


# architectures[0] -> (model_type, reader)
ARCHITECTURES: dict[str, tuple[str, Callable[[_Reader], None]]] = {
    "LlamaForCausalLM": ("llama", _llama),
    "MistralForCausalLM": ("mistral", _llama),
    "Qwen2ForCausalLM": ("qwen2", _qwen2),
    "Qwen3ForCausalLM": ("qwen3", _qwen3),
    "Qwen3MoeForCausalLM": ("qwen3_moe", _qwen3_moe),
    "MixtralForCausalLM": ("mixtral", _mixtral),
    "DeepseekV3ForCausalLM": ("deepseek_v3", _deepseek_v3),
    "GptOssForCausalLM": ("gpt_oss", _gpt_oss),
    "GPT2LMHeadModel": ("gpt2", _gpt2),
    "GPTNeoXForCausalLM": ("gpt_neox", _gpt_neox),
}
MODEL_TYPES = {model_type: arch for arch, (model_type, _) in ARCHITECTURES.items()}


def _architecture(doc: Mapping[str, Any], name: str) -> str:
    """The family's architecture: ``architectures[0]`` when stepsim reads it, else the
    one of ``model_type``; else a one-line error saying what is read."""
    listed = doc.get("architectures")
    first = listed[0] if isinstance(listed, list) and listed else None
    if not isinstance(first, str):
        first = None
    if first in ARCHITECTURES:
        return first
    model_type = doc.get("model_type")
    if isinstance(model_type, str) and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    given = first if first is not None else model_type
    field = "architectures[0]" if first is not None else "model_type"
    # the architectures share their "ForCausalLM": only a near-exact spelling is suggested
    hint = did_you_mean(given, [*ARCHITECTURES, *MODEL_TYPES], cutoff=0.9)
    raise ScenarioError(
        f"{name}: {field}={_shown(given)} is not an architecture stepsim reads; it reads "
        f"{', '.join(ARCHITECTURES)}" + (f"; {hint}" if hint else ""),
        key="model.hf_config",
        value=given,
        rule="must be a supported architecture",
    )


def model_keys(path: Path, name: str) -> dict[str, Any]:
    """The `[model]` keys the config.json at ``path`` gives (seq_length excepted; see
    the module's note). ``name`` is how errors name the file, e.g.
    ``model.hf_config='config.json'``."""
    text = read_text(path, name)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if isinstance(exc, ValueError) else "nested too deep"
        raise ScenarioError(f"{name}: not valid JSON: {reason}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(
            f"{name}: a config.json holds one JSON object, not {type(doc).__name__}"
        )
    reader = _Reader(doc, name, _architecture(doc, name))
    ARCHITECTURES[reader.architecture][1](reader)
    known = schema.keys()["model"]
    for key, value in reader.values.items():
        try:
            check_value(known[key], value)
        except ScenarioError as exc:
            raise ScenarioError(
                f"{name}: field {reader.sources[key]!r} gives {exc}",
                key=exc.key,
                value=exc.value,
                rule=exc.rule,
            ) from None
    return dict(reader.values)

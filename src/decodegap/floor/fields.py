"""Reading a config.json's fields: the names each size goes by across families, checked whole numbers, and the part
of a composite (multimodal) config that is the language model.

Families spell one size many ways (GPT-2's `n_embd`, OPT's `ffn_dim`, Ernie's `moe_k`): each size has one tuple of
aliases here, read first-given-wins, so the geometry code asks for a size, never for a family's name of it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from decodegap.errors import UserError

# Sizes no real model reaches, so that a hand-edited config (1e12 layers, a 1e30 hidden size) is refused in one
# line instead of exhausting memory in a per-layer loop.
MAX_LAYERS = 10_000
MAX_WIDTH = 1_000_000  # hidden, intermediate, head dims, lora ranks
MAX_HEADS = 100_000
MAX_VOCAB = 100_000_000
MAX_EXPERTS = 100_000

# ---- aliases: the first name a config gives wins ----------------------------------------------------------------
HIDDEN = ("hidden_size", "n_embd", "d_model", "model_dim")
LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers")
HEADS = ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads", "attention_heads")
# GPT-Neo's name for its attention heads; in a Mamba-2 config the same name counts SSM heads, so it is read as
# attention heads only where no recurrent mixer is described.
HEADS_IF_NO_SSM = ("num_heads",)
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "kv_n_heads", "num_query_groups")
VOCAB = ("vocab_size", "padded_vocab_size", "n_vocab")
INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", "decoder_ffn_dim", "d_ff", "dff",
                "inner_hidden_size")
# Dense layers of MoE models whose experts take intermediate_size (Llama 4, MiniMax-M3)
DENSE_INTERMEDIATE = ("intermediate_size_mlp", "dense_intermediate_size")
MOE_INTERMEDIATE = ("moe_intermediate_size", "expert_intermediate_size", "expert_ffn_hidden_size")
EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts", "n_experts",
           "num_routed_experts")
TOP_K = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k",
         "n_activated_experts", "num_selected_experts", "top_k_experts")
SHARED_EXPERTS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert")
# The total width of a layer's shared expert(s), where a config gives it apart from the routed experts' width
SHARED_WIDTH = ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                "shared_intermediate_size")
SLIDING_WINDOW = ("sliding_window", "attention_window_size")

# Where composite configs keep their language model (LLaVA-style text_config, InternVL's llm_config, ColQwen's
# vlm_config around a text_config, Qwen-Omni's thinker_config).
TEXT_PARTS = ("text_config", "llm_config", "language_config", "text_model_config", "vlm_config", "thinker_config")
# BERT-style encoders (post-norm blocks, learned positions) that lack the token-type embeddings that mark the rest
BERT_STYLE_TYPES = {"bert-generation"}


class Fields:
    """Reads integer fields of one config, each checked to be a whole number within its range."""

    def __init__(self, cfg: dict[str, Any], source: str) -> None:
        self.cfg, self.source = cfg, source
        self.warnings: list[str] = []

    def has(self, *names: str) -> bool:
        return any(self.cfg.get(n) is not None for n in names)

    def name_of(self, *names: str) -> str:
        """The alias the config gives (the first name when it gives none)."""
        return next((n for n in names if self.cfg.get(n) is not None), names[0])

    def int(self, *names: str, default: int | None = None, low: int = 0, high: int = MAX_WIDTH) -> int:
        name = self.name_of(*names)
        value = self.cfg.get(name)
        label = name
        if value is None:
            if default is None:
                raise UserError(f"{self.source}: {name} is missing")
            value = default  # a derived default is checked like a given value
            label = f"{name} (absent, derived from the other fields)"
        if isinstance(value, list) and value:
            # A per-layer list in a scalar field (Hunyuan's moe_topk): one value when all agree, else the most
            # common one, said in the warnings.
            values = [self._whole(v, label, low, high) for v in value]
            common = Counter(values).most_common(1)[0][0]
            if len(set(values)) > 1:
                self.warnings.append(f"{name} differs per layer ({min(values)}-{max(values)}): {common} used for "
                                     "every layer")
            return common
        return self._whole(value, label, low, high)

    def per_layer(self, *names: str, count: int, default: int, low: int = 0, high: int = MAX_WIDTH) -> list[int]:
        """A width that may be one number or a list with one entry per layer (Gemma 3n's intermediate_size)."""
        name = self.name_of(*names)
        value = self.cfg.get(name)
        if isinstance(value, list):
            if len(value) != count:
                raise UserError(f"{self.source}: {name} lists {len(value)} values for {count} layers")
            return [self._whole(v, name, low, high) for v in value]
        return [self.int(*names, default=default, low=low, high=high)] * count

    def _whole(self, value: Any, label: str, low: int, high: int) -> int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        if number is None:
            raise UserError(f"{self.source}: {label} must be a whole number, got {str(value)[:40]!r}")
        if not low <= number <= high:
            raise UserError(f"{self.source}: {label} must be between {low:,} and {high:,}, got {value!r}")
        return number

    def int_list(self, name: str, high: int) -> list[int]:
        value = self.cfg.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and
                                                  0 <= v <= high for v in value):
            raise UserError(f"{self.source}: {name} must be a list of layer indices, got {str(value)[:80]}")
        return value

    def str_list(self, name: str) -> list[str]:
        value = self.cfg.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{self.source}: {name} must be a list of layer kinds, got {str(value)[:80]}")
        return [v.lower() for v in value]

    def flag(self, name: str, default: bool) -> bool:
        value = self.cfg.get(name)
        return default if value is None else bool(value)


def flattened(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config with the sub-dicts some families keep sizes in lifted to the top (MPT's attn_config, DBRX's
    ffn_config; Kimi Linear's linear_attn_config, prefixed linear_); top-level fields win."""
    out = dict(cfg)
    for key, prefix in (("attn_config", ""), ("ffn_config", ""), ("linear_attn_config", "linear_")):
        part = cfg.get(key)
        if isinstance(part, dict):
            for name, value in part.items():
                out.setdefault(prefix + name if not name.startswith(prefix) else name, value)
    return out


def _is_text_model(part: Any) -> bool:
    return isinstance(part, dict) and (any(part.get(n) is not None for n in HIDDEN + LAYERS)
                                       or any(isinstance(part.get(k), dict) for k in TEXT_PARTS))


def text_part(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """The language model of a config: the config itself, or the text part a composite config nests (even where
    the composite also has a top-level hidden_size: PaliGemma's is the projector's). Refuses, in one line, what is
    not a decoder-only language model."""
    for _ in range(4):  # vlm_config -> text_config: a few levels at most
        key = next((k for k in TEXT_PARTS if _is_text_model(cfg.get(k))), None)
        if key is None:
            break
        outer, cfg = cfg, dict(cfg[key])
        if cfg.get("quantization_config") is None:
            cfg["quantization_config"] = outer.get("quantization_config")
        if cfg.get("tie_word_embeddings") is None and outer.get("tie_word_embeddings") is not None:
            cfg["tie_word_embeddings"] = outer["tie_word_embeddings"]
    model_type = str(cfg.get("model_type") or "unknown")
    if cfg.get("is_encoder_decoder") or cfg.get("encoder_layers") is not None:
        raise UserError(f"{source}: model_type '{model_type}' is an encoder-decoder; the floor covers decoder-only "
                        "language models")
    if cfg.get("type_vocab_size") is not None or model_type in BERT_STYLE_TYPES:
        raise UserError(f"{source}: model_type '{model_type}' is a BERT-style encoder; the floor "
                        "covers decoder-only language models")
    return flattened(cfg)

"""Model geometry from a Hugging Face config.json on disk: the shapes a decode step reads, parameter counts.

No download and no transformers import: the config is plain JSON and the families differ in field names
(fields.py), in how they lay out their layers (layout.py) and in their recurrent mixers (mixers.py). Tables of
families appear only where the architecture decides what no config field says (which MLPs are ungated).
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from decodegap.errors import UserError
from decodegap.floor.fields import (
    DENSE_INTERMEDIATE,
    EXPERTS,
    HEADS,
    HEADS_IF_NO_SSM,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    MOE_INTERMEDIATE,
    SHARED_EXPERTS,
    SHARED_WIDTH,
    TOP_K,
    VOCAB,
    Fields,
    text_part,
)
from decodegap.floor.geometry import ModelGeometry, common_width
from decodegap.floor.layout import FULL, build_layers, mixers, moe_flags
from decodegap.floor.mixers import recurrent_kind, recurrent_mixer

__all__ = ["ModelGeometry", "geometry_from_dict", "load_model", "read_config_json", "read_json_file"]

MLA_TYPES = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm_moe_dsa", "deepseek_v32"}
# Families whose MLP is up -> act -> down, with no gate (HF's modeling code decides; no config field says so).
PLAIN_MLP_TYPES = {"gpt2", "gpt_bigcode", "gptj", "codegen", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "opt",
                   "bloom", "falcon", "mpt", "xglm", "biogpt", "starcoder2", "phi", "persimmon", "fuyu", "nemotron",
                   "apertus", "arcee", "nanochat", "jais2", "cosmos3_edge", "nemotron_h", "git", "openai-gpt", "ctrl"}
# Families whose config class ties the output head to the embedding table when config.json leaves
# tie_word_embeddings out (transformers' class defaults; every other decoder family's default is untied).
TIED_BY_DEFAULT = {"bloom", "cohere", "cohere2", "cohere2_moe", "cpmant", "ctrl", "ernie4_5", "ernie4_5_moe", "falcon",
                   "falcon_mamba", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox_japanese", "granite_swa",
                   "jetmoe", "lfm2", "lfm2_moe", "mamba", "minicpm3", "mpt", "openai-gpt", "opt", "recurrent_gemma",
                   "smollm3", "starcoder2", "vaultgemma", "xglm", "youtu", "zamba", "zamba2", "zaya", "biogpt"}
# Families with one always-on shared expert of the routed experts' width and no config field for it.
ALWAYS_SHARED_EXPERT = {"llama4", "hunyuan_v1_moe"}
# Families whose attention output is gated per head by a second half of q_proj (no field says so in HF's
# config; vLLM's says attn_output_gate, read first).
OUTPUT_GATED_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "afmoe", "muse_glimmer"}
# MLPs half as wide as their width field says: RecurrentGemma's (HF: intermediate_size // 2), Moshi's (one fc1 of
# ffn_dim holds both the gate and the up projection).
MLP_WIDTH_DIVISOR = {"recurrent_gemma": 2, "moshi": 2}
# Fields that mean structure these counts leave out (with the fields it also needs set): the floor says so in its
# warnings instead of being silently wrong.
UNMODELLED = {
    "altup_num_inputs": "AltUp and LAuReL blocks (Gemma 3n)",
    ("vocab_size_per_layer_input", "hidden_size_per_layer_input"): "per-layer input embeddings (Gemma 3n / Gemma 4)",
    "hc_mult": "hyper-connections",
    "compress_rates": "the KV compressor and its indexer (DeepSeek-V4)",
    "num_mem_blocks": "transformer blocks shared between layers (Zamba: counted once per use)",
    "adapter_rank": "per-layer LoRA adapters on shared blocks (Zamba 2)",
    "num_layers_per_stack": "stacks run several times per step (HRM)",
    "attention_hidden_size": "attention over the hidden state joined with the input embedding (Zamba)",
    "zero_expert_num": "zero-computation experts and shortcut-connected sublayers (LongCat-Flash)",
    "global_head_dim": "full-attention layers with a head size and KV heads of their own (Gemma 4)",
    "attention_k_eq_v": "keys that serve as values (no v_proj; Gemma 4)",
}
# Families whose structure no field announces, and which these counts leave out: said in the warnings.
FAMILY_WARNINGS = {"jetmoe": "JetMoE's mixture-of-attention experts are counted as one dense attention"}
# Families the floor cannot describe at all: one line instead of a wrong floor.
UNSUPPORTED = {"rwkv": "RWKV's time-mix layers", "xlstm": "xLSTM's cells", "reformer": "Reformer's LSH attention"}


def _base(model_type: str) -> str:
    """The family a text part belongs to (qwen3_5_text -> qwen3_5)."""
    return model_type.removesuffix("_text")


def geometry_from_dict(cfg: dict[str, Any], source: str = "config") -> ModelGeometry:
    """Build the geometry from a parsed config.json. Raises UserError naming any missing required fields."""
    cfg = text_part(cfg, source)
    model_type = str(cfg.get("model_type") or "unknown")
    family = _base(model_type)
    if family in UNSUPPORTED:
        raise UserError(f"{source}: model_type '{model_type}': {UNSUPPORTED[family]}: not modelled by the floor")
    f = Fields(cfg, source)
    kind = recurrent_kind(cfg, model_type)
    heads_names = HEADS if kind else HEADS + HEADS_IF_NO_SSM
    has_attention = f.has(*heads_names)
    is_mla = cfg.get("kv_lora_rank") is not None or model_type in MLA_TYPES
    num_experts = 0 if cfg.get("is_moe") is False else f.int(*EXPERTS, default=0, high=MAX_EXPERTS)
    pattern = any(cfg.get(n) is not None for n in ("hybrid_override_pattern", "layers_block_type"))

    missing = [names[0] for names in (HIDDEN, VOCAB) if not f.has(*names)]
    if not f.has(*LAYERS) and not pattern:
        missing.append(LAYERS[0])
    if not has_attention and kind not in ("mamba", "mamba2"):
        missing.append(HEADS[0])
    width_default = _default_width(f, family)
    if not f.has(*INTERMEDIATE, *MOE_INTERMEDIATE, *DENSE_INTERMEDIATE) and width_default is None and \
            kind not in ("mamba", "mamba2"):
        missing.append(INTERMEDIATE[0])
    if is_mla:
        missing += [n for n in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim") if cfg.get(n) is None]
    if missing:
        raise UserError(
            f"{source}: model_type '{model_type}' is missing required fields: {', '.join(missing)}"
        )

    hidden = f.int(*HIDDEN, low=1)
    vocab = f.int(*VOCAB, low=1, high=MAX_VOCAB)
    num_layers = f.int(*LAYERS, low=1, high=MAX_LAYERS) if f.has(*LAYERS) and not pattern else None
    heads = kv_heads = head_dim = 0
    if has_attention:
        heads = f.int(*heads_names, low=1, high=MAX_HEADS)
        if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
            kv_heads = 1  # Falcon-7B, StarCoder: one KV head, whatever num_kv_heads says
        else:
            kv_heads = f.int(*KV_HEADS, default=heads, low=1, high=MAX_HEADS)
        if kv_heads > heads:
            raise UserError(f"{source}: num_key_value_heads ({kv_heads}) exceeds num_attention_heads ({heads})")
        if heads % kv_heads:
            raise UserError(f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                            f"({kv_heads})")
        head_dim = f.int("head_dim", "attention_head_dim", default=hidden // heads, low=0 if is_mla else 1)
        head_dim = head_dim or hidden // heads

    mixer_list = mixers(f, num_layers, kind, has_attention, family)
    n = len(mixer_list)
    recurrent = None
    if any(m.recurrent for m in mixer_list):
        if kind is None:
            f.warnings.append("recurrent layers without the fields of a known recurrent mixer (Mamba, DeltaNet, "
                              "short convolution, RG-LRU): counted as full attention")
            mixer_list = [replace(m, attention=FULL, window=0, recurrent=False) if m.recurrent else m
                          for m in mixer_list]
        else:
            recurrent = recurrent_mixer(kind, f, hidden, heads, head_dim)
    if not has_attention and any(m.attention for m in mixer_list):
        raise UserError(f"{source}: model_type '{model_type}' has attention layers but no num_attention_heads")

    top_k = 0
    moe = None
    moe_width = 0
    if num_experts:
        if f.has(*TOP_K):
            top_k = f.int(*TOP_K, high=MAX_EXPERTS)
        else:
            top_k = 1
            f.warnings.append(f"{TOP_K[0]} is not given: 1 expert per token assumed (active counts and expert "
                              "reads are a lower bound)")
        if top_k > num_experts:
            raise UserError(f"{source}: {f.name_of(*TOP_K)} ({top_k}) exceeds the {num_experts} experts")
        moe = moe_flags(f, n)
        # Mixtral, gpt-oss and Llama 4 have no separate MoE width: their experts use intermediate_size.
        moe_width = f.int(*MOE_INTERMEDIATE, *INTERMEDIATE, low=1)
    dense_names = (DENSE_INTERMEDIATE + INTERMEDIATE) if num_experts else INTERMEDIATE
    widths = f.per_layer(*dense_names, count=n, default=width_default or 0)
    widths = [_adjusted_width(w, f, family) for w in widths]
    layers = build_layers(mixer_list, moe, widths)

    n_shared = f.int(*SHARED_EXPERTS, default=1 if family in ALWAYS_SHARED_EXPERT else 0, high=MAX_EXPERTS)
    shared_width = n_shared * moe_width
    if f.has(*SHARED_WIDTH) and f.int(*SHARED_WIDTH):  # one shared block of its own width (Qwen2-MoE, Granite)
        n_shared = max(n_shared, 1)
        shared_width = f.int(*SHARED_WIDTH)
    if num_experts and f.flag("enable_moe_block", False):  # Gemma 4: each layer runs its dense MLP beside the experts
        n_shared, shared_width = n_shared + 1, shared_width + f.int(*INTERMEDIATE, low=1)

    mla = {name: f.int(name, default=0) if is_mla else 0
           for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")}
    if is_mla and mla["kv_lora_rank"] + mla["qk_rope_head_dim"] < 1:
        raise UserError(f"{source}: kv_lora_rank + qk_rope_head_dim must be at least 1")
    v_head_dim = f.int("v_head_dim", default=head_dim) if has_attention else 0
    for names, what in UNMODELLED.items():
        names = (names,) if isinstance(names, str) else names  # all set: a width of 0 turns the structure off
        if all(cfg.get(n) for n in names):
            f.warnings.append(f"{names[0]}: {what} not modelled; parameter counts and the floor leave them out")
    if family in FAMILY_WARNINGS:
        f.warnings.append(FAMILY_WARNINGS[family])
    _check_dtype(cfg, source)

    return ModelGeometry(
        model_type=model_type,
        hidden=hidden,
        vocab=vocab,
        layers=layers,
        attention="mla" if is_mla else "gqa",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        q_lora_rank=f.int("q_lora_rank", default=0),
        kv_lora_rank=mla["kv_lora_rank"],
        qk_nope_head_dim=mla["qk_nope_head_dim"],
        qk_rope_head_dim=mla["qk_rope_head_dim"],
        v_head_dim=v_head_dim if is_mla or v_head_dim != head_dim else 0,
        o_lora_rank=0 if is_mla else f.int("o_lora_rank", default=0),
        o_groups=f.int("o_groups", default=1, low=1),
        intermediate=common_width(layers),
        num_experts=num_experts,
        experts_per_token=top_k,
        num_shared_experts=n_shared if num_experts else 0,
        moe_intermediate=moe_width,
        shared_expert_intermediate=shared_width if num_experts else 0,
        mlp_gated=family not in PLAIN_MLP_TYPES,
        recurrent=recurrent,
        tie_embeddings=f.flag("tie_word_embeddings", family in TIED_BY_DEFAULT or family.startswith("gemma")),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")) and not is_mla,
        qk_norm=model_type.startswith("qwen3") or bool(cfg.get("use_qk_norm")),
        output_gate=f.flag("attn_output_gate", family in OUTPUT_GATED_TYPES) and not is_mla,
        expert_bias=model_type == "gpt_oss",
        mtp_layers=f.int("num_nextn_predict_layers", default=0, high=MAX_LAYERS),
        indexer_heads=f.int("index_n_heads", default=0, high=MAX_HEADS),
        indexer_head_dim=f.int("index_head_dim", default=0),
        indexer_topk=f.int("index_topk", default=0, high=100_000_000),
        warnings=tuple(dict.fromkeys(f.warnings)),
    )


def _default_width(f: Fields, family: str) -> int | None:
    """The MLP width a config leaves to its family's convention: MPT's expansion_ratio, GPT-2's 4 x hidden."""
    hidden = f.int(*HIDDEN, default=0)
    if f.has("expansion_ratio"):
        return f.int("expansion_ratio", low=1) * hidden
    if family in PLAIN_MLP_TYPES:
        return 4 * hidden
    return None


def _adjusted_width(width: int, f: Fields, family: str) -> int:
    """The width a layer really has where the family derives it from intermediate_size: LFM2's auto-adjusted
    feed-forward (2/3, times a multiplier, rounded up to a multiple), RecurrentGemma's half."""
    if f.flag("block_auto_adjust_ff_dim", False):
        width = int(2 * width / 3)
        multiplier = f.cfg.get("block_ffn_dim_multiplier")
        if multiplier is not None:
            number = isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool)
            if not number or not math.isfinite(multiplier) or not 0 < multiplier * width <= MAX_WIDTH:
                raise UserError(f"{f.source}: block_ffn_dim_multiplier must be a positive number that keeps the MLP "
                                f"under {MAX_WIDTH:,} wide, got {str(multiplier)[:40]!r}")
            width = int(multiplier * width)
        step = f.int("block_multiple_of", default=1, low=1)
        width = step * -(-width // step)
    return width // MLP_WIDTH_DIVISOR.get(family, 1)


# The dtypes a checkpoint's weights may be stored in (torch_dtype / dtype of config.json); quantized checkpoints
# say more in their quantization_config.
KNOWN_DTYPES = {"bfloat16", "float16", "float32", "half", "float", "bf16", "fp16", "fp32", "float8_e4m3fn",
                "float8_e5m2", "auto"}


def _check_dtype(cfg: dict[str, Any], source: str) -> None:
    for name in ("torch_dtype", "dtype"):
        value = cfg.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or value.replace("torch.", "").lower() not in KNOWN_DTYPES:
            raise UserError(f"{source}: {name} {str(value)[:40]!r} is not a dtype (known: "
                            f"{', '.join(sorted(KNOWN_DTYPES))})")


GZIP_MAGIC = b"\x1f\x8b"
CONFIG_MAX_BYTES = 64 << 20  # a config.json is kilobytes; a larger file is something else (a trace, weights)
# Keys that only a profiler trace (or a decodegap report) has at its top level.
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"')


def file_kind(path: Path, head: bytes) -> str | None:
    """What a file that is not JSON text is, from its first bytes: "a gzipped profiler trace", "a gzip file",
    "a damaged gzip file", "a binary file"; None for text."""
    if head[:2] == GZIP_MAGIC:
        try:
            text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 20)
        except zlib.error:
            return "a damaged gzip file"
        return "a gzipped profiler trace" if any(key in text for key in _TRACE_KEYS) else "a gzip file"
    try:
        head[:4096].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head[:4096]) - 4:  # not a character cut at the end of the sample
            return "a binary file"
    return None


def not_gzip(path: Path, head: bytes) -> bool:
    """Whether a file named .gz is not gzip (plain text under a gzip name)."""
    return path.name.lower().endswith(".gz") and head[:2] != GZIP_MAGIC


def named_for_what_it_is(path: Path, exc: UserError) -> UserError:
    """A trace file the reader refused, with what it is where its name says otherwise (plain text named .gz)."""
    if not Path(path).is_file():  # only a regular file is looked into: opening a named pipe blocks for its writer
        return exc
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return exc
    if not_gzip(Path(path), head):
        return UserError(f"{exc}; the file is plain text, not gzip despite its .gz name")
    return exc


def read_json_file(path: str | Path, default_name: str, what: str) -> tuple[Any, Path]:
    """Parse a JSON file given as itself or as the folder holding `default_name`; (value, file). A file that is not
    JSON text (a gzipped trace, a binary) is named for what it is."""
    path = Path(path)
    file = path / default_name if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"no {what} at {path} (give a {default_name} or a folder holding one)")
    fix = f"give the {default_name} file (or its folder)"
    try:
        with open(file, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{file}: cannot read ({exc.strerror or exc})") from None
    kind = file_kind(file, raw[: 1 << 20])
    if kind is not None:
        raise UserError(f"{file}: {kind}, not a {what} ({default_name}); {fix}"
                        + ("; traces are for decodegap analyze" if "trace" in kind else ""))
    if len(raw) > CONFIG_MAX_BYTES:
        raise UserError(f"{file}: over {CONFIG_MAX_BYTES >> 20} MB, too large for a {what}; {fix}")
    try:
        return json.loads(raw.decode("utf-8")), file
    except UnicodeDecodeError as exc:
        raise UserError(f"{file}: not UTF-8 text (byte {exc.start}), not a {what}; {fix}") from None
    except json.JSONDecodeError as exc:
        what_it_is = "plain text, not gzip despite its .gz name, and malformed JSON" if not_gzip(file, raw) else \
            "malformed JSON"
        raise UserError(f"{file}: {what_it_is} ({exc.msg} at line {exc.lineno} column {exc.colno}), not a {what}; "
                        f"{fix}") from None
    except RecursionError:
        raise UserError(f"{file}: JSON nested too deeply for a {what}; {fix}") from None


def read_config_json(path: str | Path) -> tuple[dict[str, Any], Path]:
    """Parse config.json from a file or a model folder; returns the dict and the folder it lives in."""
    cfg, file = read_json_file(path, "config.json", "model config")
    if not isinstance(cfg, dict):
        raise UserError(f"{file}: a JSON {type(cfg).__name__}, not a model config (config.json is a JSON object); "
                        "give the config.json file (or its folder)")
    if "traceEvents" in cfg:
        raise UserError(f"{file}: a profiler trace, not a model config (config.json); give the config.json file (or "
                        "its folder); traces are for decodegap analyze")
    if str(cfg.get("schema", "")).startswith("decodegap."):
        raise UserError(f"{file}: a decodegap report, not a model config (config.json); give the config.json file "
                        "(or its folder)")
    return cfg, file.parent


def load_model(path: str | Path) -> ModelGeometry:
    """Geometry of the model whose config.json is at `path` (the file or its folder)."""
    cfg, _ = read_config_json(path)
    return geometry_from_dict(cfg, source=str(path))

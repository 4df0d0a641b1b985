"""Model geometry from a Hugging Face config.json on disk: the shapes a decode step reads, parameter counts.

No download and no transformers import: the config is plain JSON and the families differ only in field names.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodegap.errors import UserError

# Families whose field names we know; anything else goes through the same field-presence path.
DENSE_TYPES = {"llama", "qwen2", "qwen3", "mistral"}
MOE_TYPES = {"mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss"}
MLA_TYPES = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm_moe_dsa", "deepseek_v32"}


@dataclass(frozen=True)
class ModelGeometry:
    """Shapes of one decoder-only transformer, enough to count parameters and bytes read per decode step."""

    model_type: str
    num_layers: int
    hidden: int
    vocab: int
    attention: str  # "mla" or "gqa" (MHA is GQA with kv_heads == heads)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # MLA (0 when attention == "gqa")
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MLP / MoE
    intermediate: int = 0  # dense MLP width (dense models, and the first-k-dense layers of MoE models)
    num_dense_layers: int = 0
    num_moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0  # total width of the shared expert(s) in one layer
    # Extras
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (qwen2, gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3)
    expert_bias: bool = False  # gpt-oss experts carry biases
    mtp_layers: int = 0
    # DeepSeek sparse attention (DSA) indexer; 0 when absent
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    indexer_topk: int = 0
    # Sliding-window layers read at most `sliding_window` tokens of KV (gpt-oss alternates; 0 = none)
    sliding_window: int = 0
    num_sliding_layers: int = 0

    # ---- shapes -------------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def has_indexer(self) -> bool:
        return self.indexer_heads > 0

    @property
    def kv_latent(self) -> bool:
        """True when the cache holds one shared latent per token (MLA) rather than per-head K and V."""
        return self.is_mla

    @property
    def kv_width(self) -> int:
        """KV-cache elements per token per layer."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    # ---- parameters per piece ---------------------------------------------------------------------
    def attention_projection_params(self) -> dict[str, int]:
        """Weights of each attention projection in one layer, by HF module name (self_attn.<name>)."""
        h = self.hidden
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            out: dict[str, int] = {}
            if self.q_lora_rank:
                out["q_a_proj"] = h * self.q_lora_rank
                out["q_b_proj"] = self.q_lora_rank * self.num_heads * qk_head
            else:
                out["q_proj"] = h * self.num_heads * qk_head
            out["kv_a_proj_with_mqa"] = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            out["kv_b_proj"] = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            out["o_proj"] = self.num_heads * self.v_head_dim * h
            return out
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        bias = self.attention_bias
        return {
            "q_proj": h * q_out + (q_out if bias else 0),
            "k_proj": h * kv_out + (kv_out if bias else 0),
            "v_proj": h * kv_out + (kv_out if bias else 0),
            "o_proj": q_out * h + (h if bias else 0),
        }

    @property
    def attention_params_per_layer(self) -> int:
        """Attention projections plus their small norms (MLA latent norms, qwen3 q/k norms)."""
        extra = 0
        if self.is_mla:
            extra = self.q_lora_rank + self.kv_lora_rank
        elif self.qk_norm:
            extra = 2 * self.head_dim
        return sum(self.attention_projection_params().values()) + extra

    def indexer_projection_params(self) -> dict[str, int]:
        """DSA indexer (DeepSeek-V3.2, GLM-5): query from the q latent, one shared key head, head weights."""
        if not self.has_indexer:
            return {}
        q_source = self.q_lora_rank or self.hidden
        return {
            "wq_b": q_source * self.indexer_heads * self.indexer_head_dim,
            "wk": self.hidden * self.indexer_head_dim,
            "weights_proj": self.hidden * self.indexer_heads,
        }

    @property
    def indexer_params_per_layer(self) -> int:
        if not self.has_indexer:
            return 0
        return (
            sum(self.indexer_projection_params().values()) + 2 * self.indexer_head_dim
        )  # k_norm weight+bias

    @property
    def dense_mlp_params(self) -> int:
        """One gated (SwiGLU) dense MLP: gate, up and down projections."""
        return 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """One routed expert (gated MLP of width moe_intermediate)."""
        biases = (2 * self.moe_intermediate + self.hidden) if self.expert_bias else 0
        return 3 * self.hidden * self.moe_intermediate + biases

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer together."""
        return 3 * self.hidden * self.shared_expert_intermediate

    @property
    def router_params(self) -> int:
        return self.num_experts * self.hidden + (self.num_experts if self.expert_bias else 0)

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Zero when tied: the output head reuses the embedding matrix (still read once per step)."""
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    # ---- totals -------------------------------------------------------------------------------------
    @property
    def moe_layer_params(self) -> int:
        return self.num_experts * self.expert_params + self.shared_expert_params + self.router_params

    @property
    def params_total(self) -> int:
        """Every weight of the main model (MTP layers excluded, as publishers count them)."""
        per_layer_common = self.attention_params_per_layer + self.indexer_params_per_layer
        per_layer_common += self.norm_params_per_layer
        layers = self.num_layers * per_layer_common
        layers += self.num_dense_layers * self.dense_mlp_params + self.num_moe_layers * self.moe_layer_params
        return layers + self.embedding_params + self.lm_head_params + self.hidden  # final norm

    @property
    def params_active_non_embedding(self) -> int:
        """Weights one token multiplies with, without the embedding table and output head."""
        per_layer_common = self.attention_params_per_layer + self.indexer_params_per_layer
        per_layer_common += self.norm_params_per_layer
        moe_active = (
            self.experts_per_token * self.expert_params + self.shared_expert_params + self.router_params
        )
        return (
            self.num_layers * per_layer_common
            + self.num_dense_layers * self.dense_mlp_params
            + self.num_moe_layers * moe_active
            + self.hidden
        )

    @property
    def output_head_params(self) -> int:
        """The vocab x hidden matrix the output head multiplies with, tied or not."""
        return self.vocab * self.hidden

    @property
    def params_active(self) -> int:
        """What one token reads: every active weight and the output head, but not the input embedding table (a
        token reads one row of it). OpenAI's, DeepSeek's and Moonshot's convention."""
        return self.params_active_non_embedding + self.output_head_params

    @property
    def params_active_with_embeddings(self) -> int:
        """Active weights with the whole embedding table and the (untied) head counted: Qwen's and Mistral's."""
        return self.params_active_non_embedding + self.embedding_params + self.lm_head_params

    @property
    def params_mtp(self) -> int:
        """Multi-token-prediction block(s): one more decoder layer (MoE when the model has MoE), the eh_proj
        that joins hidden state and next-token embedding, and its three norms. The embedding and output head
        it shares with the main model are not counted again (DeepSeek's published 14B counts its stored
        copies)."""
        if not self.mtp_layers:
            return 0
        layer = self.attention_params_per_layer + self.indexer_params_per_layer + self.norm_params_per_layer
        layer += self.moe_layer_params if self.is_moe else self.dense_mlp_params
        return self.mtp_layers * (layer + 2 * self.hidden * self.hidden + 3 * self.hidden)


# ---- parsing ------------------------------------------------------------------------------------------


# Sizes no real model reaches, so that a hand-edited config (1e12 layers, a 1e30 hidden size) is refused in one
# line instead of exhausting memory in a per-layer loop.
MAX_LAYERS = 10_000
MAX_WIDTH = 1_000_000  # hidden, intermediate, head dims, lora ranks
MAX_HEADS = 100_000
MAX_VOCAB = 100_000_000
MAX_EXPERTS = 100_000


class _Fields:
    """Reads integer fields of one config, each checked to be a whole number within its range."""

    def __init__(self, cfg: dict[str, Any], source: str) -> None:
        self.cfg, self.source = cfg, source

    def int(self, *names: str, default: int | None = None, low: int = 0, high: int = MAX_WIDTH) -> int:
        name = next((n for n in names if self.cfg.get(n) is not None), names[0])
        value = self.cfg.get(name)
        label = name
        if value is None:
            if default is None:
                raise UserError(f"{self.source}: {name} is missing")
            value = default  # a derived default is checked like a given value
            label = f"{name} (absent, derived from the other fields)"
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


def _moe_layer_flags(cfg: dict[str, Any], num_layers: int, fields: _Fields) -> list[bool]:
    """Which layers carry an MoE block, following each family's own rule."""
    first_dense = fields.int("first_k_dense_replace", default=0, high=MAX_LAYERS)
    freq = fields.int("moe_layer_freq", default=1, high=MAX_LAYERS) or 1
    sparse_step = fields.int("decoder_sparse_step", default=1, high=MAX_LAYERS) or 1
    dense_only = set(fields.int_list("mlp_only_layers", MAX_LAYERS))
    flags = []
    for i in range(num_layers):
        is_moe = i >= first_dense and i % freq == 0  # DeepSeek's rule
        is_moe = is_moe and (i + 1) % sparse_step == 0 and i not in dense_only  # Qwen-MoE's rule
        flags.append(is_moe)
    return flags


def geometry_from_dict(cfg: dict[str, Any], source: str = "config") -> ModelGeometry:
    """Build the geometry from a parsed config.json. Raises UserError naming any missing required fields."""
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    model_type = str(cfg.get("model_type") or "unknown")

    required = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
    missing = [name for name in required if cfg.get(name) is None]
    if cfg.get("intermediate_size") is None and cfg.get("moe_intermediate_size") is None:
        missing.append("intermediate_size")
    is_mla = cfg.get("kv_lora_rank") is not None or model_type in MLA_TYPES
    if is_mla:
        missing += [n for n in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim") if cfg.get(n) is None]
    if missing:
        raise UserError(
            f"{source}: model_type '{model_type}' is missing required fields: {', '.join(missing)}"
        )

    f = _Fields(cfg, source)
    hidden = f.int("hidden_size", low=1)
    num_layers = f.int("num_hidden_layers", low=1, high=MAX_LAYERS)
    heads = f.int("num_attention_heads", low=1, high=MAX_HEADS)
    kv_heads = f.int("num_key_value_heads", default=heads, low=1, high=MAX_HEADS)
    if kv_heads > heads:
        raise UserError(f"{source}: num_key_value_heads ({kv_heads}) exceeds num_attention_heads ({heads})")
    if heads % kv_heads:
        raise UserError(f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                        f"({kv_heads})")
    head_dim = f.int("head_dim", default=hidden // heads, low=1)
    vocab = f.int("vocab_size", low=1, high=MAX_VOCAB)
    intermediate = f.int("intermediate_size", default=0)

    num_experts = f.int("n_routed_experts", "num_experts", "num_local_experts", default=0, high=MAX_EXPERTS)
    top_k = f.int("num_experts_per_tok", "experts_per_token", default=0, high=MAX_EXPERTS) if num_experts else 0
    if top_k > num_experts:
        raise UserError(f"{source}: num_experts_per_tok ({top_k}) exceeds the {num_experts} experts")
    if num_experts:
        moe_flags = _moe_layer_flags(cfg, num_layers, f)
        # Mixtral and gpt-oss have no separate MoE width: their experts use intermediate_size.
        moe_intermediate = f.int("moe_intermediate_size", "intermediate_size", low=1)
    else:
        moe_flags = [False] * num_layers
        moe_intermediate = 0
    num_moe = sum(moe_flags)

    n_shared = f.int("n_shared_experts", default=0, high=MAX_EXPERTS)
    shared_width = n_shared * moe_intermediate
    if cfg.get("shared_expert_intermediate_size"):  # qwen2_moe: one shared expert of its own width
        n_shared = max(n_shared, 1)
        shared_width = f.int("shared_expert_intermediate_size")

    layer_types = cfg.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise UserError(f"{source}: layer_types must be a list, got {str(layer_types)[:80]}")
    window = f.int("sliding_window", default=0, high=100_000_000)
    if layer_types:
        num_sliding = sum(1 for t in layer_types if t == "sliding_attention")
    elif window and cfg.get("use_sliding_window", True) and model_type == "mistral":
        num_sliding = num_layers  # Mistral-7B v0.1 slides on every layer
    else:
        num_sliding = 0
    mla = {name: f.int(name, default=0) if is_mla else 0
           for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")}
    if is_mla and mla["kv_lora_rank"] + mla["qk_rope_head_dim"] < 1:
        raise UserError(f"{source}: kv_lora_rank + qk_rope_head_dim must be at least 1")
    _check_dtype(cfg, source)

    return ModelGeometry(
        model_type=model_type,
        num_layers=num_layers,
        hidden=hidden,
        vocab=vocab,
        attention="mla" if is_mla else "gqa",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        q_lora_rank=mla["q_lora_rank"],
        kv_lora_rank=mla["kv_lora_rank"],
        qk_nope_head_dim=mla["qk_nope_head_dim"],
        qk_rope_head_dim=mla["qk_rope_head_dim"],
        v_head_dim=f.int("v_head_dim", default=head_dim) if is_mla else 0,
        intermediate=intermediate,
        num_dense_layers=num_layers - num_moe,
        num_moe_layers=num_moe,
        num_experts=num_experts,
        experts_per_token=top_k,
        num_shared_experts=n_shared,
        moe_intermediate=moe_intermediate,
        shared_expert_intermediate=shared_width,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")) and not is_mla,
        qk_norm=model_type.startswith("qwen3"),
        expert_bias=model_type == "gpt_oss",
        mtp_layers=f.int("num_nextn_predict_layers", default=0, high=MAX_LAYERS),
        indexer_heads=f.int("index_n_heads", default=0, high=MAX_HEADS),
        indexer_head_dim=f.int("index_head_dim", default=0),
        indexer_topk=f.int("index_topk", default=0, high=100_000_000),
        sliding_window=window if num_sliding else 0,
        num_sliding_layers=num_sliding if window else 0,
    )


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

"""Weight and KV-cache formats, with the real bits each weight costs once its scales are counted.

A scheme says, for each component of each layer, which format its weights are stored in. It comes from
hf_quant_config.json (ModelOpt), a config.json `quantization_config`, or an explicit --weights/--kv choice.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from decodegap.errors import NAME_ONLY, ParameterError, UserError
from decodegap.floor.geometry import ModelGeometry


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits_per_weight: float  # payload plus scales / zero points, averaged over the weights
    compute: tuple[str, ...]  # tensor-core dtypes a GEMM on these weights can use, fastest first
    how_counted: str

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8


# Bits include the block scales each format stores beside the payload; per-tensor scales are negligible.
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("bf16", 16.0, ("bf16",), "16 bits"),
        WeightFormat("fp16", 16.0, ("fp16", "bf16"), "16 bits"),
        WeightFormat("fp8", 8.0, ("fp8", "bf16"), "8 bits; per-tensor/per-channel scales negligible"),
        # DeepSeek-style blockwise FP8: one fp32 scale per 128x128 block = 32 bits / 16384 weights.
        WeightFormat("fp8-block", 8.0 + 32 / (128 * 128), ("fp8", "bf16"), "8 bits + fp32 scale per 128x128"),
        WeightFormat("int8", 8.0, ("int8", "bf16"), "8 bits; per-channel scales negligible"),
        # NVFP4: e2m1 payload + one FP8 (e4m3) scale per 16 weights (+ a per-tensor fp32, negligible).
        WeightFormat("nvfp4", 4.0 + 8 / 16, ("fp4", "fp8", "bf16"), "4 bits + fp8 scale per 16"),
        # MXFP4 (OCP microscaling): e2m1 payload + one E8M0 scale per 32 weights.
        WeightFormat("mxfp4", 4.0 + 8 / 32, ("fp4", "fp8", "bf16"), "4 bits + e8m0 scale per 32"),
        # GPTQ/AWQ int4, group 128: fp16 scale + 4-bit zero point per group.
        WeightFormat("int4", 4.0 + (16 + 4) / 128, ("bf16",), "4 bits + fp16 scale and 4-bit zero per 128"),
        # GGUF k-quants: 256-weight super-blocks (sizes from ggml's block_q*_K structs).
        WeightFormat("q4_0", 18 * 8 / 32, ("int8", "bf16"), "18 bytes per 32 weights (fp16 scale)"),
        WeightFormat("q4_k", 144 * 8 / 256, ("int8", "bf16"), "144 bytes per 256 weights"),
        WeightFormat("q5_k", 176 * 8 / 256, ("int8", "bf16"), "176 bytes per 256 weights"),
        WeightFormat("q6_k", 210 * 8 / 256, ("int8", "bf16"), "210 bytes per 256 weights"),
        WeightFormat("q8_0", 34 * 8 / 32, ("int8", "bf16"), "34 bytes per 32 weights (fp16 scale)"),
    )
}
KV_BYTES_PER_ELEMENT: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}

# Components whose weights a scheme places; embeddings and the MoE router stay 16-bit in every engine we know.
COMPONENTS = (
    "attention",
    "indexer",
    "dense_mlp",
    "experts",
    "shared_experts",
    "router",
    "embedding",
    "lm_head",
)
ALWAYS_16_BIT = {"router", "embedding"}


def weight_format(name: str) -> WeightFormat:
    key = name.strip().lower().replace("-", "_").replace("fp8_block", "fp8-block")
    aliases = {"bfloat16": "bf16", "float16": "fp16", "e4m3": "fp8", "fp4": "nvfp4", "w4a16": "int4"}
    key = aliases.get(key, key)
    if key not in WEIGHT_FORMATS:
        raise UserError(f"unknown weight format '{name}'; known: {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[key]


def kv_bytes(name: str) -> float:
    key = name.strip().lower()
    key = {"bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8"}.get(
        key, key
    )
    if key not in KV_BYTES_PER_ELEMENT:
        raise UserError(f"unknown KV-cache dtype '{name}'; known: {', '.join(KV_BYTES_PER_ELEMENT)}")
    return KV_BYTES_PER_ELEMENT[key]


# ---- module names, to match a checkpoint's exclude lists against ---------------------------------------


def component_modules(geometry: ModelGeometry, component: str, layer: int) -> tuple[str, ...]:
    """HF module names holding a component's weights in one layer (one expert stands for all)."""
    p = f"model.layers.{layer}."
    if component == "attention":
        return tuple(p + "self_attn." + m for m in geometry.attention_projection_params())
    if component == "indexer":
        return tuple(p + "self_attn.indexer." + m for m in geometry.indexer_projection_params())
    if component == "dense_mlp":
        return tuple(p + "mlp." + m for m in ("gate_proj", "up_proj", "down_proj"))
    if component == "experts":
        if geometry.model_type == "mixtral":
            return tuple(p + "block_sparse_moe.experts.0." + m for m in ("w1", "w2", "w3"))
        if geometry.model_type == "gpt_oss":
            return (p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj")
        return tuple(p + "mlp.experts.0." + m for m in ("gate_proj", "up_proj", "down_proj"))
    if component == "shared_experts":
        block = "mlp.shared_expert." if geometry.model_type == "qwen2_moe" else "mlp.shared_experts."
        return tuple(p + block + m for m in ("gate_proj", "up_proj", "down_proj"))
    if component == "recurrent":  # the in and out projections of a Mamba / DeltaNet / conv mixer
        block = {"gated_deltanet": "linear_attn", "kda": "self_attn", "lightning": "self_attn",
                 "short_conv": "conv", "rg_lru": "temporal_block"}.get(
            geometry.recurrent.kind if geometry.recurrent else "", "mamba")
        return (p + block + ".in_proj", p + block + ".out_proj")
    if component == "lm_head":
        return ("lm_head",)
    raise ValueError(component)


class _ExcludeMatcher:
    """Exclude lists mix globs ('model.layers.*.self_attn', '*indexer*') and plain names matched as a dotted
    prefix ('lm_head', HF's modules_to_not_convert). A module is excluded when it or a parent matches."""

    def __init__(self, patterns: tuple[str, ...]):
        self.patterns = patterns
        regexes = []
        for pat in patterns:
            if pat.startswith("re:"):  # compressed-tensors style
                regexes.append(pat[3:])
            elif any(c in pat for c in "*?["):
                regexes.append(fnmatch.translate(pat))
            else:
                regexes.append(re.escape(pat))
        self._regex = re.compile("|".join(f"(?:{r})" for r in regexes)) if regexes else None

    @cache  # noqa: B019 - one matcher per scheme, few distinct names
    def excluded(self, module: str) -> bool:
        if self._regex is None:
            return False
        parts = module.split(".")
        # Whole-name matches of the module or any dotted parent; plain names also match as a dotted suffix
        # ('lm_head' excludes 'lm_head', 'mlp.gate' excludes 'model.layers.3.mlp.gate').
        candidates = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        candidates |= {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
        return any(self._regex.fullmatch(c) for c in candidates)


@dataclass(frozen=True)
class QuantScheme:
    """Which format each component's weights are in, and the KV-cache dtype."""

    weights: WeightFormat  # the quantized format
    unquantized: WeightFormat = field(default_factory=lambda: WEIGHT_FORMATS["bf16"])  # excluded modules
    kv_dtype: str = "bf16"
    exclude: tuple[str, ...] = ()
    source: str = "default"

    @property
    def kv_bytes_per_element(self) -> float:
        return kv_bytes(self.kv_dtype)

    @property
    def _matcher(self) -> _ExcludeMatcher:
        return _matcher_for(self.exclude)

    def format_for(self, geometry: ModelGeometry, component: str, layer: int = 0) -> WeightFormat:
        """Format of a component in a layer. A component counts as excluded only when every one of its modules
        is excluded: the cheaper reading, since the floor must stay a lower bound."""
        if component in ALWAYS_16_BIT:
            return self.unquantized
        if not self.exclude:
            return self.weights
        modules = component_modules(geometry, component, layer)
        if modules and all(self._matcher.excluded(m) for m in modules):
            return self.unquantized
        return self.weights

    def describe(self) -> str:
        text = f"weights {self.weights.name} ({self.weights.bits_per_weight:g} bits/weight)"
        if self.exclude:
            text += f", {len(self.exclude)} excluded module patterns in {self.unquantized.name}"
        return f"{text}, KV {self.kv_dtype} [{self.source}]"


@lru_cache(maxsize=32)
def _matcher_for(patterns: tuple[str, ...]) -> _ExcludeMatcher:
    return _ExcludeMatcher(patterns)


# ---- reading a checkpoint's quantization -----------------------------------------------------------------


def _from_modelopt(q: dict[str, Any], source: str) -> QuantScheme:
    algo = str(q.get("quant_algo") or "").upper()
    formats = {
        "NVFP4": "nvfp4",
        "FP8": "fp8",
        "W4A16_AWQ": "int4",
        "W4A8_AWQ": "int4",
        "MXFP4": "mxfp4",
        "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
        "FP8_BLOCK_SCALES": "fp8-block",
        "W8A16": "int8",
        "INT8_SQ": "int8",
        "W4A8_NVFP4_FP8": "nvfp4",
        "NVFP4_AWQ": "nvfp4",
    }
    if algo not in formats:
        raise ParameterError(f"{source}: unsupported ModelOpt quant_algo '{algo}'; give {{weights}} instead",
                             weights=NAME_ONLY)
    kv_algo = str(q.get("kv_cache_quant_algo") or "").upper()
    return QuantScheme(
        weights=WEIGHT_FORMATS[formats[algo]],
        kv_dtype="fp8" if kv_algo.startswith("FP8") else "bf16",
        exclude=tuple(q.get("exclude_modules") or ()),
        source=source,
    )


def _whole(value: Any, name: str, source: str, low: int, high: int) -> int:
    """A whole number in [low, high] from a quantization config, else one line naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or int(value) != value or not low <= value <= high:
        raise UserError(f"{source}: quantization_config {name} must be a whole number in [{low}, {high}], "
                        f"got {value!r}")
    return int(value)


def scheme_from_quantization_config(qc: dict[str, Any], source: str) -> QuantScheme:
    """A config.json `quantization_config` (HF transformers conventions)."""
    method = str(qc.get("quant_method") or "").lower()
    exclude = tuple(qc.get("modules_to_not_convert") or qc.get("ignore") or qc.get("exclude_modules") or ())
    if method == "fp8":
        fmt = "fp8-block" if qc.get("weight_block_size") else "fp8"
        return QuantScheme(WEIGHT_FORMATS[fmt], exclude=exclude, source=source)
    if method == "mxfp4":
        return QuantScheme(WEIGHT_FORMATS["mxfp4"], exclude=exclude, source=source)
    if method == "modelopt":
        return _from_modelopt(qc, source)
    if method in ("gptq", "awq"):
        bits = _whole(qc.get("bits", qc.get("w_bit", 4)), "bits", source, 1, 16)
        group = _whole(qc.get("group_size", qc.get("q_group_size", 128)) or 128, "group_size", source, -1, 1 << 20)
        if group <= 0:  # GPTQ's -1: one scale per output channel
            group = 4096
        fmt = WeightFormat(
            f"int{bits}",
            bits + (16 + bits) / group,
            ("bf16",),
            f"{bits} bits + fp16 scale and {bits}-bit zero per {group}",
        )
        return QuantScheme(fmt, exclude=exclude, source=source)
    raise ParameterError(f"{source}: unsupported quant_method '{method}'; give {{weights}} (and {{kv}}) instead",
                         weights=NAME_ONLY, kv=NAME_ONLY)


def load_quant(path: str | Path | None, model_config: dict[str, Any] | None = None) -> QuantScheme:
    """Scheme from an hf_quant_config.json (file or folder); else from the model config's quantization_config;
    else plain BF16 weights and KV."""
    if path is not None:
        from decodegap.floor.config import read_json_file

        data, file = read_json_file(path, "hf_quant_config.json", "quantization config")
        if isinstance(data, dict) and isinstance(data.get("quantization"), dict):
            return _from_modelopt(data["quantization"], source=file.name)
        if isinstance(data, dict) and isinstance(data.get("quantization_config"), dict):
            return scheme_from_quantization_config(data["quantization_config"], source=file.name)
        if isinstance(data, dict) and "quant_method" in data:
            return scheme_from_quantization_config(data, source=file.name)
        raise UserError(f"{file}: no 'quantization' or 'quant_method' section found")
    if model_config and isinstance(model_config.get("quantization_config"), dict):
        return scheme_from_quantization_config(model_config["quantization_config"], "config.json")
    return QuantScheme(WEIGHT_FORMATS["bf16"], source="unquantized")


def with_overrides(scheme: QuantScheme, weights: str | None = None, kv: str | None = None) -> QuantScheme:
    """Apply --weights / --kv. An explicit --weights format applies to every linear layer (lm_head included);
    the checkpoint's exclude list no longer applies."""
    if weights is not None:
        try:
            fmt = weight_format(weights)
        except (UserError, AttributeError):
            raise ParameterError(f"{{weights}}: unknown weight format; known: {', '.join(WEIGHT_FORMATS)}",
                                 weights=weights) from None
        scheme = QuantScheme(fmt, kv_dtype=scheme.kv_dtype, source=f"--weights {weights}")
    if kv is not None:
        try:
            kv_bytes(kv)
        except (UserError, AttributeError):
            raise ParameterError(f"{{kv}}: unknown KV-cache dtype; known: {', '.join(KV_BYTES_PER_ELEMENT)}",
                                 kv=kv) from None
        scheme = QuantScheme(
            scheme.weights,
            scheme.unquantized,
            kv.strip().lower().replace("fp8_e4m3", "fp8"),
            scheme.exclude,
            scheme.source + f", --kv {kv}",
        )
    return scheme


def resolve_quant(
    model_path: str | Path,
    quant_path: str | Path | None = None,
    weights: str | None = None,
    kv: str | None = None,
) -> QuantScheme:
    """The scheme the floor command uses: --quant if given, else an hf_quant_config.json beside the model's
    config.json, else the config's own quantization_config, else BF16; then --weights / --kv on top."""
    from decodegap.floor.config import read_config_json

    cfg, folder = read_config_json(model_path)
    if quant_path is None and weights is None and (folder / "hf_quant_config.json").is_file():
        quant_path = folder / "hf_quant_config.json"
    scheme = load_quant(quant_path, cfg) if weights is None else QuantScheme(WEIGHT_FORMATS["bf16"])
    return with_overrides(scheme, weights, kv)

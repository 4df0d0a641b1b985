"""The per-layer layout of a decoder: which token mixer each layer runs (full or windowed attention, a recurrent
mixer, both side by side) and which MLP (dense of its own width, MoE, none).

Configs describe this many ways; each is read here, first given wins:
- a pattern of blocks, each block one mixer OR one MLP: `hybrid_override_pattern` ("M-M*-E": Mamba, MLP,
  attention, MoE; Nemotron-H checkpoints) or `layers_block_type` (Nemotron-H, Zamba: mamba / attention / mlp / moe /
  hybrid = Mamba beside a shared attention + MLP block);
- a mixer per layer, every layer also having an MLP: `layer_types` (full_attention, sliding_attention,
  chunked_attention, linear_attention, mamba, conv...), or a rule transformers derives them from (MiniMax's
  `attn_type_list`, Qwen3-Next's `full_attention_interval`, `sliding_window_pattern`; Gemma 2 alternates),
  `block_types` (RecurrentGemma, cycled), `full_attn_idxs`
  (LFM2), `linear_attn_config.full_attn_layers` (Kimi Linear checkpoints, numbered from 1), `attn_layer_indices`
  (Bamba), `attn_layer_period` / `attn_layer_offset` (Jamba);
- none of these: every layer attention; with Mamba fields and attention heads, both in parallel (Falcon-H1); with
  Mamba fields alone, a pure state-space model (no attention, no MLP).
Which layers are MoE follows `mlp_layer_types`, `moe_layers`, `expert_layer_period` / `expert_layer_offset`, or
the first-k-dense, frequency and step rules of DeepSeek, Qwen-MoE, Ernie and Llama 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from decodegap.errors import UserError
from decodegap.floor.fields import MAX_LAYERS, Fields

FULL, SLIDING = "full", "sliding"
DENSE, MOE = "dense", "moe"

# layer_types / layers_block_type values, by what they put in a layer
_FULL_NAMES = {"full_attention", "attention", "global_attention", "global", "full"}
_SLIDING_NAMES = {"sliding_attention", "local_attention", "sliding", "local", "swa"}
_CHUNKED_NAMES = {"chunked_attention"}
_RECURRENT_NAMES = {"linear_attention", "mamba", "mamba2", "ssm", "conv", "short_conv", "recurrent", "rg_lru",
                    "deltanet", "gated_deltanet", "kda", "lightning", "lightning_attention", "m"}
_MLP_NAMES = {"mlp", "dense", "-"}
_MOE_NAMES = {"moe", "sparse", "e"}
_HYBRID_NAMES = {"hybrid"}  # Zamba: a Mamba layer with the shared attention + MLP block before it
# hybrid_override_pattern characters
_PATTERN = {"m": "mamba", "*": "attention", "-": "mlp", "e": "moe"}


@dataclass(frozen=True)
class Layer:
    """One decoder layer: its attention (full, sliding or none), whether it runs a recurrent mixer, its MLP."""

    attention: str = ""  # FULL | SLIDING | "" (no attention)
    window: int = 0  # tokens a sliding (or chunked) attention reads at most; 0 = the whole context
    recurrent: bool = False
    mlp: str = ""  # DENSE | MOE | "" (no MLP)
    mlp_width: int = 0  # a dense MLP's width in this layer


@dataclass(frozen=True)
class _Mixer:
    attention: str = ""
    window: int = 0
    recurrent: bool = False
    block_mlp: str | None = None  # from a block pattern: this block's MLP ("" for a mixer-only block)


def _mixer_of(name: str, windows: dict[str, int], f: Fields, blocks: bool) -> _Mixer:
    """A layer kind's mixer; `blocks`: the kind names a whole block (a mixer-only or MLP-only layer)."""
    mlp = "" if blocks else None
    if name in _FULL_NAMES:
        return _Mixer(FULL, block_mlp=mlp)
    if name in _SLIDING_NAMES:
        return _Mixer(SLIDING, windows["sliding"], block_mlp=mlp) if windows["sliding"] else _Mixer(FULL,
                                                                                                  block_mlp=mlp)
    if name in _CHUNKED_NAMES:
        return _Mixer(SLIDING, windows["chunked"], block_mlp=mlp) if windows["chunked"] else _Mixer(FULL,
                                                                                                  block_mlp=mlp)
    if name in _RECURRENT_NAMES:
        return _Mixer(recurrent=True, block_mlp=mlp)
    if blocks and name in _MLP_NAMES:
        return _Mixer(block_mlp=DENSE)
    if blocks and name in _MOE_NAMES:
        return _Mixer(block_mlp=MOE)
    if blocks and name in _HYBRID_NAMES:
        return _Mixer(FULL, recurrent=True, block_mlp=DENSE)
    what = "full attention" + ("" if "attention" in name else " (not a kind the floor knows)")
    f.warnings.append(f"layer kind '{name}' read as {what}")
    return _Mixer(FULL, block_mlp=mlp)


def mixers(f: Fields, num_layers: int | None, recurrent_kind: str | None, has_attention: bool,
           model_type: str) -> list[_Mixer]:
    """Each layer's mixer (and, for block patterns, its MLP). `num_layers` None: the pattern gives the depth."""
    cfg = f.cfg
    windows = {"sliding": f.int("sliding_window", "attention_window_size", default=0, high=100_000_000),
               "chunked": f.int("attention_chunk_size", default=0, high=100_000_000)}
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        names = [_PATTERN.get(c.lower(), c) for c in pattern]
        return _sized([_mixer_of(n, windows, f, True) for n in names], num_layers, "hybrid_override_pattern", f)
    if cfg.get("layers_block_type") is not None:
        return _sized([_mixer_of(n, windows, f, True) for n in f.str_list("layers_block_type")], num_layers,
                      "layers_block_type", f)
    if cfg.get("layer_types") is not None:
        return _sized([_mixer_of(n, windows, f, False) for n in f.str_list("layer_types")], num_layers,
                      "layer_types", f)
    n = _depth(num_layers, f)
    rule = _layer_types_by_rule(f, n, model_type, windows["sliding"])
    if rule is not None:
        return [_mixer_of(name, windows, f, False) for name in rule]
    blocks = "block_types" if cfg.get("block_types") is not None else "_block_types"  # released RecurrentGemma
    if cfg.get(blocks) is not None:  # RecurrentGemma: the list repeats over the layers
        kinds = f.str_list(blocks) or ["attention"]
        if cfg.get("attention_window_size") is not None:  # its attention blocks are local, over that window
            kinds = ["sliding_attention" if k in _FULL_NAMES else k for k in kinds]
        return [_mixer_of(kinds[i % len(kinds)], windows, f, False) for i in range(n)]
    attention_at: set[int] | None = None
    if cfg.get("full_attn_idxs") is not None:
        attention_at = set(f.int_list("full_attn_idxs", MAX_LAYERS))
    elif cfg.get("linear_full_attn_layers") is not None and recurrent_kind:  # Kimi Linear's linear_attn_config
        attention_at = {i - 1 for i in f.int_list("linear_full_attn_layers", MAX_LAYERS)}  # numbered from 1
    elif "attn_layer_indices" in cfg and recurrent_kind:
        attention_at = set(f.int_list("attn_layer_indices", MAX_LAYERS))  # None: every layer Mamba (Bamba)
    elif cfg.get("attn_layer_period") is not None and recurrent_kind:
        period = f.int("attn_layer_period", low=1, high=MAX_LAYERS)
        offset = f.int("attn_layer_offset", default=0, high=MAX_LAYERS)
        attention_at = {i for i in range(n) if i % period == offset}
    if attention_at is not None:
        return [_Mixer(FULL) if i in attention_at else _Mixer(recurrent=True) for i in range(n)]
    if recurrent_kind in ("mamba", "mamba2"):
        if not has_attention:
            return [_Mixer(recurrent=True, block_mlp="")] * n  # Mamba alone: no attention, no MLP
        return [_Mixer(FULL, recurrent=True)] * n  # Falcon-H1: attention and Mamba side by side in every layer
    if windows["sliding"] and f.flag("use_sliding_window", True):
        # a window and no pattern: every layer slides (Mistral-7B v0.1, StarCoder2, Phi-3; Qwen2 turns it off)
        return [_Mixer(SLIDING, windows["sliding"])] * n
    return [_Mixer(FULL)] * n


def _layer_types_by_rule(f: Fields, n: int, model_type: str, window: int) -> list[str] | None:
    """The layer kinds a released config gives as a rule rather than a list (transformers derives layer_types from
    it): MiniMax's attn_type_list (0: lightning attention, 1: softmax), Qwen3-Next's full_attention_interval (every
    k-th layer full, the others gated DeltaNet), a sliding window with its pattern (every k-th layer full: Gemma 3's
    sliding_window_pattern; Gemma 2 alternates without one). None where the config gives no such rule."""
    cfg = f.cfg
    if cfg.get("attn_type_list") is not None:
        kinds = f.int_list("attn_type_list", 1)
        if len(kinds) != n:
            raise UserError(f"{f.source}: attn_type_list lists {len(kinds)} layers, num_hidden_layers is {n}")
        return ["full_attention" if k else "linear_attention" for k in kinds]
    if cfg.get("full_attention_interval") is not None:
        every = f.int("full_attention_interval", low=1, high=MAX_LAYERS)
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    every = f.int("sliding_window_pattern", default=2 if model_type.startswith("gemma2") else 0, high=MAX_LAYERS)
    if window and every:
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    return None


def _depth(num_layers: int | None, f: Fields) -> int:
    if num_layers is None:
        raise UserError(f"{f.source}: model_type '{f.cfg.get('model_type') or 'unknown'}' gives no layer count "
                        "(num_hidden_layers) and no per-layer pattern")
    return num_layers


def _sized(layers: list[_Mixer], num_layers: int | None, name: str, f: Fields) -> list[_Mixer]:
    if not layers or len(layers) > MAX_LAYERS:
        raise UserError(f"{f.source}: {name} must list 1 to {MAX_LAYERS:,} layers, got {len(layers)}")
    if num_layers is not None and len(layers) != num_layers:
        raise UserError(f"{f.source}: {name} lists {len(layers)} layers, num_hidden_layers is {num_layers}")
    return layers


def moe_flags(f: Fields, n: int) -> list[bool]:
    """Which of n layers carry an MoE block (for a model with routed experts), following the family's rule."""
    cfg = f.cfg
    if cfg.get("mlp_layer_types") is not None:  # 'dense' / 'sparse' (or 'moe', 'hash_moe')
        types = f.str_list("mlp_layer_types")
        if len(types) != n:
            raise UserError(f"{f.source}: mlp_layer_types lists {len(types)} layers for {n}")
        return [t not in _MLP_NAMES for t in types]
    if cfg.get("moe_layers") is not None:  # Llama 4
        listed = set(f.int_list("moe_layers", MAX_LAYERS))
        return [i in listed for i in range(n)]
    if cfg.get("expert_layer_period") is not None:  # Jamba
        period = f.int("expert_layer_period", low=1, high=MAX_LAYERS)
        offset = f.int("expert_layer_offset", default=0, high=MAX_LAYERS)
        return [i % period == offset for i in range(n)]
    first = f.int("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index", default=0, high=MAX_LAYERS)
    last = cfg.get("moe_layer_end_index")
    last = n - 1 if last is None or last == -1 else f.int("moe_layer_end_index", high=MAX_LAYERS)
    freq = f.int("moe_layer_freq", default=1, high=MAX_LAYERS) or 1
    step = f.int("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_interval", default=1,
                 high=MAX_LAYERS) or 1
    dense_only = set(f.int_list("mlp_only_layers", MAX_LAYERS))
    return [first <= i <= last and i % freq == 0  # DeepSeek's and Ernie's rule
            and (i + 1) % step == 0 and i not in dense_only  # Qwen-MoE's and Llama 4's
            for i in range(n)]


def build_layers(mixer_list: list[_Mixer], moe: list[bool] | None, widths: list[int]) -> tuple[Layer, ...]:
    """The layers, from each one's mixer, the MoE flags (None: no routed experts) and the dense widths."""
    out = []
    for i, m in enumerate(mixer_list):
        mlp = m.block_mlp if m.block_mlp is not None else (MOE if moe and moe[i] else DENSE)
        if mlp == MOE and moe is None:
            mlp = DENSE  # an 'moe' block in a model without routed experts
        out.append(Layer(m.attention, m.window if m.attention == SLIDING else 0, m.recurrent, mlp,
                         widths[i] if mlp == DENSE else 0))
    return tuple(out)

"""Recurrent token mixers (Mamba, Mamba-2, gated DeltaNet, Kimi delta attention, lightning attention, short
convolutions, RG-LRU): their weights per layer and the state a decode step reads and writes per sequence, in place
of a KV cache that grows with the context.

Which kind a layer is comes from the config's own fields (a Mamba-2 config has SSM heads, a DeltaNet config has
linear key/value heads); only where nothing in the config says which (MiniMax's lightning attention) does the
family decide, as HF's modeling code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decodegap.floor.fields import MAX_HEADS, Fields

# Kinds whose config fields say nothing else: the family's modeling code decides.
FAMILY_RECURRENT_KIND = {"minimax": "lightning", "minimax_m1": "lightning"}
STATE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "bfloat16": 2, "bf16": 2, "fp16": 2}

MAMBA_HEADS = ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads")
MAMBA_STATE = ("ssm_state_size", "mamba_d_state", "state_size")
MAMBA_CONV = ("mamba_d_conv", "conv_kernel", "conv1d_width", "linear_conv_kernel_dim")
MAMBA_EXPAND = ("mamba_expand", "expand")


@dataclass(frozen=True)
class RecurrentMixer:
    """One recurrent layer's mixer: its weights, and the state each sequence carries from step to step."""

    kind: str  # mamba | mamba2 | gated_deltanet | kda | lightning | short_conv | rg_lru
    params: int  # weights of one layer's mixer (projections, convolution, gates, norms)
    state_elements: int  # the recurrent state of one sequence in one layer (SSM state, linear-attention matrix)
    conv_elements: int  # the convolution window one sequence keeps in one layer (the last kernel-1 inputs)
    state_bytes: int  # bytes per state element (the config's SSM cache dtype, else 16-bit)
    heads: int  # heads the mixer is split by across tensor-parallel ranks (0: none)

    @property
    def state_bytes_per_sequence(self) -> int:
        """One layer's state and convolution window of one sequence."""
        return (self.state_elements + self.conv_elements) * self.state_bytes


def recurrent_kind(cfg: dict[str, Any], model_type: str) -> str | None:
    """The recurrent mixer a config's fields describe, or None when they describe none."""
    has = lambda *names: any(cfg.get(n) is not None for n in names)  # noqa: E731
    if has("linear_num_key_heads", "linear_key_head_dim"):
        return "gated_deltanet"
    if has("linear_num_heads", "linear_head_dim"):
        return "kda"
    if has(*MAMBA_STATE):
        # Mamba-2 splits its state into heads; Mamba-1 (and Zamba's multi-head variant) projects a low-rank dt.
        return "mamba2" if has("num_heads", *MAMBA_HEADS) and not has("mamba_dt_rank") else "mamba"
    if has("lru_width"):
        return "rg_lru"
    if has("conv_L_cache"):
        return "short_conv"
    return FAMILY_RECURRENT_KIND.get(model_type.removesuffix("_text"))


def recurrent_mixer(kind: str, f: Fields, hidden: int, heads: int, head_dim: int) -> RecurrentMixer:
    """Weights and state of one layer of `kind`, following HF's modeling code for it."""
    cfg = f.cfg
    h = hidden
    dtype = str(cfg.get("mamba_ssm_cache_dtype") or "").replace("torch.", "").lower()
    state_bytes = STATE_BYTES.get(dtype, 2)
    if kind in ("mamba", "mamba2"):
        d_state = f.int(*MAMBA_STATE, low=1)
        d_conv = f.int(*MAMBA_CONV, default=4, low=1)
        expand = f.int(*MAMBA_EXPAND, default=2, low=1)
        # Mamba's intermediate_size is its inner width; Falcon-H1 gives mamba_d_ssm.
        inner_default = expand * h
        if kind == "mamba":
            # Mamba alone calls its inner width intermediate_size; in a hybrid that name is the MLP's.
            inner = ("mamba_d_ssm",) if cfg.get("num_attention_heads") else ("mamba_d_ssm", "intermediate_size")
            d_inner = f.int(*inner, default=inner_default, low=1)
            dt_rank = f.int("mamba_dt_rank", "time_step_rank", default=-(-h // 16), low=1)
            params = (h * 2 * d_inner  # in_proj (x and z)
                      + d_inner * (d_conv + 1)  # depthwise conv1d + bias
                      + d_inner * (dt_rank + 2 * d_state)  # x_proj -> dt, B, C
                      + dt_rank * d_inner + d_inner  # dt_proj
                      + d_inner * d_state + d_inner  # A_log, D
                      + d_inner * h)  # out_proj
            return RecurrentMixer(kind, params, d_inner * d_state, d_inner * (d_conv - 1), state_bytes, 0)
        # Mamba-2 alone calls its SSM heads num_heads; hybrids prefix them (num_heads may be attention's there).
        heads_names = MAMBA_HEADS if cfg.get("num_attention_heads") else ("num_heads", *MAMBA_HEADS)
        n_heads = f.int(*heads_names, low=1, high=MAX_HEADS)
        d_inner = f.int("mamba_d_ssm", default=0)
        head = f.int("mamba_head_dim", "mamba_d_head", "mamba_headdim", default=0)
        if not head and not d_inner and cfg.get("num_attention_heads") is None:
            head = f.int("head_dim", default=0)  # Mamba-2 alone: head_dim is the SSM head's
        d_inner = d_inner or (head * n_heads if head else inner_default)
        groups = f.int("n_groups", "mamba_n_groups", "mamba_ngroups", default=1, low=1)
        conv_dim = d_inner + 2 * groups * d_state
        params = (h * (2 * d_inner + 2 * groups * d_state + n_heads)  # in_proj: z, x, B, C, dt
                  + conv_dim * (d_conv + 1)  # conv1d + bias
                  + 3 * n_heads  # dt_bias, A_log, D
                  + (d_inner if f.flag("mamba_rms_norm", True) else 0)  # gated RMSNorm
                  + d_inner * h)  # out_proj
        return RecurrentMixer(kind, params, d_inner * d_state, conv_dim * (d_conv - 1), state_bytes, n_heads)
    if kind == "gated_deltanet":  # Qwen3-Next, Qwen3.5, OLMo-Hybrid
        nk = f.int("linear_num_key_heads", low=1, high=MAX_HEADS)
        dk = f.int("linear_key_head_dim", low=1)
        nv = f.int("linear_num_value_heads", default=nk, low=1, high=MAX_HEADS)
        dv = f.int("linear_value_head_dim", default=dk, low=1)
        d_conv = f.int("linear_conv_kernel_dim", default=4, low=1)
        key, value = nk * dk, nv * dv
        conv_dim = 2 * key + value
        params = (h * (2 * key + 2 * value)  # q, k, v and the output gate z
                  + h * 2 * nv  # beta and the decay a, per value head
                  + conv_dim * d_conv  # conv1d over q, k, v (no bias)
                  + 2 * nv + dv  # dt_bias, A_log, gated RMSNorm
                  + value * h)  # out_proj
        return RecurrentMixer(kind, params, nv * dk * dv, conv_dim * (d_conv - 1), state_bytes, nv)
    if kind == "kda":  # Kimi Linear's delta attention
        n = f.int("linear_num_heads", low=1, high=MAX_HEADS)
        d = f.int("linear_head_dim", low=1)
        d_conv = f.int("linear_conv_kernel_dim", default=4, low=1)
        width = n * d
        params = (3 * h * width  # q, k, v
                  + 3 * width * d_conv  # their short convolutions
                  + 2 * (h * d + d * width)  # forget gate f_a/f_b and output gate g_a/g_b (rank head_dim)
                  + h * n  # beta
                  + width + n + d  # dt_bias, A_log, o_norm
                  + width * h)  # o_proj
        return RecurrentMixer(kind, params, n * d * d, 3 * width * (d_conv - 1), state_bytes, n)
    if kind == "lightning":  # MiniMax-01: linear attention with an output gate, one d x d state per head
        width = heads * head_dim
        params = h * 3 * width + h * width + width * h + width  # qkv, output gate, out_proj, norm
        return RecurrentMixer(kind, params, heads * head_dim * head_dim, 0, state_bytes, heads)
    if kind == "short_conv":  # LFM2: gated short convolution
        d_conv = f.int("conv_L_cache", default=3, low=1)
        bias = h if f.flag("conv_bias", False) else 0
        params = h * 3 * h + 3 * bias + h * d_conv + h * h + bias  # in_proj (B, C, x), conv, out_proj
        return RecurrentMixer(kind, params, 0, h * (d_conv - 1), state_bytes, 0)
    if kind == "rg_lru":  # RecurrentGemma: two branches, a conv, and a block-diagonal gated LRU
        w = f.int("lru_width", default=h, low=1)
        d_conv = f.int("conv1d_width", default=4, low=1)
        block = w // heads if heads else w
        params = (2 * (h * w + w)  # linear_x, linear_y (+ biases)
                  + w * h + h  # linear_out
                  + w * (d_conv + 1)  # conv_1d + bias
                  + 2 * (w * block + w)  # input and recurrence gates, block-diagonal per head
                  + w)  # recurrent_param
        return RecurrentMixer(kind, params, w, w * (d_conv - 1), 4, heads)  # HF keeps the LRU state in fp32
    raise ValueError(kind)

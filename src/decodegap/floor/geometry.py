"""ModelGeometry: the shapes of one decoder-only model, layer by layer, and its parameter counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from decodegap.floor.layout import DENSE, MOE, SLIDING, Layer
from decodegap.floor.mixers import RecurrentMixer


@dataclass(frozen=True)
class ModelGeometry:
    """Shapes of one decoder-only model, enough to count parameters and bytes read per decode step."""

    model_type: str
    hidden: int
    vocab: int
    layers: tuple[Layer, ...]  # each layer's mixer(s) and MLP (layout.py)
    attention: str  # "mla" or "gqa" (MHA is GQA with kv_heads == heads); heads are 0 in a model without attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # MLA (0 when attention == "gqa"); v_head_dim is also set for GQA whose values are narrower than the keys
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    o_lora_rank: int = 0  # DeepSeek-V4: low-rank output projection in o_groups groups
    o_groups: int = 1
    # MLP / MoE
    intermediate: int = 0  # the dense MLP width most dense layers have (each layer's own: layers[i].mlp_width)
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0  # total width of the shared expert(s) in one layer
    mlp_gated: bool = True  # gate, up, down (SwiGLU); False: up, down (GPT-NeoX, Nemotron's squared ReLU)
    # Recurrent layers' mixer (Mamba, DeltaNet...), None in a pure transformer
    recurrent: RecurrentMixer | None = None
    # Extras
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (qwen2, gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3)
    output_gate: bool = False  # a sigmoid gate per head on the attention output (Qwen3-Next): q_proj doubled
    expert_bias: bool = False  # gpt-oss experts carry biases
    mtp_layers: int = 0
    # DeepSeek sparse attention (DSA) indexer; 0 when absent
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    indexer_topk: int = 0
    # What the config has that these counts leave out (the floor repeats them in its warnings)
    warnings: tuple[str, ...] = ()

    # ---- layout -------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_dense_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp == DENSE)

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp == MOE)

    @property
    def num_attention_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.attention)

    @property
    def num_recurrent_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.recurrent)

    @property
    def num_sliding_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.attention == SLIDING)

    @property
    def sliding_window(self) -> int:
        """The widest window of the sliding layers (0: none slide)."""
        return max((layer.window for layer in self.layers if layer.attention == SLIDING), default=0)

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
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_width(self) -> int:
        """KV-cache elements per token per attention layer."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * (self.head_dim + self.value_head_dim)

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
        if not self.num_heads:
            return {}
        q_out = self.num_heads * self.head_dim * (2 if self.output_gate else 1)
        k_out = self.num_kv_heads * self.head_dim
        v_out = self.num_kv_heads * self.value_head_dim
        o_in = self.num_heads * self.value_head_dim
        bias = self.attention_bias
        out = {}
        if self.q_lora_rank:  # DeepSeek-V4: low-rank queries without MLA's latent KV
            out["q_a_proj"] = h * self.q_lora_rank
            out["q_b_proj"] = self.q_lora_rank * q_out
        else:
            out["q_proj"] = h * q_out + (q_out if bias else 0)
        out["k_proj"] = h * k_out + (k_out if bias else 0)
        out["v_proj"] = h * v_out + (v_out if bias else 0)
        if self.o_lora_rank:
            out["o_a_proj"] = o_in * self.o_lora_rank  # o_groups blocks of (o_in / groups) x o_lora_rank
            out["o_b_proj"] = self.o_groups * self.o_lora_rank * h
        else:
            out["o_proj"] = o_in * h + (h if bias else 0)
        return out

    @property
    def attention_params_per_layer(self) -> int:
        """One attention layer's projections plus their small norms (MLA latent norms, qwen3 q/k norms)."""
        extra = 0
        if self.is_mla:
            extra = self.q_lora_rank + self.kv_lora_rank
        elif self.qk_norm:
            extra = 2 * self.head_dim
        if self.q_lora_rank and not self.is_mla:
            extra += self.q_lora_rank
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
    def recurrent_params_per_layer(self) -> int:
        return self.recurrent.params if self.recurrent else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP or expert: 3 gated (gate, up, down), 2 plain (up, down)."""
        return 3 if self.mlp_gated else 2

    def mlp_params(self, width: int) -> int:
        """One dense MLP of the given width."""
        return self.mlp_matrices * self.hidden * width

    @property
    def dense_mlp_params(self) -> int:
        """One dense MLP of the common width (`intermediate`)."""
        return self.mlp_params(self.intermediate)

    @property
    def expert_params(self) -> int:
        """One routed expert (an MLP of width moe_intermediate)."""
        biases = (2 * self.moe_intermediate + self.hidden) if self.expert_bias else 0
        return self.mlp_matrices * self.hidden * self.moe_intermediate + biases

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer together."""
        return self.mlp_matrices * self.hidden * self.shared_expert_intermediate

    @property
    def router_params(self) -> int:
        return self.num_experts * self.hidden + (self.num_experts if self.expert_bias else 0)

    @property
    def norm_params_per_layer(self) -> int:
        """Two norms per layer (before the mixer, before the MLP); as an average over layers that have one
        block only (Nemotron-H's mixer-or-MLP layers), one per block."""
        blocks = sum(bool(x.attention or x.recurrent) + bool(x.mlp) for x in self.layers)
        return self.hidden * blocks // max(self.num_layers, 1)

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
    def moe_layer_active_params(self) -> int:
        return self.experts_per_token * self.expert_params + self.shared_expert_params + self.router_params

    def _layer_params(self, layer: Layer, active: bool) -> int:
        n = 0
        if layer.attention:
            n += self.attention_params_per_layer + self.indexer_params_per_layer
        if layer.recurrent:
            n += self.recurrent_params_per_layer
        if layer.mlp == DENSE:
            n += self.mlp_params(layer.mlp_width)
        elif layer.mlp == MOE:
            n += self.moe_layer_active_params if active else self.moe_layer_params
        return n

    def _layers_params(self, active: bool) -> int:
        norms = self.hidden * sum(bool(x.attention or x.recurrent) + bool(x.mlp) for x in self.layers)
        return sum(self._layer_params(layer, active) for layer in self.layers) + norms + self.hidden  # final norm

    @property
    def params_total(self) -> int:
        """Every weight of the main model (MTP layers excluded, as publishers count them)."""
        return self._layers_params(active=False) + self.embedding_params + self.lm_head_params

    @property
    def params_active_non_embedding(self) -> int:
        """Weights one token multiplies with, without the embedding table and output head."""
        return self._layers_params(active=True)

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
        layer = self.attention_params_per_layer + self.indexer_params_per_layer + 2 * self.hidden
        layer += self.moe_layer_params if self.is_moe else self.dense_mlp_params
        return self.mtp_layers * (layer + 2 * self.hidden * self.hidden + 3 * self.hidden)


def common_width(layers: tuple[Layer, ...]) -> int:
    """The dense width most dense layers have (0 without dense layers)."""
    widths = Counter(layer.mlp_width for layer in layers if layer.mlp == DENSE)
    return widths.most_common(1)[0][0] if widths else 0

"""Parameter counts of many families' configs against exact truth, and what the floor refuses or warns about.

The truth in tests/fixtures/floor_truth/ never comes from decodegap: scripts/make_floor_truth.py built each type's
causal LM with transformers on torch's meta device and counted its parameters. decodegap reads the same config as
plain JSON.

Tolerance: 1%. What decodegap leaves out on purpose is smaller than that for every type here: norms' biases,
learned position embeddings of the GPT-2 generation (GPT-2: 0.8M of 124M = 0.7%), attention sinks, router biases.
MiMo-V2-Flash's active count needs 1.5%: its sliding layers carry more KV heads than num_key_value_heads says, and
its config says nowhere how many. Gemma 3n is not held to a tolerance: the floor says in its warnings what it leaves
out (AltUp, LAuReL, per-layer embeddings), and its counts stay under the truth.
"""

import json
from pathlib import Path

import pytest

from decodegap.errors import UserError
from decodegap.floor import compute_floor, geometry_from_dict, get_gpu
from decodegap.floor.quant import QuantScheme, weight_format

TRUTH = Path(__file__).parent / "fixtures" / "floor_truth"
TYPES = sorted(p.stem for p in TRUTH.glob("*.json"))
TOLERANCE = 0.01
WIDER = {"mimo_v2_flash": 0.015}  # see the module docstring
WARNED = {"gemma3n_text": "altup_num_inputs", "deepseek_v4": "compressed_sparse_attention"}


def _load(model_type: str) -> tuple[dict, dict]:
    rec = json.loads((TRUTH / f"{model_type}.json").read_text())
    return rec["config"], rec["truth"]


def _floor(g, context=4096, batch=1, tp=1):
    return compute_floor(g, QuantScheme(weights=weight_format("bf16")), get_gpu("h100"), tp=tp, batch=batch,
                         context=context)


def test_the_fixtures_cover_every_cause():
    assert len(TYPES) >= 25
    for needed in ("qwen3_next", "nemotron_h", "jamba", "falcon_h1", "bamba", "mamba2", "aria_text", "gpt_neox",
                   "gpt2", "paligemma", "deepseek_v3", "gemma3n_text", "lfm2", "kimi_linear", "minimax"):
        assert needed in TYPES


@pytest.mark.parametrize("model_type", [t for t in TYPES if t not in WARNED or t == "deepseek_v4"])
def test_params_match_the_built_model(model_type):
    cfg, truth = _load(model_type)
    g = geometry_from_dict(cfg)
    tol = WIDER.get(model_type, TOLERANCE)
    assert g.params_total == pytest.approx(truth["total"], rel=tol)
    assert g.params_active_with_embeddings == pytest.approx(truth["active_with_embeddings"], rel=tol)
    if truth["top_k"]:
        assert (g.num_experts, g.experts_per_token) == (truth["experts"], truth["top_k"])


@pytest.mark.parametrize("model_type,field", sorted(WARNED.items()))
def test_what_is_not_modelled_is_said(model_type, field):
    cfg, truth = _load(model_type)
    g = geometry_from_dict(cfg)
    assert any(field in w for w in g.warnings)
    assert any(field in w for w in _floor(g).warnings)  # the floor repeats them
    assert g.params_total <= truth["total"] * (1 + TOLERANCE)


@pytest.mark.parametrize("model_type", [t for t in TYPES if t not in WARNED])
def test_no_warning_where_everything_is_modelled(model_type):
    assert geometry_from_dict(_load(model_type)[0]).warnings == ()


# ---- per-layer layout ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type,kind,attention,recurrent,moe,dense", [
    ("qwen3_next", "gated_deltanet", 12, 36, 48, 0),  # layer_types: linear_attention / full_attention
    ("jamba", "mamba", 4, 28, 16, 16),  # attn_layer_period/offset, expert_layer_period/offset
    ("bamba", "mamba2", 0, 32, 0, 32),  # attn_layer_indices None: every layer Mamba
    ("falcon_h1", "mamba2", 32, 32, 0, 32),  # attention and Mamba side by side in every layer
    ("nemotron_h", "mamba2", 1, 1, 1, 1),  # layers_block_type: one mixer or one MLP per layer, no layer count
    ("mamba2", "mamba2", 0, 64, 0, 0),  # a pure state-space model: no attention heads, no MLP
    ("recurrent_gemma", "rg_lru", 8, 18, 0, 26),  # block_types cycled
    ("lfm2", "short_conv", 6, 10, 0, 16),  # layer_types conv / full_attention
    ("kimi_linear", "kda", 6, 21, 26, 1),  # MLA + Kimi delta attention; mlp_layer_types
    ("minimax", "lightning", 16, 16, 32, 0),  # lightning attention: the family decides the kind
    ("ernie4_5_moe", None, 28, 0, 27, 1),  # moe_layer_start_index / moe_layer_end_index
])
def test_layer_layout(model_type, kind, attention, recurrent, moe, dense):
    g = geometry_from_dict(_load(model_type)[0])
    assert (g.recurrent.kind if g.recurrent else None) == kind
    assert (g.num_attention_layers, g.num_recurrent_layers, g.num_moe_layers, g.num_dense_layers) == \
        (attention, recurrent, moe, dense)


def test_plain_and_gated_mlps():
    assert not geometry_from_dict(_load("gpt_neox")[0]).mlp_gated
    assert not geometry_from_dict(_load("nemotron_h")[0]).mlp_gated  # its experts too: up and down only
    assert geometry_from_dict(_load("qwen3_5_text")[0]).mlp_gated


def test_moe_switched_off_and_top_k_missing():
    cfg, _ = _load("doge")  # 16384 experts in the config, is_moe false: a dense model
    assert not geometry_from_dict(cfg).is_moe
    ds, _ = _load("deepseek_v3")
    g = geometry_from_dict({**ds, "num_experts_per_tok": None})  # DeepSeek-V2's default: no top-k
    assert g.experts_per_token == 1 and any("num_experts_per_tok" in w for w in g.warnings)


def test_text_part_preferred_over_a_top_level_hidden_size():
    for model_type in ("paligemma", "voxtral"):  # a top-level hidden_size (the projector's), the LM in text_config
        cfg, _ = _load(model_type)
        assert cfg.get("hidden_size") and cfg.get("num_hidden_layers") is None
        g = geometry_from_dict(cfg)
        assert (g.model_type, g.num_layers) == (cfg["text_config"]["model_type"],
                                                cfg["text_config"]["num_hidden_layers"])


# ---- the floor follows the layout -----------------------------------------------------------------------------
def test_recurrent_layers_read_state_not_a_growing_kv_cache():
    g = geometry_from_dict(_load("mamba2")[0])
    short, long = _floor(g, context=1024), _floor(g, context=131072)
    assert short.floor_ms == long.floor_ms  # nothing grows with the context
    names = {c.name for c in short.components}
    assert {"recurrent_weights", "recurrent_state"} <= names and "kv_cache" not in names
    state = short.component("recurrent_state")
    # read + written: 64 layers x (SSM state 128 heads x 64 x 128 + conv window (8192 + 2 x 8 x 128) x 3) x 2 B
    per_layer = (128 * 64 * 128 + (8192 + 2 * 8 * 128) * 3) * 2
    assert state.bytes_per_gpu == 2 * 64 * per_layer
    assert _floor(g, batch=4).component("recurrent_state").bytes_per_gpu == 4 * state.bytes_per_gpu


def test_kv_cache_only_for_attention_layers_and_sliding_ones_capped():
    g = geometry_from_dict(_load("qwen3_next")[0])
    kv = _floor(g, context=8192).component("kv_cache")
    assert kv.bytes_per_gpu == 12 * 8192 * g.kv_width * 2  # 12 of 48 layers attend
    llama4 = geometry_from_dict(_load("llama4_text")[0])  # chunked attention reads at most its chunk
    chunked = sum(1 for x in llama4.layers if x.window)
    assert chunked == 36 and llama4.sliding_window == 8192
    kv = _floor(llama4, context=32768).component("kv_cache")
    assert kv.bytes_per_gpu == (12 * 32768 + 36 * 8192) * llama4.kv_width * 2


def test_weights_of_every_mixer_and_mlp_are_read():
    g = geometry_from_dict(_load("jamba")[0])
    f = _floor(g)
    weights = sum(c.bytes_per_gpu for c in f.components if c.category in ("gemm", "moe"))
    # at batch 1 every weight a token uses is read once, in BF16: all but the unused experts, the embedding table
    # and the norms (free: 2 per layer + the final one)
    assert weights == pytest.approx(2 * (g.params_active - g.hidden * (2 * g.num_layers + 1)), rel=1e-9)
    assert f.component("recurrent_weights").bytes_per_gpu == 2 * 28 * g.recurrent.params


def test_single_block_layers_have_one_allreduce():
    g = geometry_from_dict(_load("nemotron_h")[0])  # 4 layers, each a mixer or an MLP
    assert "4 calls" in _floor(g, tp=2).component("allreduce").detail


def test_tp_must_split_the_recurrent_heads():
    g = geometry_from_dict({**_load("mamba2")[0], "num_heads": 96, "head_dim": 64})
    with pytest.raises(UserError, match="96 heads of its mamba2 layers"):
        _floor(g, tp=64)


# ---- refusals: one line, exit 2 --------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,words", [
    ({"model_type": "bart", "is_encoder_decoder": True, "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
      "vocab_size": 50265}, "is an encoder-decoder"),
    ({"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
      "intermediate_size": 3072, "vocab_size": 30522, "type_vocab_size": 2}, "BERT-style encoder"),
    ({"model_type": "rwkv", "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 50277},
     "RWKV's time-mix layers"),
    ({"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 10, "num_attention_heads": 4,
      "intermediate_size": 128}, "missing required fields: num_hidden_layers"),
    ({**json.loads((TRUTH / "jamba.json").read_text())["config"], "layer_types": ["mamba"] * 3},
     "lists 3 layers"),
])
def test_refused_in_one_line(cfg, words):
    with pytest.raises(UserError) as err:
        geometry_from_dict(cfg, source="x/config.json")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_unknown_layer_kind_is_said():
    cfg, _ = _load("qwen3_5_text")
    g = geometry_from_dict({**cfg, "layer_types": ["full_attention", "warp_attention"] * 16})
    assert any("warp_attention" in w for w in g.warnings) and g.num_attention_layers == 32


def test_kimi_linear_checkpoint_layout_numbered_from_one():
    # Released Kimi Linear checkpoints give the layout in linear_attn_config (full_attn_layers and kda_layers,
    # numbered from 1) rather than layer_types: the MLA layers are the listed ones, the others KDA.
    cfg, _ = _load("kimi_linear")
    n = 12
    full = [4, 8, 12]
    cfg = {k: v for k, v in cfg.items() if k != "layer_types"}
    cfg.update(num_hidden_layers=n, mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
               linear_attn_config={**(cfg.get("linear_attn_config") or {}), "full_attn_layers": full,
                                   "kda_layers": [i for i in range(1, n + 1) if i not in full]})
    g = geometry_from_dict(cfg)
    assert [i + 1 for i, layer in enumerate(g.layers) if layer.attention] == full
    assert [i + 1 for i, layer in enumerate(g.layers) if layer.recurrent] == [i for i in range(1, n + 1)
                                                                               if i not in full]


# ---- released checkpoints' config.json (not transformers' defaults) --------------------------------------------
RELEASED = TRUTH / "released"


def _released(stem: str) -> tuple[dict, dict]:
    rec = json.loads((RELEASED / f"{stem}.json").read_text())
    return rec["config"], rec["truth"]


@pytest.mark.parametrize("stem", sorted(p.stem for p in RELEASED.glob("*.json")))
def test_released_checkpoints_params_match_the_built_model(stem):
    # Released configs give some layouts as rules transformers derives layer_types from (Qwen3-Next's
    # full_attention_interval, MiniMax-M1's attn_type_list, Gemma 2's alternation), spell a field otherwise
    # (RecurrentGemma's _block_types) and leave tie_word_embeddings to the family's default (Gemma, GPT-2: tied).
    cfg, truth = _released(stem)
    g = geometry_from_dict(cfg)
    assert g.params_total == pytest.approx(truth["total"], rel=TOLERANCE)
    assert g.params_active_with_embeddings == pytest.approx(truth["active_with_embeddings"], rel=TOLERANCE)
    assert g.tie_embeddings == truth["tied"]


@pytest.mark.parametrize("stem,full,recurrent,sliding", [
    ("qwen3_next_80b_a3b", 12, 36, 0),  # full_attention_interval 4: every 4th layer full, the others gated DeltaNet
    ("minimax_m1_80k", 10, 70, 0),  # attn_type_list: 1 softmax attention, 0 lightning attention
    ("gemma_2_2b_it", 13, 0, 13),  # a sliding window and no pattern: Gemma 2 alternates, sliding first
    ("recurrentgemma_2b", 0, 18, 8),  # _block_types recurrent, recurrent, attention cycled over 26 layers; its
    # attention is local, over attention_window_size
])
def test_released_layouts_given_as_rules(stem, full, recurrent, sliding):
    cfg, _ = _released(stem)
    g = geometry_from_dict(cfg)
    assert (sum(x.attention == "full" for x in g.layers), sum(x.recurrent for x in g.layers),
            sum(x.attention == "sliding" for x in g.layers)) == (full, recurrent, sliding)
    if stem == "gemma_2_2b_it":
        assert [x.attention for x in g.layers[:4]] == ["sliding", "full", "sliding", "full"]


def test_a_window_without_a_pattern_slides_every_layer():
    # HF's StarCoder2, Phi-3 and Mistral-7B v0.1 attend over sliding_window tokens in every layer; Qwen2 turns its
    # window off with use_sliding_window
    cfg, _ = _load("starcoder2")
    g = geometry_from_dict({**cfg, "sliding_window": 4096})
    assert all(x.attention == "sliding" and x.window == 4096 for x in g.layers)
    assert _floor(g, context=16384).component("kv_cache").bytes_per_gpu == \
        g.num_layers * 4096 * g.kv_width * 2
    off = geometry_from_dict({**cfg, "sliding_window": 4096, "use_sliding_window": False})
    assert all(x.attention == "full" for x in off.layers)


def test_channel_split_recurrent_state_is_split_over_tensor_parallel_ranks():
    # Mamba-1 and short convolutions have no heads: engines split their inner channels over the ranks, state and
    # weights alike, so each rank reads 1/tp of the state
    for model_type in ("falcon_mamba", "lfm2"):
        g = geometry_from_dict(_load(model_type)[0])
        assert g.recurrent.heads == 0
        one = _floor(g, tp=1).component("recurrent_state").bytes_per_gpu
        assert _floor(g, tp=2).component("recurrent_state").bytes_per_gpu == one // 2

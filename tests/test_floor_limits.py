"""What the floor refuses (configs no model has, tp values that cannot shard the heads, NaN flags) and what it
warns about (weights that do not fit): exit 2 with one line naming the field, or a warning in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodegap.errors import UserError
from decodegap.floor import compute_floor, get_gpu, load_model, resolve_quant
from clitool import run_cli

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
LLAMA = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())


def one_line_error(args, capsys) -> str:
    code, out, err = run_cli(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("decodegap: error:"), (code, out, err)
    assert "Traceback" not in err and "nan ms" not in out
    return lines[0]


BROKEN = [  # (field, value, what the one line must name)
    ("num_attention_heads", 0, "num_attention_heads"),
    ("num_key_value_heads", 0, "num_key_value_heads"),
    ("num_hidden_layers", 1e12, "num_hidden_layers"),
    ("num_hidden_layers", 0, "num_hidden_layers"),
    ("num_hidden_layers", -4, "num_hidden_layers"),
    ("hidden_size", 0, "hidden_size"),
    ("hidden_size", 1e30, "hidden_size"),
    ("vocab_size", -32000, "vocab_size"),
    ("intermediate_size", "big", "intermediate_size"),
    ("hidden_size", "4096", "hidden_size"),
    ("num_hidden_layers", True, "num_hidden_layers"),
    ("torch_dtype", "bfloat17", "torch_dtype"),
    ("num_key_value_heads", 64, "num_key_value_heads"),  # above the 32 query heads
    ("num_key_value_heads", 5, "num_key_value_heads"),  # 32 query heads do not group over 5
    ("head_dim", 0, "head_dim"),
]


@pytest.mark.parametrize("field,value,named", BROKEN, ids=[f"{f}={v!r}" for f, v, _ in BROKEN])
def test_broken_config_is_one_line_naming_the_field(field, value, named, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, field: value}))
    line = one_line_error(["floor", "--model", str(path), "--gpu", "h100"], capsys)
    assert named in line
    assert named in one_line_error(["analyze", "--example", "--model", str(path)], capsys)


def test_moe_fields_are_checked_too(tmp_path, capsys):
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    for field, value in (("num_experts_per_tok", 500), ("mlp_only_layers", "all"), ("moe_intermediate_size", -1)):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, field: value}))
        assert field in one_line_error(["floor", "--model", str(path), "--gpu", "h100"], capsys)


@pytest.mark.parametrize("flags,named", [
    (["--bandwidth", "nan", "--tflops", "100"], "--bandwidth"),
    (["--bandwidth", "1000", "--tflops", "inf"], "--tflops"),
    (["--gpu", "h100", "--allreduce-us", "nan"], "--allreduce-us"),
    (["--gpu", "h100", "--allreduce-us", "-1"], "--allreduce-us"),
])
def test_nan_flags_are_refused(flags, named, capsys):
    assert named in one_line_error(["floor", "--model", str(CONFIGS / "llama-3.1-8b.json"), *flags], capsys)


def test_analyze_refuses_nan_allreduce(capsys):
    line = one_line_error(["analyze", "--example", "--gpu", "h200", "--tp", "8", "--allreduce-us", "nan"], capsys)
    assert "--allreduce-us" in line


@pytest.mark.parametrize("config,tp,ok", [
    ("llama-3.1-8b.json", 3, False),  # 32 heads over 3 ranks
    ("llama-3.1-8b.json", 16, True),  # 8 KV heads, each on 2 of 16 ranks (replicated)
    ("llama-3.1-8b.json", 64, False),  # more ranks than query heads
    ("qwen3-30b-a3b.json", 8, True),  # 32 heads, 4 KV heads: tp a multiple of the KV heads
    ("qwen3-30b-a3b.json", 6, False),
    ("deepseek-v3.json", 8, True),  # MLA: only the 128 query heads are split
    ("deepseek-v3.json", 6, False),
])
def test_tp_follows_the_engines_rule(config, tp, ok, capsys):
    args = ["floor", "--model", str(CONFIGS / config), "--gpu", "h200", "--tp", str(tp)]
    if ok:
        code, out, _ = run_cli(args, capsys)
        assert code == 0 and "floor" in out
    else:
        assert f"--tp {tp}" in one_line_error(args, capsys)
        assert f"--tp {tp}" in one_line_error(["analyze", "--example", "--model", str(CONFIGS / config), "--gpu",
                                               "h200", "--tp", str(tp)], capsys)


def _floor(config, gpu, tp=1, weights=None):
    return compute_floor(load_model(CONFIGS / config), resolve_quant(CONFIGS / config, weights=weights), get_gpu(gpu),
                         tp=tp)


def test_weights_that_do_not_fit_are_warned_about(capsys):
    # DeepSeek-V3 (671B, FP8) on one 80 GB H100; Qwen3-30B-A3B in BF16 (61 GB) on a 48 GB L40S
    ds = _floor("deepseek-v3.json", "h100")
    assert ds.memory_per_gpu.fits is False and ds.memory_per_gpu.weights_bytes == pytest.approx(672e9, rel=0.01)
    assert any("does not fit" in w for w in ds.warnings)
    qwen = _floor("qwen3-30b-a3b.json", "l40s", weights="bf16")
    assert qwen.memory_per_gpu.fits is False and qwen.memory_per_gpu.weights_bytes == pytest.approx(61.1e9, rel=0.01)
    assert qwen.to_dict()["warnings"] and qwen.to_dict()["memory_per_gpu"]["fits"] is False
    code, out, _ = run_cli(["floor", "--model", str(CONFIGS / "qwen3-30b-a3b.json"), "--gpu", "l40s"], capsys)
    assert code == 0 and "warning: does not fit" in out
    code, out, _ = run_cli(["floor", "--model", str(CONFIGS / "qwen3-30b-a3b.json"), "--gpu", "l40s", "--format",
                            "json"], capsys)
    assert "does not fit" in json.loads(out)["warnings"][0]


def test_weights_that_fit_are_not_warned_about():
    assert _floor("llama-3.1-8b.json", "h100").warnings == ()
    assert _floor("deepseek-v3.json", "h200", tp=8).memory_per_gpu.fits is True  # 84 GB per GPU of 141
    assert _floor("qwen3-30b-a3b.json", "l40s", tp=2).warnings == ()


def test_the_floor_never_divides_by_a_zero_geometry():
    with pytest.raises(UserError, match="num_attention_heads"):
        from decodegap.floor import geometry_from_dict

        geometry_from_dict({**LLAMA, "num_attention_heads": 0})


def test_hidden_size_too_small_for_the_heads_names_the_derived_field(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in {**LLAMA, "hidden_size": 1}.items() if k != "head_dim"}))
    line = one_line_error(["floor", "--model", str(path), "--gpu", "h100"], capsys)
    assert "head_dim (absent, derived" in line


def test_bad_quantization_config_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": "four"}}))
    assert "bits" in one_line_error(["floor", "--model", str(path), "--gpu", "h100"], capsys)


EXTREMES = [0, -1, 1, 3, 1e12, 1e30, float("nan"), float("inf"), 2**63, "x", "", None, True, [], {}, [1, 2], 0.5]
FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "vocab_size", "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
          "decoder_sparse_step", "mlp_only_layers", "layer_types", "sliding_window", "torch_dtype",
          "tie_word_embeddings", "model_type", "kv_lora_rank", "q_lora_rank", "n_routed_experts",
          "first_k_dense_replace", "index_topk", "num_nextn_predict_layers"]


def test_any_mutated_config_is_a_floor_or_one_line(tmp_path, capsys):
    # property-style over every (field, extreme value) pair of three families: exit 0 with finite figures,
    # or exit 2 with one line; never a traceback, a hang or "nan"

    for base_name in ("llama-3.1-8b.json", "qwen3-30b-a3b.json", "deepseek-v3.json"):
        base = json.loads((CONFIGS / base_name).read_text())
        for field in FIELDS:
            for value in EXTREMES:
                _a_floor_or_one_line({**base, field: value}, tmp_path, capsys, (base_name, field, value))


def _a_floor_or_one_line(config: dict, tmp_path, capsys, what) -> None:
    """The floor of `config`: exit 0 with finite figures, or exit 2 with one line; never a traceback or "nan"."""
    import math

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run_cli(["floor", "--model", str(path), "--gpu", "h200", "--format", "json"], capsys)
    assert code in (0, 2), (what, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (what, err)
        return
    floor = json.loads(out)
    assert math.isfinite(floor["floor_ms"]) and floor["floor_ms"] > 0, what
    assert all(math.isfinite(c["ms"]) and c["ms"] >= 0 for c in floor["components"]), what


def test_weights_that_barely_fit_are_warned_about():
    # DeepSeek-V3 (671B, FP8) on 8 H100s: 84 GB of weights a GPU, 78 GiB of the 80: it fits, leaving no room for the
    # activations an engine keeps beside weights and KV (vLLM gives those 90% of the memory by default)
    ds = _floor("deepseek-v3.json", "h100", tp=8)
    assert ds.memory_per_gpu.fits is True
    barely = [w for w in ds.warnings if w.startswith("barely fits")]
    assert len(barely) == 1 and "GiB of weights" in barely[0] and "of the 80 GiB of a h100 at tp 8" in barely[0]
    assert not any(w.startswith("barely fits") for w in _floor("deepseek-v3.json", "h200", tp=8).warnings)


LAYOUT_FIELDS = ["layer_types", "layers_block_type", "hybrid_override_pattern", "mlp_layer_types", "block_types",
                 "_block_types", "full_attn_idxs", "attn_layer_indices", "attn_layer_period", "attn_layer_offset",
                 "expert_layer_period", "full_attention_interval", "attn_type_list", "sliding_window_pattern",
                 "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "mamba_d_state",
                 "mamba_n_heads", "mamba_expand", "conv_L_cache", "block_ffn_dim_multiplier", "block_multiple_of",
                 "enable_moe_block", "top_k_experts", "num_shared_experts", "moe_layer_start_index",
                 "interleave_moe_layer_step", "attention_chunk_size", "mamba_ssm_cache_dtype", "text_config"]


def test_any_mutated_hybrid_config_is_a_floor_or_one_line(tmp_path, capsys):
    # the same over the fields the per-layer layout and the recurrent mixers read, in hybrid configs

    truth = Path(__file__).parent / "fixtures" / "floor_truth"
    for base_name in ("qwen3_next", "lfm2", "nemotron_h", "jamba"):
        base = json.loads((truth / f"{base_name}.json").read_text())["config"]
        if base_name == "lfm2":
            base = {**base, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.5}
        for field in LAYOUT_FIELDS:
            for value in EXTREMES:
                _a_floor_or_one_line({**base, field: value}, tmp_path, capsys, (base_name, field, value))

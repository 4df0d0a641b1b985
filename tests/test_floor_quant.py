"""Weight formats and how checkpoints' quantization configs place them, on configs written for these tests."""

import json
from pathlib import Path

import pytest

from decodegap.errors import UserError
from decodegap.floor import (
    WEIGHT_FORMATS,
    load_model,
    load_quant,
    resolve_quant,
    weight_format,
    with_overrides,
)
from decodegap.floor.config import read_config_json

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
COMPONENTS = ("attention", "indexer", "dense_mlp", "experts", "shared_experts", "lm_head")


@pytest.mark.parametrize(
    "name,bits",
    [
        ("bf16", 16),
        ("fp16", 16),
        ("fp8", 8),
        ("int8", 8),
        ("nvfp4", 4.5),
        ("mxfp4", 4.25),
        ("q4_0", 4.5),
        ("q4_k", 4.5),
        ("q5_k", 5.5),
        ("q6_k", 6.5625),
        ("q8_0", 8.5),
        ("int4", 4.15625),
        ("fp8-block", 8 + 32 / 16384),
    ],
)
def test_bits_per_weight_include_scales(name, bits):
    assert weight_format(name).bits_per_weight == pytest.approx(bits)


def test_format_names_are_forgiving_and_unknown_ones_list_the_known():
    assert weight_format("BF16") is WEIGHT_FORMATS["bf16"]
    assert weight_format("Q6_K") is WEIGHT_FORMATS["q6_k"]
    with pytest.raises(UserError, match="known: bf16"):
        weight_format("fp5")
    with pytest.raises(UserError, match="KV-cache dtype"):
        with_overrides(load_quant(None), kv="int3")


def test_modelopt_nvfp4_with_glob_excludes():
    g = load_model(CONFIGS / "glm-5-nvfp4")
    q = load_quant(CONFIGS / "glm-5-nvfp4" / "hf_quant_config.json")
    assert q.kv_dtype == "fp8" and q.weights.name == "nvfp4"
    formats = {c: q.format_for(g, c, 10).name for c in COMPONENTS}
    assert formats == {
        "attention": "bf16",
        "indexer": "bf16",
        "dense_mlp": "nvfp4",
        "experts": "nvfp4",
        "shared_experts": "nvfp4",
        "lm_head": "bf16",
    }
    assert q.format_for(g, "router").name == "bf16"  # routers stay 16-bit whatever the checkpoint says


def test_modelopt_per_layer_excludes(tmp_path):
    # NVIDIA lists each layer's modules; layers left out of the list are quantized.
    g = load_model(CONFIGS / "glm-5-nvfp4")
    names = [f"model.layers.{i}.self_attn.{m}" for i in range(3) for m in g.attention_projection_params()]
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(
            {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "exclude_modules": names}}
        )
    )
    q = load_quant(tmp_path)
    assert [q.format_for(g, "attention", i).name for i in (0, 2, 3, 77)] == ["bf16", "bf16", "nvfp4", "nvfp4"]


def test_partially_excluded_component_counts_as_quantized(tmp_path):
    # Only when every module of a component is excluded is it charged 16 bits: the floor stays a lower bound.
    g = load_model(CONFIGS / "glm-5-nvfp4")
    (tmp_path / "q.json").write_text(
        json.dumps({"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["*o_proj"]}})
    )
    assert load_quant(tmp_path / "q.json").format_for(g, "attention", 5).name == "nvfp4"


def test_fp8_blockwise_from_config_quantization_config():
    cfg, _ = read_config_json(CONFIGS / "deepseek-v3.json")
    g = load_model(CONFIGS / "deepseek-v3.json")
    q = load_quant(None, cfg)
    assert q.weights.name == "fp8-block" and q.kv_dtype == "bf16"
    assert {q.format_for(g, c, 10).name for c in ("attention", "dense_mlp", "experts", "lm_head")} == {
        "fp8-block"
    }


def test_mxfp4_gpt_oss_modules_to_not_convert():
    g = load_model(CONFIGS / "gpt-oss-120b.json")
    q = resolve_quant(CONFIGS / "gpt-oss-120b.json")
    assert q.weights.name == "mxfp4"
    assert q.format_for(g, "experts", 7).name == "mxfp4"
    assert q.format_for(g, "attention", 7).name == "bf16"  # model.layers.*.self_attn
    assert q.format_for(g, "lm_head").name == "bf16"


def test_quant_config_found_beside_config_json():
    q = resolve_quant(CONFIGS / "glm-5-nvfp4" / "config.json")
    assert q.weights.name == "nvfp4" and q.kv_dtype == "fp8"


def test_unquantized_default_and_overrides():
    q = resolve_quant(CONFIGS / "llama-3.1-8b.json")
    assert (q.weights.name, q.kv_dtype) == ("bf16", "bf16")
    g = load_model(CONFIGS / "glm-5-nvfp4")
    q = resolve_quant(CONFIGS / "glm-5-nvfp4", weights="q4_k", kv="fp8")
    # An explicit format covers every linear layer: the checkpoint's excludes no longer apply.
    assert {q.format_for(g, c, 4).name for c in COMPONENTS} == {"q4_k"}
    assert q.kv_dtype == "fp8" and q.kv_bytes_per_element == 1


def test_gptq_and_awq_configs():
    from decodegap.floor.quant import scheme_from_quantization_config

    q = scheme_from_quantization_config({"quant_method": "gptq", "bits": 4, "group_size": 128}, "c")
    assert q.weights.bits_per_weight == pytest.approx(4 + 20 / 128)
    q = scheme_from_quantization_config({"quant_method": "awq", "w_bit": 4, "q_group_size": 64}, "c")
    assert q.weights.bits_per_weight == pytest.approx(4 + 20 / 64)


def test_unsupported_quant_method_says_what_to_do(tmp_path):
    (tmp_path / "q.json").write_text(json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}}))
    with pytest.raises(UserError, match=r"give weights= \(and kv=\) instead") as exc:
        load_quant(tmp_path / "q.json")
    assert exc.value.as_flags().endswith("give --weights (and --kv) instead")  # on the command line
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(UserError, match="no 'quantization'"):
        load_quant(tmp_path / "empty.json")
    with pytest.raises(UserError, match="no quantization config"):
        load_quant(tmp_path / "missing.json")

"""The decode-step floor: the issue's reference figures, MoE/KV/TP behaviour, output contract, command."""

import json
from pathlib import Path

import pytest

from decodegap.errors import UserError
from decodegap.floor import compute_floor, expected_distinct_experts, get_gpu, load_model, resolve_quant
from decodegap.report.floor import render

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
GLM5 = CONFIGS / "glm-5-nvfp4"


def floor_for(name, gpu="h100", weights=None, kv=None, **kw):
    return compute_floor(
        load_model(CONFIGS / name), resolve_quant(CONFIGS / name, weights=weights, kv=kv), get_gpu(gpu), **kw
    )


def test_glm5_nvfp4_tp8_rtx_pro_6000_reproduces_the_309_tok_s_ceiling():
    f = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, batch=1, context=8192, allreduce_us=0)
    assert 300 <= f.tokens_per_s <= 330
    assert f.bound == "memory"
    # BF16 attention dominates: more bytes than the NVFP4 experts although it holds far fewer weights.
    assert f.component("attention_weights").bytes_per_gpu > f.component("experts").bytes_per_gpu
    assert f.component("attention_weights").formats == "bf16" and f.component("experts").formats == "nvfp4"
    # Dense attention over all 8k tokens (engines without sparse MLA) lands on the same ceiling.
    dense = floor_for(
        "glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192, allreduce_us=0, sparse_attention=False
    )
    assert 300 <= dense.tokens_per_s <= 330
    assert dense.component("kv_cache").bytes_per_gpu == 78 * 8192 * 576


def test_glm5_default_pcie_allreduce_adds_156_calls_about_4_ms():
    free = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192, allreduce_us=0)
    pcie = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192)
    assert pcie.component("allreduce").detail.startswith("156 calls")
    assert pcie.floor_ms - free.floor_ms == pytest.approx(156 * 25e-3, rel=0.01)
    assert 3.5 < pcie.floor_ms - free.floor_ms < 4.5
    assert pcie.bound == "collective"


def test_llama_8b_bf16_one_h100_1k_context():
    f = floor_for("llama-3.1-8b.json", "h100", batch=1, context=1024)
    # The 16 GB / 3.35 TB/s = 4.8 ms reads the embedding table too; a step reads one row of it,
    # so the floor is (16.06 - 1.05) GB / 3.35 TB/s + 134 MB of KV = 4.52 ms.
    g = load_model(CONFIGS / "llama-3.1-8b.json")
    assert g.params_total * 2 / 3.35e12 * 1e3 == pytest.approx(4.8, rel=0.01)
    assert f.floor_ms == pytest.approx(4.52, rel=0.01)
    assert f.component("kv_cache").bytes_per_gpu == 1024 * 32 * 2 * 8 * 128 * 2
    assert "allreduce" not in [c.name for c in f.components]


def test_expected_distinct_experts():
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(256, 8, 2) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 2))
    assert expected_distinct_experts(256, 8, 10_000) == pytest.approx(256)
    assert expected_distinct_experts(0, 0, 5) == 0


def test_moe_expert_bytes_follow_distinct_experts_with_batch():
    one = floor_for("qwen3-30b-a3b.json", "h100", batch=1, context=0)
    many = floor_for("qwen3-30b-a3b.json", "h100", batch=64, context=0)
    ratio = many.component("experts").bytes_per_gpu / one.component("experts").bytes_per_gpu
    assert ratio == pytest.approx(expected_distinct_experts(128, 8, 64) / 8)
    assert "8.0 of 128" in one.component("experts").detail


def test_mixtral_and_gpt_oss_moe():
    mixtral = floor_for("mixtral-8x7b.json", "a100", tp=8, context=256)
    assert mixtral.component("experts").bytes_per_gpu == pytest.approx(32 * 2 * 3 * 4096 * 14336 * 2 / 8)
    oss = floor_for("gpt-oss-120b.json", "h100", context=4096)
    assert (
        oss.component("experts").formats == "mxfp4" and oss.component("attention_weights").formats == "bf16"
    )
    # Half the layers slide over 128 tokens: KV read = (18 x 4096 + 18 x 128) tokens x 1024 x 2 B.
    assert oss.component("kv_cache").bytes_per_gpu == (18 * 4096 + 18 * 128) * 1024 * 2


def test_gqa_kv_splits_over_kv_heads_mla_latent_does_not():
    one = floor_for("llama-3.1-8b.json", "h100", tp=1, context=4096)
    eight = floor_for("llama-3.1-8b.json", "h100", tp=8, context=4096)
    assert eight.component("kv_cache").bytes_per_gpu * 8 == one.component("kv_cache").bytes_per_gpu
    ds1 = floor_for("deepseek-v3.json", "h200", tp=1, context=4096)
    ds8 = floor_for("deepseek-v3.json", "h200", tp=8, context=4096)
    assert ds8.component("kv_cache").bytes_per_gpu == ds1.component("kv_cache").bytes_per_gpu
    assert ds8.component("attention_weights").bytes_per_gpu * 8 == pytest.approx(
        ds1.component("attention_weights").bytes_per_gpu
    )


def test_kv_dtype_and_context_scale_kv_bytes():
    bf16 = floor_for("deepseek-v3.json", "h200", tp=8, context=8192)
    fp8 = floor_for("deepseek-v3.json", "h200", tp=8, context=8192, kv="fp8")
    assert bf16.component("kv_cache").bytes_per_gpu == 61 * 8192 * 576 * 2
    assert fp8.component("kv_cache").bytes_per_gpu * 2 == bf16.component("kv_cache").bytes_per_gpu
    assert fp8.component("attention_weights").formats == "fp8-block"


def test_weight_formats_change_bytes():
    bf16 = floor_for("llama-3.1-8b.json", "rtx-4090", context=0)
    q4 = floor_for("llama-3.1-8b.json", "rtx-4090", weights="q4_k", context=0)
    q8 = floor_for("llama-3.1-8b.json", "rtx-4090", weights="q8_0", context=0)
    assert q4.weight_bytes_per_gpu / bf16.weight_bytes_per_gpu == pytest.approx(4.5 / 16)
    assert q8.weight_bytes_per_gpu / bf16.weight_bytes_per_gpu == pytest.approx(8.5 / 16)


def test_large_batch_turns_compute_bound():
    f = floor_for("llama-3.1-8b.json", "h100", batch=4096, context=0)
    assert f.component("dense_mlp").bound == "compute"
    assert f.tokens_per_s < floor_for("llama-3.1-8b.json", "h100", batch=1, context=0).tokens_per_s


def test_fp4_compute_rate_used_where_the_gpu_has_it():
    f = floor_for("glm-5-nvfp4", "b200", batch=512, tp=8, context=0)
    experts = f.component("experts")
    assert experts.compute_ms == pytest.approx(experts.flops_per_gpu / 9000e12 * 1e3)


def test_replicated_weights_shown_apart():
    f = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192, allreduce_us=0)
    assert "self_attn.kv_a_proj_with_mqa" in f.replicated_weights.modules and f.replicated_weights.extra_ms > 1.0
    assert f.floor_ms == pytest.approx(sum(c.ms for c in f.components))
    llama = floor_for("llama-3.1-8b.json", "h100", tp=16, context=0)  # 16 ranks > 8 KV heads
    assert "self_attn.k_proj" in llama.replicated_weights.modules
    assert floor_for("llama-3.1-8b.json", "h100", tp=1).replicated_weights.modules == ()


def test_json_contract():
    f = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192)
    data = json.loads(render(f, "json"))
    assert data["floor_ms"] == pytest.approx(f.floor_ms) and data["tokens_per_s"] == pytest.approx(
        f.tokens_per_s, 1e-3
    )
    assert data["params"]["total"] == f.params.total and data["params"]["active"] == f.params.active
    component = data["components"][0]
    for key in ("name", "bytes_per_gpu", "flops_per_gpu", "memory_ms", "compute_ms", "ms", "bound"):
        assert key in component
    assert data["assumptions"] and data["replicated_weights"]["modules"]


def test_text_and_markdown_render():
    f = floor_for("glm-5-nvfp4", "rtx-pro-6000", tp=8, context=8192)
    text = render(f, "text")
    assert "attention_weights" in text and "tok/s" in text and "[hf_quant_config.json]" in text
    md = render(f, "md")
    assert md.count("\n| ") >= len(f.components) + 1 and "**total**" in md


def test_bad_arguments():
    with pytest.raises(UserError):
        floor_for("llama-3.1-8b.json", tp=0)
    with pytest.raises(UserError):
        floor_for("llama-3.1-8b.json", allreduce_us=-1, tp=2)


def test_command_end_to_end(capsys):
    from decodegap.commands.floor import command

    command.main(
        [
            "--model",
            str(GLM5),
            "--gpu",
            "RTX PRO 6000 Blackwell",
            "--tp",
            "8",
            "--batch",
            "1",
            "--context",
            "8192",
            "--allreduce-us",
            "0",
            "--format",
            "json",
        ],
        standalone_mode=False,
    )
    data = json.loads(capsys.readouterr().out)
    assert 300 <= data["tokens_per_s"] <= 330
    command.main(
        [
            "--model",
            str(CONFIGS / "llama-3.1-8b.json"),
            "--bandwidth",
            "1000",
            "--tflops",
            "100",
            "--weights",
            "q4_k",
            "--kv",
            "fp8",
            "--format",
            "md",
        ],
        standalone_mode=False,
    )
    assert "q4_k" in capsys.readouterr().out
    with pytest.raises(UserError, match="unknown GPU"):
        command.main(["--model", str(GLM5), "--gpu", "tpu-v5"], standalone_mode=False)
    with pytest.raises(UserError, match="missing required fields"):  # a JSON that is no model config
        command.main(
            ["--model", str(CONFIGS / "glm-5-nvfp4" / "hf_quant_config.json"), "--gpu", "h100"],
            standalone_mode=False,
        )


@pytest.mark.parametrize("flags", [["--bandwidth", "5e-324", "--tflops", "100"],
                                   ["--bandwidth", "1000", "--tflops", "1e10"],
                                   ["--gpu", "h100", "--tp", "2", "--allreduce-us", "1e308"]])
def test_gpu_numbers_whose_floor_would_not_be_finite_are_refused(flags, capsys):
    # finite, but a floor from them was not: 5e-324 GB/s or 1e308 us per all-reduce printed "floor_ms": Infinity,
    # which is no JSON
    from decodegap.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["floor", "--model", str(CONFIGS / "llama-3.1-8b.json"), *flags, "--format", "json"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("decodegap: error: --") and len(err.strip().splitlines()) == 1
    main(["floor", "--model", str(CONFIGS / "llama-3.1-8b.json"), "--bandwidth", "0.001", "--tflops", "0.001",
          "--format", "json"])
    assert strict_floor_json(capsys.readouterr().out)["floor_ms"] > 0


def strict_floor_json(text: str) -> dict:
    def refuse(constant):
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)

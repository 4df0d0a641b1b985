"""The floor against published measured decode speeds: prints the Markdown table docs/floor.md carries.

Run: PYTHONPATH=src python benchmarks/floor_validation.py. Every floor must stay below its measurement
(tests/test_floor_validation.py checks it). Configs are the project's own fixtures (published geometry).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from decodegap.floor import compute_floor, get_gpu, load_model, resolve_quant

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "configs"
GPT_FAST = "https://github.com/pytorch-labs/gpt-fast (README, Benchmarks)"
GPT_FAST_MOE = "https://github.com/pytorch-labs/gpt-fast/tree/main/mixtral-moe (README)"


@dataclass(frozen=True)
class Measurement:
    label: str
    engine: str
    config: str
    gpu: str
    tp: int
    batch: int
    context: int
    measured_tok_s: float  # per sequence
    source: str
    weights: str | None = None
    kv: str | None = None
    note: str = ""


MEASUREMENTS = (
    # gpt-fast: 8x A100-80GB (330 W), batch 1, 5-token prompt; ~200 new tokens -> context 256.
    Measurement("Llama-2-7B BF16", "gpt-fast", "llama-2-7b.json", "a100", 1, 1, 256, 104.9, GPT_FAST),
    Measurement(
        "Llama-2-7B int8", "gpt-fast", "llama-2-7b.json", "a100", 1, 1, 256, 155.58, GPT_FAST, "int8"
    ),
    Measurement(
        "Llama-2-7B int4 g32",
        "gpt-fast",
        "llama-2-7b.json",
        "a100",
        1,
        1,
        256,
        196.80,
        GPT_FAST,
        "int4",
        note="int4 charged at group 128 (4.16 b/w); g32 stores 5 b/w, so the floor is lower still",
    ),
    Measurement("Llama-2-7B BF16 TP8", "gpt-fast", "llama-2-7b.json", "a100", 8, 1, 256, 328.43, GPT_FAST),
    Measurement("Llama-2-70B BF16 TP8", "gpt-fast", "llama-2-70b.json", "a100", 8, 1, 256, 62.50, GPT_FAST),
    Measurement(
        "Mixtral-8x7B BF16 TP8", "gpt-fast", "mixtral-8x7b.json", "a100", 8, 1, 256, 203.69, GPT_FAST_MOE
    ),
    Measurement(
        "Llama-2-7B q4f16_1",
        "MLC LLM",
        "llama-2-7b.json",
        "rtx-4090",
        1,
        1,
        256,
        191.0,
        "https://github.com/mlc-ai/llm-perf-bench/pull/1",
        "q4_0",
        note="4-bit + fp16 scale per 32 = 4.5 b/w, same as q4_0",
    ),
    Measurement(
        "DeepSeek-R1-0528 NVFP4, fp8 KV, FlashMLA",
        "SGLang",
        "deepseek-v3.json",
        "h200",
        8,
        1,
        1024,
        1e3 / 17.68,
        "https://github.com/sgl-project/sglang/issues/35291",
        "nvfp4",
        "fp8",
        note="17.68 ms/step after the fix; batch and context not stated: batch 1, 1k context is the "
        "least floor any setting could have; all weights charged NVFP4",
    ),
    Measurement(
        "GLM-5-NVFP4, fp8 KV (incident)",
        "SGLang",
        "glm-5-nvfp4",
        "rtx-pro-6000",
        8,
        1,
        8192,
        10.5,
        "the incident behind this project (the README's opening)",
        note="95 ms TPOT; 13.5 tok/s after gather-then-cast",
    ),
)


def floor_for(m: Measurement):
    path = CONFIGS / m.config
    return compute_floor(
        load_model(path),
        resolve_quant(path, weights=m.weights, kv=m.kv),
        get_gpu(m.gpu),
        tp=m.tp,
        batch=m.batch,
        context=m.context,
    )


def table() -> str:
    rows = [
        "| model | engine | GPU | TP | batch | ctx | measured tok/s | floor tok/s | floor ms | "
        "measured / floor speed | source |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in MEASUREMENTS:
        f = floor_for(m)
        note = f" ({m.note})" if m.note else ""
        rows.append(
            f"| {m.label} | {m.engine} | {m.gpu} | {m.tp} | {m.batch} | {m.context} | "
            f"{m.measured_tok_s:.1f} | {f.tokens_per_s:.1f} | {f.floor_ms:.3f} | "
            f"{m.measured_tok_s / f.tokens_per_s:.0%} | {m.source}{note} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())

"""Write tests/fixtures/floor_truth/<type>.json: a model type's default config and its exact parameter counts.

The truth never comes from decodegap: each type's causal LM is built by transformers on torch's meta device (no
memory, no weights) and its parameters counted (tied weights once). Composite (multimodal) types are written as a
checkpoint ships them, whole, and their language model built from the text config; towers a causal-LM class builds
in (vision, audio) are left out by module name. Routed experts are the parameters under an `experts` module that
is not a shared one; the active count is total - routed x (1 - top_k / experts).

Run (needs transformers and torch; CPU is enough):
    PYTHONPATH=/path/to/transformers python scripts/make_floor_truth.py [TYPE ...]
tests/test_floor_families.py checks decodegap's counts against these files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "floor_truth"

# Decoder-only types covering each way a config describes its model (see the test module for what each pins).
TYPES = [
    # hybrids: recurrent mixers and how each config lays them out
    "qwen3_next", "qwen3_5_text", "olmo_hybrid", "nemotron_h", "jamba", "bamba", "falcon_h1", "granitemoehybrid",
    "lfm2", "recurrent_gemma", "minimax", "kimi_linear", "mamba2", "falcon_mamba",
    # MoE field aliases, dense placement, is_moe false
    "aria_text", "ernie4_5_moe", "hunyuan_v1_moe", "llama4_text", "exaone_moe", "doge",
    # plain (ungated) MLPs
    "gpt_neox", "starcoder2", "nemotron", "phi",
    # older field names
    "gpt2", "falcon", "gpt_neo",
    # multimodal configs with the language model under text_config (and a top-level hidden_size)
    "paligemma", "voxtral",
    # attention variants: MLA, narrower values, low-rank q/o without MLA; per-layer widths
    "deepseek_v3", "mimo_v2_flash", "deepseek_v4", "gemma3n_text",
]
NON_TEXT = re.compile(r"(vision|visual|audio|multi_modal|mm_projector|projector|speech|embed_vision|embed_audio|"
                      r"image_|img_)", re.I)
TOP_K = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "experts_per_token", "moe_k")
EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
# Constructor arguments for types whose default config leaves the point untested: LFM2's default is all attention,
# so it is built with LFM2-1.2B's layout (short convolutions, attention at six layers).
OVERRIDES = {"lfm2": {"num_hidden_layers": 16, "full_attn_idxs": [2, 5, 8, 10, 12, 14]}}
DROP = {"id2label", "label2id", "transformers_version", "_name_or_path"}


def _patch(cfg) -> None:
    """Defaults some configs leave unset and their own model cannot build without (head_dim, KV heads)."""
    for c in {id(cfg): cfg, id(cfg.get_text_config()): cfg.get_text_config()}.values():
        d = c.to_dict()
        heads = d.get("num_attention_heads")
        if "head_dim" in d and d["head_dim"] is None and heads:
            c.head_dim = d["hidden_size"] // heads
        if "num_key_value_heads" in d and d["num_key_value_heads"] is None and heads:
            c.num_key_value_heads = heads


def _first(d: dict, names) -> int | None:
    for n in names:
        v = d.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None



def count_params(model, skip: re.Pattern = NON_TEXT) -> tuple[int, int]:
    """A model's parameters (built on the meta device), each tied tensor once, and those of its routed experts
    (modules named *experts*, not *shared*); names `skip` matches (vision and audio towers) left out."""
    seen, total, routed = set(), 0, 0
    for name, p in model.named_parameters():
        if id(p) in seen or skip.search(name):
            continue
        seen.add(id(p))
        total += p.numel()
        if "experts" in name.lower() and "shared" not in name.lower():
            routed += p.numel()
    return total, routed


def truth(model_type: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **OVERRIDES.get(model_type, {}))
    _patch(cfg)
    text = cfg.get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text if text is not cfg else cfg)
    total, routed = count_params(model)
    td = text.to_dict()
    experts, top_k = _first(td, EXPERTS), _first(td, TOP_K)
    if routed and not (experts and top_k):
        raise SystemExit(f"{model_type}: routed experts but no expert count or top-k field the script knows")
    active = total - routed * (1 - top_k / experts) if routed else total
    config = {k: v for k, v in json.loads(cfg.to_json_string(use_diff=False)).items() if k not in DROP}
    return {"model_type": model_type, "built_from": "text_config" if text is not cfg else "config",
            "model_class": type(model).__name__, "config": config,
            "truth": {"total": total, "routed_experts": routed, "experts": experts if routed else None,
                      "top_k": top_k if routed else None, "active_with_embeddings": round(active)}}


def main(types: list[str]) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    OUT.mkdir(parents=True, exist_ok=True)
    for t in types or TYPES:
        rec = truth(t)
        (OUT / f"{t}.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        t_ = rec["truth"]
        print(f"{t:20s} total {t_['total'] / 1e9:9.3f}B  active {t_['active_with_embeddings'] / 1e9:8.3f}B")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(__doc__)
    main(sys.argv[1:])

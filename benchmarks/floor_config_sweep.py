"""Parameter counts of `decodegap floor` against exact truth, over every transformers model type with a causal LM.

Needs transformers (and torch, CPU is enough): for each model type, its default config is written out as a
checkpoint would ship it (composite multimodal configs whole), the causal LM is built on torch's meta device (no
memory, no weights) and its parameters counted: that is the truth, and it never comes from decodegap. decodegap then
reads the same config.json (in this process, as `decodegap floor` does) and its `params.total` and
`params.active_with_embeddings` are compared with the truth (active truth = total - routed experts x (1 - k/E)).

Run:  PYTHONPATH=src:/path/to/transformers python benchmarks/floor_config_sweep.py [--work DIR] [--only T1,T2]
The truth is cached per type under --work (default /tmp/floorsweep/<type>/{config,truth}.json); delete a
truth.json to rebuild it. Prints one row per type and the counts: right (both within 3%), wrong but warned (the
floor's `warnings` say what it leaves out), wrong silently, refused (exit 2, one line), tracebacks.

Types whose text part only has a *TextModel (Qwen2-VL and kin) are built as that model + a vocab x hidden head.
Non-text towers built into a causal LM class (Phi-4-multimodal's audio/vision) are left out by module name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

TOL = 0.03
TEXT_BACKBONE_TYPES = {"qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text", "glm4v_text",
                       "glm4v_moe_text", "glm5_next_text", "glm_image_text", "glm_ocr_text", "hunyuan_vl_text",
                       "cosmos3_edge_text", "muse_glimmer_text", "voxtral_realtime_text"}
NON_TEXT = re.compile(r"(vision|visual|vqmodel|vq_model|audio|multi_modal|mm_projector|projector|"
                      r"patch_embed(?!ding_projection)|speech|embed_vision|embed_audio|image_|img_|depth_decoder|"
                      r"embed_tokens_extend)", re.I)
E_FIELDS = ["n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", "n_experts"]
K_FIELDS = ["num_experts_per_tok", "moe_topk", "num_experts_per_token", "experts_per_token", "moe_k"]


# ---- truth (transformers) -----------------------------------------------------------------------------------
def candidates() -> list[tuple[str, str]]:
    """(model type, how to build it): 'lm' its causal LM, 'text' the causal LM of its text config, 'backbone'
    its text backbone + head."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    out = []
    for t in CONFIG_MAPPING_NAMES:
        if t in CAUSAL:
            out.append((t, "lm"))
            continue
        try:
            text = AutoConfig.for_model(t).get_text_config()
        except Exception:  # noqa: BLE001 - a config that cannot even be made is not a candidate
            continue
        kind = getattr(text, "model_type", None)
        if kind in CAUSAL:
            out.append((t, "text"))
        elif kind in TEXT_BACKBONE_TYPES:
            out.append((t, "backbone"))
    return out


def _first(d: dict, names: list[str]):
    for n in names:
        v = d.get(n)
        if isinstance(v, list):
            v = max((x for x in v if isinstance(x, int)), default=None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def build_truth(model_type: str, how: str, folder: Path) -> dict:
    """Write folder/config.json and count the model's parameters on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_floor_truth import count_params  # the same count as the tests' truth

    cfg = AutoConfig.for_model(model_type)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg.to_json_string(use_diff=False))
    text = cfg.get_text_config()
    built = text if how in ("text", "backbone") else cfg
    with torch.device("meta"):
        model = (AutoModel if how == "backbone" else AutoModelForCausalLM).from_config(built)
    total, routed = count_params(model, NON_TEXT)
    td = text.to_dict()
    if how == "backbone" and not (td.get("tie_word_embeddings") or cfg.to_dict().get("tie_word_embeddings")):
        total += td["hidden_size"] * td["vocab_size"]
    e, k = _first(td, E_FIELDS), _first(td, K_FIELDS)
    active = total - routed * (1 - k / e) if routed and e and k else (None if routed else total)
    return {"type": model_type, "how": how, "total": total, "routed_experts": routed, "experts": e, "top_k": k,
            "active": None if active is None else round(active)}


def truth_worker(types: list[list[str]], work: Path) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    for t, how in types:
        try:
            rec = build_truth(t, how, work / t)
        except Exception as exc:  # noqa: BLE001 - a default config that does not build is recorded as such
            rec = {"type": t, "how": how, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        (work / t).mkdir(parents=True, exist_ok=True)
        (work / t / "truth.json").write_text(json.dumps(rec))


# ---- decodegap (no transformers) ------------------------------------------------------------------------------
def decodegap_params(config: Path) -> dict:
    from decodegap.errors import UserError
    from decodegap.floor import compute_floor, get_gpu, load_model, resolve_quant

    try:
        g = load_model(config)
        floor = compute_floor(g, resolve_quant(config), get_gpu("h100"), tp=1, batch=1, context=4096)
    except UserError as exc:
        return {"refused": str(exc).replace(str(config.parent) + "/", "")}
    except Exception:  # noqa: BLE001 - what the sweep exists to find
        return {"traceback": traceback.format_exc(limit=3).strip().splitlines()[-1]}
    # the config reader's own warnings (what it leaves out), not the floor's about memory
    return {"total": floor.params.total, "active": floor.params.active_with_embeddings, "warnings": list(g.warnings)}


def verdict(truth: dict, dg: dict) -> tuple[str, float | None, float | None]:
    if "traceback" in dg:
        return "TRACEBACK", None, None
    if "refused" in dg:
        return "refused", None, None
    if "total" not in truth:
        return "no truth", None, None
    rt = dg["total"] / truth["total"]
    ra = dg["active"] / truth["active"] if truth.get("active") else None
    wrong = abs(rt - 1) > TOL or (ra is not None and abs(ra - 1) > TOL)
    if not wrong:
        return "ok", rt, ra
    return ("wrong, warned" if dg["warnings"] else "WRONG"), rt, ra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/floorsweep"))
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cands_file = args.work / "candidates.json"
    if not cands_file.exists():
        cands_file.write_text(json.dumps(candidates()))
    cands = [tuple(c) for c in json.loads(cands_file.read_text())]
    if args.only:
        cands = [c for c in cands if c[0] in set(args.only.split(","))]
    todo = [c for c in cands if not (args.work / c[0] / "truth.json").exists()]
    procs = [subprocess.Popen([sys.executable, __file__, "_worker", str(args.work), json.dumps(todo[w::args.workers])],
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
             for w in range(args.workers) if todo[w::args.workers]]
    for p in procs:
        p.wait()

    counts: dict[str, int] = {}
    print("| type | truth total | truth active | ours total | ours active | ratio total | ratio active | verdict |"
          " note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for t, _ in cands:
        folder = args.work / t
        truth = json.loads((folder / "truth.json").read_text()) if (folder / "truth.json").exists() else {}
        if not (folder / "config.json").exists():  # transformers could not make its default config
            counts["no config"] = counts.get("no config", 0) + 1
            continue
        dg = decodegap_params(folder / "config.json")
        v, rt, ra = verdict(truth, dg)
        counts[v] = counts.get(v, 0) + 1
        note = dg.get("refused") or dg.get("traceback") or "; ".join(dg.get("warnings", [])) or truth.get("error", "")
        print(f"| {t} | {_b(truth.get('total'))} | {_b(truth.get('active'))} | {_b(dg.get('total'))} | "
              f"{_b(dg.get('active'))} | {_r(rt)} | {_r(ra)} | {v} | {note[:160].replace('|', '/')} |")
    print()
    print(f"{len(cands)} types: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))


def _b(n) -> str:
    return "-" if n is None else f"{n / 1e9:.3f}B"


def _r(x) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        truth_worker(json.loads(sys.argv[3]), Path(sys.argv[2]))
    else:
        main()

"""Steps, phase and layers on the traces engines really write (issue 12): real traces of SGLang and vLLM (the
public test data of AMD's TraceLens, MIT), real H200 recordings (tests/fixtures/traces/gpu_h200, with measured
truth files) and hand-built forwards of every pattern (tracegen.engine_forwards)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodegap.pipeline import analyze_path
from decodegap.cli import main
from decodegap.report.json import report_dict
from decodegap.steps.marks import parse_mark
from decodegap.trace.tables import Annotation
from tracegen import decode_loop, engine_forwards, write

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
H200 = FIXTURES / "gpu_h200"
CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _d(path) -> dict:
    return report_dict(analyze_path(path))


def _counts(d: dict) -> dict:
    return {p: d["steps"][p]["count"] for p in ("decode", "prefill", "mixed", "training")}


def _truth(name: str) -> dict:
    return json.loads((H200 / f"{name}.truth.json").read_text())


# --- real engine traces ------------------------------------------------------------------------------------------

def test_sglang_trace_is_one_decode_forward_of_36_layers():
    d = _d(FIXTURES / "engines" / "sglang_qwen3-8b_decode_mi300x.json.gz")
    assert _counts(d) == {"decode": 1, "prefill": 0, "mixed": 0, "training": 0}
    assert d["layers"] == 36 and d["workload"] == "inference"
    assert d["steps"]["source"] == "sglang_step" and d["steps"]["decode"]["batch"] == 32
    assert d["summary"].startswith("1 decode forward (batch 32) replayed by one HIP graph; 36 layers")
    assert any("one forward" in w for w in d["warnings"])  # statistics over steps are from one sample


def test_vllm_trace_is_one_decode_forward_of_24_alternating_layers():
    d = _d(FIXTURES / "engines" / "vllm_gpt-oss-20b_decode_fullgraph_mi300x.json.gz")
    assert _counts(d)["decode"] == 1 and d["layers"] == 24
    assert d["steps"]["source"] == "vllm_execute"
    kinds = sorted((k["count"], tuple(k["markers"])) for k in d["layer_kinds"])
    assert kinds == [(12, ("kernel_unified_attention_2d",)),
                     (12, ("kernel_unified_attention_3d", "reduce_segments"))]
    assert "2 kinds of layer" in d["layers_evidence"]


# --- real H200 recordings -------------------------------------------------------------------------------------------

def test_torch_compile_generate_16_layers_and_its_prefill():
    truth = _truth("hf_compile_generate")
    d = _d(H200 / "hf_compile_generate.json.gz")
    assert d["layers"] == truth["layers"] == 16  # Inductor numbers each layer's kernels differently
    assert d["steps"]["decode"]["count"] == 7 and d["steps"]["prefill"]["count"] == 1
    assert d["steps"]["prefill"]["tokens"] == 32 and d["steps"]["decode"]["tokens"] == 2  # GEMM rows: batch x tokens


def test_cuda_graph_decode_one_forward_per_replay():
    d = _d(H200 / "hf_cudagraph_decode.json.gz")
    assert d["steps"]["source"] == "graph_launch"
    assert d["steps"]["decode"]["count"] == 6 and d["layers"] == 16


def test_training_steps_are_training_not_decode():
    d = _d(H200 / "train_steps.json.gz")
    assert d["workload"] == "training"
    assert _counts(d) == {"decode": 0, "prefill": 0, "mixed": 0, "training": 3}
    assert d["breakdown_phase"] == "training"
    assert not [f for f in d["findings"] if f["id"] in ("host_bound", "kv_pool_cast", "weight_copy")]


def test_host_bound_loop_is_not_cut_at_its_largest_gap():
    # the largest GPU idle gap of every step lies inside it (after layer 8): cuts still fall between steps
    d = _d(H200 / "eager_hostbound_nomarkers.json.gz")
    truth = _truth("eager_hostbound_nomarkers")
    assert d["steps"]["source"] == "anchor_embedding" and d["layers"] == truth["layers"] == 16
    assert d["steps"]["prefill"]["count"] == 0
    assert d["steps"]["decode"]["count"] == truth["steps"]["decode"] == 5 and d["steps"]["dropped_partial"] == 0
    ms = d["steps"]["decode"]["ms_each"]
    assert max(ms) < 1.2 * min(ms)  # complete, alike steps


def test_interior_step_with_a_cut_gpu_annotation_is_kept():
    d = _d(H200 / "gpu_step_annotation_cut.json.gz")
    assert d["steps"]["decode"]["count"] == 5 and d["steps"]["dropped_partial"] == 0
    assert d["steps"]["source"] == "profiler_step"
    assert any("GPU-side annotation of ProfilerStep#4" in w for w in d["warnings"])
    assert not any("partial" in w for w in d["warnings"])


# --- hand-built patterns ------------------------------------------------------------------------------------------

CASES = {
    "sglang annotation, one graph": (dict(annotation="sglang", graph="full", layers=8, hip=True),
                                     "sglang_step", {"decode": 1}, 8),
    "vllm piecewise mixed forward": (dict(annotation="vllm", graph="piecewise", phases=("mixed",), layers=6),
                                     "vllm_execute", {"mixed": 1}, 6),
    "vllm piecewise prefill then decode": (dict(annotation="vllm", graph="piecewise", forwards=3,
                                                phases=("prefill", "decode", "decode"), layers=6),
                                           "vllm_execute", {"prefill": 1, "decode": 2}, 6),
    "piecewise graphs, no marks, one forward": (dict(graph="piecewise", layers=10), "anchor_embedding",
                                                {"decode": 1}, 10),
    "piecewise graphs, no marks, 4 forwards": (dict(graph="piecewise", layers=10, forwards=4), "anchor_embedding",
                                               {"decode": 4}, 10),
    "full graphs, no marks, 4 forwards": (dict(graph="full", layers=10, forwards=4), "graph_launch", {"decode": 4}, 10),
    "alternating attention, one forward": (dict(alternate=True, layers=12), "anchor_embedding", {"decode": 1}, 12),
    "alternating attention, 5 forwards": (dict(alternate=True, layers=12, forwards=5), "anchor_embedding",
                                          {"decode": 5}, 12),
    "inductor numbering, one forward": (dict(inductor=True, layers=12), "anchor_embedding", {"decode": 1}, 12),
    "inductor numbering, 5 forwards": (dict(inductor=True, layers=12, forwards=5), "anchor_embedding",
                                       {"decode": 5}, 12),
    "two eager forwards": (dict(layers=12, forwards=2), "anchor_embedding", {"decode": 2}, 12),
    "a 2-layer model, 5 forwards": (dict(layers=2, forwards=5), "anchor_embedding", {"decode": 5}, 2),
    "eager prefill then decode": (dict(layers=12, forwards=6, phases=("prefill",) + ("decode",) * 5),
                                  "anchor_embedding", {"prefill": 1, "decode": 5}, 12),
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_patterns(tmp_path, case):
    kw, source, counts, layers = CASES[case]
    d = _d(write(engine_forwards(**kw), tmp_path / "t.json"))
    assert d["steps"]["source"] == source
    assert {p: c for p, c in _counts(d).items() if c} == counts
    assert d["layers"] == layers
    assert d["steps"]["dropped_partial"] == 0


@pytest.mark.parametrize("layers, nope_every", [(8, 4), (12, 3), (8, None)])
def test_replays_of_one_graph_with_alike_work_between_are_one_forward_each(tmp_path, layers, nope_every):
    """A hand-written loop that captures its whole decode step (the argmax too) in one CUDA graph: no host op marks a
    forward, and layers that skip an op (NoPE every few layers) differ in length. Each replay is one step holding
    exactly its forward's GPU work (the generator's tags), the next forward's input updates included."""
    doc = engine_forwards(forwards=6, layers=layers, graph="full", sampling_in_graph=True, nope_every=nope_every)
    busy = [0.0] * 6
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            busy[e["args"]["tracegen_forward"]] += e["dur"] / 1e3
    d = _d(write(doc, tmp_path / "t.json"))
    assert d["steps"]["source"] == "graph_launch" and {p: c for p, c in _counts(d).items() if c} == {"decode": 6}
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx(busy, abs=1e-4)


def test_prefill_shaped_forward_is_not_decode(tmp_path):
    d = _d(write(engine_forwards(layers=6, phases=("prefill",), forwards=1), tmp_path / "t.json"))
    # one forward, no marks: its projections see 16,384 rows, its lm_head 32 (each sequence's last token)
    assert _counts(d) == {"decode": 0, "prefill": 1, "mixed": 0, "training": 0}
    assert (d["steps"]["prefill"]["tokens"], d["steps"]["prefill"]["batch"]) == (32 * 512, 32)
    d = _d(write(engine_forwards(layers=6, phases=("prefill",), annotation="sglang"), tmp_path / "s.json"))
    assert _counts(d)["prefill"] == 1 and d["steps"]["prefill"]["tokens"] == 32 * 512


def test_mark_parsing():
    def mark(name):
        return parse_mark(Annotation(name, 0, 10, False))

    m = mark("step[EXTEND bs=15 toks=15360]")
    assert (m.family, m.phase, m.batch, m.tokens) == ("sglang_step", "prefill", 15, 15360)
    m = mark("execute_40_context_1(sq8sk8sqsq64sqsk64)_generation_32(sq32sk900sqsq32sqsk900)")
    assert (m.family, m.phase, m.batch, m.tokens) == ("vllm_execute", "mixed", 33, 40)
    assert mark("ProfilerStep#12").family == "profiler_step"
    assert mark("decodegap.step#3").family == "profiler_step"
    assert mark("## forward ##") is None and mark("step_helper") is None


def test_overlapping_and_duplicated_step_annotations(tmp_path):
    doc = decode_loop(steps=4, layers=3, markers="cpu")
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    doc["traceEvents"] += [dict(marks[1])]  # written twice
    marks[2]["ts"] -= 260  # starts before the step before it ends
    marks[2]["dur"] += 260
    d = _d(write(doc, tmp_path / "t.json"))
    assert sum(_counts(d).values()) == 4 and d["steps"]["dropped_partial"] == 0  # the duplicate is one step
    assert any("overlap" in w for w in d["warnings"])  # never silently


def test_many_steps_are_linear(tmp_path):
    # 3,000 steps: the assignment of kernels to steps is one sorted pass, not a scan per step
    d = _d(write(decode_loop(steps=3000, layers=1, markers="cpu", gap_us=5.0), tmp_path / "t.json"))
    assert d["steps"]["decode"]["count"] == 3000


def test_sanity_warnings_floor_and_config_layers(tmp_path, capsys):
    path = write(decode_loop(steps=4, layers=4, gap_us=2.0), tmp_path / "t.json")
    try:
        main(["analyze", str(path), "--format", "json", "--model", str(CONFIGS / "llama-3.1-8b.json"),
              "--gpu", "h100"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    d = json.loads(capsys.readouterr().out)
    warnings = " | ".join(d["warnings"])
    assert "shorter than its hardware floor" in warnings
    assert "4 layers per step, the model config 32" in warnings


def test_a_profiler_step_wrapping_a_whole_generate_is_cut_into_its_forwards(tmp_path):
    # prof.step() once per generate() call: one annotation holds a prefill and 7 decode forwards
    doc = engine_forwards(forwards=8, layers=10, phases=("prefill",) + ("decode",) * 7)
    launches = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"]
    t0, t1 = min(e["ts"] for e in launches), max(e["ts"] + e["dur"] for e in launches)
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
                               "ts": t0 - 1, "dur": t1 - t0 + 2, "args": {}})
    d = _d(write(doc, tmp_path / "t.json"))
    assert d["steps"]["source"] == "profiler_step" and "several forwards" in d["steps"]["source_detail"]
    assert _counts(d) == {"decode": 7, "prefill": 1, "mixed": 0, "training": 0} and d["layers"] == 10


def test_one_eager_forward_without_marks_is_one_step(tmp_path):
    # one HF decode forward (16 layers, eager, two norm+projection groups per layer), its marks removed
    doc = json.loads(__import__("gzip").open(H200 / "gpu_step_annotation_cut.json.gz").read())
    events = doc["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == "ProfilerStep#3")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset",
                                                                             "gpu_user_annotation")]
    kept_host = [e for e in host if lo <= e["ts"] < hi and e.get("cat") != "user_annotation"]
    corr = {e["args"]["correlation"] for e in kept_host if "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e.get("args", {}).get("correlation") in corr]
    doc["traceEvents"] = [e for e in events if e.get("ph") == "M"] + kept_host + gpu
    d = _d(write(doc, tmp_path / "one.json"))
    assert _counts(d)["decode"] == 1 and sum(_counts(d).values()) == 1 and d["layers"] == 16

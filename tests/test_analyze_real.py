"""analyze on real H200 traces (trimmed by scripts/trim_trace.py from full captures)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from decodegap.pipeline import AnalysisOptions, analyze_path
from decodegap.report.json import render_json, report_dict

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
CAST = FIXTURES / "mla_cast_eager_2steps.json.gz"
HF = FIXTURES / "hf_llama_generate_6steps.json.gz"


@pytest.fixture(scope="module")
def cast_report():
    return analyze_path(CAST, AnalysisOptions(tpot_ms=109.1))


@pytest.fixture(scope="module")
def hf_report():
    return analyze_path(HF)


def _gpu_step_durations_ms(path: Path) -> list[float]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["dur"] / 1e3 for e in events if e.get("cat") == "gpu_user_annotation"]


def test_cast_trace_steps_match_gpu_profiler_steps(cast_report):
    d = report_dict(cast_report)
    assert d["schema"] == "decodegap.report/1"
    assert d["steps"]["decode"]["count"] == 2 and d["steps"]["prefill"]["count"] == 0
    assert d["steps"]["decode"]["source"] == "profiler_step"
    durations = sorted(_gpu_step_durations_ms(CAST))
    median = (durations[0] + durations[1]) / 2
    assert abs(d["steps"]["decode"]["ms"]["median"] - median) <= 0.05 * median


def test_cast_trace_layers_and_top_kernel(cast_report):
    d = report_dict(cast_report)
    assert d["layers"] == 78
    top = d["kernels"][0]
    assert top["category"] == "cast" and top["op"] == "aten::copy_"
    assert top["calls_per_step"] == 78
    assert [495552, 1, 576] in [shape for shape, _ in top["input_shapes"]]
    assert 64 <= top["ms_per_step"] <= 70
    assert top["bytes_per_call"] == 495552 * 576 * 3  # fp8 read + bf16 write
    assert d["categories"][0]["name"] == "cast" and d["categories"][0]["share"] > 0.5
    assert 0.3 < d["gpu_busy_fraction"] < 0.9


def test_cast_trace_findings(cast_report):
    d = report_dict(cast_report)
    ids = [f["id"] for f in d["findings"]]
    assert ids[0] == "kv_pool_cast" and "host_bound" in ids and "profiler_overhead" in ids
    cast = d["findings"][0]
    ev = cast["evidence"]
    assert ev["calls_per_step"] == 78 and ev["layers"] == 78 and ev["calls_per_layer"] == 1
    assert abs(ev["bytes_per_call"] - 856e6) <= 0.1 * 856e6
    assert abs(ev["bytes_per_step"] - 66.8e9) <= 0.1 * 66.8e9
    assert (ev["dtype_from"], ev["dtype_to"], ev["shape"]) == ("fp8_e4m3", "bf16", [495552, 1, 576])
    assert cast["share"] >= 0.6
    assert "gather" in cast["fix"] and "FP8" in cast["fix"]
    assert json.loads(render_json(cast_report))["findings"][0]["id"] == "kv_pool_cast"


def test_every_kernel_counted_with_nanosecond_durations(cast_report):
    # The GPU time per step equals the raw (3-decimal) kernel durations inside the GPU step windows, summed.
    with gzip.open(CAST, "rt") as f:
        events = json.load(f)["traceEvents"]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "gpu_user_annotation"]
    kernels = [e for e in events if e.get("cat") == "kernel" and any(a <= e["ts"] < b for a, b in windows)]
    exact_ms = sum(e["dur"] for e in kernels) / 1e3 / len(windows)
    rounded_ms = sum(round(e["dur"]) for e in kernels) / 1e3 / len(windows)
    b = cast_report.main.breakdown
    assert b.kernels_per_step == len(kernels) / len(windows)
    assert abs(b.gpu_ms_per_step - exact_ms) < 1e-6 * exact_ms
    assert abs(rounded_ms - exact_ms) > 1e-4  # whole-microsecond rounding would have been visibly off


def test_hf_generate_without_markers(hf_report):
    d = report_dict(hf_report)
    assert d["steps"]["prefill"]["count"] == 1
    assert d["steps"]["decode"]["count"] == 6
    assert d["steps"]["decode"]["source"] == "anchor_embedding"
    assert d["layers"] == 16
    ids = [f["id"] for f in d["findings"]]
    assert "kv_pool_cast" not in ids and "host_bound" in ids
    # every kernel of every decode step is counted: per-step calls of the per-layer attention kernel
    # (groups split by input shapes, which grow with the KV length: sum them)
    assert sum(k["calls_per_step"] for k in d["kernels"] if k["category"] == "attention") == pytest.approx(16, abs=0.01)


def test_markdown_and_text_lead_with_findings(cast_report):
    from decodegap.analysis import build
    from decodegap.report.markdown import render_markdown
    from decodegap.report.text import render_text

    md = render_markdown(build(cast_report))
    assert md.index("Root causes") < md.index("Time per decode step by category")
    assert "`kv_pool_cast`" in md
    text = render_text(build(cast_report))
    assert text.index("ROOT CAUSES") < text.index("time per decode step by category")
    assert "[kv_pool_cast]" in text


def test_html_report_is_self_contained_and_escaped(cast_report):
    from decodegap.analysis import build
    from decodegap.report.html import render_html

    page = render_html(build(cast_report))
    assert page.startswith("<!doctype html>") and "<script" not in page and "kv_pool_cast" in page
    assert "&lt;" in page  # C++ template brackets in kernel names are escaped
    assert page.index("Root causes") < page.index("Top kernels")

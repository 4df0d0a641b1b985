"""Traces the demo recorded on an H200 through the project's own record path (benchmarks/demo_gpu.py), analyzed
here on a CPU. All three: GLM-5 TP-rank slice, 12 layers, the real 495,552-slot FP8 pool, 2,048 active tokens.

cast_graph         full_cast replayed from a CUDA graph, no shapes, 3 profiled steps
cast_eager         full_cast eager, record_shapes on, 2 profiled steps
gather_cast_eager  gather-then-cast eager, record_shapes on, 2 profiled steps (the incident's patch)
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from decodegap.pipeline import analyze_path
from decodegap.capture import METADATA_KEY

TRACES = Path(__file__).parent / "fixtures" / "traces"
POOL_ELEMENTS = 495_552 * 576
CAST_BYTES = POOL_ELEMENTS * 3  # fp8 read + bf16 write


def finding(report, fid: str):
    return next((f for f in report.findings if f.id == fid), None)


@pytest.fixture(scope="module")
def cast_graph():
    return analyze_path(TRACES / "cast_graph.json.gz")


@pytest.fixture(scope="module")
def cast_eager():
    return analyze_path(TRACES / "cast_eager.json.gz")


@pytest.fixture(scope="module")
def gather_cast_eager():
    return analyze_path(TRACES / "gather_cast_eager.json.gz")


@pytest.mark.parametrize("name, steps", [("cast_graph", 3), ("cast_eager", 2), ("gather_cast_eager", 2)])
def test_recorded_through_the_project_record_path(name, steps):
    with gzip.open(TRACES / f"{name}.json.gz", "rt") as f:
        doc = json.load(f)
    meta = json.loads(doc[METADATA_KEY]) if isinstance(doc[METADATA_KEY], str) else doc[METADATA_KEY]
    assert meta["steps"] == steps
    assert meta["target"].startswith("decodegap.demo:")
    assert meta["unprofiled_step_ms"]["clock"] == "cuda_events"
    assert doc["deviceProperties"][0]["name"] == "NVIDIA H200"
    marks = {e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert marks == {f"ProfilerStep#{i}" for i in range(steps)}


def test_cast_graph_found_from_launch_shape(cast_graph):
    b = cast_graph.main.breakdown
    assert b.decode_count == 3
    assert b.layers == 12
    assert 13.5 < b.step_ms.median < 14.5  # 13.97 ms on the H200; 13.51 ms unprofiled
    assert b.gpu_busy_fraction > 0.9  # the graph removed the host from the step
    f = finding(cast_graph, "kv_pool_cast")
    assert f is not None and cast_graph.findings[0] is f
    ev = f.evidence
    assert ev["from_graph"] is True and ev["op"] is None  # no CPU op under graph replay
    assert ev["bytes_source"] == "launch"
    assert ev["elements_per_call"] == POOL_ELEMENTS  # grid 557,496 x block 128 x 4 per thread
    assert ev["bytes_per_call"] == CAST_BYTES
    assert ev["calls_per_step"] == 12 and ev["calls_per_layer"] == 1
    assert 0.8 < ev["us_per_call"] / 1e3 < 0.9  # ~0.85 ms per 856 MB cast
    assert 0.7 < f.share < 0.8


def test_cast_eager_names_the_pool_shape(cast_eager):
    b = cast_eager.main.breakdown
    assert b.decode_count == 2 and b.layers == 12
    f = finding(cast_eager, "kv_pool_cast")
    assert f is not None
    ev = f.evidence
    assert ev["op"] == "aten::copy_" and ev["bytes_source"] == "shapes" and ev["from_graph"] is False
    assert ev["shape"] == [495_552, 1, 576]
    assert (ev["dtype_from"], ev["dtype_to"]) == ("fp8_e4m3", "bf16")
    assert ev["bytes_per_call"] == CAST_BYTES
    assert ev["calls_per_step"] == 12
    assert 9.5 < f.ms_per_step < 11  # 10.2 ms of GPU time per step
    # eager PyTorch with shapes recorded: the host is the other story
    assert finding(cast_eager, "host_bound") is not None


def test_gather_cast_eager_has_no_pool_cast(gather_cast_eager):
    b = gather_cast_eager.main.breakdown
    assert b.decode_count == 2 and b.layers == 12
    assert finding(gather_cast_eager, "kv_pool_cast") is None
    casts = [k for k in b.kernels if k.category == "cast" and k.input_shapes]
    # what is still cast: the 2,048 gathered rows per layer, [1, 2048, 576] -> 3.5 MB, not the 856 MB pool
    biggest = max(casts, key=lambda k: k.bytes_per_call or 0)
    assert biggest.input_shapes[0][0] == [1, 2048, 576]
    assert biggest.bytes_per_call == 2048 * 576 * 3
    assert sum(c.ms_per_step for c in b.categories if c.name == "cast") < 0.5
    assert b.gpu_ms_per_step < 4.0  # from 13.6 ms with the pool cast


def test_fix_removes_ten_ms_of_gpu_work_per_step(cast_eager, gather_cast_eager):
    before, after = cast_eager.main.breakdown, gather_cast_eager.main.breakdown
    assert 9.5 < before.gpu_ms_per_step - after.gpu_ms_per_step < 11


def test_bundled_example_is_the_demo_at_full_geometry(capsys):
    # the demo at full geometry, full_cast, replayed from a CUDA graph: no op shapes, the pool found from the
    # launch shape and the bundled GLM-5 config (what `decodegap analyze --example` does)
    from decodegap.cli import main

    try:
        main(["analyze", "--example", "--format", "json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    d = json.loads(capsys.readouterr().out)
    assert d["trace"]["device"] == "NVIDIA H200"
    # 3 complete steps: the last one's GPU-side annotation is cut short, but all of its kernels are in the trace
    assert d["steps"]["decode"]["count"] == 3 and d["layers"] == 78 and d["steps"]["dropped_partial"] == 0
    assert any("GPU-side annotation of ProfilerStep#2" in w for w in d["warnings"])
    assert 85 < d["steps"]["decode"]["ms"]["median"] < 100  # the incident: 93-95 ms per token
    f = d["findings"][0]
    assert f["id"] == "kv_pool_cast" and f["evidence"]["from_graph"] is True
    assert f["evidence"]["pool_slots"] == 495_552 and f["evidence"]["matches_model_kv_width"] is True
    assert f["evidence"]["calls_per_step"] == 78 and f["share"] > 0.6
    assert abs(f["evidence"]["bytes_per_step"] - 66.8e9) < 0.05 * 66.8e9
    assert f["evidence"]["active_tokens"] == 2048

"""analyze on hand-built traces: every Kineto flavour the loader must tolerate, and step detection."""

from __future__ import annotations

import pytest

from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict
from tracegen import decode_loop, write, write_kineto_layout


def _report(tmp_path, name="t.json", writer=write, **kw):
    return report_dict(analyze_path(writer(decode_loop(**kw), tmp_path / name)))


@pytest.mark.parametrize("markers", ["gpu", "cpu", None])
def test_steps_found_with_or_without_markers(tmp_path, markers):
    d = _report(tmp_path, markers=markers, steps=6, layers=5)
    assert d["steps"]["decode"]["count"] == 6  # without markers too: the cuts fall in the gaps between steps
    assert d["layers"] == 5
    expected = {"gpu": "profiler_step", "cpu": "profiler_step", None: "anchor_embedding"}[markers]
    assert d["steps"]["decode"]["source"] == d["steps"]["source"] == expected


def test_without_markers_last_step_is_kept(tmp_path):
    d = _report(tmp_path, markers=None, steps=8, layers=3, gap_us=500)
    # the cut lands in the inter-step gap, so only the first step (no gap before it) can be lost
    assert d["steps"]["decode"]["count"] >= 7


def test_prefill_told_apart(tmp_path):
    d = _report(tmp_path, markers="gpu", steps=5, layers=4, prefill=True)
    assert d["steps"]["prefill"]["count"] == 1 and d["steps"]["decode"]["count"] == 5


def test_cuda_graph_kernels_are_kept_and_attributed_to_the_graph(tmp_path):
    d = _report(tmp_path, markers="gpu", steps=4, layers=6, graph=True)
    assert d["steps"]["decode"]["count"] == 4 and d["layers"] == 6
    assert all(k["from_graph"] and k["op"] is None for k in d["kernels"])
    assert all(k["grid"] == "[132, 1, 1]" for k in d["kernels"])
    assert sum(k["calls_per_step"] for k in d["kernels"]) == 6 * 4 + 3


def test_rocm_integer_timestamps_old_categories(tmp_path):
    d = _report(tmp_path, rocm=True, integer_us=True, old_categories=True, steps=4, layers=3)
    assert d["steps"]["decode"]["count"] == 4
    assert d["trace"]["device"] == "AMD Instinct MI300X"
    gemm = [k for k in d["kernels"] if k["name"].startswith("Cijk_")]
    assert gemm and gemm[0]["category"] == "gemm" and gemm[0]["op"] == "aten::mm"
    assert d["launch_us_per_kernel"] == 5.0  # hipLaunchKernel counted as a launch


def test_streaming_layout_reads_the_same(tmp_path):
    plain = _report(tmp_path, "a.json", steps=4, layers=3)
    streamed = _report(tmp_path, "b.json.gz", writer=write_kineto_layout, steps=4, layers=3)
    for key in ("steps", "layers", "categories", "gpu_ms_per_step"):
        assert plain[key] == streamed[key]


def test_folder_of_ranks_reports_each_and_the_slowest(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write(decode_loop(steps=4, layers=3, collective_us=30.0), folder / "1700000000-TP-0-DECODE.trace.json.gz")
    write(decode_loop(steps=4, layers=3, collective_us=5.0, gap_us=200.0) | {},
          folder / "1700000000-TP-1-DECODE.trace.json.gz")
    d = report_dict(analyze_path(folder))
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["slowest_rank"] == 0  # rank 0's collectives take longer, so its steps do
    assert d["ranks"][0]["collective_ms_per_step"] > d["ranks"][1]["collective_ms_per_step"]


def test_rank_from_distributed_info_and_vllm_names(tmp_path):
    folder = tmp_path / "vllm"
    folder.mkdir()
    write(decode_loop(steps=3, layers=3, rank=1), folder / "a.json")
    write(decode_loop(steps=3, layers=3), folder / "worker-rank-0.1700000000.pt.trace.json.gz")
    d = report_dict(analyze_path(folder))
    assert sorted(r["rank"] for r in d["ranks"]) == [0, 1]


def test_healthy_trace_raises_no_finding(tmp_path):
    # dense GPU work, small gaps, no casts, no collectives: nothing to report
    d = _report(tmp_path, steps=5, layers=4, gap_us=2.0)
    assert d["findings"] == []
    assert d["gpu_busy_fraction"] > 0.9


def test_cut_off_last_step_is_dropped_not_called_prefill(tmp_path):
    # the profiler lost the end of the last step (seen under CUDA-graph replay): a subset of a decode step
    doc = decode_loop(steps=4, layers=6, gap_us=2.0)
    kernels = [e for e in doc["traceEvents"] if e["cat"] == "kernel"]
    lost = {id(e) for e in kernels[-len(kernels) // 8:]}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in lost]
    d = report_dict(analyze_path(write(doc, tmp_path / "t.json")))
    assert d["steps"]["decode"]["count"] == 3 and d["steps"]["prefill"]["count"] == 0
    assert d["steps"]["dropped_partial"] == 1
    assert any("partial" in w for w in d["warnings"])


def test_two_traces_claiming_one_rank_are_flagged(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    write(decode_loop(steps=3, layers=3), folder / "host.1.rank-0.decodegap.pt.trace.json.gz")
    write(decode_loop(steps=3, layers=3), folder / "host.2.rank-0.decodegap.pt.trace.json.gz")
    d = report_dict(analyze_path(folder))
    assert any("two traces claim rank 0" in w for w in d["warnings"])


def test_cuda_graph_trace_without_markers(tmp_path):
    # SGLang/vLLM decode under CUDA graphs: no ProfilerStep, every kernel replayed from a graph
    d = _report(tmp_path, markers=None, steps=6, layers=5, graph=True, gap_us=300.0)
    assert d["steps"]["decode"]["source"] == "graph_launch"
    assert d["steps"]["decode"]["count"] >= 5 and d["layers"] == 5
    assert all(k["from_graph"] for k in d["kernels"])

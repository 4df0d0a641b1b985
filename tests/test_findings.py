"""Each detector fires on the trace that shows its cause, and stays silent where it must."""

from __future__ import annotations

from pathlib import Path

from decodegap.analyze import AnalysisOptions, analyze_path
from decodegap.gap import prepare_model_options
from decodegap.report.json import report_dict
from tracegen import decode_loop, write

FIXTURES = Path(__file__).parent / "fixtures"
CAST = FIXTURES / "traces" / "mla_cast_eager_2steps.json.gz"
HF = FIXTURES / "traces" / "hf_llama_generate_6steps.json.gz"


def _ids(report) -> list[str]:
    return [f.id for f in report.findings]


def test_collective_bound_on_latency_bound_all_reduces(tmp_path):
    # hand-built: a 4-layer step whose NCCL all-reduce of 8 KB takes 60 us, 6x what its bytes need
    report = analyze_path(write(decode_loop(steps=4, layers=4, collective_us=60.0, gap_us=2.0), tmp_path / "t.json"))
    found = {f.id: f for f in report.findings}
    assert "collective_bound" in found
    ev = found["collective_bound"].evidence
    assert ev["calls_per_step"] == 4 and ev["groups"][0]["bytes_per_call"] == 8192
    assert ev["groups"][0]["slowdown"] > 4


def test_collective_bound_silent_when_collectives_are_cheap(tmp_path):
    report = analyze_path(write(decode_loop(steps=4, layers=4, collective_us=2.0, gap_us=2.0), tmp_path / "t.json"))
    assert "collective_bound" not in _ids(report) and "straggler_rank" not in _ids(report)


def test_straggler_named_across_ranks(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    # rank 0 waits 80 us per all-reduce for rank 1, which arrives last and waits 5 us
    write(decode_loop(steps=4, layers=6, collective_us=80.0, gap_us=2.0, rank=0), folder / "r0.json")
    write(decode_loop(steps=4, layers=6, collective_us=5.0, gap_us=2.0, rank=1), folder / "r1.json")
    report = analyze_path(folder)
    straggler = [f for f in report.findings if f.id == "straggler_rank"]
    assert straggler and straggler[0].evidence["straggler_rank"] == 1
    assert report_dict(report)["slowest_rank"] == 0


def test_host_bound_silent_on_dense_steps(tmp_path):
    report = analyze_path(write(decode_loop(steps=4, layers=4, gap_us=1.0), tmp_path / "t.json"))
    assert "host_bound" not in _ids(report)


def test_weight_copy_on_expert_gathers_and_silent_on_llama():
    assert "weight_copy" in _ids(analyze_path(CAST))
    assert "weight_copy" not in _ids(analyze_path(HF))


def test_profiler_cross_check():
    slower = analyze_path(CAST, AnalysisOptions(tpot_ms=109.1))
    f = next(f for f in slower.findings if f.id == "profiler_overhead")
    assert f.evidence["unprofiled_ms"] == 109.1 and f.evidence["ratio"] > 1.3
    assert "profiler_overhead" not in _ids(analyze_path(CAST, AnalysisOptions(tpot_ms=140.0)))
    outside = analyze_path(HF, AnalysisOptions(tpot_ms=60.0))
    assert "outside_step" in _ids(outside)


def test_kv_pool_cast_with_model_matches_the_latent_width():
    options = AnalysisOptions()
    prepare_model_options(options, FIXTURES / "configs" / "deepseek-v3.json", None, None, None, "h200", 8, 1, 2048,
                          None)
    report = analyze_path(CAST, options)
    cast = report.findings[0]
    assert cast.id == "kv_pool_cast"
    assert cast.evidence["matches_model_kv_width"] is True and cast.evidence["model_kv_width"] == 576
    assert cast.evidence["active_tokens"] == 2048 and cast.evidence["active_fraction"] < 0.01
    assert "kv_lora_rank + qk_rope_head_dim" in cast.title
    gap = report_dict(report)["gap"]
    assert gap["floor_ms"] > 0 and gap["step_ms"] > gap["floor_ms"]
    assert gap["explained_by_findings_ms"] > 0.8 * gap["excess_ms"]
    cast_row = next(r for r in gap["rows"] if r["category"] == "cast")
    assert cast_row["floor_ms"] == 0 and cast_row["excess_ms"] > 60


def test_kv_pool_cast_silent_for_a_model_with_another_kv_width():
    options = AnalysisOptions()
    prepare_model_options(options, FIXTURES / "configs" / "llama-3.1-8b.json", None, None, None, None, 1, 1, None,
                          None)
    assert "kv_pool_cast" not in _ids(analyze_path(CAST, options))


FULL_POOL_CAST = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
                  "::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, "
                  "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, "
                  "unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >")


def _graph_cast_trace(tmp_path):
    doc = decode_loop(steps=3, layers=6, graph=True, gap_us=2.0, extra_layer_kernels=((FULL_POOL_CAST, "cast", 860.0),))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"] == FULL_POOL_CAST:
            e["args"]["grid"], e["args"]["block"] = [557496, 1, 1], [128, 1, 1]
    return write(doc, tmp_path / "graph.json")


def test_kv_pool_cast_under_cuda_graph_from_launch_shape(tmp_path):
    # hand-built like the incident under CUDA-graph replay: no CPU op, so no shapes; grid x block x 4 elements
    report = analyze_path(_graph_cast_trace(tmp_path))
    cast = report.findings[0]
    assert cast.id == "kv_pool_cast" and cast.evidence["from_graph"] is True
    assert cast.evidence["elements_per_call"] == 557496 * 128 * 4
    assert cast.evidence["bytes_source"] == "launch"
    assert cast.evidence["calls_per_step"] == 6 and cast.evidence["layers"] == 6


def test_kv_pool_cast_under_cuda_graph_with_model_finds_the_pool(tmp_path):
    options = AnalysisOptions()
    prepare_model_options(options, FIXTURES / "configs" / "deepseek-v3.json", None, None, None, None, 1, 1, 2048,
                          None)
    cast = analyze_path(_graph_cast_trace(tmp_path), options).findings[0]
    assert cast.evidence["pool_slots"] == 495552 and cast.evidence["row_elements"] == 576
    assert cast.evidence["matches_model_kv_width"] is True
    assert cast.evidence["active_fraction"] == round(2048 / 495552, 6)

"""What each fix would buy (issue 23): every finding's `after_fix`, the report's `best_case`, and the diff's prediction,
from the trace's own numbers on committed fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

import decodegap
from decodegap.cli import main
from decodegap.report.markdown import render_markdown
from decodegap.report.html import render_html
from decodegap.report.text import render_text

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
DEMO_RANK = ROOT / "tests" / "fixtures" / "configs" / "glm5-demo-rank.json"
POOL_SLOTS, ACTIVE = 495_552, 2_048


@pytest.fixture(scope="module")
def example():
    return decodegap.analyze(decodegap.EXAMPLE_TRACE)  # its own config and 2,048 active tokens, assumed


def test_kv_pool_cast_predicts_the_step_with_the_cast_of_the_active_tokens_only(example):
    """The bundled example is the demo's full_cast on an H200 under CUDA graphs: the cast of the whole 495,552-slot
    pool, 78 times per step. Fixed, it casts the 2,048 active tokens at the bandwidth the kernel reached (its time
    scales with its bytes). On the H200 run of the same demo (decodegap demo --compare --scale full --cuda-graph) the
    estimate was 26.128 ms against gather-then-cast's measured 26.049 ms (profiled, as this step is)."""
    f = example.findings[0]
    step = example.steps.decode.ms.median
    assert f.id == "kv_pool_cast" and step == pytest.approx(91.8911)
    cast_after = f.ms_per_step * ACTIVE / POOL_SLOTS
    assert cast_after == pytest.approx(0.274, abs=5e-4)
    assert f.after_fix.step_ms == pytest.approx(step - f.ms_per_step + cast_after, abs=1e-4)
    assert f.after_fix.step_ms == pytest.approx(25.8649, abs=1e-4)
    assert f.after_fix.tokens_per_s == pytest.approx(1e3 / 25.8649, abs=1e-3)
    assumes = f.after_fix.assumes
    assert "2,048 active tokens of the 495,552-slot pool" in assumes and "1,007 GB/s" in assumes
    assert "0.274 ms per step instead of 66.300" in assumes
    # one finding with an estimate: the best case is its estimate
    assert example.best_case.findings == ["kv_pool_cast"]
    assert example.best_case.step_ms == f.after_fix.step_ms


def test_kv_pool_cast_without_the_active_tokens_has_no_estimate():
    a = decodegap.analyze(FIXTURES / "cast_graph.json.gz")  # no model, no context: the pool's size is not known
    f = next(f for f in a.findings if f.id == "kv_pool_cast")
    assert f.after_fix is None and a.best_case is None


def test_host_bound_predicts_the_gpu_work_from_one_graph_launch():
    a = decodegap.analyze(FIXTURES / "hf_llama_generate_6steps.json.gz")
    f = next(f for f in a.findings if f.id == "host_bound")
    busy = a.steps.decode.ms.median - f.ms_per_step  # host_bound's cost is the step's GPU idle time
    launch_us = f.evidence["launch_us_per_kernel"]  # no graph in this eager trace: one launch call
    assert f.after_fix.step_ms == pytest.approx(busy + launch_us / 1e3, abs=2e-4)
    assert "the trace's median launch call" in f.after_fix.assumes


def test_best_case_adds_the_fixes_that_take_from_different_parts_of_the_step():
    a = decodegap.analyze(FIXTURES / "mla_cast_eager_2steps.json.gz", model=DEMO_RANK, context=ACTIVE)
    by_id = {f.id: f for f in a.findings}
    assert set(by_id) >= {"kv_pool_cast", "host_bound", "weight_copy"}
    step = a.steps.decode.ms.median
    saved = sum(step - by_id[i].after_fix.step_ms for i in ("kv_pool_cast", "host_bound", "weight_copy"))
    assert a.best_case.findings == [f.id for f in a.findings if f.after_fix is not None]
    assert a.best_case.step_ms == pytest.approx(step - saved, abs=2e-4)
    # GPU work taken out of a host-bound step only shortens it once the host keeps up: the estimate says so
    assert "host-bound" in by_id["kv_pool_cast"].after_fix.assumes


def test_measurement_findings_have_no_estimate():
    a = decodegap.analyze(FIXTURES / "cast_eager.json.gz")
    f = next(f for f in a.findings if f.id == "profiler_overhead")
    assert f.after_fix is None and "profiler_overhead" not in a.best_case.findings


def test_every_view_shows_the_estimate_beside_its_finding(example):
    f = example.findings[0]
    shown = "25.865 ms/step = 38.7 tok/s per sequence"
    text = render_text(example, width=200)
    assert f"66.300 ms/step (75% of the step's GPU time); after the fix: {shown}" in text
    assert "the estimate assumes the cast reads only the 2,048 active tokens" in text
    assert f"after the fix: **{shown}**" in render_markdown(example)
    assert f"after the fix: <b>{shown}</b>" in render_html(example)
    assert f.after_fix.assumes.split(" (")[0] in render_html(example)


def test_diff_puts_the_predicted_step_beside_the_measured_one(capsys):
    args = ["diff", str(FIXTURES / "cast_eager.json.gz"), str(FIXTURES / "gather_cast_eager.json.gz"),
            "--model", str(DEMO_RANK), "--context", str(ACTIVE)]
    d = decodegap.diff(FIXTURES / "cast_eager.json.gz", FIXTURES / "gather_cast_eager.json.gz", model=DEMO_RANK,
                       context=ACTIVE)
    before = decodegap.analyze(FIXTURES / "cast_eager.json.gz", model=DEMO_RANK, context=ACTIVE)
    cast = next(f for f in before.findings if f.id == "kv_pool_cast")
    assert d["predicted"] == {"step_ms": cast.after_fix.step_ms, "findings": ["kv_pool_cast"],
                              "measured_ms": d["after"]["step_ms"],
                              "off_pct": round((d["after"]["step_ms"] / cast.after_fix.step_ms - 1) * 100, 2)}
    rows = {r["id"]: r for r in d["findings"]}
    assert rows["kv_pool_cast"]["predicted_step_ms"] == cast.after_fix.step_ms
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    assert (f"predicted by before's findings once kv_pool_cast is fixed: {cast.after_fix.step_ms:.3f} ms; measured "
            f"{d['after']['step_ms']:.3f} ms ({d['predicted']['off_pct']:+.1f}%)") in out


def test_a_report_saved_before_the_estimates_reads_back(tmp_path, example):
    import json

    data = example.to_dict()
    del data["best_case"]
    for f in data["findings"]:
        del f["after_fix"]
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(data))
    old = decodegap.load(saved)
    assert old.best_case is None and old.findings[0].after_fix is None
    assert decodegap.diff(saved, saved)["predicted"] is None

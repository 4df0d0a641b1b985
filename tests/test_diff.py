"""decodegap diff on committed fixtures and saved reports."""

from __future__ import annotations

import json
from pathlib import Path

from decodegap.pipeline import analyze_path
from decodegap.cli import main
from decodegap.api import load_report
from decodegap.report.diff import diff_reports, render_diff
from decodegap.report.json import render_json
from tracegen import decode_loop, write

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
CAST = FIXTURES / "mla_cast_eager_2steps.json.gz"


def test_diff_of_a_fix(tmp_path):
    # before: a slow step with a per-layer cast; after: the same loop without it
    cast = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda, LoadWithCast<1>>"
    before = decode_loop(steps=4, layers=4, gap_us=2.0, extra_layer_kernels=((cast, "cast", 400.0),))
    after = decode_loop(steps=4, layers=4, gap_us=2.0)
    b = load_report(write(before, tmp_path / "before.json"))
    a = load_report(write(after, tmp_path / "after.json"))
    d = diff_reports(b, a)
    assert d["speedup"] > 1.5
    statuses = {k["status"] for k in d["kernels"]}
    assert statuses == {"gone"}
    gone = [k for k in d["kernels"] if k["status"] == "gone"]
    assert gone[0]["category"] == "cast" and gone[0]["before_calls"] == 4
    cats = {c["name"]: c for c in d["categories"]}
    assert cats["cast"]["delta_ms"] < -1.5
    for fmt in ("text", "md", "json"):
        out = render_diff(d, fmt)
        assert "cast" in out
    assert json.loads(render_diff(d, "json"))["schema"] == "decodegap.diff/1"


def test_diff_reads_saved_reports_and_traces_alike(tmp_path, capsys):
    saved = tmp_path / "report.json"
    saved.write_text(render_json(analyze_path(CAST)))
    assert load_report(saved) == json.loads(saved.read_text())
    try:
        main(["diff", str(saved), str(CAST), "--format", "json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    d = json.loads(capsys.readouterr().out)
    assert d["speedup"] == 1.0 and d["kernels"] == [] and d["findings_appeared"] == []


def test_diff_missing_input(tmp_path, capsys):
    try:
        main(["diff", str(tmp_path / "a.json"), str(CAST)])
    except SystemExit as exc:
        assert exc.code == 2
    err = capsys.readouterr().err
    assert err.startswith("decodegap: error:") and "no such file" in err


def test_diff_of_the_demo_fix_on_h200_fixtures():
    # the demo on an H200, eager: full_cast before, gather_cast after (tests/fixtures/traces, made by the demo)
    d = diff_reports(load_report(FIXTURES / "cast_eager.json.gz"), load_report(FIXTURES / "gather_cast_eager.json.gz"))
    assert "kv_pool_cast" in d["findings_vanished"] and "kv_pool_cast" not in d["findings_appeared"]
    gone = [k for k in d["kernels"] if k["status"] == "gone" and k["category"] == "cast"]
    assert gone and max(k["before_ms"] for k in gone) > 10
    cats = {c["name"]: c for c in d["categories"]}
    assert cats["cast"]["delta_ms"] < -10


# --- the diff's additions: GPU idle, findings gone/kept/new, kernels matched across eager and graph, warnings ---

POOL_CAST = "LoadWithCast"  # the demo's pool-wide cast kernel (a BF16 lambda over an FP8 pool)


def test_eager_and_graph_replay_match_kernels_by_name():
    # the same 12-per-step pool cast: eager groups by op shapes, graph replay by grid; it must not be gone + new
    d = diff_reports(load_report(FIXTURES / "cast_eager.json.gz"), load_report(FIXTURES / "cast_graph.json.gz"))
    pool = [k for k in d["kernels"] if POOL_CAST in k["name"] and "BFloat16)#1}" in k["name"]]
    assert not [k for k in pool if k["status"] in ("gone", "new")]
    assert "kv_pool_cast" in d["findings_kept"]
    both = {k["name"] for k in d["kernels"] if k["status"] == "gone"} & \
        {k["name"] for k in d["kernels"] if k["status"] == "new"}
    assert not both  # no kernel name is gone and new at once across the two kinds of grouping


def test_match_kernels_splits_only_groups_of_one_kind():
    from decodegap.report.diff import match_kernels

    def group(shapes=None, grid=None, ms=1.0, calls=2.0):
        return {"name": "k", "category": "gemm", "ms_per_step": ms, "calls_per_step": calls,
                "input_shapes": shapes, "grid": grid, "block": "[128, 1, 1]" if grid else None}

    eager = [group(shapes=[[[1, 8], "bf16"]]), group(shapes=[[[4, 8], "bf16"]], ms=3.0)]
    graph = [group(grid="[4, 1, 1]", ms=2.0), group(grid="[8, 1, 1]", ms=1.0)]
    pairs = match_kernels(eager, graph)
    assert len(pairs) == 1 and pairs[0][2] == "name"
    assert pairs[0][0]["ms_per_step"] == 4.0 and pairs[0][1]["ms_per_step"] == 3.0
    assert pairs[0][0]["calls_per_step"] == 4.0
    same_kind = match_kernels(eager, [group(shapes=[[[1, 8], "bf16"]], ms=0.5)])
    assert sorted((o is not None, n is not None, how) for o, n, how in same_kind) == \
        [(True, False, "shapes"), (True, True, "shapes")]


def test_gpu_idle_row_and_findings_gone_kept_new():
    before, after = load_report(FIXTURES / "cast_eager.json.gz"), load_report(FIXTURES / "gather_cast_eager.json.gz")
    d = diff_reports(before, after)
    assert d["gpu_idle"] == {"before_ms": before["idle_ms_per_step"], "after_ms": after["idle_ms_per_step"],
                             "delta_ms": round(after["idle_ms_per_step"] - before["idle_ms_per_step"], 4)}
    rows = {f["id"]: f for f in d["findings"]}
    assert rows["kv_pool_cast"]["status"] == "gone" and rows["kv_pool_cast"]["after_ms"] is None
    assert rows["host_bound"]["status"] == "kept" and rows["host_bound"]["before_ms"] > 50
    assert d["findings_kept"] == sorted(i for i, f in rows.items() if f["status"] == "kept")
    text = render_diff(d)
    assert "(GPU idle)" in text and f"{after['idle_ms_per_step']:.3f}" in text
    assert "findings gone: kv_pool_cast" in text and "kept: host_bound" in text
    md = render_diff(d, "md")
    assert "| (GPU idle) |" in md


def test_warning_when_the_sides_are_different_workloads(tmp_path):
    h200 = load_report(write(decode_loop(steps=4, layers=4), tmp_path / "h200.json"))
    mi300 = load_report(write(decode_loop(steps=4, layers=4, rocm=True), tmp_path / "mi300.json"))
    deeper = load_report(write(decode_loop(steps=4, layers=6), tmp_path / "deeper.json"))
    assert diff_reports(h200, h200)["warnings"] == []
    gpu = diff_reports(h200, mi300)["warnings"]
    assert len(gpu) == 1 and "GPU" in gpu[0] and "NVIDIA H200" in gpu[0] and "MI300X" in gpu[0]
    layers = diff_reports(h200, deeper)["warnings"]
    assert len(layers) == 1 and "layer count: 4 before, 6 after" in layers[0]
    models = diff_reports({**h200, "floor": {"model_type": "llama"}}, {**h200, "floor": {"model_type": "qwen3"}})
    assert len(models["warnings"]) == 1 and "llama" in models["warnings"][0]
    assert "warning: the two sides differ in GPU" in render_diff(diff_reports(h200, mi300))


# --- the CI gate: diff --fail-if-slower PCT -------------------------------------------------------------------

def _gate(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(["diff", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_gate_on_the_h200_fixtures_traces_and_saved_reports(tmp_path, capsys):
    bug, fix = FIXTURES / "cast_eager.json.gz", FIXTURES / "gather_cast_eager.json.gz"  # 66.1 vs 62.4 ms
    saved = {}
    for name, path in (("bug", bug), ("fix", fix)):
        saved[name] = tmp_path / f"{name}.json"
        main_code = _gate_analyze(path, saved[name], capsys)
        assert main_code == 0 and saved[name].exists()
    for before, after in ((bug, fix), (saved["bug"], saved["fix"])):
        code, out, _ = _gate([str(before), str(after), "--fail-if-slower", "5"], capsys)
        assert code == 0
        assert out.strip().splitlines()[-1].startswith("decodegap gate: PASS: median step 66.132 -> 62.392 ms")
        code, out, _ = _gate([str(after), str(before), "--fail-if-slower", "5"], capsys)
        assert code == 1
        verdict = out.strip().splitlines()[-1]
        assert verdict.startswith("decodegap gate: FAIL") and "6.0% slower; limit 5% slower" in verdict
        # a looser limit lets the same regression through
        assert _gate([str(after), str(before), "--fail-if-slower", "7"], capsys)[0] == 0


def _gate_analyze(trace: Path, out: Path, capsys) -> int:
    try:
        main(["analyze", str(trace), "--format", "json", "-o", str(out)])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    capsys.readouterr()
    return code


def test_gate_on_tracegen_pairs_json_format(tmp_path, capsys):
    cast = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda, LoadWithCast<1>>"
    slow = write(decode_loop(steps=4, layers=4, extra_layer_kernels=((cast, "cast", 400.0),)), tmp_path / "s.json")
    fast = write(decode_loop(steps=4, layers=4), tmp_path / "f.json")
    code, out, err = _gate([str(slow), str(fast), "--fail-if-slower", "0", "--format", "json"], capsys)
    assert code == 0
    gate = json.loads(out)["gate"]  # stdout stays JSON; the verdict goes to stderr
    assert gate["failed"] is False and gate["slower_pct"] < -50 and gate["limit_pct"] == 0
    assert err.startswith("decodegap gate: PASS")
    code, out, err = _gate([str(fast), str(slow), "--fail-if-slower", "0", "--format", "json"], capsys)
    assert code == 1 and json.loads(out)["gate"]["failed"] is True and err.startswith("decodegap gate: FAIL")
    # the same trace on both sides is no regression, even at a 0% limit
    assert _gate([str(fast), str(fast), "--fail-if-slower", "0"], capsys)[0] == 0


def test_gate_refuses_a_bad_percentage(tmp_path, capsys):
    for bad in ("-1", "nan", "inf", "five"):
        code, out, err = _gate([str(CAST), str(CAST), "--fail-if-slower", bad], capsys)
        assert code == 2, bad
        assert err.startswith("decodegap: error:") and len(err.strip().splitlines()) == 1
        assert out == ""


def test_a_report_against_itself_is_no_change(tmp_path, capsys):
    # issue 24: no "1.00x faster", no "-0.0% faster", no empty table under "changed"
    saved = tmp_path / "report.json"
    saved.write_text(render_json(analyze_path(CAST)))
    for fmt in ("text", "md"):
        try:
            main(["diff", str(saved), str(CAST), "--fail-if-slower", "5", "--format", fmt])
        except SystemExit as exc:
            assert exc.code in (0, None)
        out = capsys.readouterr().out
        assert "(no change)" in out.splitlines()[2]
        assert "x faster" not in out and "0.0%" not in out and "status" not in out
        assert "kernel groups: none changed (" in out
        assert out.rstrip().endswith("(no change; limit 5% slower)")


def test_slower_and_faster_are_worded_as_such():
    def side(ms):
        return {"path": "x", "step_ms": ms}

    d = {"before": side(10.0), "after": side(12.5), "speedup": 0.8, "step_delta_ms": 2.5, "categories": [],
         "kernels": [], "unchanged_kernel_groups": 0}
    assert "(+2.500 ms, 1.25x slower)" in render_diff(d)
    d.update(after=side(8.0), speedup=1.25, step_delta_ms=-2.0)
    assert "(-2.000 ms, 1.25x faster)" in render_diff(d)


def test_cpu_only_traces_have_no_gpu_idle_row(tmp_path):
    doc = decode_loop(steps=3, layers=2)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] in ("cpu_op", "user_annotation")]
    report = load_report(write(doc, tmp_path / "cpu.json"))
    assert report["idle_ms_per_step"] is None  # no GPU, no GPU idle time
    d = diff_reports(report, report)
    assert d["gpu_idle"] is None and "(GPU idle)" not in render_diff(d)
    # an older saved report of a CPU-only trace still carries a number: it is not shown either
    old = {**report, "idle_ms_per_step": 0.129}
    assert diff_reports(old, old)["gpu_idle"] is None

"""decodegap diff on committed fixtures and saved reports."""

from __future__ import annotations

import json
from pathlib import Path

from decodegap.pipeline import analyze_path
from decodegap.cli import main
from decodegap.compare import diff_reports, load_report, render_diff
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

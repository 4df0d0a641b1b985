"""Bad input gets one clear line on stderr and exit code 2, or a report with warnings: never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodegap.pipeline import analyze_path
from decodegap.errors import UserError
from decodegap.report.json import report_dict
from decodegap.trace import load_trace
from tracegen import decode_loop, write, write_kineto_layout
from clitool import run_cli


def assert_one_line_error(args, capsys, *fragments):
    code, out, err = run_cli(args, capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decodegap: error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_path(tmp_path, capsys):
    assert_one_line_error(["analyze", str(tmp_path / "nope.json")], capsys, "no such file")


def test_a_pipe_is_refused_not_waited_on(tmp_path, capsys):
    # a named pipe no one writes to hung analyze and diff (the refusal's wording opened it to look at its first
    # bytes), and a pipe, /dev/null or <(zcat trace.json.gz) was called "the folder" holding no trace files
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    trace = write(decode_loop(steps=4, layers=2, markers=None), tmp_path / "t.json")
    for args in (["analyze", str(fifo)], ["diff", str(trace), str(fifo)], ["analyze", "/dev/null"]):
        assert_one_line_error(args, capsys, "not a file or folder (a pipe, socket or device)")
    (tmp_path / "ranks").mkdir()  # in a folder, a pipe is no trace file: skipped
    os.mkfifo(tmp_path / "ranks" / "r1.json")
    write(decode_loop(steps=4, layers=2, markers=None), tmp_path / "ranks" / "r0.json")
    code, out, err = run_cli(["analyze", str(tmp_path / "ranks")], capsys)
    assert code == 0 and "Traceback" not in err


def test_folder_without_traces(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hi")
    assert_one_line_error(["analyze", str(tmp_path)], capsys, "no trace files")


def test_empty_file(tmp_path, capsys):
    (tmp_path / "t.json").write_text("")
    assert_one_line_error(["analyze", str(tmp_path / "t.json")], capsys, "empty")


def test_not_json(tmp_path, capsys):
    (tmp_path / "t.json").write_text("this is not json at all")
    assert_one_line_error(["analyze", str(tmp_path / "t.json")], capsys, "not a JSON trace")


def test_json_without_events(tmp_path, capsys):
    (tmp_path / "t.json").write_text(json.dumps({"schemaVersion": 1}))
    assert_one_line_error(["analyze", str(tmp_path / "t.json")], capsys, "no traceEvents")


def test_json_with_empty_events(tmp_path, capsys):
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": []}))
    assert_one_line_error(["analyze", str(tmp_path / "t.json")], capsys, "no profiler events")


def test_truncated_json_plain_layout_keeps_the_events_before_the_cut(tmp_path):
    """A cut one-line trace reads like a cut trace in Kineto's layout: its whole events, then the truncation check."""
    doc = decode_loop(steps=6, layers=3)
    events = [json.dumps(e) for e in doc["traceEvents"]]
    whole = len(events) // 2
    text = json.dumps(doc)
    cut = text.index(events[whole]) + len(events[whole]) // 2  # halfway through an event
    (tmp_path / "t.json").write_text(text[:cut])
    kineto = write_kineto_layout(doc, tmp_path / "k.json").read_text()
    (tmp_path / "k.json").write_text(kineto[: kineto.index(events[whole]) + len(events[whole]) // 2])
    one_line, reference = load_trace(tmp_path / "t.json"), load_trace(tmp_path / "k.json")
    assert len(one_line.gpu) == len(reference.gpu) > 0 and one_line.warnings == reference.warnings
    assert any("truncated" in w for w in one_line.warnings)


def test_json_cut_before_its_events_is_refused(tmp_path, capsys):
    text = json.dumps(decode_loop(steps=3, layers=2))
    (tmp_path / "t.json").write_text(text[: text.index('"traceEvents"') + 5])
    assert_one_line_error(["analyze", str(tmp_path / "t.json")], capsys, "the JSON is truncated")


def test_truncated_kineto_layout_is_salvaged_with_a_warning(tmp_path):
    path = write_kineto_layout(decode_loop(steps=6, layers=3), tmp_path / "t.json")
    text = path.read_text()
    path.write_text(text[: int(len(text) * 0.8)])
    report = analyze_path(path)
    assert any("truncated" in w for w in report.warnings)
    assert report.main.breakdown.decode_count >= 3


def test_truncated_gzip(tmp_path, capsys):
    path = write(decode_loop(steps=3, layers=2), tmp_path / "t.json.gz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    code, out, err = run_cli(["analyze", str(path)], capsys)
    assert "Traceback" not in err
    assert (code == 2 and "truncated" in err) or (code == 0 and "truncated" in out)


def test_not_gzip_despite_magic(tmp_path, capsys):
    (tmp_path / "t.json.gz").write_bytes(b"\x1f\x8b" + os.urandom(200))
    code, _, err = run_cli(["analyze", str(tmp_path / "t.json.gz")], capsys)
    assert code == 2 and err.startswith("decodegap: error:") and len(err.strip().splitlines()) == 1


def test_odd_events_are_skipped_with_a_warning(tmp_path):
    doc = decode_loop(steps=4, layers=3)
    doc["traceEvents"] += [5, "x", None, [1, 2], {"ph": "X", "cat": "kernel"}, {"ph": "X", "cat": "kernel",
                           "name": "k", "ts": "not a number", "dur": 1}, {"ph": "X", "cat": "kernel", "name": "k",
                           "ts": 1.0, "dur": -5}, {"ph": "X", "cat": "kernel", "name": {"a": 1}, "ts": 1, "dur": 1},
                           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 1,
                            "args": {"External id": {"bad": 1}, "Input Dims": "weird"}}]
    report = analyze_path(write(doc, tmp_path / "t.json"))
    assert report.main.breakdown.decode_count == 4
    assert any("skipped" in w for w in report.warnings)


def test_numbers_as_strings_are_accepted(tmp_path):
    doc = decode_loop(steps=3, layers=2)
    for e in doc["traceEvents"]:
        e["ts"] = str(e["ts"])
        e["dur"] = str(e["dur"])
    report = analyze_path(write(doc, tmp_path / "t.json"))
    assert report.main.breakdown.decode_count == 3 and not report.warnings


def test_cpu_only_trace_gives_cpu_op_breakdown_with_a_warning(tmp_path):
    doc = decode_loop(steps=3, layers=2)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] in ("cpu_op", "user_annotation")]
    d = report_dict(analyze_path(write(doc, tmp_path / "t.json")))
    assert d["steps"]["decode"]["count"] == 3
    assert any("no GPU events" in w for w in d["warnings"])
    assert {k["name"] for k in d["kernels"]} >= {"aten::mm", "aten::add"}


def test_huge_decompressed_size_is_refused(tmp_path, capsys, monkeypatch):
    path = write(decode_loop(steps=3, layers=2), tmp_path / "t.json.gz")
    monkeypatch.setenv("DECODEGAP_MAX_TRACE_BYTES", "1000")
    assert_one_line_error(["analyze", str(path)], capsys, "GB", "DECODEGAP_MAX_TRACE_BYTES")


def test_bad_flags(tmp_path, capsys):
    assert_one_line_error(["analyze", "--format", "xml", "x"], capsys, "--format")
    assert_one_line_error(["analyze", "--tpot", "-3", "x"], capsys, "--tpot")
    assert_one_line_error(["analyze"], capsys, "missing TRACE")
    assert_one_line_error(["nosuchcommand"], capsys)


def test_input_file_is_never_changed(tmp_path):
    path = write(decode_loop(steps=3, layers=2), tmp_path / "t.json.gz")
    before = path.read_bytes()
    analyze_path(path)
    assert path.read_bytes() == before


def test_cli_never_prints_a_traceback_in_a_real_process(tmp_path):
    (tmp_path / "t.json").write_text("{\"traceEvents\": [")
    result = subprocess.run([sys.executable, "-m", "decodegap", "analyze", str(tmp_path / "t.json")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("decodegap: error:")


VALID = json.dumps(decode_loop(steps=3, layers=2)).encode()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_loader_accepts_only_documented_errors(tmp_path, data):
    """Random corruption of a valid trace: the loader returns a Trace or raises UserError, nothing else."""
    kind = data.draw(st.sampled_from(["truncate", "flip", "insert", "random", "gzip"]))
    blob = bytearray(VALID)
    if kind == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 20))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    elif kind == "insert":
        pos = data.draw(st.integers(0, len(blob)))
        blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=40))
    elif kind == "random":
        blob = bytearray(data.draw(st.binary(max_size=300)))
    else:
        blob = bytearray(gzip.compress(bytes(blob)))
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    path = Path(tmp_path) / "fuzz.json"
    path.write_bytes(bytes(blob))
    try:
        trace = load_trace(path)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert trace.gpu.ts_ns.dtype.kind == "i"

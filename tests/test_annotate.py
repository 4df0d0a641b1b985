"""`analyze --annotate`: the trace with decodegap's steps, layers and findings added, for Perfetto."""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
from pathlib import Path

import pytest

from decodegap.report.annotate import PID
from decodegap.api import annotate, run
from decodegap.cli import main
from layouts import LAYOUTS, write_layout
from tracegen import decode_loop, engine_forwards, write, write_kineto_layout

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def _read(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ours(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("pid") == PID]


def _theirs(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("pid") != PID]


def _spans(doc: dict, prefix: str) -> list[dict]:
    return [e for e in _ours(doc) if e.get("ph") == "X" and e["name"].startswith(prefix)]


def _ns(us: float) -> int:
    return round(us * 1000)


def _kernels(doc: dict) -> list[tuple[int, int, str]]:
    return sorted((_ns(e["ts"]), _ns(e["dur"]), e["name"]) for e in _theirs(doc) if e.get("cat") == "kernel")


def _kernel_under(kernels: list[tuple[int, int, str]], span: dict) -> str | None:
    """The kernel a span covers: same duration, same start within 1 ns (epoch-scale microseconds read as float64
    keep about a nanosecond, in the loader as here)."""
    ts, dur = _ns(span["ts"]), _ns(span["dur"])
    i = bisect.bisect_left(kernels, (ts - 1,))
    return next((name for t, d, name in kernels[i:i + 4] if abs(t - ts) <= 1 and d == dur), None)


def _check_nesting(doc: dict) -> None:
    """Perfetto draws a thread's complete events only when they nest: no span may end inside a later one."""
    by_tid: dict[int, list] = {}
    for e in _ours(doc):
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append((_ns(e["ts"]), -_ns(e["dur"]), e["name"]))
    for spans in by_tid.values():
        stack: list[int] = []
        for start, neg_dur, _ in sorted(spans):
            end = start - neg_dur
            while stack and stack[-1] + 2 <= start:  # 2 ns apart: a float64 reader may move an end by 1 ns
                stack.pop()
            assert not stack or end <= stack[-1], "spans of one thread overlap without nesting"
            stack.append(end)


def _check_layers_in_steps(doc: dict, layers_per_step: int) -> None:
    steps = _spans(doc, "decode step") + _spans(doc, "prefill step")
    layers = _spans(doc, "layer ")
    for step in steps:
        lo, hi = _ns(step["ts"]), _ns(step["ts"]) + _ns(step["dur"])
        inside = [la for la in layers if la["args"]["step"] == step["args"]["index"]]
        assert len(inside) == layers_per_step
        assert [la["name"] for la in inside] == [f"layer {i}" for i in range(layers_per_step)]
        for la in inside:
            assert la["tid"] == step["tid"]
            assert lo <= _ns(la["ts"]) and _ns(la["ts"]) + _ns(la["dur"]) <= hi
    assert len(layers) == layers_per_step * len(steps)


def test_marker_less_decode_loop(tmp_path):
    doc = decode_loop(steps=5, layers=6, markers=None)
    doc["baseTimeNanoseconds"] = 1_790_857_026_000_000_000  # the loader adds it to its origin; it must come off
    src = write(doc, tmp_path / "loop.json")
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    report = run(src)
    found = report.ranks[0].steps.steps
    assert report.ranks[0].steps.source == "anchor_embedding" and len(found) == 5
    out = tmp_path / "loop.annotated.json.gz"
    assert annotate(src, out) == [out]
    new = _read(out)
    assert _theirs(new) == doc["traceEvents"]  # every original event, unchanged, in order
    assert {k for k in new if k != "traceEvents"} == {k for k in doc if k != "traceEvents"}
    steps = _spans(new, "decode step")
    assert len(steps) == len(found)
    assert [s["name"] for s in steps] == [f"decode step {s.index}" for s in found]
    _check_layers_in_steps(new, 6)
    _check_nesting(new)
    assert all(e["cat"] == "decodegap" for e in _ours(new) if e["ph"] != "M")
    meta = {(e["name"], e["args"]["name"]) for e in _ours(new) if e["ph"] == "M" and "name" in e["args"]}
    assert ("process_name", "decodegap") in meta and ("thread_name", "steps and layers") in meta
    # on the trace's own clock: each layer starts where its first kernel starts
    kernel_starts = {_ns(e["ts"]) for e in doc["traceEvents"] if e["cat"] == "kernel"}
    assert all(_ns(la["ts"]) in kernel_starts for la in _spans(new, "layer "))
    first_kernel = min(e["ts"] for e in doc["traceEvents"] if e["cat"] == "kernel")
    assert min(s["ts"] for s in steps) >= first_kernel - 1e-3
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before  # the input is never modified


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_is_annotated_the_same(tmp_path, layout):
    # traceEvents anywhere among the keys, baseTimeNanoseconds before or after it, any whitespace and line ends
    doc = decode_loop(steps=5, layers=6, markers=None)
    doc["baseTimeNanoseconds"] = 1_790_857_026_000_000_000
    src = write_layout(doc, layout, tmp_path / f"loop.{layout}.json.gz")
    out = tmp_path / "loop.annotated.json"
    annotate(src, out)
    new = _read(out)
    if layout == "bare":
        new, doc = {"traceEvents": new}, {"traceEvents": doc["traceEvents"]}
    assert _theirs(new) == doc["traceEvents"]
    assert {k: v for k, v in new.items() if k not in ("traceEvents", "traceName")} == \
        {k: v for k, v in doc.items() if k != "traceEvents"}
    reference = _read(annotate(write_layout(doc, "kineto", tmp_path / "k.json"), tmp_path / "k.out.json")[0])
    assert _ours(new) == _ours(reference)  # the same spans, on the trace's own clock, in every layout
    _check_layers_in_steps(new, 6)
    kernel_starts = {_ns(e["ts"]) for e in doc["traceEvents"] if e["cat"] == "kernel"}
    assert all(_ns(la["ts"]) in kernel_starts for la in _spans(new, "layer "))


def test_engine_forwards_eager_and_the_analysis_of_the_overlay(tmp_path):
    src = write_kineto_layout(engine_forwards(forwards=4, layers=8), tmp_path / "engine.json.gz")
    out = tmp_path / "engine.annotated.json"
    annotate(src, out)
    new = _read(out)
    assert _theirs(new) == _read(src)["traceEvents"]
    assert len(_spans(new, "decode step")) == len(run(src).ranks[0].steps.steps) == 4
    _check_layers_in_steps(new, 8)
    _check_nesting(new)
    # decodegap reads its own overlay back as the same trace (its events are of no category it analyzes)
    again = run(out).ranks[0]
    assert [(s.start_ns, s.end_ns) for s in again.steps.steps] == \
        [(s.start_ns, s.end_ns) for s in run(src).ranks[0].steps.steps]


def test_base_time_after_the_events(tmp_path):
    # Kineto's older exporters write baseTimeNanoseconds after traceEvents: the header alone cannot tell the origin
    doc = decode_loop(steps=4, layers=4, markers=None)
    events = ",\n  ".join(json.dumps(e) for e in doc["traceEvents"])
    text = ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ' + events +
            '\n  ],\n  "baseTimeNanoseconds": 1700000000000000000,\n  "traceName": "x"\n}\n')
    src = tmp_path / "tail.json"
    src.write_text(text)
    out = tmp_path / "tail.out.json"
    annotate(src, out)
    new = _read(out)
    kernel_starts = {_ns(e["ts"]) for e in doc["traceEvents"] if e["cat"] == "kernel"}
    layers = _spans(new, "layer ")
    assert layers and all(_ns(la["ts"]) in kernel_starts for la in layers)
    assert new["baseTimeNanoseconds"] == 1700000000000000000


def test_findings_mark_the_kernels_they_blame(tmp_path):
    src = FIXTURES / "cast_eager.json.gz"  # kv_pool_cast: a pool-wide cast, 12 per step, 2 steps
    out = tmp_path / "cast.json.gz"
    main_args = ["analyze", str(src), "--annotate", str(out), "--format", "json"]
    try:
        main(main_args)
    except SystemExit as exc:
        assert exc.code in (0, None)
    new = _read(out)
    blamed = _spans(new, "kv_pool_cast:")
    assert len(blamed) == 24
    kernels = _kernels(new)
    for span in blamed:
        name = _kernel_under(kernels, span)  # a span over a kernel of the trace
        assert "LoadWithCast" in name and span["args"]["kernel"] == name
    # the other cast kernel (same family, not the pool) is not blamed
    casts = [name for _, _, name in kernels if "direct_copy_kernel_cuda" in name]
    assert len(casts) > 24
    instants = {e["name"] for e in _ours(new) if e["ph"] == "i"}
    assert "host_bound" in instants  # a finding without a kernel: one mark
    _check_layers_in_steps(new, 12)
    _check_nesting(new)


def test_graph_replay_example(tmp_path):
    out = tmp_path / "example.json.gz"
    try:
        main(["analyze", "--example", "--annotate", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    new = _read(out)
    assert len(_spans(new, "decode step")) == 3
    _check_layers_in_steps(new, 78)
    assert len(_spans(new, "kv_pool_cast:")) == 3 * 78
    _check_nesting(new)


def test_folder_gives_a_folder(tmp_path):
    folder = tmp_path / "ranks"
    (folder / "sub").mkdir(parents=True)
    write(decode_loop(steps=4, layers=4, markers=None, rank=0), folder / "rank-0.json.gz")
    write(decode_loop(steps=4, layers=4, markers=None, rank=1), folder / "sub" / "rank-1.json")
    out = tmp_path / "annotated"
    written = annotate(folder, out)
    assert sorted(written) == sorted([out / "rank-0.json.gz", out / "sub" / "rank-1.json"])
    for path in written:
        new = _read(path)
        assert len(_spans(new, "decode step")) >= 3
        _check_layers_in_steps(new, 4)
    file_out = tmp_path / "a-file.json"
    file_out.write_text("{}")
    with pytest.raises(Exception, match="give a folder"):
        annotate(folder, file_out)


def test_refusals(tmp_path, capsys):
    src = write(decode_loop(steps=4, layers=4, markers=None), tmp_path / "t.json")
    before = src.read_bytes()
    for out, words in ((src, "is the input trace"), (tmp_path, "is a folder")):
        with pytest.raises(SystemExit) as exc:
            main(["analyze", str(src), "--annotate", str(out)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("decodegap: error:") and words in err and len(err.strip().splitlines()) == 1
    assert src.read_bytes() == before
    assert not list(tmp_path.glob(".*partial"))


def test_findings_whose_evidence_lists_groups(tmp_path):
    # weight_copy's evidence lists its kernel groups by short name, op and shapes: each call of them is marked
    out = tmp_path / "mla.json.gz"
    written = annotate(FIXTURES / "mla_cast_eager_2steps.json.gz", out)
    new = _read(written[0])
    kernels = _kernels(new)
    for finding in ("weight_copy", "kv_pool_cast"):
        spans = _spans(new, finding + ":")
        assert len(spans) == 2 * 78  # once per layer, 78 layers, 2 steps
        assert all(_kernel_under(kernels, sp) == sp["args"]["kernel"] for sp in spans)
    assert len({s["tid"] for s in _spans(new, "weight_copy:")}) == 1  # calls that never overlap share one lane
    _check_nesting(new)


def test_bare_event_array(tmp_path):
    # the JSON Array Format of chrome://tracing: no header, the events only
    events = decode_loop(steps=4, layers=4, markers=None)["traceEvents"]
    src = tmp_path / "bare.json"
    src.write_text(json.dumps(events))
    out = tmp_path / "bare.out.json"
    annotate(src, out)
    new = json.loads(out.read_text())
    assert isinstance(new, list)
    assert [e for e in new if e.get("pid") != PID] == events
    doc = {"traceEvents": new}
    assert len(_spans(doc, "decode step")) >= 3
    _check_layers_in_steps(doc, 4)


def test_report_and_overlay_cannot_share_a_file(tmp_path, capsys):
    src = write(decode_loop(steps=4, layers=4, markers=None), tmp_path / "t.json")
    same = tmp_path / "both.json"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(src), "-o", str(same), "--annotate", str(same)])
    assert exc.value.code == 2 and "the same file" in capsys.readouterr().err
    assert not same.exists()


def test_truncated_trace_is_refused(tmp_path, capsys):
    # analyze salvages a cut trace whose GPU timeline covers the window; its overlay could not be valid JSON
    full = write_kineto_layout(decode_loop(steps=6, layers=4, markers=None), tmp_path / "full.json")
    cut = tmp_path / "cut.json"
    cut.write_bytes(full.read_bytes()[:-300])
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(cut), "--annotate", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cannot annotate a truncated trace" in err
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_outputs_never_overwrite_an_input(tmp_path, capsys):
    # -o and --annotate were checked only against the trace they annotate: -o the trace itself, either of them the
    # --model config, or an --annotate folder inside the input folder (another rank's file) overwrote an input
    src = write(decode_loop(steps=4, layers=4, markers=None), tmp_path / "t.json")
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
                                  "num_attention_heads": 4, "vocab_size": 1000, "intermediate_size": 512}))
    folder = tmp_path / "ranks"
    (folder / "sub").mkdir(parents=True)
    write(decode_loop(steps=4, layers=4, markers=None), folder / "a.json")
    write(decode_loop(steps=4, layers=4, markers=None), folder / "sub" / "a.json")
    inputs = [src, config, folder / "a.json", folder / "sub" / "a.json"]
    before = {p: p.read_bytes() for p in inputs}
    for argv in (["analyze", str(src), "-o", str(src)],
                 ["analyze", str(src), "--format", "json", "-o", str(src)],
                 ["analyze", str(src), "--model", str(model), "-o", str(config)],
                 ["analyze", str(src), "--model", str(model), "--annotate", str(config)],
                 ["analyze", str(folder), "-o", str(folder / "sub" / "a.json")],
                 ["analyze", str(folder), "--annotate", str(folder / "sub")]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2, argv
        assert err.startswith("decodegap: error:") and "input" in err and len(err.strip().splitlines()) == 1, err
    assert {p: p.read_bytes() for p in inputs} == before
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == \
        sorted(p.relative_to(tmp_path) for p in inputs)
    # a new file beside the inputs is fine, and may be written again
    report = tmp_path / "report.txt"
    for _ in range(2):
        main(["analyze", str(src), "-o", str(report)])
    assert report.read_text() and src.read_bytes() == before[src]

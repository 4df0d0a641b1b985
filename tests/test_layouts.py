"""Every JSON layout of a trace gives the identical report (issue 21): the committed fixtures re-saved in each layout
of tests/layouts.py, and the reader's memory flat in a layout that is not Kineto's."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from functools import lru_cache
from pathlib import Path

import pytest

import decodegap
from decodegap.trace import load_trace, read
from decodegap.trace.json_events import decode_trace
from layouts import LAYOUTS, write_layout
from tracegen import decode_loop

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
# the step/phase fixtures and engine traces; the accuracy corpus (60 traces, two of them cut short) is left to its own
# test, which would take minutes in every layout, and the cut files (cuts/: JSON text that ends early, which no other
# layout can hold) to theirs
TRACES = sorted(p for p in FIXTURES.rglob("*.json.gz") if not {"corpus", "cuts"} & set(p.parts)) + [
    Path(decodegap.EXAMPLE_TRACE)]
GZIPPED = {"kineto", "minified", "indent2_crlf"}  # the others are written plain


@lru_cache(maxsize=1)
def _doc(path: Path) -> dict:
    with gzip.open(path, "rb") as f:
        return json.load(f)


def _report(path: Path, example: bool = False) -> dict:
    # the bundled example is analyzed with its bundled model wherever it lies
    extra = {"model": decodegap.EXAMPLE_MODEL, "context": 2048} if example else {}
    d = decodegap.analyze(path, **extra).to_dict()
    del d["trace"]["path"], d["trace"]["files"]
    for rank in d["ranks"]:
        del rank["path"]
    return d


@lru_cache(maxsize=2)
def _expected(path: Path, bare: bool, tmp: Path) -> dict:
    """The report of the committed file; for a bare event array, of its events without the metadata."""
    example = path == TRACES[-1]
    if not bare:
        return _report(path, example)
    return _report(write_layout({"traceEvents": _doc(path)["traceEvents"]}, "kineto", tmp / "bare.expected.json"),
                   example)


@pytest.mark.parametrize(("trace", "layout"), [(t, layout) for t in TRACES for layout in LAYOUTS],
                         ids=lambda v: v if isinstance(v, str) else v.name.removesuffix(".json.gz"))
def test_every_layout_gives_the_identical_report(tmp_path_factory, trace, layout):
    expected = _expected(trace, layout == "bare", tmp_path_factory.getbasetemp())
    path = tmp_path_factory.mktemp("layout") / f"t.{layout}.json{'.gz' if layout in GZIPPED else ''}"
    try:
        assert _report(write_layout(_doc(trace), layout, path), trace == TRACES[-1]) == expected
    finally:
        path.unlink(missing_ok=True)  # 16 traces x 8 layouts: keep the disk clear


def _peak_bytes(read_it) -> int:
    tracemalloc.start()
    try:
        read_it()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_with_the_columns_not_the_text_in_a_minified_trace(tmp_path, monkeypatch):
    """4x the events on one line: the reader alone holds no more, and reading into tables grows by what the tables
    hold (as much as in Kineto's layout), not by the text (which whole-text decoding would hold, and more)."""
    monkeypatch.setattr(read, "CHUNK_BYTES", 1 << 15)  # many chunks at a test's size
    paths = {(layout, steps): write_layout(decode_loop(steps=steps, layers=8), layout, tmp_path / f"{layout}{steps}")
             for layout in ("minified", "kineto") for steps in (60, 240)}
    small, large = paths["minified", 60], paths["minified", 240]
    assert large.stat().st_size - small.stat().st_size > 3 << 20

    def reader(path):
        return lambda: decode_trace(path, lambda batch: None)

    # flat: 3 MB more text, and no more held than the pieces in flight (the inflating thread runs READ_AHEAD ahead,
    # so which of them are alive at the peak depends on timing)
    assert _peak_bytes(reader(large)) - _peak_bytes(reader(small)) < (read.READ_AHEAD + 1) * read.CHUNK_BYTES

    def tables(layout, steps):
        return _peak_bytes(lambda: load_trace(paths[layout, steps]))

    grow, grow_kineto = (tables(layout, 240) - tables(layout, 60) for layout in ("minified", "kineto"))
    assert grow < 1.1 * grow_kineto + (1 << 16), (grow, grow_kineto)
    assert tables("minified", 240) < 0.75 * large.stat().st_size


def test_a_byte_order_mark_is_skipped(tmp_path):
    """Windows editors may start a UTF-8 file with a byte order mark: the same trace."""
    doc = decode_loop(steps=3, layers=2)
    plain = write_layout(doc, "indent2_crlf", tmp_path / "t.json")
    marked = tmp_path / "bom.json"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert _report(marked) == _report(plain)


@pytest.mark.parametrize("layout", ["kineto", "minified", "lines", "indent2_crlf"])
@pytest.mark.parametrize("stray", [b'"', b"{", b"}", b"["])
def test_damage_costs_only_the_events_it_touches(tmp_path, layout, stray):
    """Stray quotes and brackets mislead the scan (the text is no longer JSON): the reader gets back on track at
    the next separator, so only the events they land in are lost, and the file is not taken for a cut one."""
    doc = _doc(FIXTURES / "cast_graph.json.gz")
    text = bytearray(LAYOUTS[layout](doc).encode())
    start = text.index(b"traceEvents")
    for i in range(1, 4):  # the colon after "ph" in three events, a quarter, half and three quarters in
        at = text.index(b'"ph"', start + (len(text) - start) * i // 4) + 4
        text[at:at + 1] = stray
    path = tmp_path / "damaged.json"
    path.write_bytes(bytes(text))
    events: list = []
    _, warnings, truncated = decode_trace(path, events.extend)
    assert truncated is None
    assert len(doc["traceEvents"]) - 3 <= len(events) <= len(doc["traceEvents"]), (len(events), warnings)


# --- the second decoding process (trace/worker.py) ----------------------------------------------------------------

def _trace_fields(path: Path):
    """Everything load_trace makes of a file (columns, names, shapes, annotations, warnings), or the one line it
    refuses the file with."""
    try:
        trace = load_trace(path)
    except decodegap.errors.UserError as exc:
        return str(exc)
    out = {"names": trace.names, "shapes": trace.shapes, "annotations": trace.annotations,
           "warnings": trace.warnings, "truncated": trace.truncated, "known_until_ns": trace.known_until_ns}
    for table in ("gpu", "cpu_ops", "runtime"):
        for name, column in vars(getattr(trace, table)).items():
            value = column.tolist() if hasattr(column, "tolist") else column
            if hasattr(column, "ids"):
                value = (column.ids.tolist(), column.values)
            elif hasattr(column, "present"):
                value = column.present
            out[f"{table}.{name}"] = value
    return out


def _alone_and_with_a_worker(path: Path, monkeypatch) -> tuple:
    """(what the reader reads alone, with a second process, how many batches that process answered)."""
    from decodegap.trace import worker

    asked = []
    real_ask = worker.Worker.ask
    monkeypatch.setattr(worker.Worker, "ask", lambda self, slot, buf, end: (asked.append(end),
                                                                              real_ask(self, slot, buf, end))[1])
    monkeypatch.setenv("DECODEGAP_READ_WORKER", "0")
    alone = _trace_fields(path)
    monkeypatch.setenv("DECODEGAP_READ_WORKER", "1")
    return alone, _trace_fields(path), len(asked)


@pytest.mark.parametrize("layout", ["kineto", "lines", "minified", "sorted_events_first", "indent2_crlf", "bare"])
def test_a_second_process_reads_what_the_reader_alone_reads(tmp_path, monkeypatch, layout):
    """The batches a second process decodes are merged in the text's order: the same columns, ids and warnings."""
    from decodegap.trace import worker

    monkeypatch.setattr(read, "CHUNK_BYTES", 1 << 13)  # many batches at a test's size
    path = write_layout(decode_loop(steps=12, layers=4), layout, tmp_path / f"t.{layout}.json")
    alone, together, asked = _alone_and_with_a_worker(path, monkeypatch)
    assert asked > 3 or not worker.can_fork()
    assert together == alone


def test_a_second_process_that_dies_leaves_the_reader_reading_alone(tmp_path, monkeypatch):
    """The second process killed while batches are in flight (the kernel's out-of-memory killer, say): the next
    question goes nowhere, its answer is the pipe's end, and the reader reads on alone from before that batch."""
    import signal

    from decodegap.trace import worker

    if not worker.can_fork():
        pytest.skip("no second process here (one core, or not Linux)")
    monkeypatch.setattr(read, "CHUNK_BYTES", 1 << 13)
    path = write_layout(decode_loop(steps=12, layers=4), "lines", tmp_path / "t.json")
    monkeypatch.setenv("DECODEGAP_READ_WORKER", "0")
    alone = _trace_fields(path)
    calls = []
    real_ask = worker.Worker.ask

    def ask(self, slot, buf, end):
        calls.append(slot)
        if len(calls) == 3:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        real_ask(self, slot, buf, end)

    monkeypatch.setattr(worker.Worker, "ask", ask)
    monkeypatch.setenv("DECODEGAP_READ_WORKER", "1")
    assert _trace_fields(path) == alone
    assert len(calls) >= 3


@pytest.mark.parametrize(("damage", "offset"), [(b"x", 6), (b"]", 6), (b'"', 6), (b"\xff", 9), (b'"', 2)],
                         ids=["letter", "bracket", "quote", "bad-utf8", "quote-in-string"])
def test_a_batch_the_second_process_cannot_read_is_read_again_by_the_reader(tmp_path, monkeypatch, damage, offset):
    """Damage in a batch handed on (in place of the colon after a key, or inside a string): the reader goes back to
    where it stood before that batch and reads on alone, with exactly the result of reading alone (the same events
    lost, the same warnings)."""
    from decodegap.trace import json_events, worker

    monkeypatch.setattr(read, "CHUNK_BYTES", 1 << 13)
    monkeypatch.setattr(worker, "SLOTS", 64)  # every batch to the second process (none decoded ahead by the reader)
    monkeypatch.setattr(json_events, "SLOTS", 64)
    text = bytearray(LAYOUTS["lines"](decode_loop(steps=12, layers=4)).encode())
    at = text.index(b'"name"', len(text) // 2) + offset
    text[at:at + 1] = damage
    path = tmp_path / "damaged.json"
    path.write_bytes(bytes(text))
    rewinds = []
    real_restore = json_events.Reader.restore
    monkeypatch.setattr(json_events.Reader, "restore", lambda self, *args: (rewinds.append(args),
                                                                            real_restore(self, *args))[1])
    alone, together, asked = _alone_and_with_a_worker(path, monkeypatch)
    assert together == alone
    if worker.can_fork() and damage != b'"':  # a stray quote is seen by the scan: nothing handed on after it
        assert asked and rewinds

"""Property test: real committed traces, in Kineto's layout and others, mutated the way hostile inputs are (numbers
to extremes, NaN, strings, huge ints; deep nesting; cuts at random byte offsets; gzip damage; flipped bytes). Every
case must give exit 0 with a sane report (finite, non-negative times; shares in [0, 1]; strict JSON) or exit 2 with
one line, within a time and memory bound that grows with the case's size. Then the reader on its own: random valid
traces in random layouts read as json.load reads them, and cut anywhere keep exactly their whole events."""

from __future__ import annotations

import gzip
import json
import re
import time
import tracemalloc
import zlib
from contextlib import contextmanager
from datetime import timedelta
from functools import lru_cache
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from decodegap.pipeline import analyze_path
from decodegap.errors import UserError
from decodegap.trace import json_events, load_trace, read, scan
from decodegap.report.json import render_json
from hostile import assert_one_line, assert_sane_report, fixture_text, run_cli_measured, strict_json
from layouts import LAYOUTS

# The smallest committed traces of two kinds: a CUDA-graph replay (3 MB of text) and an eager HF generate loop.
CORPUS = ("cast_graph", "hf_llama_generate_6steps")
NUMBER = re.compile(rb'"(ts|dur|correlation|External id|device|stream|pid|tid|bytes|rank|world_size|'
                    rb'baseTimeNanoseconds)":\s*(-?[0-9][0-9.eE+-]*)')
EXTREMES = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e300", b"-1e300", b"1e17", b"1e12", b"-1",
            b"0", b"-0.0", b"4e15", str(2**63).encode(), str(2**64).encode(), str(-(2**63) - 1).encode(),
            str(10**40).encode(), b'"inf"', b'"-inf"', b'"nan"', b'"1e999"', b'"abc"', b'""', b"null", b"true",
            b"[]", b"{}", b"[[[[[[1]]]]]]", b'{"a": [1, {"b": null}]}']


@lru_cache(maxsize=None)
def laid_out(name: str, layout: str) -> bytes:
    """A fixture's text in one of tests/layouts.py's layouts (Kineto's: the committed text itself)."""
    if layout == "committed":
        return fixture_text(name)
    return LAYOUTS[layout](json.loads(fixture_text(name))).encode()


@lru_cache(maxsize=None)
def numbers(name: str, layout: str = "committed") -> list[tuple[int, int]]:
    """Byte spans of the numeric values of the fields the loader reads."""
    return [m.span(2) for m in NUMBER.finditer(laid_out(name, layout))]


def _replace(text: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    out, last = [], 0
    for start, end, value in sorted(edits):
        if start < last:
            continue  # overlapping edit: keep the first
        out += [text[last:start], value]
        last = end
    return b"".join(out + [text[last:]])


def _position(draw, length: int) -> int:
    """A position anywhere in `length` (hypothesis' integers favour the small ones: the header, every time)."""
    return draw(st.integers(0, 2**40)) % length if length else 0


@st.composite
def hostile_case(draw) -> tuple[bytes, str, int]:
    """(file bytes, suffix, size of its text) of one mutated fixture."""
    name = draw(st.sampled_from(CORPUS))
    layout = draw(st.sampled_from(["committed", "committed", "minified", "lines", "indent2_crlf", "sort_keys"]))
    text = laid_out(name, layout)
    spans = numbers(name, layout)
    kind = draw(st.sampled_from(["extremes", "extremes", "nesting", "cut", "cut_gzip", "gzip_damage", "flip",
                                 "extremes_and_cut"]))
    if kind in ("extremes", "extremes_and_cut"):
        count = draw(st.integers(1, 40))
        text = _replace(text, [(*spans[_position(draw, len(spans))], draw(st.sampled_from(EXTREMES)))
                               for _ in range(count)])
    if kind == "nesting":
        depth = draw(st.integers(1, 5000))
        start, end = spans[_position(draw, len(spans))]
        text = _replace(text, [(start, end, b"[" * depth + b"1" + b"]" * depth)])
    if kind in ("cut", "extremes_and_cut"):
        text = text[: _position(draw, len(text) + 1)]
    if kind == "flip":
        blob = bytearray(text)
        for _ in range(draw(st.integers(1, 30))):
            blob[_position(draw, len(blob))] = draw(st.integers(0, 255))
        text = bytes(blob)
    if kind in ("cut_gzip", "gzip_damage"):
        blob = bytearray(gzip.compress(text, 1))
        if kind == "cut_gzip":
            blob = blob[: _position(draw, len(blob) + 1)]
        else:
            for _ in range(draw(st.integers(1, 10))):
                blob[_position(draw, len(blob))] = draw(st.integers(0, 255))
        return bytes(blob), ".json.gz", len(text)  # damage can only shorten the text
    return text, ".json", len(text)


def time_bound_s(text_bytes: int) -> float:
    """Generous for 2 busy cores: 3 s plus 1 s per MB of text (the real rate is ~20-50 MB/s)."""
    return 3.0 + text_bytes / 1e6


def memory_bound_bytes(text_bytes: int) -> float:
    """Python-traced peak: 32 MB plus 12x the text (streaming keeps a batch of records and the columns)."""
    return 32e6 + 12 * text_bytes


def analyze_case(path: Path) -> tuple[str | None, str | None]:
    """(JSON report, None) or (None, error message): the CLI's two outcomes, in-process."""
    try:
        return render_json(analyze_path(path)), None
    except UserError as exc:
        return None, str(exc)


def _first_kernel_field(name: str, field: bytes, value: bytes) -> tuple[bytes, str, int]:
    """A fixture with one kernel's field set to `value` (the explicit examples below)."""
    text = fixture_text(name)
    kernel = text.index(b'"cat": "kernel"') if b'"cat": "kernel"' in text else text.index(b'"cat":"kernel"')
    match = re.compile(rb'"' + field + rb'": ?(-?[0-9][0-9.eE+-]*)').search(text, kernel)
    text = text[: match.start(1)] + value + text[match.end(1):]
    return text, ".json", len(text)


@example(case=_first_kernel_field("cast_graph", b"ts", b'"-inf"'))
@example(case=_first_kernel_field("hf_llama_generate_6steps", b"dur", b"1e17"))
@example(case=_first_kernel_field("cast_graph", b"correlation", str(2**64).encode()))
@settings(max_examples=60, deadline=timedelta(seconds=30), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=hostile_case())
def test_hostile_fixture_mutations_give_a_sane_report_or_one_line(tmp_path, case):
    blob, suffix, size = case
    path = tmp_path / f"case{suffix}"
    path.write_bytes(blob)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out, error = analyze_case(path)
        wall = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wall < time_bound_s(size), (wall, size)
    assert peak < memory_bound_bytes(size), (peak, size)
    if error is not None:
        assert_one_line(error)
        return
    assert_sane_report(strict_json(out))


CLI_CASES = {
    "nan_and_huge_numbers": lambda text: text.replace(b'"dur": 1', b'"dur": NaN', 50)
    .replace(b'"correlation": 5', b'"correlation": 18446744073709551616', 50),
    "cut_in_the_gpu_section": lambda text: text[: int(len(text) * 0.7)],
    "deep_nesting": lambda text: text.replace(b'"dur": 2', b'"dur": ' + b"[" * 3000 + b"]" * 3000, 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_hostile_cases_through_the_cli(tmp_path, case):
    """The real command in a fresh process: exit code, one line, wall time and peak RSS growth."""
    text = CLI_CASES[case](fixture_text("cast_graph"))
    path = tmp_path / "case.json"
    path.write_bytes(text)
    run = run_cli_measured(["analyze", str(path), "--format", "json"], tmp_path)
    assert run.wall_s < time_bound_s(len(text)), run
    assert run.rss_growth_mb * 1e6 < memory_bound_bytes(len(text)), run
    assert run.code in (0, 2), run.stderr[-3000:]
    if run.code == 2:
        assert_one_line(run.stderr)
        assert run.stderr.startswith("decodegap: error:")
    else:
        assert_sane_report(strict_json(run.stdout))


# --- the reader: random layouts of random valid traces, and their cuts --------------------------------------------

_ODD_CHARS = '"\\{}[],:\n\t/ ' + "é✓\U0001F600\x00\x1f"
_TEXT = st.text(st.sampled_from(_ODD_CHARS) | st.characters(codec="utf-8"), max_size=12)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _TEXT | st.floats(allow_nan=False,
                                                                                           allow_infinity=False)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                       max_leaves=8)
_ARGS = st.fixed_dictionaries({}, optional={
    "External id": st.integers(-5, 2**40), "correlation": st.integers(-5, 2**40) | st.from_regex(r"\A[0-9]{1,5}\Z"),
    "device": st.integers(0, 8), "stream": st.integers(0, 99), "grid": st.lists(st.integers(0, 10**6), max_size=3),
    "block": st.lists(st.integers(0, 1024), max_size=3),
    "Input Dims": st.lists(st.lists(st.integers(0, 10**6), max_size=3), max_size=3),
    "Input type": st.lists(_TEXT, max_size=3), "nested": st.lists(st.dictionaries(_TEXT, _VALUES, max_size=2),
                                                                     max_size=3), "other": _VALUES})
_EVENTS = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "M"]), "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime",
                                                                                "user_annotation", _ODD_CHARS]),
     "name": _TEXT, "ts": st.floats(0, 1e13, allow_nan=False) | st.integers(0, 10**13)},
    optional={"dur": st.floats(0, 1e6, allow_nan=False) | st.integers(0, 10**6), "pid": st.integers(0, 9) | _TEXT,
              "tid": st.integers(0, 9) | _TEXT, "args": _ARGS, "zzz": _VALUES})
_ELEMENT = _EVENTS | _EVENTS | _EVENTS | _VALUES  # mostly events; a few of anything else
_META = st.fixed_dictionaries({}, optional={
    "deviceProperties": st.lists(st.fixed_dictionaries({"id": st.integers(0, 8), "name": _TEXT}), max_size=2),
    "distributedInfo": st.fixed_dictionaries({"rank": st.integers(0, 7), "world_size": st.integers(1, 8)}),
    "baseTimeNanoseconds": st.integers(0, 2**62), "schemaVersion": st.integers(0, 3),
    "traceEventsNot": _VALUES, "fools": st.just('"traceEvents": [{"ph": "X"}]'), "other": _VALUES})
_BLANKS = st.sampled_from(["", "", " ", "\n", "\r\n", "\t", "\n    ", " \n\n "])


@st.composite
def laid_out_trace(draw) -> tuple[bytes, list, dict, list[int]]:
    """(text, events, metadata, where each element's text ends) of a random trace in a random layout: any indent,
    separators, key order, escapes, line ends, position of traceEvents among the members, or a bare array."""
    events = draw(st.lists(_ELEMENT, max_size=25))
    meta = draw(_META)
    dump = {"indent": draw(st.sampled_from([None, None, 0, 1, 2, "\t"])), "sort_keys": draw(st.booleans()),
            "ensure_ascii": draw(st.booleans()), "separators": draw(st.sampled_from([None, (",", ":"), (", ", ": ")]))}
    crlf = draw(st.booleans())

    def blank() -> bytes:
        text = draw(_BLANKS)
        return (text.replace("\n", "\r\n") if crlf else text).encode()

    def value(v) -> bytes:
        text = json.dumps(v, **dump)
        return (text.replace("\n", "\r\n") if crlf else text).encode()  # json.dumps never writes a raw \n in strings

    out, ends = bytearray(), []
    bare = draw(st.integers(0, 9)) == 0
    if not bare:
        out += b"{" + blank()
        keys = list(meta)
        where = draw(st.integers(0, len(keys)))
        for i, key in enumerate(keys[:where] + ["traceEvents"] + keys[where:]):
            out += (b"," + blank() if i else b"") + value(key) + blank() + b":" + blank()
            if key != "traceEvents":
                out += value(meta[key]) + blank()
                continue
            out += b"[" + blank()
            for j, e in enumerate(events):
                out += (b"," + blank() if j else b"") + value(e)
                ends.append(len(out))
                out += blank()
            out += b"]" + blank()
        out += b"}" + blank()
    else:
        out += b"[" + blank()
        for j, e in enumerate(events):
            out += (b"," + blank() if j else b"") + value(e)
            ends.append(len(out))
            out += blank()
        out += b"]"
    return bytes(out), events, ({} if bare else meta), ends


def _plain(value):
    """A record as plain values (Raw fields as the JSON they hold), for comparisons across layouts."""
    if isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value) if len(value) else None
    if isinstance(value, msgspec.Struct):
        return tuple(_plain(getattr(value, f)) for f in value.__struct_fields__)
    return value


def _as_json_load(events: list) -> tuple[list, list[str]]:
    """json.load's events as the reader's records (one batch of json.dumps' text), and the warnings they give."""
    records: list = []
    batches = json_events._Batches(records.extend)
    batches(json.dumps(events).encode())
    return [_plain(e) for e in records], batches.warnings()


def _each_as_json_load(events: list) -> list:
    """The record of each element (None for those skipped for their field types)."""
    out = []
    for e in events:
        records, _ = _as_json_load([e])
        out.append(records[0] if records else None)
    return out


@contextmanager
def _reader_knobs(chunk: int, window: int, guess: bool):
    """Small chunks and scan windows (every boundary falls somewhere odd), with or without the separator guess."""
    saved = read.CHUNK_BYTES, scan.SCAN_BYTES, json_events.GUESS_MISSES
    read.CHUNK_BYTES, scan.SCAN_BYTES = chunk, window
    json_events.GUESS_MISSES = 3 if guess else 0
    try:
        yield
    finally:
        read.CHUNK_BYTES, scan.SCAN_BYTES, json_events.GUESS_MISSES = saved


def _read(path: Path) -> tuple[list, object, list[str], str | None]:
    got: list = []
    header, warnings, truncated = json_events.decode_trace(path, got.extend)
    return [_plain(e) for e in got], header, warnings, truncated


_KNOBS = (st.sampled_from([256, 300, 1024, 4096, 1 << 23]), st.sampled_from([7, 64, 1000, 1 << 20]), st.booleans())


@settings(max_examples=150, deadline=timedelta(seconds=10), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=laid_out_trace(), knobs=st.tuples(*_KNOBS), gz=st.booleans())
def test_reader_reads_any_layout_as_json_load_does(tmp_path, case, knobs, gz):
    text, events, meta, _ = case
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    if not events:
        with pytest.raises(UserError):  # no events: nothing to analyze, and said so in one line
            with _reader_knobs(*knobs):
                load_trace(path)
        return
    with _reader_knobs(*knobs):
        got, header, warnings, truncated = _read(path)
    assert (got, warnings, truncated) == (*_as_json_load(events), None)
    assert header.deviceProperties == meta.get("deviceProperties")
    assert header.distributedInfo == meta.get("distributedInfo")
    assert header.baseTimeNanoseconds == meta.get("baseTimeNanoseconds")


@settings(max_examples=150, deadline=timedelta(seconds=10), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=laid_out_trace(), knobs=st.tuples(*_KNOBS), at=st.integers(0, 2**40), gz=st.booleans())
def test_a_cut_anywhere_keeps_the_whole_events_before_it(tmp_path, case, knobs, at, gz):
    """A cut file yields exactly the elements whose text ends before the cut (the truncation check then decides),
    or one line; never another error, never a hang."""
    text, events, _, ends = case
    cut = at % (len(text) + 1)
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    if gz:  # the gzip bytes that hold exactly the text before the cut
        deflate = zlib.compressobj(1, zlib.DEFLATED, 31)
        path.write_bytes(deflate.compress(text[:cut]) + deflate.flush(zlib.Z_SYNC_FLUSH))
    else:
        path.write_bytes(text[:cut])
    whole = [e for e, end in zip(_each_as_json_load(events), ends, strict=True) if end <= cut]
    t0 = time.perf_counter()
    try:
        with _reader_knobs(*knobs):
            got, _, _, truncated = _read(path)
    except UserError as exc:
        assert_one_line(str(exc))
        # refused only when no whole event comes before the cut
        assert not [e for e in whole if isinstance(e, tuple)], str(exc)
        return
    finally:
        assert time.perf_counter() - t0 < 5
    try:  # and the loader's truncation check on what came before the cut: a trace, or one line
        with _reader_knobs(*knobs):
            load_trace(path)
    except UserError as exc:
        assert_one_line(str(exc))
    complete = cut >= len(text.rstrip()) and not gz
    assert (truncated is None) == complete or gz and truncated is not None
    events_only = [e for e in got if isinstance(e, tuple)]  # an odd element (a number) may read as its cut part
    assert events_only == [e for e in whole if isinstance(e, tuple)]


_STRAYS = st.sampled_from([None, b'"', b"[", b"]", b"{", b"}", b",", b"x", b"\xff", b"\\", b"\n"])


@settings(max_examples=100, deadline=timedelta(seconds=10), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=laid_out_trace(), knobs=st.tuples(*_KNOBS), at=st.integers(0, 2**40), stray=_STRAYS,
       cut=st.booleans(), gz=st.booleans())
def test_a_second_decoding_process_changes_nothing(tmp_path, monkeypatch, case, knobs, at, stray, cut, gz):
    """Random layouts, damaged or cut anywhere: the reader with a second decoding process (trace/worker.py) reads
    exactly what it reads alone (the same columns, ids and warnings, or the same one line)."""
    from test_layouts import _trace_fields

    text = case[0]
    where = at % (len(text) + 1)
    if stray is not None:
        text = text[:where] + stray + text[where + 1:]
    elif cut:
        text = text[:where]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    with _reader_knobs(*knobs):
        monkeypatch.setenv("DECODEGAP_READ_WORKER", "0")
        alone = _trace_fields(path)
        monkeypatch.setenv("DECODEGAP_READ_WORKER", "1")
        assert _trace_fields(path) == alone

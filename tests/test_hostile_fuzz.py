"""Property test: real committed traces, mutated the way hostile inputs are (numbers to extremes, NaN, strings,
huge ints; deep nesting; cuts at random byte offsets; gzip damage; flipped bytes). Every case must give exit 0 with
a sane report (finite, non-negative times; shares in [0, 1]; strict JSON) or exit 2 with one line, within a time
and memory bound that grows with the case's size."""

from __future__ import annotations

import gzip
import re
import time
import tracemalloc
from datetime import timedelta
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from decodegap.pipeline import analyze_path
from decodegap.errors import UserError
from decodegap.report.json import render_json
from hostile import assert_one_line, assert_sane_report, fixture_text, run_cli_measured, strict_json

# The smallest committed traces of two kinds: a CUDA-graph replay (3 MB of text) and an eager HF generate loop.
CORPUS = ("cast_graph", "hf_llama_generate_6steps")
NUMBER = re.compile(rb'"(ts|dur|correlation|External id|device|stream|pid|tid|bytes|rank|world_size|'
                    rb'baseTimeNanoseconds)": (-?[0-9][0-9.eE+-]*)')
EXTREMES = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e300", b"-1e300", b"1e17", b"1e12", b"-1",
            b"0", b"-0.0", b"4e15", str(2**63).encode(), str(2**64).encode(), str(-(2**63) - 1).encode(),
            str(10**40).encode(), b'"inf"', b'"-inf"', b'"nan"', b'"1e999"', b'"abc"', b'""', b"null", b"true",
            b"[]", b"{}", b"[[[[[[1]]]]]]", b'{"a": [1, {"b": null}]}']


@lru_cache(maxsize=None)
def numbers(name: str) -> list[tuple[int, int]]:
    """Byte spans of the numeric values of the fields the loader reads."""
    return [m.span(2) for m in NUMBER.finditer(fixture_text(name))]


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
    text = fixture_text(name)
    spans = numbers(name)
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

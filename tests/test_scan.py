"""The structural scan (trace/scan.py) against a byte-by-byte reference, on random JSON cut into random pieces."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from decodegap.trace import scan
from decodegap.trace.scan import Siblings

_TEXT = st.text(st.sampled_from('"\\{}[],:\n/ aé'), max_size=10)
_VALUES = st.recursive(st.none() | st.integers() | _TEXT, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=10)


def _reference(text: bytes) -> tuple[list[int], int]:
    """Commas at depth 0 and the closing bracket, one byte at a time."""
    commas, depth, in_string, escaped = [], 0, False, False
    for i, byte in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
        elif byte in b"]}":
            depth -= 1
            if depth < 0:
                return commas, i
        elif byte == 0x2C and depth == 0:
            commas.append(i)
    return commas, -1


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_VALUES, max_size=8), indent=st.sampled_from([None, 0, 2]), window=st.integers(1, 64),
       cuts=st.lists(st.integers(0, 10**6), max_size=6), closed=st.booleans())
def test_scan_finds_what_a_byte_by_byte_reader_finds(values, indent, window, cuts, closed):
    text = json.dumps(values, indent=indent, ensure_ascii=False).encode()[1:]  # from inside the list
    if not closed:
        text = text[:-1]
    expected = _reference(text)
    saved, scan.SCAN_BYTES = scan.SCAN_BYTES, window
    try:
        s, commas, close = Siblings(), [], -1
        bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
        for lo, hi in zip(bounds, bounds[1:], strict=False):  # the text as it comes: in pieces
            found, close = s.scan(text, lo, hi)
            commas += found.tolist()
            if close >= 0:
                break
    finally:
        scan.SCAN_BYTES = saved
    assert (commas, close) == expected and not s.damaged

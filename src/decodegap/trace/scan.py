"""Where the values of a JSON container begin and end, found from the text's structure a window at a time.

A `Siblings` scan starts between two values of an array or object (or before its first) and follows the text,
however it was cut into pieces, keeping what it needs between pieces: whether it is inside a string, whether the
next byte is escaped, and how deep it is. It reports the commas that separate the container's own values (depth
0) and the bracket that closes the container (depth -1). Whitespace, line ends and key order make no difference.

Each window is read with numpy, never byte by byte in Python: the positions of the bytes that matter (quotes,
backslashes, brackets, commas, line feeds) come from byte comparisons and `flatnonzero`; a quote is escaped when an odd
run of backslashes comes right before it; a token is inside a string when an odd number of unescaped quotes
precede it (a cumulative sum); depth is a cumulative sum of +1 per opening and -1 per closing bracket outside
strings. JSON strings cannot hold a raw line feed, so a line feed always lies outside strings: one that the count
puts inside a string proves the text damaged: the count starts afresh from each line feed of that window, and
`damaged` says so (the reader then stops trusting the scan until it is back on track)."""

from __future__ import annotations

import numpy as np

SCAN_BYTES = 1 << 20  # a window: its token arrays stay a few megabytes whatever the chunk
FIRST_WINDOW_BYTES = 1 << 12  # windows start this small and double up to SCAN_BYTES
QUOTE, BACKSLASH, NEWLINE, OPEN, CLOSE, COMMA = 1, 2, 3, 4, 5, 6
_KIND = np.zeros(256, np.uint8)
for _byte, _kind in ((b'"', QUOTE), (b"\\", BACKSLASH), (b"\n", NEWLINE), (b"{", OPEN), (b"[", OPEN), (b"}", CLOSE),
                     (b"]", CLOSE), (b",", COMMA)):
    _KIND[_byte[0]] = _kind
_STEP = np.zeros(7, np.int8)  # the change of depth at each kind of token
_STEP[OPEN], _STEP[CLOSE] = 1, -1
_NONE = np.empty(0, np.int64)


class Siblings:
    """A scan through the values of one container, from a point between two of them outside any string."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.depth = 0  # below the container's own level
        self.in_string = False
        self.escaped = False  # the next byte is escaped (an odd run of backslashes ended the last window)
        self.damaged = False  # a line feed inside a string: the text is not valid JSON

    def scan(self, data, start: int, end: int, first_comma: bool = False) -> tuple[np.ndarray, int]:
        """Follow data[start:end] on from the state the last call left. Returns the positions (in data) of the
        commas at depth 0 (only the first when `first_comma`) and the position of the bracket that closes the
        container, -1 when it is not in the text. After a close the state means nothing: reset before reuse."""
        found, close, lo = [], -1, start
        size = min(FIRST_WINDOW_BYTES, SCAN_BYTES)  # small first: a member's value often ends within bytes
        while lo < end and close < 0:
            hi = min(lo + size, end)
            commas, close = self._window(data, lo, hi)
            if len(commas):
                if first_comma:
                    return commas[:1], -1
                found.append(commas)
            lo, size = hi, min(2 * size, SCAN_BYTES)
        return (np.concatenate(found) if len(found) > 1 else found[0] if found else _NONE), close

    def _window(self, data, lo: int, hi: int) -> tuple[np.ndarray, int]:
        text = np.frombuffer(data, np.uint8, hi - lo, lo)  # a view: released below, before data can be resized
        folded = text | 0x20  # `[` `]` as `{` `}`
        pos = np.flatnonzero((text == 0x22) | (text == 0x5C) | (text == 0x0A) | (text == 0x2C) | (folded == 0x7B)
                             | (folded == 0x7D))
        kind = np.take(_KIND, np.take(text, pos))
        del text, folded
        if self.escaped or kind.size and (kind == BACKSLASH).any():
            pos, kind = self._unescaped(pos, kind, hi - lo)
        if not pos.size:
            return _NONE, -1
        quote = kind == QUOTE
        quotes = np.cumsum(quote, dtype=np.int32)
        before = quotes - quote  # unescaped quotes before each token, in this window
        inside = (before & 1).astype(bool) ^ self.in_string
        newline = kind == NEWLINE
        if (inside & newline).any():  # damaged text: count again from each line feed, outside a string
            self.damaged = True
            line = np.cumsum(newline) - newline  # the line each token is on (a line feed ends its line)
            line_start = np.concatenate(([0], quotes[newline]))  # quotes before each line
            inside = ((before - line_start[line]) & 1).astype(bool) ^ (self.in_string & (line == 0))
            self.in_string = bool((quotes[-1] - line_start[-1]) & 1)
        else:
            self.in_string ^= bool(quotes[-1] & 1)
        step = np.where(inside, 0, np.take(_STEP, kind))
        depth = np.cumsum(step, dtype=np.int32)  # relative to the window's start (at most its length)
        floor = max(-self.depth, -(1 << 30))
        out = np.flatnonzero(depth < floor)
        if out.size:
            close = int(pos[out[0]]) + lo
            pos, kind, inside, depth = pos[: out[0]], kind[: out[0]], inside[: out[0]], depth[: out[0]]
        else:
            close = -1
            self.depth += int(depth[-1])
        return pos[(kind == COMMA) & ~inside & (depth == floor)] + lo, close

    def _unescaped(self, pos: np.ndarray, kind: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The tokens without backslashes and without the bytes they escape. A run of backslashes escapes the byte
        after it when its length is odd (`\\\\` is one escaped backslash, `\\\\\\"` an escaped quote)."""
        drop = kind == BACKSLASH
        if self.escaped and pos.size and pos[0] == 0:
            drop[0] = True  # the byte the last window's odd run escapes
            escaped_first = kind[0] == BACKSLASH
        else:
            escaped_first = False
        slashes = np.flatnonzero(kind == BACKSLASH)
        if escaped_first:
            slashes = slashes[1:]
        self.escaped = False
        if slashes.size:
            at = pos[slashes]
            run_start = np.flatnonzero(np.concatenate(([True], at[1:] != at[:-1] + 1)))
            run_end = np.concatenate((run_start[1:], [slashes.size]))  # exclusive, into `at`
            odd = (run_end - run_start) & 1 == 1
            after = at[run_end - 1] + 1  # the byte each run escapes when odd
            target = after[odd]
            if target.size and target[-1] == size:
                self.escaped = True  # it is the next window's first byte
                target = target[:-1]
            index = np.searchsorted(pos, target)
            hit = index < pos.size
            hit[hit] = pos[index[hit]] == target[hit]
            drop[index[hit]] = True
        keep = ~drop
        return pos[keep], kind[keep]

"""Decoding a trace's JSON text into event records, batch by batch, in any layout.

The text streams through in chunks. The top level (an object, or a bare array of events) is followed by its
structure: each member's key, and its value skipped with a `scan.Siblings` scan to the comma or brace that ends it,
so whitespace, line ends, key order and where `traceEvents` sits make no difference. The members the analysis
reads (deviceProperties, distributedInfo, baseTimeNanoseconds, decodegap_record) keep their text, before or after
the events, and are decoded at the end; the others are skipped. Inside `traceEvents`, each chunk's text is cut
after its last whole element and that batch is decoded (typed, only the needed fields) and turned into columns
before the next chunk is read, so memory holds one batch of records, never the file.

Where to cut: the scan finds the commas between elements. Cheaper first, at no cost to exactness: the layouts
writers use all put `}`, a comma and `{` (with any whitespace) between events, so the last such separator in the
chunk is tried, and decoding the batch proves it. `[` + text + `]` parses as an array only when the text is a run
of whole elements (a separator inside a string or a nested list leaves a string or bracket open, one past the end
of the list leaves text after it), so a batch that decodes was cut right; one that does not is cut by the scan
instead, and after a few such misses the file is cut by the scan alone.

Odd text degrades step by step instead of failing the file: a batch msgspec refuses is read untyped (by Python's
json when msgspec refuses NaN, Infinity or 1e999), and failing that element by element, skipping what cannot be
read. Text that is not valid JSON can mislead the scan (a stray quote or bracket). It tells: a line feed inside a
string, a brace closing the list, a batch cut by the scan that does not decode, or a separator the scan saw inside
one element where the pieces between separators decode as events. Then the elements are read both by the scan and
at each `}, {` (whichever reads more), and the next separator puts the scan back on track, so damage costs the
events it touches and memory stays flat. A cut file keeps every element before the cut (the caller decides
whether what came before the cut can be trusted)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import deque
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import msgspec
import numpy as np

from decodegap.errors import UserError
from decodegap.trace import schema
from decodegap.trace.read import NotATrace, TruncatedStream, iter_text_chunks, text_limit_bytes
from decodegap.trace.scan import Siblings
from decodegap.trace.worker import SLOT_BYTES, SLOTS, Worker, can_fork

HEADER_FIELDS = frozenset(f for f in schema.TraceDocument.__struct_fields__ if f != "traceEvents")
HEADER_MAX_BYTES = 64 << 20  # a top-level member kept for the header is ignored past this size
KEY_MAX_BYTES = 1 << 20  # a top-level key this long is no trace's
TAIL_MAX_BYTES = 1 << 20  # how far from the end a list that never closed is looked for its end
GUESS_MISSES = 3  # separators that did not cut whole elements before the fast path is given up for the file
# A file this big is read with a second decoding process (worker.py) where one may be forked; smaller ones are read
# before it would pay. DECODEGAP_READ_WORKER=0 never uses one, =1 uses one whatever the size.
WORKER_MIN_FILE_BYTES = 4 << 20
_BLANK = re.compile(rb"[ \t\r\n]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# What comes before the `{` of an element in every layout: `}`, a comma, whitespace (a blank flood is not tried)
_SEPARATOR_BEFORE = re.compile(rb"\}[ \t\r\n]{0,64},[ \t\r\n]{0,64}\Z")
_SEPARATOR_LOOKBACK = 132
# Every `}, {` (any whitespace): in text the scan cannot follow (damaged), where most elements still end
_SEPARATORS = re.compile(rb"(?<=\})[ \t\r\n]*,[ \t\r\n]*(?=\{)")

Consume = Callable[[list], None]
# What a decoder raises on text it cannot read: msgspec reports bad UTF-8 inside strings as UnicodeDecodeError, a
# number beyond float range (1e999) as ValidationError even untyped, and nesting deeper than the interpreter's
# recursion limit as RecursionError.
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
# Python's json reads NaN, Infinity and 1e999 (which other tools write) but builds a dict per object: small texts only.
PYTHON_JSON_MAX_BYTES = 64 << 20
_event_list = msgspec.json.Decoder(list[schema.AnyEvent], strict=False)
_header = msgspec.json.Decoder(schema.TraceDocument, strict=False)
_one_event = msgspec.json.Decoder(schema.AnyEvent, strict=False)
_text = msgspec.json.Decoder(str)


class Unreadable(Exception):
    """Text no decoder could read; the message says why."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return f"nested deeper than {sys.getrecursionlimit()} levels"
    return str(exc)


def loads(text) -> object:
    """Untyped JSON: msgspec, else Python's json for what msgspec refuses but JSON writers produce (NaN, 1e999)."""
    try:
        return msgspec.json.decode(text)
    except DECODE_ERRORS as exc:
        first = exc
    if len(text) <= PYTHON_JSON_MAX_BYTES and not isinstance(first, RecursionError):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            pass
    raise Unreadable(_reason(first))


def _times_as_words(item: dict) -> None:
    """A NaN or infinite ts/dur (read by Python's json) as the word msgspec reads back as that float: JSON would
    write it as null and the event would count as oddly typed rather than as one without a usable time."""
    for key in ("ts", "dur"):
        value = item.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            item[key] = str(value)


def element_bounds(text) -> list[tuple[int, int]]:
    """Where the elements of an array's inside (`text` without its brackets) lie: between the commas the scan
    finds at depth 0."""
    commas, _ = Siblings().scan(text, 0, len(text))
    bounds = [-1, *commas.tolist(), len(text)]
    return [(a + 1, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _as_array(text, start: int, end: int) -> bytes:
    """`[` + text[start:end] + `]`, copied once."""
    with memoryview(text) as view:
        return b"".join((b"[", view[start:end], b"]"))


class _Batches:
    """Decodes event batches: typed, else untyped (odd field types, NaN) and converted, else (text that is not
    JSON) element by element."""

    def __init__(self, consume: Consume) -> None:
        self.consume = consume
        self.elements = 0  # elements decoded, events or not
        self.skipped = 0  # events with fields of unexpected types
        self.unreadable = 0  # events whose text no decoder could read

    def _take(self, events: list) -> None:
        self.elements += len(events)
        self.consume(events)

    def whole(self, text: bytes) -> bool:
        """Decode a `[...]` batch of whole elements if it is valid JSON; False (and nothing decoded) if not."""
        try:
            events = _event_list.decode(text)
        except DECODE_ERRORS:
            try:
                items = loads(text if isinstance(text, bytes) else bytes(text))  # (Python's json takes no views)
            except Unreadable:
                return False
            events = self._convert(items if isinstance(items, list) else [items])
        self._take(events)
        return True

    def __call__(self, text: bytes) -> bool:
        """Decode a `[...]` batch, element by element where it is not valid JSON. True when it was."""
        if self.whole(text):
            return True
        self.damaged_elements(text[1:-1])
        return False

    def damaged_elements(self, inside) -> None:
        """Each element of text that is not valid JSON on its own, skipping (and counting) those no decoder reads.
        Where elements end is read two ways, and the one that reads more elements is kept: by the scan (right when
        the structure is whole, e.g. a bad UTF-8 byte inside a string) or at each `}, {` (right when a stray quote
        or bracket misleads the scan)."""
        inside = bytes(inside)
        by_scan = self._pieces([inside[a:b] for a, b in element_bounds(inside)])
        by_separator = self._pieces(_SEPARATORS.split(inside))
        events, unreadable, skipped = min(by_scan, by_separator, key=lambda r: (-len(r[0]), r[1]))
        self.unreadable += unreadable
        self.skipped += skipped
        self._take(events)

    def _pieces(self, pieces: list[bytes]) -> tuple[list, int, int]:
        """(events, pieces no decoder reads, events skipped for their field types) of pieces of text, each read
        as one element; the counters are left as they were."""
        skipped, events, unreadable = self.skipped, [], 0
        for piece in pieces:
            if piece.strip() and not self._read(piece, events):
                unreadable += 1
        skipped, self.skipped = self.skipped - skipped, skipped
        return events, unreadable, skipped

    def elements_of(self, inside, cut_last: bool = False) -> None:
        """Each element of an array's inside whose structure is whole (it was cut, not damaged) on its own; with
        `cut_last` the last one is kept when it is whole (the cut went after it), and never counted."""
        bounds = [(a, b) for a, b in element_bounds(inside) if bytes(inside[a:b]).strip()]
        events: list = []
        for i, (a, b) in enumerate(bounds):
            if not self._read(bytes(inside[a:b]), events) and not (cut_last and i == len(bounds) - 1):
                self.unreadable += 1
        self._take(events)

    @staticmethod
    def looks_damaged(inside) -> bool:
        """Whether text the scan reads as (part of) one element is rather several events with damage the scan
        cannot see (a stray bracket shifts its depth): split at each `}, {`, most pieces decode as events."""
        pieces = _SEPARATORS.split(bytes(inside))
        if len(pieces) < 3:
            return False
        events = 0
        for piece in pieces[1:-1]:  # the first and last may be cut
            try:
                event = _one_event.decode(piece)
            except DECODE_ERRORS:
                continue
            events += type(event) is schema.Event and bool(event.ph)
        return events * 2 > len(pieces) - 2

    def _read(self, piece: bytes, events: list) -> bool:
        try:
            events.append(_one_event.decode(piece))
            return True
        except DECODE_ERRORS:
            pass
        try:
            events += self._convert([loads(piece)])
            return True
        except Unreadable:
            return False

    def _convert(self, items: list) -> list:
        events = []
        for item in items:
            if isinstance(item, dict):
                _times_as_words(item)
            try:  # through JSON again, so the Raw fields are filled as on the fast path
                events.append(_one_event.decode(msgspec.json.encode(item)))
            except (*DECODE_ERRORS, OverflowError, TypeError, UnicodeEncodeError):  # a lone surrogate (\udc00)
                self.skipped += 1
        return events

    def warnings(self) -> list[str]:
        out = []
        if self.unreadable:
            out.append(f"{self.unreadable} events were not readable JSON (corrupt or nested too deeply) and were "
                       "skipped")
        if self.skipped:
            out.append(f"{self.skipped} events had fields of unexpected types and were skipped")
        return out


class _Producer:
    """Decodes batches into column chunks of a builder of its own (`builder.fresh()`), for another builder's merge:
    in the second process, or in the reader's own when it decodes a batch ahead of one not yet answered."""

    def __init__(self, builder) -> None:
        self.builder = builder.fresh()
        self.batches = _Batches(self.builder.add)

    def run(self, text) -> tuple | None:
        """(chunk, elements, events skipped) of a `[...]` batch of whole elements; None (nothing read) if it is not
        valid JSON."""
        batches = self.batches
        elements, skipped = batches.elements, batches.skipped
        if not batches.whole(text):
            return None
        return self.builder.take_chunk(), batches.elements - elements, batches.skipped - skipped


class _Rewind(Exception):  # noqa: N818
    """The second process could not read a batch taken for granted: the reader stands where it stood before it."""


_LOCAL, _REMOTE = 0, 1


class _Parallel:
    """Batches decoded by a second process (worker.py) while the reader reads on, merged in the text's order.

    Only the batches cut at a `}, {` separator (every batch of a valid text but its last) are handed on, and the
    reader goes on as if each had decoded; when the second process is busy the reader decodes the batch itself,
    with a builder of its own, so that the ids still follow the text's order. Every other step of the reader
    (the list's end, a cut by the scan, damage) first waits for all answers (`settle`). A batch the second process
    could not read puts the reader back where it stood before that batch, with the text since then, and the
    reader reads on alone, exactly as without a second process: what is read never depends on it."""

    def __init__(self, reader: Reader, builder, batches: _Batches, aside=None) -> None:
        self.reader, self.builder, self.batches, self.aside = reader, builder, batches, aside
        self.local = _Producer(builder)
        remote = _Producer(builder)  # the child's, forked with it
        self.ids = [[np.zeros(1, np.int32) for _ in range(3)] for _ in (_LOCAL, _REMOTE)]
        self.pending: deque = deque()  # [answered, result, text (its length if in a slot), mark, slot, source]
        self.asked: deque = deque()  # those the second process has not answered yet, in order
        self.free = list(range(SLOTS))
        self.fed: list[int] = []  # the length of each chunk fed since the oldest batch not merged (what a rewind
        self.fed_before = 0  # feeds again), and how many chunks were fed before those
        self.replay: list[bytes] = []  # after a rewind: the chunks to feed again, as they were fed
        self.worker = Worker(remote)
        self.on = True

    def offer(self, buf: bytearray, end: int, mark) -> bool:
        """Like `_Batches.whole` of `[` + buf[:end] + `]` (False: not valid JSON, nothing read), for a batch whose
        decoding may be taken for granted and merged later."""
        self._collect(wait=False)
        while not self.free and self._aside():  # the second process holds every batch it can: other work first
            self._collect(wait=False)
        if self.free and end + 2 <= SLOT_BYTES:
            slot = self.free.pop()
            self.worker.ask(slot, buf, end)
            entry = [False, None, end + 2, mark, slot, _REMOTE]  # its text stays in the slot until merged
            self.pending.append(entry)
            self.asked.append(entry)
            return True
        text = _as_array(buf, 0, end)
        result = self.local.run(text)
        if result is None:
            self.settle()
            self.stop()
            return False
        self.pending.append([True, result, text, mark, None, _LOCAL])
        self._merge()
        return True

    def _aside(self) -> bool:
        """One step of the aside work; False when there is none (left)."""
        if self.aside is None:
            return False
        try:
            next(self.aside)
            return True
        except StopIteration:
            self.aside = None
            return False

    def settle(self) -> None:
        """Wait for every answer and merge them all (or rewind at one the second process could not read)."""
        self._collect(wait=True)
        self._merge()

    def _collect(self, wait: bool) -> None:
        while self.asked and (wait or self.worker.ready()):
            entry = self.asked.popleft()
            entry[0], entry[1] = True, self.worker.answer()
            self._merge()

    def _merge(self) -> None:
        pending = self.pending
        while pending and pending[0][0]:
            entry = pending.popleft()
            if entry[1] is None:
                self._rewind(entry)
            if entry[5] == _REMOTE:
                self.free.append(entry[4])
            chunk, elements, skipped = entry[1]
            self.builder.merge(chunk, self.ids[entry[5]])
            self.batches.elements += elements
            self.batches.skipped += skipped
        if not pending:  # no rewind can go back before the chunks fed so far
            self.fed_before += len(self.fed)
            self.fed.clear()

    def _rewind(self, entry: list) -> None:
        """Put the reader back where it stood before `entry` was handed on: its state then, the text it held then,
        and the chunks fed since (to feed again one by one, as the reader alone would have met them)."""
        texts = [self.worker.text(e[4], e[2]) if e[5] == _REMOTE else e[2] for e in (entry, *self.pending)]
        since = b"".join(b"".join((memoryview(t)[1:-1], b",")) for t in texts) + bytes(self.reader.buf)
        state, scan, held, fed = entry[3]
        at, self.replay = held, []
        for size in self.fed[fed - self.fed_before:]:
            self.replay.append(since[at:at + size])
            at += size
        self.stop()
        self.reader.restore(state, scan, since[:held])
        raise _Rewind

    def stop(self) -> None:
        if self.on:
            self.on = False
            self.worker.close()
            self.pending.clear()
            self.asked.clear()


def _use_worker(path: Path) -> bool:
    setting = os.environ.get("DECODEGAP_READ_WORKER", "")
    if setting == "0":
        return False
    try:
        big = os.stat(path).st_size >= WORKER_MIN_FILE_BYTES
    except OSError:
        return False
    return (big or setting == "1") and can_fork()


START, OBJECT, EVENTS, DONE = range(4)  # where a Reader is: before the text, in the top-level object, in a list
MEMBER, KEY, COLON, VALUE, SKIP, AFTER = range(6)  # what the top-level object expects next
_QUOTE, _COLON, _COMMA, _OPEN, _END = b'"'[0], b":"[0], b","[0], b"["[0], b"}"[0]
_BOM = b"\xef\xbb\xbf"
_NOT_MARKED = frozenset(("path", "batches", "locate", "buf", "scan", "parallel", "held_limit"))


class Reader:
    """Follows a trace's text chunk by chunk (`feed`, then `finish`): the members of the top-level object, and the
    elements of its `traceEvents` list (or of a bare top-level list) in batches for `batches`. With `locate` it
    only finds where the events begin (`events_at`, an offset in the text) and reads nothing more."""

    def __init__(self, path: Path, batches: _Batches | None, locate: bool = False) -> None:
        self.path, self.batches, self.locate = path, batches, locate
        self.buf = bytearray()
        self.base = 0  # the offset in the text of buf[0]
        self.mode = START
        self.bare = False  # the text is a bare list of events
        self.next = MEMBER
        self.p = 0  # how far the top-level object is read, in buf
        self.key = ""
        self.member = 0  # where the member being read starts, in buf
        self.keep = False  # whether its text is kept for the header
        self.members: list[bytes] = []
        self.scan = Siblings()
        self.scanned = 0  # how far the scan has read, in buf
        self.searched = 0  # how far separators were looked for, in buf
        self.misses = 0  # separators that did not cut whole elements
        self.lost = False  # text that is not valid JSON misled the scan: only a separator puts it back on track
        self.events_at: int | None = None
        self.lists = 0  # traceEvents lists begun
        self.warnings: list[str] = []
        self.held_limit = text_limit_bytes(held=True)
        self.parallel: _Parallel | None = None

    def feed(self, chunk) -> None:
        if self.mode == DONE:
            return
        self.buf += chunk
        if self.parallel is not None and self.parallel.on:
            self.parallel.fed.append(len(chunk))
        self._run()
        if self.mode == EVENTS and self.held_limit is not None and len(self.buf) > self.held_limit:
            raise UserError(f"{self.path}: over {len(self.buf) / 1e9:.1f} GB of the trace's events must be held at "
                            f"once (one event that large, or text that is not JSON), more than the "
                            f"{self.held_limit / 1e9:.1f} GB this machine can decode safely (set "
                            "DECODEGAP_MAX_TRACE_BYTES to override)")

    def _run(self) -> None:
        try:
            while self.mode != DONE and self._step():
                pass
        except _Rewind:
            self._replay()

    def _replay(self) -> None:
        """Read on alone from where a rewind put the reader (before a batch the second process could not read),
        feeding again the chunks fed since, one by one: exactly what reading alone would have done."""
        pieces, self.parallel.replay = self.parallel.replay, []
        while self.mode != DONE and self._step():
            pass
        for piece in pieces:
            if self.mode == DONE:
                return
            self.buf += piece
            while self.mode != DONE and self._step():
                pass

    def _mark(self) -> tuple:
        """What a rewind needs to put the reader back here: its state, how much text it holds, and how many chunks
        were fed before (the text itself is kept by the batches handed on since, and the reader)."""
        state = {k: v for k, v in vars(self).items() if k not in _NOT_MARKED}
        state["members"], state["warnings"] = list(self.members), list(self.warnings)
        parallel = self.parallel
        return state, dict(vars(self.scan)), len(self.buf), parallel.fed_before + len(parallel.fed)

    def restore(self, state: dict, scan: dict, text: bytes) -> None:
        """Back to a state `_mark` took, holding `text` (the text held then)."""
        vars(self).update(state)
        vars(self.scan).update(scan)
        self.buf[:] = text

    def _settle(self) -> None:
        if self.parallel is not None and self.parallel.on:
            self.parallel.settle()

    def _step(self) -> bool:
        """One step of reading; False when it needs more text."""
        if self.mode == EVENTS:
            return self._events()
        if self.mode == OBJECT:
            return self._object()
        if self.base == 0 and self.buf.startswith(_BOM[:len(self.buf)]):
            if len(self.buf) < len(_BOM):
                return False
            self._trim(len(_BOM))  # a byte order mark, as Windows editors write
        p = _BLANK.match(self.buf).end()
        if p == len(self.buf):
            self._trim(p)
            return False
        if self.buf[p] == _OPEN:
            self.bare = True
            self._enter_events(p + 1)
        elif self.buf[p] == b"{"[0]:
            self.mode, self.p = OBJECT, p + 1
        else:
            raise NotATrace(f"{self.path}: {self._what_it_is()}")
        return True

    def _what_it_is(self) -> str:
        try:
            loads(bytes(self.buf[:PYTHON_JSON_MAX_BYTES]))
        except Unreadable as exc:
            return f"not a JSON trace ({exc})"
        return "not a profiler trace (no traceEvents list)"

    def _trim(self, n: int) -> None:
        """Let go of buf's first n bytes (read, and not kept)."""
        del self.buf[:n]
        self.base += n
        self.p -= n
        self.member -= n
        self.scanned = max(self.scanned - n, 0)
        self.searched = max(self.searched - n, 0)

    # --- the top-level object --------------------------------------------------------------------------------

    def _invalid(self, p: int) -> None:
        where = f"{bytes(self.buf[p:p + 24])!r} at byte {self.base + p:,} of the text"
        if not self.lists:
            raise NotATrace(f"{self.path}: not a JSON trace ({where} where a key, ':' or ',' belongs)")
        if self.next == AFTER and not self.bare:  # right after the `]` that ended the events: it did not
            self.mode, self.lost = EVENTS, True
            self._trim(p)
            return
        self.warnings.append(f"the text after the events is not valid JSON ({where}): the rest was not read")
        self.mode = DONE

    def _object(self) -> bool:
        buf = self.buf
        if self.next == KEY:
            m = _STRING.match(buf, self.p)
            if m is None:
                if len(buf) - self.p > KEY_MAX_BYTES:
                    self._invalid(self.p)
                return False
            try:
                self.key = _text.decode(m.group())
            except DECODE_ERRORS:
                self._invalid(self.p)
                return True
            self.p, self.next = m.end(), COLON
            return True
        if self.next == SKIP:
            return self._skip_value()
        p = _BLANK.match(buf, self.p).end()
        if p == len(buf):
            self.p = p
            if self.next in (MEMBER, AFTER):  # between members: nothing to keep
                self._trim(p)
            return False
        ch = buf[p]
        if self.next in (MEMBER, AFTER) and ch == _END:  # (after a comma, a trailing one, which is forgiven)
            self.mode = DONE
        elif self.next == MEMBER and ch == _QUOTE:
            self.member = self.p = p
            self.next = KEY
        elif self.next == AFTER and ch == _COMMA:
            self.p, self.next = p + 1, MEMBER
        elif self.next == COLON and ch == _COLON:
            self.p, self.next = p + 1, VALUE
        elif self.next == VALUE and self.key == "traceEvents" and ch == _OPEN:
            self._enter_events(p + 1)
            self.next = AFTER
        elif self.next == VALUE:
            self.keep = self.key in HEADER_FIELDS
            self.scan.reset()
            self.p = self.scanned = p
            self.next = SKIP
        else:
            self._invalid(p)
        return True

    def _skip_value(self) -> bool:
        """Read a member's value to the comma or brace after it; keep the member's text if it is a header field."""
        buf = self.buf
        commas, close = self.scan.scan(buf, self.scanned, len(buf), first_comma=True)
        end = int(commas[0]) if len(commas) else close
        if end < 0:
            self.scanned = len(buf)
            if self.keep and len(buf) - self.member > HEADER_MAX_BYTES:
                self.warnings.append(f"the trace's {self.key!r} is over {HEADER_MAX_BYTES >> 20} MB and was ignored")
                self.keep = False
            if not self.keep:
                self._trim(len(buf))
            return False
        if self.keep:
            self.members.append(bytes(buf[self.member:end]))
        self.keep = False
        self.p = end + 1
        if len(commas):
            self.next = MEMBER
        else:
            self.mode = DONE
        return True

    # --- the events ------------------------------------------------------------------------------------------

    def _enter_events(self, p: int) -> None:
        self._trim(p)
        self.mode = EVENTS
        self.lists += 1
        self.events_at = self.base
        self.scan.reset()
        self.scanned = self.searched = 0
        self.lost = False
        if self.locate:
            self.mode = DONE

    def _cut(self, n: int, reset: bool) -> None:
        """Drop the first n bytes of the events' text (decoded); `reset`: the scan starts afresh after them."""
        self._trim(n)
        if reset:
            self.scan.reset()
            self.scanned = 0

    def _last_separator(self) -> int:
        """The comma of the last `}, {` (any whitespace) in the text not yet searched; -1 if none."""
        buf = self.buf
        at = len(buf)
        for _ in range(64):
            at = buf.rfind(b"{", self.searched, at)
            if at < 0:
                break
            m = _SEPARATOR_BEFORE.search(buf, max(0, at - _SEPARATOR_LOOKBACK), at)
            if m is not None:
                return m.start() + m.group().index(b",")
        return -1

    def _events(self) -> bool:
        buf, batches = self.buf, self.batches
        parallel = self.parallel if self.parallel is not None and self.parallel.on else None
        mark = self._mark() if parallel is not None else None
        cut = self._last_separator() if self.lost or self.misses < GUESS_MISSES else -1
        self.searched = len(buf)
        if cut >= 0:
            if self.lost:  # back on track after text the scan could not follow
                self._settle()
                batches(_as_array(buf, 0, cut))
                self._cut(cut + 1, reset=True)
                self.lost, cut = False, -1
            elif parallel.offer(buf, cut, mark) if parallel is not None else batches.whole(_as_array(buf, 0, cut)):
                self._cut(cut + 1, reset=True)
                cut = -1
        if self.lost:
            return False
        commas, close = self.scan.scan(buf, self.scanned, len(buf))
        if self.scan.damaged or close >= 0 or len(commas) or cut > 0:
            self._settle()  # every step but a batch cut at a separator waits for the second process's answers
        if self.scan.damaged or close >= 0 and buf[close] != b"]"[0]:
            return self._damaged()  # a line feed inside a string, or a brace closing the list: not valid JSON
        if close >= 0:
            batches(_as_array(buf, 0, close))
            self._cut(close + 1, reset=True)
            if self.bare:
                self.mode = DONE
            else:
                self.mode, self.p = OBJECT, 0
            return True
        self.scanned = len(buf)
        if len(commas):
            end = int(commas[-1])
            valid = batches(_as_array(buf, 0, end))
            self._cut(end + 1, reset=False)
            cut -= end + 1
            if not valid:
                return self._damaged()
        if cut > 0:  # the separator did not cut whole elements: nested in one, or damage the scan cannot see?
            if batches.looks_damaged(buf[:cut]):
                return self._damaged()
            self.misses += 1
        return False

    def _damaged(self) -> bool:
        """Text that is not valid JSON: the scan's reading of it cannot be trusted until the next separator, which
        may already be in the text not yet decoded (so read on at once)."""
        self.lost = True
        self.scanned = len(self.buf)
        self.searched = 0
        return True

    # --- the end ---------------------------------------------------------------------------------------------

    def _close_misread_list(self, tries: int = 64) -> None:
        """At the end of a text whose events list never closed: if a `]` near the end closes it after all (the
        scan misread damaged text before it), read the elements before it one by one and the members after it."""
        buf = self.buf
        close = len(buf)
        for _ in range(tries):
            close = buf.rfind(b"]", max(0, len(buf) - TAIL_MAX_BYTES), close)
            if close < 0:
                return
            tail = bytes(buf[close + 1:])
            if self.bare:
                if tail.strip():
                    continue
            else:
                try:
                    loads(b'{"":0' + tail)
                except Unreadable:
                    continue
            self.batches.damaged_elements(buf[:close])
            self._cut(close + 1, reset=True)
            self.lost = False
            if self.bare:
                self.mode = DONE
                return
            self.mode, self.p = OBJECT, 0
            while self.mode != DONE and self._step():
                pass
            return

    def finish(self, truncated: str | None) -> tuple[schema.TraceDocument, str | None]:
        """The header, and why the text ends early when it does."""
        path = self.path
        if self.parallel is not None:
            try:
                self._settle()
            except _Rewind:
                self._replay()
            self.parallel.stop()
        if self.mode == START:
            if truncated:
                raise UserError(f"{path}: {truncated}")
            raise NotATrace(f"{path}: the file is empty")
        if self.mode == EVENTS and not truncated and (self.lost or self.batches.looks_damaged(self.buf)):
            self._close_misread_list()
        if self.mode == EVENTS:
            if self.lost:  # damaged text, then the cut
                self.batches.damaged_elements(self.buf)
            elif bytes(self.buf).strip():
                self.batches.elements_of(self.buf, cut_last=True)
            truncated = truncated or "the JSON ends early"
            if not self.batches.elements + self.batches.skipped + self.batches.unreadable:
                raise UserError(f"{path}: the JSON is truncated before its first whole event ({truncated})")
        if self.mode == OBJECT:
            if not self.lists:
                raise UserError(f"{path}: the JSON is truncated ({truncated or 'it ends before traceEvents'})")
            truncated = truncated or "the JSON ends early"
        if not self.lists:
            raise NotATrace(f"{path}: not a profiler trace (no traceEvents list)")
        if not self.members:
            return schema.TraceDocument(), truncated
        return _decode_header(path, b"{" + b",".join(self.members) + b"}"), truncated


def decode_trace(path: Path, consume: Consume, builder=None,
                 aside=None) -> tuple[schema.TraceDocument, list[str], str | None]:
    """Feed every event batch to `consume`; return the document's other fields, any warnings, and why the text
    ends early when it does (the caller decides whether what came before the cut can be trusted). With `builder`
    (whose `add` is `consume`; see TableBuilder.fresh, take_chunk, merge) a big file is decoded on two cores, and
    `aside` (an iterator) stepped while the second process holds every batch it can (load_trace)."""
    batches = _Batches(consume)
    reader = Reader(path, batches)
    truncated: str | None = None
    if builder is not None and _use_worker(path):
        reader.parallel = _Parallel(reader, builder, batches, aside)  # forked before the read-ahead thread starts
    try:
        try:
            with closing(iter_text_chunks(path, text_limit_bytes())) as chunks:  # closed at once when feed raises
                for chunk in chunks:
                    reader.feed(chunk)
        except TruncatedStream as exc:
            truncated = str(exc)
        header, truncated = reader.finish(truncated)
    finally:
        if reader.parallel is not None:
            reader.parallel.stop()
    return header, reader.warnings + batches.warnings(), truncated


def _decode_header(path: Path, text: bytes) -> schema.TraceDocument:
    try:
        return _header.decode(text)
    except DECODE_ERRORS:
        pass
    try:
        raw = loads(text)
    except Unreadable as exc:
        raise UserError(f"{path}: the trace header is not valid JSON ({exc})") from None
    return _pick_header(raw if isinstance(raw, dict) else {})


def _finite(value):
    """`value` with NaN and infinite numbers (which only Python's json reads) replaced by None, in place."""
    stack = [value]
    while stack:
        item = stack.pop()
        keys = item.keys() if isinstance(item, dict) else range(len(item)) if isinstance(item, list) else ()
        for key in keys:
            child = item[key]
            if isinstance(child, float) and not math.isfinite(child):
                item[key] = None
            elif isinstance(child, (dict, list)):
                stack.append(child)
    return value


def _pick_header(raw: dict) -> schema.TraceDocument:
    """The header fields that have the expected types; the others are ignored."""

    def field(key, kind):
        value = raw.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return _finite(value) if isinstance(value, kind) and not isinstance(value, bool) else None

    return schema.TraceDocument(
        deviceProperties=field("deviceProperties", list), distributedInfo=field("distributedInfo", dict),
        decodegap_record=field("decodegap_record", dict),
        baseTimeNanoseconds=field("baseTimeNanoseconds", (int, float)),
    )

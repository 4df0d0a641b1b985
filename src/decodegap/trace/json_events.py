"""Decoding a trace's JSON text into event records, batch by batch.

Kineto writes one event per block, separated by `},\\n  {`. Cutting the text at those separators lets each
few-megabyte batch be decoded (typed, only the needed fields) and turned into columns before the next is read,
so memory holds one batch of records instead of the whole file's. Text laid out any other way (minified,
re-indented, a bare event array) is decoded whole, which costs more memory but reads the same.

Odd text degrades step by step instead of failing the file: a batch msgspec refuses is read untyped (by Python's
json when msgspec refuses NaN, Infinity or 1e999), and failing that event by event, skipping what cannot be read."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from decodegap.errors import UserError
from decodegap.trace import schema
from decodegap.trace.read import CHUNK_BYTES, NotATrace, TruncatedStream, iter_text_chunks, text_limit_bytes, too_big

EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
SEPARATOR = b"},\n  {"
HEADER_MAX_BYTES = 64 << 20

Consume = Callable[[list], None]
# What a decoder raises on text it cannot read: msgspec reports bad UTF-8 inside strings as UnicodeDecodeError, a
# number beyond float range (1e999) as ValidationError even untyped, and nesting deeper than the interpreter's
# recursion limit as RecursionError.
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
# Python's json reads NaN, Infinity and 1e999 (which other tools write) but builds a dict per object: small texts only.
PYTHON_JSON_MAX_BYTES = 64 << 20
_event_list = msgspec.json.Decoder(list[schema.AnyEvent], strict=False)
_document = msgspec.json.Decoder(schema.Document, strict=False)
_one_event = msgspec.json.Decoder(schema.AnyEvent, strict=False)


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


class _Batches:
    """Decodes event batches, falling back to event-by-event conversion for batches with odd field types."""

    def __init__(self, path: Path, consume: Consume) -> None:
        self.path, self.consume = path, consume
        self.skipped = 0  # events with fields of unexpected types
        self.unreadable = 0  # events whose text no decoder could read
        self.seen_separator = False

    def decode(self, text) -> list:
        try:
            return _event_list.decode(text)
        except DECODE_ERRORS:
            return self._tolerant(text)

    def _tolerant(self, text) -> list:
        try:
            items = loads(text)
        except Unreadable:
            return self._one_by_one(text)
        return self._convert(items if isinstance(items, list) else [items])

    def _one_by_one(self, text) -> list:
        """Each event of a `[...]` batch on its own. Kineto's separator holds a raw newline, which no JSON string
        may contain, so the pieces between separators are whole events."""
        pieces = bytes(text[1:-1]).split(SEPARATOR)
        events = []
        for i, piece in enumerate(pieces):
            one = (b"{" if i else b"") + piece + (b"}" if i < len(pieces) - 1 else b"")
            try:
                events.append(_one_event.decode(one))
                continue
            except DECODE_ERRORS:
                pass
            try:
                events += self._convert([loads(one)])
            except Unreadable:
                self.unreadable += 1
        return events

    def _convert(self, items: list) -> list:
        events = []
        for item in items:
            if isinstance(item, dict):
                _times_as_words(item)
            try:  # through JSON again, so the Raw fields are filled as on the fast path
                events.append(_one_event.decode(msgspec.json.encode(item)))
            except (*DECODE_ERRORS, OverflowError, TypeError):
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

    def __call__(self, text) -> None:
        self.consume(self.decode(text))


def decode_trace(path: Path, consume: Consume) -> tuple[schema.TraceDocument, list[str], str | None]:
    """Feed every event batch to `consume`; return the document's other fields, any warnings, and why the text
    ends early when it does (the caller decides whether what came before the cut can be trusted)."""
    warnings: list[str] = []
    batches = _Batches(path, consume)
    head = bytearray()
    header_text: bytes | None = None
    pending = bytearray()
    whole: bytearray | None = None
    truncated: str | None = None
    try:
        whole_limit = text_limit_bytes(streaming=False)
        for chunk in iter_text_chunks(path, text_limit_bytes(streaming=True)):
            if whole is not None:
                whole += chunk
                if whole_limit is not None and len(whole) > whole_limit:
                    raise too_big(path, len(whole), whole_limit)
                continue
            if header_text is None:
                head += chunk
                match = EVENTS_KEY.search(head)
                if match is None:
                    if len(head) > HEADER_MAX_BYTES:
                        whole, head = head, bytearray()
                    continue
                header_text = bytes(head[: match.end()])
                pending = head[match.end():]
                head = bytearray()
            else:
                pending += chunk
            cut = pending.rfind(SEPARATOR)
            if cut < 0:
                if len(pending) > 4 * CHUNK_BYTES:  # not Kineto's layout: decode the whole text instead
                    whole = bytearray(header_text) + pending
                    pending = bytearray()
                continue
            batches.seen_separator = True
            batches(b"[" + pending[: cut + 1] + b"]")
            del pending[: cut + 2]
    except TruncatedStream as exc:
        truncated = str(exc)

    if whole is None and header_text is not None and not batches.seen_separator:
        whole = bytearray(header_text) + pending  # one line or another layout: not Kineto's, decode it whole
    if whole is not None or header_text is None:
        text = whole if whole is not None else head
        if truncated:
            raise UserError(f"{path}: {truncated}")
        doc = _decode_whole(path, text, batches)
        return doc, warnings + batches.warnings(), None

    events, footer = _split_tail(pending, batches)
    if events is None:
        # The file was cut off (profiler killed mid-export, partial copy): every complete event is kept.
        truncated = truncated or "the JSON ends early"
        footer = b"}"
    else:
        batches.consume(events)
    header = _decode_header(path, header_text + b"]" + footer, header_text + b"]}")
    if not isinstance(header, schema.TraceDocument):
        raise NotATrace(f"{path}: not a profiler trace (the top level is not an object)")
    return header, warnings + batches.warnings(), truncated


def _decode_header(path: Path, text: bytes, fallback: bytes) -> schema.TraceDocument:
    error = ""
    for candidate in (text, fallback):
        try:
            return _document.decode(candidate)
        except DECODE_ERRORS:
            pass
        try:
            raw = loads(candidate)
        except Unreadable as exc:
            error = str(exc)
            continue
        return _pick_header(raw if isinstance(raw, dict) else {}, [])
    raise UserError(f"{path}: the trace header is not valid JSON ({error})")


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


def _pick_header(raw: dict, events: list) -> schema.TraceDocument:
    """The header fields that have the expected types; the others are ignored."""

    def field(key, kind):
        value = raw.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return _finite(value) if isinstance(value, kind) and not isinstance(value, bool) else None

    return schema.TraceDocument(
        traceEvents=events, deviceProperties=field("deviceProperties", list),
        distributedInfo=field("distributedInfo", dict), decodegap_record=field("decodegap_record", dict),
        baseTimeNanoseconds=field("baseTimeNanoseconds", (int, float)),
    )


def _split_tail(pending: bytearray, batches: _Batches, tries: int = 64) -> tuple[list | None, bytes]:
    """Split `<last event> ] <rest of document>` at the bracket that closes traceEvents, trying the last
    brackets first (the rest of the document is short); None when the text was cut off before it."""
    close = len(pending)
    for _ in range(tries):
        close = pending.rfind(b"]", 0, close)
        if close < 0:
            break
        text = b"[" + pending[:close] + b"]"
        try:
            return _event_list.decode(text), bytes(pending[close + 1:])
        except DECODE_ERRORS:
            pass
        try:  # odd values (NaN, a string for a number) rather than the wrong bracket?
            items = loads(text)
        except Unreadable:
            continue
        return batches._convert(items if isinstance(items, list) else [items]), bytes(pending[close + 1:])
    return None, b""


def _decode_whole(path: Path, text, batches: _Batches) -> schema.TraceDocument:
    if not bytes(text[:4096]).strip():
        raise NotATrace(f"{path}: the file is empty")
    try:
        doc = _document.decode(text)
    except DECODE_ERRORS as exc:
        if isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc).lower():
            raise UserError(f"{path}: the JSON is truncated ({exc})") from None
        doc = _tolerant_document(path, text, batches)
    if isinstance(doc, list):
        doc = schema.TraceDocument(traceEvents=doc)
    if not isinstance(doc, schema.TraceDocument) or doc.traceEvents is None:
        raise NotATrace(f"{path}: not a profiler trace (no traceEvents list)")
    batches.consume(doc.traceEvents)
    doc.traceEvents = None
    return doc


def _tolerant_document(path: Path, text, batches: _Batches) -> schema.TraceDocument:
    try:
        raw = loads(text)
    except Unreadable as exc:
        raise NotATrace(f"{path}: not a JSON trace ({exc})") from None
    events = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(events, list):
        raise NotATrace(f"{path}: not a profiler trace (no traceEvents list)")
    converted = batches._convert(events)
    return _pick_header(raw if isinstance(raw, dict) else {}, converted)

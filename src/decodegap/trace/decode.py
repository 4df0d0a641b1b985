"""Decoding a trace's JSON text into event records, batch by batch.

Kineto writes one event per block, separated by `},\\n  {`. Cutting the text at those separators lets each
few-megabyte batch be decoded (typed, only the needed fields) and turned into columns before the next is read,
so memory holds one batch of records instead of the whole file's. Text laid out any other way (minified,
re-indented, a bare event array) is decoded whole, which costs more memory but reads the same."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec

from decodegap.errors import UserError
from decodegap.trace import schema
from decodegap.trace.read import CHUNK_BYTES, TruncatedStream, iter_text_chunks, text_limit_bytes, too_big

EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
SEPARATOR = b"},\n  {"
HEADER_MAX_BYTES = 64 << 20

Consume = Callable[[list], None]
# msgspec reports bad UTF-8 inside strings as UnicodeDecodeError rather than DecodeError.
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
_event_list = msgspec.json.Decoder(list[schema.AnyEvent], strict=False)
_document = msgspec.json.Decoder(schema.Document, strict=False)
_one_event = msgspec.json.Decoder(schema.AnyEvent, strict=False)


class _Batches:
    """Decodes event batches, falling back to event-by-event conversion for batches with odd field types."""

    def __init__(self, path: Path, consume: Consume) -> None:
        self.path, self.consume = path, consume
        self.skipped = 0
        self.seen_separator = False

    def decode(self, text) -> list:
        try:
            return _event_list.decode(text)
        except msgspec.ValidationError:
            return self._tolerant(text)
        except DECODE_ERRORS as exc:
            raise UserError(f"{self.path}: invalid JSON inside traceEvents ({exc})") from None

    def _tolerant(self, text) -> list:
        try:
            items = msgspec.json.decode(text)
        except DECODE_ERRORS as exc:
            raise UserError(f"{self.path}: invalid JSON inside traceEvents ({exc})") from None
        return self._convert(items)

    def _convert(self, items: list) -> list:
        events = []
        for item in items:
            try:  # through JSON again, so the Raw fields are filled as on the fast path
                events.append(_one_event.decode(msgspec.json.encode(item)))
            except msgspec.ValidationError:
                self.skipped += 1
        return events

    def __call__(self, text) -> None:
        self.consume(self.decode(text))


def decode_trace(path: Path, consume: Consume) -> tuple[schema.TraceDocument, list[str]]:
    """Feed every event batch to `consume`; return the document's other fields and any warnings."""
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
        return _decode_whole(path, text, batches), warnings

    events, footer = _split_tail(pending, batches)
    if events is None:
        # The file was cut off (profiler killed mid-export, partial copy): keep every complete event.
        warnings.append(f"the trace is truncated ({truncated or 'the JSON ends early'}); "
                        "the events before the cut were analyzed")
        footer = b"}"
    else:
        batches.consume(events)
        if truncated:
            warnings.append(f"the trace is truncated ({truncated}); the events before the cut were analyzed")
    header = _decode_header(path, header_text + b"]" + footer, header_text + b"]}")
    if batches.skipped:
        warnings.append(f"{batches.skipped} events had fields of unexpected types and were skipped")
    if not isinstance(header, schema.TraceDocument):
        raise UserError(f"{path}: not a profiler trace (the top level is not an object)")
    return header, warnings


def _decode_header(path: Path, text: bytes, fallback: bytes) -> schema.TraceDocument:
    for candidate in (text, fallback):
        try:
            return _document.decode(candidate)
        except msgspec.ValidationError:
            raw = msgspec.json.decode(candidate)
            return _pick_header(raw if isinstance(raw, dict) else {}, [])
        except DECODE_ERRORS as exc:
            error = exc
    raise UserError(f"{path}: the trace header is not valid JSON ({error})")


def _pick_header(raw: dict, events: list) -> schema.TraceDocument:
    """The header fields that have the expected types; the others are ignored."""

    def field(key, kind):
        value = raw.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

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
        except msgspec.ValidationError:
            return batches._tolerant(text), bytes(pending[close + 1:])
        except DECODE_ERRORS:
            continue
    return None, b""


def _decode_whole(path: Path, text, batches: _Batches) -> schema.TraceDocument:
    if not bytes(text[:4096]).strip():
        raise UserError(f"{path}: the file is empty")
    try:
        doc = _document.decode(text)
    except msgspec.ValidationError:
        doc = _tolerant_document(path, text, batches)
    except DECODE_ERRORS as exc:
        if "truncated" in str(exc).lower():
            raise UserError(f"{path}: the JSON is truncated ({exc})") from None
        raise UserError(f"{path}: not a JSON trace ({exc})") from None
    if isinstance(doc, list):
        doc = schema.TraceDocument(traceEvents=doc)
    if not isinstance(doc, schema.TraceDocument) or doc.traceEvents is None:
        raise UserError(f"{path}: not a profiler trace (no traceEvents list)")
    batches.consume(doc.traceEvents)
    doc.traceEvents = None
    return doc


def _tolerant_document(path: Path, text, batches: _Batches) -> schema.TraceDocument:
    try:
        raw = msgspec.json.decode(text)
    except DECODE_ERRORS as exc:
        raise UserError(f"{path}: not a JSON trace ({exc})") from None
    events = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(events, list):
        raise UserError(f"{path}: not a profiler trace (no traceEvents list)")
    converted = batches._convert(events)
    return _pick_header(raw if isinstance(raw, dict) else {}, converted)

"""Reading a trace file's text as a stream of byte chunks: plain or gzipped JSON (told by magic bytes, not the
name), with a hard stop for files that would not fit in memory."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from queue import Full, Queue

from decodegap.errors import UserError

try:  # ISA-L's inflate: zlib's stream API, about 3x faster; the text of a .gz is made on a core the decoding shares
    from isal import isal_zlib as inflate_library
except ImportError:  # a platform without its wheels: the standard library's
    inflate_library = zlib
INFLATE_ERRORS = (zlib.error, inflate_library.error)

# The text is read a chunk at a time: a couple of megabytes, so a chunk, the records decoded from it and the passes
# over them stay in the CPU's caches, and what is held at once stays small.
CHUNK_BYTES = 1 << 21
COMPRESSED_READ_BYTES = 1 << 18
GZIP_WBITS = zlib.MAX_WBITS | 16
READ_AHEAD = 2  # pieces of text made ahead of the reader (at most CHUNK_BYTES each)
# Memory per byte of trace text: the streaming decoder keeps only columns (about a sixth of the text), in every
# layout. Text that must be held at once (one event that large, or damaged text the decoder cannot cut) is held with
# its records. Refuse what cannot fit rather than swap.
STREAMING_TEXT_PER_MEMORY = 4.0
HELD_TEXT_PER_MEMORY = 1 / 2.5
# JSON may start with any amount of blank space, but a trace starts with `{` or `[`: a file that is blank this far
# in is refused at once, instead of after reading gigabytes of spaces.
LEADING_BLANK_MAX = 1 << 20
JSON_BLANKS = b" \t\n\r"


# Called after each chunk read with (path, bytes of the file read so far, file size): a progress display's hook
# (decodegap.report.progress); None reads silently.
ON_READ: ContextVar[Callable[[Path, int, int], None] | None] = ContextVar("decodegap_on_read", default=None)


class NotATrace(UserError):
    """The file is no profiler trace at all (empty, not JSON, JSON without traceEvents): a folder skips it."""


class TruncatedStream(Exception):
    """The compressed stream ended early; the text read so far is still usable."""


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def text_limit_bytes(held: bool = False) -> int | None:
    """The most trace text this machine can decode (with `held`: hold at once): DECODEGAP_MAX_TRACE_BYTES, else
    from available memory."""
    env = os.environ.get("DECODEGAP_MAX_TRACE_BYTES")
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise UserError(f"DECODEGAP_MAX_TRACE_BYTES={env!r} is not a number of bytes") from None
    available = available_memory_bytes()
    if available is None:
        return None
    return int(available * (HELD_TEXT_PER_MEMORY if held else STREAMING_TEXT_PER_MEMORY))


def too_big(path: Path, size: int, limit: int) -> UserError:
    return UserError(
        f"{path}: the trace is over {size / 1e9:.1f} GB of text, more than the {limit / 1e9:.1f} GB this machine "
        "can decode safely (set DECODEGAP_MAX_TRACE_BYTES to override, or capture fewer steps)"
    )


def _open(path: Path):
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    return f


def _gunzip(f, path: Path) -> Iterator[bytes]:
    """The decompressed text of a gzip file (one or more members) in pieces of at most CHUNK_BYTES, each as the
    inflater made it (not gathered into bigger chunks: the reader holds what it needs, and a copy of the text would
    cost time and memory). An inflater object rather than GzipFile: GzipFile.read loses what it decompressed before
    a cut, and a cut .gz must keep the same text as the same cut .json. Raises TruncatedStream at a cut (after
    yielding what came before), UserError at damaged data."""
    inflater = inflate_library.decompressobj(GZIP_WBITS)
    data, produced, held = b"", 0, False
    while True:
        if not data and not held:
            data = f.read(COMPRESSED_READ_BYTES)
            if not data:
                if inflater.eof:
                    return
                raise TruncatedStream("the gzip stream ends early (truncated file)")
        after_member = inflater.eof
        if after_member:  # another member follows, or padding
            if not data.strip(b"\x00"):
                data = b""
                continue
            inflater = inflate_library.decompressobj(GZIP_WBITS)
        try:
            text = inflater.decompress(data, CHUNK_BYTES)
        except INFLATE_ERRORS as exc:
            if after_member:  # bytes that are no gzip follow a whole, checksummed member: the text ends there
                return
            if not produced:
                raise UserError(f"{path}: not a readable gzip file ({exc})") from None
            # most damage is noticed only at the checksum, after decoding past it: no text of it can be trusted
            raise UserError(f"{path}: the gzip data is damaged (noticed after {produced} bytes of text: "
                            f"{exc})") from None
        data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        # a full piece may leave text inside the inflater (ISA-L's holds it with no tail left): ask again, with no input
        held = len(text) == CHUNK_BYTES and not inflater.eof
        if text:
            produced += len(text)
            yield text


def _plain(f) -> Iterator[bytes]:
    while chunk := f.read(CHUNK_BYTES):
        yield chunk


def _is_blank(chunk: bytes) -> bool:
    # isspace() stops at the first other byte (cheap on real text); the translate confirms JSON's four blanks only
    return chunk.isspace() and not chunk.translate(None, JSON_BLANKS)


def iter_text_chunks(path: Path, limit: int | None = None) -> Iterator[bytes]:
    """The trace's text in chunks, without its leading blank space. A chunk that is all blank space comes as a
    single space (the same JSON outside strings), so no amount of blank space costs memory.
    Raises TruncatedStream at a cut-off gzip stream (after yielding what it had)."""
    leading = 0
    for chunk in _raw_chunks(path, limit):
        if leading is not None:
            text = chunk.lstrip(JSON_BLANKS)
            leading += len(chunk) - len(text)
            if leading > LEADING_BLANK_MAX:
                raise NotATrace(f"{path}: not a JSON trace (over {leading >> 20} MB of blank space before any JSON)")
            if not text:
                continue
            chunk, leading = text, None
        yield b" " if _is_blank(chunk) else chunk


def _ahead(pieces: Iterator[bytes], f) -> Iterator[tuple[bytes, int]]:
    """(piece, how far the file is read) of `pieces`, made by a thread of their own up to READ_AHEAD pieces ahead:
    the inflater lets go of the interpreter while it inflates (and checks the CRC), so on a second core the text of
    the next pieces is made while this one is decoded. What the thread raises is raised here, after the pieces made
    before it; when the reader stops early, the thread stops at its next piece."""
    queue: Queue = Queue(READ_AHEAD)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.05)
                return True
            except Full:
                pass
        return False

    def run() -> None:
        try:
            for piece in pieces:
                if piece and not put((piece, f.tell())):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001  (handed to the reader, which raises it)
            put(_Raised(exc))
        finally:
            pieces.close()

    thread = threading.Thread(target=run, name="decodegap-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = queue.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


def _raw_chunks(path: Path, limit: int | None) -> Iterator[bytes]:
    total = 0
    on_read = ON_READ.get()
    with _open(path) as f:
        compressed = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        size = os.fstat(f.fileno()).st_size if on_read else 0
        try:
            for chunk, at in _ahead(_gunzip(f, path) if compressed else _plain(f), f):
                total += len(chunk)
                if limit is not None and total > limit:
                    raise too_big(path, total, limit)
                if on_read:
                    on_read(path, at, size)
                yield chunk
        except OSError as exc:
            raise UserError(f"{path}: cannot read ({exc})") from None

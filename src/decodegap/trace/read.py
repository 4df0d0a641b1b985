"""Reading a trace file's text as a stream of byte chunks: plain or gzipped JSON (told by magic bytes, not the
name), with a hard stop for files that would not fit in memory."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from decodegap.errors import UserError

CHUNK_BYTES = 1 << 23
# Memory per byte of trace text: the streaming decoder keeps only columns (about a sixth of the text), the
# whole-text fallback for other layouts keeps the text plus its records. Refuse what cannot fit rather than swap.
STREAMING_TEXT_PER_MEMORY = 4.0
WHOLE_TEXT_PER_MEMORY = 1 / 2.5


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


def text_limit_bytes(streaming: bool = True) -> int | None:
    """The most trace text this machine can decode: DECODEGAP_MAX_TRACE_BYTES, else from available memory."""
    env = os.environ.get("DECODEGAP_MAX_TRACE_BYTES")
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise UserError(f"DECODEGAP_MAX_TRACE_BYTES={env!r} is not a number of bytes") from None
    available = available_memory_bytes()
    if available is None:
        return None
    return int(available * (STREAMING_TEXT_PER_MEMORY if streaming else WHOLE_TEXT_PER_MEMORY))


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
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb"), True
    return f, False


def iter_text_chunks(path: Path, limit: int | None = None) -> Iterator[bytes]:
    """The trace's text in chunks. Raises TruncatedStream at a cut-off gzip stream (after yielding what it had)."""
    stream, compressed = _open(path)
    total = 0
    with stream:
        while True:
            try:
                chunk = stream.read(CHUNK_BYTES)
            except EOFError:
                raise TruncatedStream("the gzip stream ends early (truncated file)") from None
            except (gzip.BadGzipFile, zlib.error) as exc:
                if total:
                    raise TruncatedStream(f"the gzip stream is corrupt after {total} bytes ({exc})") from None
                raise UserError(f"{path}: not a readable gzip file ({exc})") from None
            except OSError as exc:
                raise UserError(f"{path}: cannot read ({exc})") from None
            if not chunk:
                return
            total += len(chunk)
            if limit is not None and total > limit:
                raise too_big(path, total, limit)
            yield chunk

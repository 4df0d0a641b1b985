"""A progress bar on stderr while a large trace loads: only when stderr is a terminal (a pipe, a file or a CI log
gets nothing), only for traces over PROGRESS_MIN_BYTES of text (a small trace loads faster than a bar is worth;
a gzipped trace counts by the text size its gzip trailer records). Driven by the loader's chunk reads through
decodegap.trace.read.ON_READ; the bar counts bytes of the file read."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from decodegap.trace.read import ON_READ

PROGRESS_MIN_BYTES = 50_000_000  # of trace text


@contextmanager
def load_progress(stream: TextIO | None = None, min_bytes: int = PROGRESS_MIN_BYTES,
                  force: bool = False) -> Iterator[None]:
    """Show a bar on `stream` (stderr) for each trace file over `min_bytes` read inside the block. `force`: draw
    even when the stream is no terminal (tests)."""
    stream = stream if stream is not None else sys.stderr
    if not (force or _is_tty(stream)):
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(file=stream, force_terminal=True if force else None)
    progress = Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(),
                        TimeRemainingColumn(), console=console, transient=True)
    tasks: dict[Path, int] = {}

    small: set[Path] = set()

    def on_read(path: Path, done: int, size: int) -> None:
        if path in small:
            return
        if path not in tasks and text_bytes(path, size) < min_bytes:
            small.add(path)
            return
        if path not in tasks:
            if not tasks:
                progress.start()
            tasks[path] = progress.add_task(path.name, total=size)
            progress.update(tasks[path], completed=done)
            progress.refresh()  # drawn at once, not on the refresh thread's next tick (a fast read may end first)
            return
        progress.update(tasks[path], completed=done)

    token = ON_READ.set(on_read)
    try:
        yield
    finally:
        ON_READ.reset(token)
        if tasks:
            progress.stop()


def text_bytes(path: Path, size: int) -> int:
    """The trace's text size: the file's, or for gzip the size its trailer records (ISIZE: the last member's text
    modulo 4 GiB, so at least the file's size is taken)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, 2)
            return max(int.from_bytes(f.read(4), "little"), size)
    except OSError:
        return size


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False

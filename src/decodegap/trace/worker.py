"""A second process that decodes event batches beside the reader, on a second core.

Decoding a batch (msgspec) and turning it into columns take ~80% of reading a trace, and both hold the
interpreter: a thread cannot share them. A process forked before the reading starts (so it shares everything
imported, copy-on-write, and starts in milliseconds) takes batches the reader hands it: the text goes through a few
slots of shared memory, the column chunks come back pickled through a pipe. It runs `run(text)` on a producer of its
own and answers, in the order asked, its chunk or None (the text is no batch of whole elements, or anything went
wrong). It ends when the pipe to it is closed, and never runs the parent's exit handlers.

Forking is safe only in a process with no other threads (a thread's locks would stay held in the child), so the
reader uses it only then, only on Linux, only outside other workers' processes, and only with two cores or more."""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import struct
import sys
import threading

SLOTS = 3  # batches in flight at once
SLOT_BYTES = 8 << 20  # a batch longer than this is decoded by the reader itself
PIPE_BYTES = 1 << 20  # the answers' pipe, so a chunk is written without waiting for the reader to read it
_F_SETPIPE_SZ = 1031
_ASK = struct.Struct("<II")  # slot, bytes
_SIZE = struct.Struct("<Q")


def can_fork() -> bool:
    """Whether a decoding process may be forked here: Linux, at least two cores for this process, no other thread
    running, and not inside a multiprocessing worker (a folder's --jobs already uses every core)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        if len(os.sched_getaffinity(0)) < 2:
            return False
    except (AttributeError, OSError):
        return False
    process = sys.modules.get("multiprocessing.process")
    return process is None or process.parent_process() is None


class Worker:
    """The forked process, from the parent's side: `ask(slot, text)`, then `answer()` in the same order."""

    def __init__(self, producer) -> None:
        self.memory = mmap.mmap(-1, SLOTS * SLOT_BYTES)  # shared with the child (MAP_SHARED)
        ask_r, ask_w = os.pipe()
        answer_r, answer_w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(answer_w, _F_SETPIPE_SZ, PIPE_BYTES)
        except (ImportError, OSError):
            pass
        pid = os.fork()
        if pid == 0:  # the child: serve until the pipe closes, then leave without the parent's exit handlers
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which ends this
                os.close(ask_w)
                os.close(answer_r)
                _serve(ask_r, answer_w, self.memory, producer)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(ask_r)
        os.close(answer_w)
        self.pid, self.ask_fd, self.answer_fd = pid, ask_w, answer_r

    def ask(self, slot: int, buf, end: int) -> None:
        """Hand on `[` + buf[:end] + `]` (a batch's elements), written straight into the slot (no copy of it is made
        first)."""
        start = slot * SLOT_BYTES
        memory = self.memory
        memory[start] = 0x5B  # [
        with memoryview(buf) as view:
            memory[start + 1:start + 1 + end] = view[:end]
        memory[start + 1 + end] = 0x5D  # ]
        try:
            _write(self.ask_fd, _ASK.pack(slot, end + 2))
        except OSError:  # the child is gone (killed, out of memory): its answer reads as the pipe's end, None
            pass

    def text(self, slot: int, size: int) -> bytes:
        """The text asked in `slot` (kept there until the slot is asked again)."""
        return self.memory[slot * SLOT_BYTES:slot * SLOT_BYTES + size]

    def ready(self) -> bool:
        return bool(select.select([self.answer_fd], [], [], 0)[0])

    def answer(self):
        """The next answer (waiting for it); None when the batch was not read or the child is gone."""
        head = _read(self.answer_fd, _SIZE.size)
        if head is None:
            return None
        data = _read(self.answer_fd, _SIZE.unpack(head)[0])
        return None if data is None else pickle.loads(data)

    def close(self) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        LAST_MEMORY.clear()
        LAST_MEMORY.update(_memory(pid))
        for fd in (self.ask_fd, self.answer_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        self.memory.close()


# The last child's memory when it ended (for benchmarks): its peak RSS, which counts the pages it shares with the
# parent (all the parent held when it forked), and what it held of its own then (private pages), in bytes.
LAST_MEMORY: dict[str, int] = {}


def _memory(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            out.update(peak_rss=int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) << 10)
        with open(f"/proc/{pid}/smaps_rollup") as f:
            out.update(private=sum(int(line.split()[1]) for line in f if line.startswith("Private_")) << 10)
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return out


def _serve(ask_fd: int, answer_fd: int, memory: mmap.mmap, producer) -> None:
    while True:
        head = _read(ask_fd, _ASK.size)
        if head is None:
            return
        slot, size = _ASK.unpack(head)
        start = slot * SLOT_BYTES
        try:  # decoded where it lies (the records' raw fields are copied out before the slot is asked again)
            result = producer.run(memoryview(memory)[start:start + size])
        except Exception:  # noqa: BLE001  (MemoryError too: the reader reads this batch itself)
            result = None
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        _write(answer_fd, _SIZE.pack(len(data)) + data)


def _read(fd: int, size: int) -> bytes | None:
    """Exactly `size` bytes, or None at the end of the pipe."""
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _write(fd: int, data: bytes) -> None:
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.write(fd, view[done:])

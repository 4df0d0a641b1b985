"""Where a trace goes and how it gets there: file name, rank, atomic gzip write, one-line warnings.

Stdlib only: this module is imported in every process that `decodegap record` touches.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass

TRACE_SUFFIX = ".decodegap.pt.trace.json.gz"
# Temp files carry this suffix so that a glob for finished traces (`*.pt.trace.json.gz`) never sees them.
PARTIAL_SUFFIX = ".decodegap.partial"
# A temp file is `.<pid>.<kind>.<8 hex>.<host>.decodegap.partial`, so that `record` can tell which process left it
# (and whether that process is gone); anything the exporter adds after the name (a `.tmp` of its own) matches too.
_PARTIAL_RE = re.compile(r"^\.(?P<pid>\d+)\.(?P<kind>[a-z]+)\.[0-9a-f]{8}\.(?P<host>.+?)\.decodegap\.partial")


def warn(message: str) -> None:
    """One line on stderr, prefixed `decodegap: warning:`; never raises (stderr may be closed in a daemon)."""
    try:
        sys.stderr.write(f"decodegap: warning: {' '.join(str(message).split())}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110 - a warning must never break the host program
        pass


def host_name() -> str:
    # Keep the file name portable: no path separators or spaces from an odd host name.
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def detect_rank() -> tuple[int | None, int | None]:
    """(rank, world_size): torch.distributed when initialized, else RANK, else LOCAL_RANK; None when unknown."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001, S110 - a half-torn-down process group is not our problem
        pass
    world = _env_int("WORLD_SIZE")
    for name in ("RANK", "LOCAL_RANK"):
        rank = _env_int(name)
        if rank is not None:
            return rank, world
    return None, world


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def trace_path(out_dir: str, rank: int | None, pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return os.path.join(out_dir, f"{host_name()}.{pid}.rank-{rank or 0}{TRACE_SUFFIX}")


def check_writable(out_dir: str) -> str | None:
    """Create out_dir if needed and prove a file can be made in it; returns why not, or None."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".probe-", suffix=PARTIAL_SUFFIX)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc} ({out_dir})"
    return None


def publish_gzip(json_path: str, final_path: str) -> None:
    """Gzip json_path into a temp file beside final_path, then rename it into place (atomic on POSIX).

    A reader sees either no file or a whole one under final_path, never a half-written one.
    """
    out_dir = os.path.dirname(final_path) or "."
    fd, tmp = _create_temp(out_dir, "trace")
    try:
        # Level 4: traces are large and we write inside a live step; the size gain of 9 is small.
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=4) as gz,
            open(json_path, "rb") as src,
        ):
            shutil.copyfileobj(src, gz, 1 << 20)
        os.replace(tmp, final_path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def temp_json_path(out_dir: str) -> str:
    fd, path = _create_temp(out_dir, "export")
    os.close(fd)
    return path


def json_looks_complete(path: str) -> bool:
    """Whether a JSON document ends like one: a writer that hit a full disk may stop without raising."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().rstrip()
    except OSError:
        return False
    return tail.endswith(b"}")


def _create_temp(out_dir: str, kind: str) -> tuple[int, str]:
    # Not mkstemp: its 0600 mode would survive the rename; a trace should be as readable as any file (umask).
    for _ in range(100):
        name = f".{os.getpid()}.{kind}.{secrets.token_hex(4)}.{host_name()}{PARTIAL_SUFFIX}"
        path = os.path.join(out_dir, name)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {out_dir}")


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def remove_with_siblings(path: str) -> None:
    """Remove a temp file and whatever an exporter made beside it under the same name plus a suffix."""
    for sibling in glob.glob(glob.escape(path) + "*"):
        unlink_quietly(sibling)


def remove_own_partials(out_dir: str) -> None:
    """Remove every temp file this process has in out_dir (on SIGTERM in the middle of an export)."""
    for path in glob.glob(os.path.join(glob.escape(out_dir), f".{os.getpid()}.*{PARTIAL_SUFFIX}*")):
        unlink_quietly(path)


@dataclass(frozen=True)
class Partial:
    path: str
    pid: int
    size: int


def remove_dead_partials(out_dir: str) -> list[Partial]:
    """Remove the temp files in out_dir left by processes of this host that no longer run; returns them."""
    host = host_name()
    removed = []
    try:
        names = os.listdir(out_dir)
    except OSError:
        return []
    for name in names:
        match = _PARTIAL_RE.match(name)
        if match is None or match["host"] != host or process_alive(int(match["pid"])):
            continue
        path = os.path.join(out_dir, name)
        try:
            size = os.path.getsize(path)
            os.unlink(path)
        except OSError:
            continue
        removed.append(Partial(path, int(match["pid"]), size))
    return removed


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has finished
    except (OSError, IndexError):
        return True

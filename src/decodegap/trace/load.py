"""Loading: trace file(s) -> Trace. One pass over the decoded records fills the columnar tables."""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from itertools import compress, repeat
from operator import attrgetter, eq, itemgetter
from pathlib import Path

import msgspec
import numpy as np

from decodegap.errors import UserError
from decodegap.trace import schema
from decodegap.trace.json_events import decode_trace
from decodegap.trace.read import NotATrace
from decodegap.trace.tables import (
    KERNEL,
    MEMCPY,
    MEMSET,
    Annotation,
    CpuOpTable,
    GpuTable,
    InternedColumn,
    RuntimeTable,
    SparseColumn,
    Trace,
)

# Kineto category names, old and new, mapped onto the tables they feed.
_CATEGORY_TABLE = {
    "kernel": "gpu",
    "gpu_memcpy": "gpu",
    "memcpy": "gpu",
    "gpu_memset": "gpu",
    "memset": "gpu",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "runtime": "runtime",
    "hip_runtime": "runtime",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
}
_GPU_KIND = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "memcpy": MEMCPY, "gpu_memset": MEMSET, "memset": MEMSET}

# What a sane time is. Kineto writes microseconds (since the epoch or a boot clock): beyond 3e15 us (95 years) no
# clock reads, and within it every start, duration and end stays inside int64 nanoseconds.
MAX_ABS_US = 3e15
# A start further than this many core spans outside the trace's core span, or a duration longer than this many
# core spans, is no measurement of this trace (a stray timestamp, an overflowed counter) and is dropped.
OUTLIER_SPANS = 100.0
# The core span is never taken below this (10 ms), so a trace of a few events keeps a kernel of up to a second.
MIN_CORE_SPAN_US = 1e4
# A GPU activity that runs on past the start of the next one on its (in-order) stream by more than this, and by
# more than half its own length, reports a duration the stream could not have had: it is cut at that next start.
STREAM_OVERLAP_US = 10.0
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Kineto writes the CPU ops first and the GPU activities (with the runtime calls) after them, not in time order: a
# cut file may hold the whole CPU side and only the start of the GPU timeline. It is analyzed only when the GPU
# timeline reaches this share of the window the CPU side spans; otherwise its steps would come out short or empty.

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_PATTERNS = (
    re.compile(r"-TP-(\d+)"),  # SGLang: <id>-TP-<rank>[-DP-..][-EXTEND|-DECODE].trace.json.gz
    re.compile(r"rank[-_]?(\d+)", re.IGNORECASE),  # vLLM / tensorboard handler: <instance>-rank-<n>.<ns>.pt.trace...
)


def _as_int(value, default: int = -1) -> int:
    """An int64 from a JSON value (numbers as strings too), else `default`."""
    if value is None or isinstance(value, bool):
        return default
    try:
        number = value if isinstance(value, int) else int(float(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        return default
    return number if INT64_MIN <= number <= INT64_MAX else default


class _Interner:
    """Values -> small integer ids, first come first numbered."""

    def __init__(self, first="") -> None:
        self.ids: dict = {first: 0}
        self.values: list = [first]

    def many(self, values: list) -> np.ndarray:
        """The ids of values, in C: one lookup each, and a second pass only when the batch has new values."""
        try:
            return np.fromiter(map(self.ids.__getitem__, values), np.int32, len(values))
        except KeyError:
            pass
        ids = self.ids
        for value in dict.fromkeys(values):  # the batch's distinct values, at C speed
            if value not in ids:
                ids[value] = len(self.values)
                self.values.append(value)
        return np.fromiter(map(ids.__getitem__, values), np.int32, len(values))


def _kineto_text(raw: bytes) -> bytes:
    """A JSON text (a launch shape, op shapes or dtypes) written the one way Kineto writes it (`[128, 1, 1]`),
    whatever the layout it was read in: the same value is the same text, and so one kernel group."""
    if not raw:
        return raw
    try:
        return msgspec.json.format(msgspec.json.encode(msgspec.json.decode(raw)), indent=0)
    except (msgspec.DecodeError, msgspec.EncodeError, UnicodeDecodeError, RecursionError, OverflowError):
        return raw


class _TextInterner(_Interner):
    """JSON texts -> ids by their value: each new text is rewritten by `_kineto_text`, once per distinct text."""

    def __init__(self, first=None) -> None:
        super().__init__(first)
        self.seen: dict = {first: 0}  # each text as read -> its id

    def many(self, values: list) -> np.ndarray:
        try:
            return np.fromiter(map(self.seen.__getitem__, values), np.int32, len(values))
        except KeyError:
            pass
        seen, ids = self.seen, self.ids
        for value in dict.fromkeys(values):
            if value not in seen:
                text = _kineto_text(value) if value else value
                if text not in ids:
                    ids[text] = len(self.values)
                    self.values.append(text)
                seen[value] = ids[text]
        return np.fromiter(map(seen.__getitem__, values), np.int32, len(values))


def _column(events: list, attribute: str, dtype) -> np.ndarray:
    """One field of every record as an array; attrgetter + map keep the loop in C. An integer the column's type
    cannot hold (a correlation of 2**64) becomes -1, unknown."""
    try:
        return np.fromiter(map(attrgetter(attribute), events), dtype, len(events))
    except OverflowError:
        info = np.iinfo(dtype)
        return np.fromiter((v if info.min <= v <= info.max else -1 for v in map(attrgetter(attribute), events)),
                           dtype, len(events))


def _ids_or_fallback(ids: np.ndarray, events: list, fallback: str) -> np.ndarray:
    """Device/stream from args, or from pid/tid for the (old) traces that only put them there."""
    missing = np.flatnonzero(ids < 0)
    limit = np.iinfo(ids.dtype).max
    for i in missing.tolist():
        value = _tid(getattr(events[i], fallback))
        ids[i] = value if value <= limit else hash(value) & 0x7FFFFFFF
    return ids


def _tid(value) -> int:
    """A thread (or process) id as an int64: ints as they are, anything else (strings, huge ints) hashed."""
    if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
        return value
    return hash(value) & 0x7FFFFFFF if value is not None else -1


# What each `cat` of an event feeds, as a small code per event (0: no table): the GPU kinds first, so a GPU
# activity's kind is its code less one.
_GPU_CODE = 1  # + KERNEL / MEMCPY / MEMSET
CPU_OP_CODE, RUNTIME_CODE, ANNOTATION_CODE, GPU_ANNOTATION_CODE = 4, 5, 6, 7
_TABLE_CODE = {"cpu_op": CPU_OP_CODE, "runtime": RUNTIME_CODE, "annotation": ANNOTATION_CODE,
               "gpu_annotation": GPU_ANNOTATION_CODE}
_PH, _CAT, _NAME, _TS, _DUR, _ARGS, _TID = map(attrgetter, ("ph", "cat", "name", "ts", "dur", "args", "tid"))
_COLLECTIVE_NAME = attrgetter("collective_name")


def _category_code(cat: str) -> int:
    table = _CATEGORY_TABLE.get(cat) or _CATEGORY_TABLE.get(cat.lower())
    if table == "gpu":
        kind = _GPU_KIND.get(cat)
        return _GPU_CODE + (_GPU_KIND[cat.lower()] if kind is None else kind)
    return _TABLE_CODE.get(table, 0)


def _only(values: list, kind: type) -> bool:
    """Whether every value is exactly of `kind` (one C pass)."""
    return set(map(type, values)) <= {kind}


def _pick(items: list, rows: np.ndarray) -> list | tuple:
    """items[i] for each row, in C."""
    if len(rows) == len(items):
        return items
    if len(rows) == 1:
        return [items[int(rows[0])]]
    return itemgetter(*rows.tolist())(items)


def _names(events) -> list[str]:
    """The events' names as strings: none as "", a number as its text."""
    names = list(map(_NAME, events))
    if not _only(names, str):
        names = [v if type(v) is str else "" if v is None else str(v) for v in names]
    return names


def _name_ids(interner: _Interner, events) -> np.ndarray:
    """The ids of the events' names. The interner holds only strings, so a name of another type (a number, none)
    is no key of it: the slow path, which writes it as a string first."""
    try:
        return np.fromiter(map(interner.ids.__getitem__, map(_NAME, events)), np.int32, len(events))
    except KeyError:
        return interner.many(_names(events))


def _args(events) -> list[schema.EventArgs]:
    """The events' args; args that are no object (a list, a string) as none."""
    args = list(map(_ARGS, events))
    if not _only(args, schema.EventArgs):
        args = [a if type(a) is schema.EventArgs else schema.NO_ARGS for a in args]
    return args


def _tids(events) -> np.ndarray:
    tids = list(map(_TID, events))
    if _only(tids, int):
        try:
            return np.fromiter(tids, np.int64, len(tids))
        except OverflowError:
            pass
    return np.fromiter(map(_tid, tids), np.int64, len(tids))


class TableBuilder:
    """Turns batches of event records into column chunks; `finish` joins them into a Trace."""

    def __init__(self) -> None:
        self.names = _Interner()
        self.shapes = _TextInterner(first="")
        self.gpu: list[tuple[np.ndarray, ...]] = []
        self.ops: list[tuple[np.ndarray, ...]] = []
        self.op_args = _TextInterner()  # the distinct Input Dims / Input type texts
        self.op_args.seen[b""] = 0  # an op without them: None
        self.op_dims: list[np.ndarray] = []  # ids into op_args, a chunk per batch
        self.op_types: list[np.ndarray] = []
        self.op_collective: dict[int, dict] = {}  # op row -> collective metadata, for the few ops that have it
        self.op_count = 0
        self.runtime: list[tuple[np.ndarray, ...]] = []
        self.annotations: list[tuple] = []
        self.odd = 0
        self.bad_time = 0
        self.codes: dict[str, int] = {}  # each `cat` seen -> its table's code
        self._taken = (1, 1, 1)  # how many of names, shapes and op_args values the last take_chunk had handed on

    # --- batches built elsewhere (json_events' second process, or ahead of their turn) --------------------------
    # A builder of its own numbers the names and texts it meets in its own order; `take_chunk` hands on what it built
    # since the last call with the values it met for the first time, and `merge` renumbers them into this builder's
    # ids. Merged in the text's order, each value gets the id it would have had if this builder had read the batch.

    def fresh(self) -> TableBuilder:
        return TableBuilder()

    def take_chunk(self) -> tuple:
        """What `add` built since the last call, with this builder's own ids, for another builder's `merge`."""
        names, shapes, op_args = self.names.values, self.shapes.values, self.op_args.values
        a, b, c = self._taken
        chunk = (self.gpu, self.ops, self.op_dims, self.op_types, self.runtime, self.annotations, self.op_collective,
                 self.op_count, self.odd, self.bad_time, names[a:], shapes[b:], op_args[c:])
        self._taken = (len(names), len(shapes), len(op_args))
        self.gpu, self.ops, self.op_dims, self.op_types, self.runtime, self.annotations = [], [], [], [], [], []
        self.op_collective, self.op_count, self.odd, self.bad_time = {}, 0, 0, 0
        return chunk

    def merge(self, chunk: tuple, ids: list) -> None:
        """A chunk of another builder (`take_chunk`), in the text's order. `ids`: that builder's value ids -> this
        builder's (names, shapes, op_args), kept between its chunks and extended here."""
        gpu, ops, dims, types, runtime, annotations, collective, count, odd, bad_time, *new = chunk
        for k, (interner, values) in enumerate(zip((self.names, self.shapes, self.op_args), new, strict=True)):
            if values:
                known, own = interner.ids, interner.values
                for value in values:
                    if value not in known:
                        known[value] = len(own)
                        own.append(value)
                ids[k] = np.concatenate((ids[k], np.fromiter(map(known.__getitem__, values), np.int32, len(values))))
        names, shapes, op_args = ids
        self.gpu += [(g[0], names[g[1]], *g[2:8], shapes[g[8]], shapes[g[9]], g[10]) for g in gpu]
        self.ops += [(names[o[0]], *o[1:]) for o in ops]
        self.op_dims += [op_args[d] for d in dims]
        self.op_types += [op_args[t] for t in types]
        self.runtime += [(names[r[0]], *r[1:]) for r in runtime]
        self.annotations += annotations
        for row, value in collective.items():
            self.op_collective[self.op_count + row] = value
        self.op_count += count
        self.odd += odd
        self.bad_time += bad_time

    def add(self, batch: list) -> None:
        """One batch of records into column chunks: the complete ('X') events with a sane start and duration, by
        the table their category feeds; non-objects and events whose time is missing, NaN, infinite, negative
        (durations) or beyond any clock are counted. Each field is read for a whole table at once (map and
        attrgetter in C, numpy for the tests), never event by event in Python."""
        events = batch
        if not _only(batch, schema.Event):
            events = [e for e in batch if type(e) is schema.Event]
            self.odd += len(batch) - len(events)
        n = len(events)
        if not n:
            return
        codes = self.codes
        try:
            code = bytes(map(codes.__getitem__, map(_CAT, events)))
        except KeyError:  # a category not seen before
            for cat in dict.fromkeys(map(_CAT, events)):
                if cat not in codes:
                    codes[cat] = _category_code(cat)
            code = bytes(map(codes.__getitem__, map(_CAT, events)))
        code = np.frombuffer(code, np.int8)
        complete = np.frombuffer(bytes(map(eq, map(_PH, events), repeat("X"))), bool)
        ts, dur = _column(events, "ts", np.float64), _column(events, "dur", np.float64)
        # The comparisons are False for NaN (a missing ts is NaN), so NaN and infinities fail them too.
        sane = (ts >= -MAX_ABS_US) & (ts <= MAX_ABS_US) & (dur >= 0.0) & (dur <= MAX_ABS_US)
        self.bad_time += int(np.count_nonzero(complete & ~sane))
        code = np.where(complete & sane, code, 0)
        names = self.names
        rows = np.flatnonzero((code >= _GPU_CODE) & (code < _GPU_CODE + 3))
        if len(rows):
            g = _pick(events, rows)
            args = _args(g)
            self.gpu.append((
                (code[rows] - _GPU_CODE).astype(np.int8),
                _name_ids(names, g),
                ts[rows],
                dur[rows],
                _ids_or_fallback(_column(args, "device", np.int32), g, "pid"),
                _ids_or_fallback(_column(args, "stream", np.int64), g, "tid"),
                _column(args, "correlation", np.int64),
                _column(args, "external_id", np.int64),
                self.shapes.many(list(map(bytes, map(attrgetter("grid"), args)))),
                self.shapes.many(list(map(bytes, map(attrgetter("block"), args)))),
                _column(args, "nbytes", np.int64),
            ))
        rows = np.flatnonzero(code == CPU_OP_CODE)
        if len(rows):
            ops = _pick(events, rows)
            args = _args(ops)
            self.ops.append((
                _name_ids(names, ops),
                ts[rows],
                dur[rows],
                _tids(ops),
                _column(args, "external_id", np.int64),
            ))
            self.op_dims.append(self.op_args.many(list(map(bytes, map(attrgetter("input_dims"), args)))))
            self.op_types.append(self.op_args.many(list(map(bytes, map(attrgetter("input_type"), args)))))
            for i in compress(range(len(args)), map(_COLLECTIVE_NAME, args)):
                self.op_collective[self.op_count + i] = _collective(args[i])
            self.op_count += len(ops)
        rows = np.flatnonzero(code == RUNTIME_CODE)
        if len(rows):
            rt = _pick(events, rows)
            args = _args(rt)
            self.runtime.append((
                _name_ids(names, rt),
                ts[rows],
                dur[rows],
                _tids(rt),
                _column(args, "correlation", np.int64),
                _column(args, "external_id", np.int64),
            ))
        for table, on_gpu in ((ANNOTATION_CODE, False), (GPU_ANNOTATION_CODE, True)):
            rows = np.flatnonzero(code == table)
            if len(rows):
                self.annotations.extend(zip(_names(_pick(events, rows)), ts[rows].tolist(), dur[rows].tolist(),
                                            repeat(on_gpu)))

    def finish(self, path: Path, header: schema.TraceDocument, warnings: list[str]) -> Trace:
        if self.odd:
            warnings.append(f"{self.odd} events were malformed (not objects) and were skipped")
        if self.bad_time:
            warnings.append(f"{self.bad_time} events had no usable time (missing, NaN, infinite, a negative "
                            "duration, or beyond any clock) and were skipped")
        gpu_cols = _join(self.gpu, (np.int8, np.int32, np.float64, np.float64, np.int32, np.int64, np.int64,
                                    np.int64, np.int32, np.int32, np.int64))
        self.gpu = []
        op_cols = _join(self.ops, (np.int32, np.float64, np.float64, np.int64, np.int64))
        self.ops = []  # the chunks are joined: let them go before the next copies
        op_cols += _join([(d, t) for d, t in zip(self.op_dims, self.op_types, strict=True)], (np.int32, np.int32))
        self.op_dims = self.op_types = []
        rt_cols = _join(self.runtime, (np.int32, np.float64, np.float64, np.int64, np.int64, np.int64))
        self.runtime = []
        gpu_cols, op_cols, rt_cols = self._drop_outliers(gpu_cols, op_cols, rt_cols, warnings)
        starts = [cols[i].min() for cols, i in ((gpu_cols, 2), (op_cols, 1), (rt_cols, 1)) if cols[i].size]
        starts += [min(a[1] for a in self.annotations)] if self.annotations else []
        origin_us = float(min(starts)) if starts else 0.0

        def ns(ts_us: np.ndarray) -> np.ndarray:
            # Subtracting the origin before scaling keeps the nanosecond decimals exact in float64.
            return np.rint((ts_us - origin_us) * 1000.0).astype(np.int64)

        def dur_ns(dur_us: np.ndarray) -> np.ndarray:
            return np.rint(dur_us * 1000.0).astype(np.int64)

        order = np.argsort(gpu_cols[2], kind="stable")
        kind, name_id, ts, dur, device, stream, corr, ext, grid, block, nbytes = (c[order] for c in gpu_cols)
        clipped = _clip_stream_overlaps(ts, dur, device, stream)
        if clipped:
            warnings.append(f"{clipped} GPU activities ran on past the start of the next one on their stream "
                            "(impossible on an in-order stream) and were cut at that start")
        gpu = GpuTable(kind=kind, name_id=name_id, ts_ns=ns(ts), dur_ns=dur_ns(dur), device=device,
                       stream=stream, correlation=corr, external_id=ext, grid_id=grid, block_id=block,
                       nbytes=nbytes)
        cpu_ops = CpuOpTable(name_id=op_cols[0], ts_ns=ns(op_cols[1]), dur_ns=dur_ns(op_cols[2]), tid=op_cols[3],
                             external_id=op_cols[4], input_dims=InternedColumn(op_cols[5], self.op_args.values),
                             input_types=InternedColumn(op_cols[6], self.op_args.values),
                             collective=SparseColumn(len(op_cols[0]), self.op_collective))
        runtime = RuntimeTable(name_id=rt_cols[0], ts_ns=ns(rt_cols[1]), dur_ns=dur_ns(rt_cols[2]),
                               tid=rt_cols[3], correlation=rt_cols[4], external_id=rt_cols[5])
        annotations = sorted(
            (Annotation(name, int(round((ts - origin_us) * 1000)), int(round(dur * 1000)), on_gpu)
             for name, ts, dur, on_gpu in self.annotations),
            key=lambda a: a.ts_ns,
        )
        base_ns = _as_int(header.baseTimeNanoseconds, 0)
        info = header.distributedInfo if isinstance(header.distributedInfo, dict) else {}
        rank, world = _as_int(info.get("rank"), -1), _as_int(info.get("world_size"), -1)
        device_name = next((p["name"] for p in header.deviceProperties or []
                            if isinstance(p, dict) and isinstance(p.get("name"), str)), None)
        return Trace(
            path=path, rank=rank if rank >= 0 else None, world_size=world if world > 0 else None,
            device_name=device_name, names=self.names.values,
            shapes=[s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in self.shapes.values],
            gpu=gpu, cpu_ops=cpu_ops, runtime=runtime, annotations=annotations,
            origin_ns=base_ns + int(round(origin_us * 1000)), base_ns=base_ns,
            record_meta=header.decodegap_record if isinstance(header.decodegap_record, dict) else None,
            warnings=warnings,
        )


    def _drop_outliers(self, gpu_cols: list, op_cols: list, rt_cols: list, warnings: list[str]) -> tuple:
        """Drop the events whose start or duration no clock of this trace could have measured (see _outliers)."""
        ann_ts = np.array([a[1] for a in self.annotations], dtype=np.float64)
        ann_dur = np.array([a[2] for a in self.annotations], dtype=np.float64)
        tables = [(gpu_cols[2], gpu_cols[3]), (op_cols[1], op_cols[2]), (rt_cols[1], rt_cols[2]), (ann_ts, ann_dur)]
        masks, core_us = _outliers(tables)
        dropped = sum(int(m.sum()) for m in masks)
        if not dropped:
            return gpu_cols, op_cols, rt_cols
        warnings.append(f"{dropped} events started far outside the trace's time range or lasted far longer than "
                        f"it (over {OUTLIER_SPANS:g}x its core span of {core_us / 1e3:.3f} ms) and were dropped")
        gpu_mask, op_mask, rt_mask, ann_mask = masks
        op_keep = np.flatnonzero(~op_mask)
        self.op_collective = SparseColumn(len(op_mask), self.op_collective).take(op_keep).present
        self.annotations = [a for a, drop in zip(self.annotations, ann_mask.tolist(), strict=True) if not drop]
        return ([c[~gpu_mask] for c in gpu_cols], [c[~op_mask] for c in op_cols], [c[~rt_mask] for c in rt_cols])


def _outliers(tables: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[np.ndarray], float]:
    """Per (starts, durations) table, the rows that start more than OUTLIER_SPANS core spans outside the trace's core
    span or last longer than OUTLIER_SPANS core spans; and the core span. The core span runs from the k-th earliest
    start to the k-th latest (k = 0.1% of the events, at least a few), so a few stray timestamps cannot widen it."""
    starts = np.concatenate([ts for ts, _ in tables])
    n = len(starts)
    if not n:
        return [np.zeros(len(ts), dtype=bool) for ts, _ in tables], 0.0
    k = max(n // 1000, min(8, n // 10))
    lo, hi = np.partition(starts, (k, n - 1 - k))[[k, n - 1 - k]]
    core = max(float(hi - lo), MIN_CORE_SPAN_US)
    first, last = lo - OUTLIER_SPANS * core, hi + OUTLIER_SPANS * core
    return [(ts < first) | (ts > last) | (dur > OUTLIER_SPANS * core) for ts, dur in tables], float(hi - lo)


def _clip_stream_overlaps(ts: np.ndarray, dur: np.ndarray, device: np.ndarray, stream: np.ndarray) -> int:
    """Cut (in place) the GPU activities that overlap the next one on their stream by more than STREAM_OVERLAP_US
    and by more than half their own duration: work on one stream runs in order. Returns how many were cut."""
    if len(ts) < 2:
        return 0
    order = np.lexsort((ts, stream, device))
    d, s, t, du = device[order], stream[order], ts[order], dur[order]
    room = t[1:] - t[:-1]  # from each start to the next start on the same stream
    overlap = du[:-1] - room
    cut = ((d[1:] == d[:-1]) & (s[1:] == s[:-1]) & (s[:-1] >= 0) & (overlap > STREAM_OVERLAP_US)
           & (overlap > 0.5 * du[:-1]))
    dur[order[:-1][cut]] = room[cut]
    return int(cut.sum())


def _join(chunks: list[tuple[np.ndarray, ...]], dtypes: tuple) -> list[np.ndarray]:
    if not chunks:
        return [np.empty(0, dtype=d) for d in dtypes]
    return [np.concatenate(cols) for cols in zip(*chunks, strict=True)]


def _collective(args: schema.EventArgs) -> dict:
    return {
        "name": args.collective_name,
        "in_nelems": _as_int(args.in_msg_nelems),
        "out_nelems": _as_int(args.out_msg_nelems),
        "dtype": args.msg_dtype,
        "group_size": _as_int(args.group_size),
    }


@contextmanager
def _no_gc():
    """Decoding allocates hundreds of thousands of objects without cycles; collection passes only cost time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_trace(path: str | Path, aside=None) -> Trace:
    """One rank's trace. `aside`: an iterator whose each step is a piece of other work (importing the next module
    of the analysis), stepped while a second decoding process (json_events._Parallel) has every batch it can hold:
    instead of decoding a batch itself then, the reader does that work. What is read does not depend on it."""
    path = Path(path)
    builder = TableBuilder()
    try:
        with _no_gc():
            header, warnings, truncated = decode_trace(path, builder.add, builder, aside)
            trace = builder.finish(path, header, warnings)
    except MemoryError:  # e.g. one event of gigabytes, or damaged text held whole
        raise UserError(f"{path}: the trace does not fit in this machine's memory (capture fewer steps, or set "
                        "DECODEGAP_MAX_TRACE_BYTES lower to be refused earlier)") from None
    if not len(trace.gpu) and not len(trace.cpu_ops.ts_ns) and not trace.annotations:
        why = f": {'; '.join(trace.warnings)}" if trace.warnings else ""
        raise NotATrace(f"{path}: the trace has no profiler events (no kernels, CPU ops or annotations){why}")
    if truncated:
        _salvage_truncated(trace, truncated)
    return trace


def gpu_reach(trace: Trace) -> tuple[int, int, int] | None:
    """(start, end, reach): the CPU side's window (its CPU ops and CPU annotations, which Kineto writes first) and how
    far into it the GPU data is known to reach; None when there is no CPU side to compare with. The GPU data reaches
    only as far as
    - the last GPU activity's end;
    - the first launch whose GPU activity is missing (a CPU that runs ahead launches work the file lost);
    - when some GPU activity has lost its launch record, the last runtime call's end: the runtime calls are
      written among the GPU activities and are cut with them, so later launches are unknown."""
    ops, marks = trace.cpu_ops, [a for a in trace.annotations if not a.on_gpu]
    if not len(ops.ts_ns) and not marks:
        return None
    starts = ([int(ops.ts_ns.min())] if len(ops.ts_ns) else []) + [a.ts_ns for a in marks]
    ends = ([int((ops.ts_ns + ops.dur_ns).max())] if len(ops.ts_ns) else []) + [a.ts_ns + a.dur_ns for a in marks]
    start, end = min(starts), max(ends)
    if not len(trace.gpu):
        return start, end, start
    reach = int(trace.gpu.end_ns.max())
    rt, gpu = trace.runtime, trace.gpu
    if len(rt.ts_ns):
        launch_ids = [i for i, name in enumerate(trace.names) if "Launch" in name]
        lost = np.isin(rt.name_id, launch_ids) & (rt.correlation >= 0) & ~np.isin(rt.correlation, gpu.correlation)
        if lost.any():
            reach = min(reach, int(rt.ts_ns[lost].min()))
        reach = min(reach, int((rt.ts_ns + rt.dur_ns).max()))  # later launches were cut with the GPU events
    orphans = (gpu.correlation >= 0) & ~np.isin(gpu.correlation, rt.correlation)
    if orphans.any():
        reach = min(reach, int((rt.ts_ns + rt.dur_ns).max()) if len(rt.ts_ns) else start)
    return start, end, reach


def gpu_coverage(trace: Trace) -> float | None:
    """The share of the CPU side's window that the GPU data is known to cover (gpu_reach)."""
    found = gpu_reach(trace)
    if found is None:
        return None
    start, end, reach = found
    if end <= start:
        return 1.0 if reach >= end else 0.0
    return min(max((reach - start) / (end - start), 0.0), 1.0)


def _salvage_truncated(trace: Trace, reason: str) -> None:
    """A cut trace keeps what is whole before the cut: the steps stage keeps only the steps every launch of which
    has its GPU work in the file (or, where no CPU op is tied to a launch, that end before the host time the GPU events
    are known to reach: `known_until_ns`), and refuses the file when none does."""
    trace.truncated = reason
    expects_gpu = trace.has_gpu or len(trace.runtime.ts_ns) > 0 or trace.device_name is not None
    found = gpu_reach(trace) if expects_gpu else None
    if found is None:
        trace.warnings.append(f"the trace is truncated ({reason}); the events before the cut were analyzed")
        return
    start, end, reach = found
    trace.known_until_ns = reach
    percent = int(gpu_coverage(trace) * 100)  # rounded down: 97.9% must not read as 98%
    trace.annotations = [a for a in trace.annotations if a.on_gpu or a.ts_ns <= reach]
    trace.warnings.append(f"the trace is truncated ({reason}); its GPU events reach {percent}% of the profiled "
                          "window: only the steps that end before the cut are analyzed")


def _is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def rank_from_filename(name: str) -> int | None:
    for pattern in _RANK_PATTERNS:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def file_id(path: Path) -> tuple[int, int] | None:
    """The file a path names (device, inode), the same through any link to it; None where there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (the same path, or links to it)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        return False
    return (found := file_id(b)) is not None and found == file_id(a)


def find_trace_files(path: Path) -> list[Path]:
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    if not path.is_dir():  # a named pipe (or <(zcat ...)), socket or device: no folder, and opening one can block
        raise UserError(f"{path}: not a file or folder (a pipe, socket or device); save the trace to a file and give "
                        "that")
    files = sorted(p for p in path.rglob("*") if _is_trace_file(p))
    if not files:
        raise UserError(f"{path}: the folder holds no trace files (*.json or *.json.gz)")
    return files


def _load_folder_files(path: Path, files: list[Path]) -> list[Trace]:
    """Every trace among the files; a file that is no trace at all (a config.json beside the traces) is skipped
    with a warning rather than failing the folder."""
    if path.is_file():
        return [load_trace(files[0])]
    traces, skipped = [], []
    for f in files:
        try:
            traces.append(load_trace(f))
        except NotATrace as exc:
            skipped.append((f, str(exc).removeprefix(f"{f}: ")))
    if not traces:
        first, why = skipped[0]
        raise UserError(f"{path}: the folder holds no profiler traces ({len(skipped)} JSON file(s) that are not, "
                        f"e.g. {first.name}: {why})")
    if skipped:
        names = ", ".join(f.name for f, _ in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        traces[0].warnings.append(f"skipped {len(skipped)} file(s) in the folder that are not profiler traces: "
                                  f"{names}")
    return traces


def load_traces(path: str | Path) -> list[Trace]:
    """One trace per rank, ordered by rank. Rank comes from the file name (SGLang, vLLM), else distributedInfo."""
    path = Path(path)
    traces = _load_folder_files(path, find_trace_files(path))
    for trace in traces:
        from_name = rank_from_filename(trace.path.name)
        if from_name is not None:
            trace.rank = from_name
    if len(traces) > 1:
        traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, str(t.path)))
        for i, trace in enumerate(traces):
            if trace.rank is None:
                trace.rank = i
    return traces

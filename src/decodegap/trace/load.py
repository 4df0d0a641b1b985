"""Loading: trace file(s) -> Trace. One pass over the decoded records fills the columnar tables."""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path

import numpy as np

from decodegap.errors import UserError
from decodegap.trace import schema
from decodegap.trace.decode import decode_trace
from decodegap.trace.tables import (
    KERNEL,
    MEMCPY,
    MEMSET,
    Annotation,
    CpuOpTable,
    GpuTable,
    RuntimeTable,
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

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_PATTERNS = (
    re.compile(r"-TP-(\d+)"),  # SGLang: <id>-TP-<rank>[-DP-..][-EXTEND|-DECODE].trace.json.gz
    re.compile(r"rank[-_]?(\d+)", re.IGNORECASE),  # vLLM / tensorboard handler: <instance>-rank-<n>.<ns>.pt.trace...
)


def _as_int(value, default: int = -1) -> int:
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


class _Interner:
    """Values -> small integer ids, first come first numbered."""

    def __init__(self, first="") -> None:
        self.ids: dict = {first: 0}
        self.values: list = [first]

    def many(self, values: list) -> np.ndarray:
        ids = self.ids
        for value in dict.fromkeys(values):  # the batch's distinct values, at C speed
            if value not in ids:
                ids[value] = len(self.values)
                self.values.append(value)
        return np.fromiter(map(ids.__getitem__, values), np.int32, len(values))


def _column(events: list, attribute: str, dtype) -> np.ndarray:
    """One field of every record as an array; attrgetter + map keep the loop in C."""
    return np.fromiter(map(attrgetter(attribute), events), dtype, len(events))


def _ids_or_fallback(ids: np.ndarray, events: list, fallback: str) -> np.ndarray:
    """Device/stream from args, or from pid/tid for the (old) traces that only put them there."""
    missing = np.flatnonzero(ids < 0)
    for i in missing.tolist():
        ids[i] = _tid(getattr(events[i], fallback))
    return ids


def _tid(value) -> int:
    if isinstance(value, int):
        return value
    return hash(value) & 0x7FFFFFFF if value is not None else -1


def _usable(batch: list) -> tuple[list[schema.Event], int]:
    """Complete ('X') events with a usable time and non-negative duration, and the count of odd ones dropped."""
    good = [e for e in batch if type(e) is schema.Event and e.ph == "X"]
    odd = sum(1 for e in batch if type(e) is not schema.Event)
    usable = [e for e in good if e.ts == e.ts and e.dur >= 0]  # e.ts == e.ts rejects NaN (missing ts)
    odd += len(good) - len(usable)
    for e in usable:
        if type(e.args) is not schema.EventArgs:
            e.args = schema.NO_ARGS
        if type(e.name) is not str:
            e.name = "" if e.name is None else str(e.name)
    return usable, odd


class TableBuilder:
    """Turns batches of event records into column chunks; `finish` joins them into a Trace."""

    def __init__(self) -> None:
        self.names = _Interner()
        self.shapes = _Interner()
        self.gpu: list[tuple[np.ndarray, ...]] = []
        self.ops: list[tuple[np.ndarray, ...]] = []
        self.op_dims: list = []
        self.op_types: list = []
        self.op_collective: list = []
        self.runtime: list[tuple[np.ndarray, ...]] = []
        self.annotations: list[tuple] = []
        self.odd = 0

    def add(self, batch: list) -> None:
        events, odd = _usable(batch)
        self.odd += odd
        groups: dict[str, list] = {"gpu": [], "cpu_op": [], "runtime": [], "annotation": [], "gpu_annotation": []}
        for e in events:
            table = _CATEGORY_TABLE.get(e.cat) or _CATEGORY_TABLE.get(e.cat.lower())
            if table is not None:
                groups[table].append(e)
        names, shapes = self.names, self.shapes
        if g := groups["gpu"]:
            kinds = list(map(attrgetter("cat"), g))
            self.gpu.append((
                np.fromiter((_GPU_KIND.get(c) or _GPU_KIND[c.lower()] for c in kinds), np.int8, len(g)),
                names.many(list(map(attrgetter("name"), g))),
                _column(g, "ts", np.float64),
                _column(g, "dur", np.float64),
                _ids_or_fallback(_column(g, "args.device", np.int32), g, "pid"),
                _ids_or_fallback(_column(g, "args.stream", np.int64), g, "tid"),
                _column(g, "args.correlation", np.int64),
                _column(g, "args.external_id", np.int64),
                shapes.many([bytes(r) for r in map(attrgetter("args.grid"), g)]),
                shapes.many([bytes(r) for r in map(attrgetter("args.block"), g)]),
                _column(g, "args.nbytes", np.int64),
            ))
        if ops := groups["cpu_op"]:
            self.ops.append((
                names.many(list(map(attrgetter("name"), ops))),
                _column(ops, "ts", np.float64),
                _column(ops, "dur", np.float64),
                np.fromiter(map(_tid, map(attrgetter("tid"), ops)), np.int64, len(ops)),
                _column(ops, "args.external_id", np.int64),
            ))
            args = list(map(attrgetter("args"), ops))
            self.op_dims.extend(bytes(a.input_dims) if a.input_dims else None for a in args)
            self.op_types.extend(bytes(a.input_type) if a.input_type else None for a in args)
            self.op_collective.extend(_collective(a) if a.collective_name else None for a in args)
        if rt := groups["runtime"]:
            self.runtime.append((
                names.many(list(map(attrgetter("name"), rt))),
                _column(rt, "ts", np.float64),
                _column(rt, "dur", np.float64),
                np.fromiter(map(_tid, map(attrgetter("tid"), rt)), np.int64, len(rt)),
                _column(rt, "args.correlation", np.int64),
                _column(rt, "args.external_id", np.int64),
            ))
        for key, on_gpu in (("annotation", False), ("gpu_annotation", True)):
            self.annotations.extend((e.name, e.ts, e.dur, on_gpu) for e in groups[key])

    def finish(self, path: Path, header: schema.TraceDocument, warnings: list[str]) -> Trace:
        if self.odd:
            warnings.append(f"{self.odd} events were malformed (not objects, or without a usable time) "
                            "and were skipped")
        gpu_cols = _join(self.gpu, (np.int8, np.int32, np.float64, np.float64, np.int32, np.int64, np.int64,
                                    np.int64, np.int32, np.int32, np.int64))
        op_cols = _join(self.ops, (np.int32, np.float64, np.float64, np.int64, np.int64))
        rt_cols = _join(self.runtime, (np.int32, np.float64, np.float64, np.int64, np.int64, np.int64))
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
        gpu = GpuTable(kind=kind, name_id=name_id, ts_ns=ns(ts), dur_ns=dur_ns(dur), device=device,
                       stream=stream, correlation=corr, external_id=ext, grid_id=grid, block_id=block,
                       nbytes=nbytes)
        cpu_ops = CpuOpTable(name_id=op_cols[0], ts_ns=ns(op_cols[1]), dur_ns=dur_ns(op_cols[2]), tid=op_cols[3],
                             external_id=op_cols[4], input_dims=self.op_dims, input_types=self.op_types,
                             collective=self.op_collective)
        runtime = RuntimeTable(name_id=rt_cols[0], ts_ns=ns(rt_cols[1]), dur_ns=dur_ns(rt_cols[2]),
                               tid=rt_cols[3], correlation=rt_cols[4], external_id=rt_cols[5])
        annotations = sorted(
            (Annotation(name, int(round((ts - origin_us) * 1000)), int(round(dur * 1000)), on_gpu)
             for name, ts, dur, on_gpu in self.annotations),
            key=lambda a: a.ts_ns,
        )
        info = header.distributedInfo if isinstance(header.distributedInfo, dict) else {}
        rank, world = _as_int(info.get("rank"), -1), _as_int(info.get("world_size"), -1)
        device_name = next((p["name"] for p in header.deviceProperties or []
                            if isinstance(p, dict) and isinstance(p.get("name"), str)), None)
        return Trace(
            path=path, rank=rank if rank >= 0 else None, world_size=world if world > 0 else None,
            device_name=device_name, names=self.names.values,
            shapes=[s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in self.shapes.values],
            gpu=gpu, cpu_ops=cpu_ops, runtime=runtime, annotations=annotations,
            origin_ns=_as_int(header.baseTimeNanoseconds, 0) + int(round(origin_us * 1000)),
            record_meta=header.decodegap_record if isinstance(header.decodegap_record, dict) else None,
            warnings=warnings,
        )


def _join(chunks: list[tuple[np.ndarray, ...]], dtypes: tuple) -> list[np.ndarray]:
    if not chunks:
        return [np.empty(0, dtype=d) for d in dtypes]
    return [np.concatenate(cols) for cols in zip(*chunks)]


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


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    builder = TableBuilder()
    with _no_gc():
        header, warnings = decode_trace(path, builder.add)
        trace = builder.finish(path, header, warnings)
    if not len(trace.gpu) and not len(trace.cpu_ops.ts_ns) and not trace.annotations:
        raise UserError(f"{path}: the trace has no profiler events (no kernels, CPU ops or annotations)")
    return trace


def _is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def rank_from_filename(name: str) -> int | None:
    for pattern in _RANK_PATTERNS:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def find_trace_files(path: Path) -> list[Path]:
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if _is_trace_file(p))
    if not files:
        raise UserError(f"{path}: the folder holds no trace files (*.json or *.json.gz)")
    return files


def load_traces(path: str | Path) -> list[Trace]:
    """One trace per rank, ordered by rank. Rank comes from the file name (SGLang, vLLM), else distributedInfo."""
    files = find_trace_files(Path(path))
    traces = [load_trace(f) for f in files]
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

"""The Trace: one rank's events as columnar numpy tables (one row per event, one array per field).

Times are int64 nanoseconds relative to the earliest event of the trace, so kernel durations keep the
nanosecond decimals Kineto writes (rounding to whole microseconds loses a third of small-kernel time)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Kinds of GPU activity in Trace.gpu.kind
KERNEL, MEMCPY, MEMSET = 0, 1, 2
GPU_KIND_NAMES = ("kernel", "memcpy", "memset")


@dataclass
class GpuTable:
    """Kernels, memcpys and memsets, sorted by start time."""

    kind: np.ndarray  # int8: KERNEL / MEMCPY / MEMSET
    name_id: np.ndarray  # int32 into Trace.names
    ts_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    device: np.ndarray  # int32, -1 unknown
    stream: np.ndarray  # int64, -1 unknown
    correlation: np.ndarray  # int64, -1 none
    external_id: np.ndarray  # int64, -1 none
    grid_id: np.ndarray  # int32 into Trace.shapes ("" = none)
    block_id: np.ndarray  # int32 into Trace.shapes
    nbytes: np.ndarray  # int64 (memcpy/memset payload), -1 unknown

    def __len__(self) -> int:
        return len(self.ts_ns)

    @property
    def end_ns(self) -> np.ndarray:
        return self.ts_ns + self.dur_ns


def unique(values) -> np.ndarray:
    """np.unique(values) of integers, by a sort: since numpy 2.3 a plain np.unique finds the distinct values with a
    hash table, 5-10x slower than sorting on these columns (~9 ms for 30k ids), and its first call imports
    numpy.ma (~20 ms)."""
    ordered = np.sort(np.asarray(values).ravel())
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def isin(values: np.ndarray, test) -> np.ndarray:
    """np.isin(values, test) of integer arrays, by a search in the sorted distinct `test` (np.isin takes a plain
    np.unique of a long `test`: see unique)."""
    test = unique(test)
    if not len(test):
        return np.zeros(np.shape(values), dtype=bool)
    at = np.searchsorted(test, values)
    at[at == len(test)] = 0
    return test[at] == values


def group_rows(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows alike in every column (integer columns of one length), grouped: (each group's first row, each row's
    group, rows per group), the groups in the order of their values, the first column first. A sort of integer keys:
    np.unique(axis=0) compares rows as opaque records, many times slower."""
    n = len(columns[0])
    if not n:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    order = np.lexsort(columns[::-1])  # stable: each group's rows stay in row order
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for column in columns:
        ordered = column[order]
        new[1:] |= ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(new)
    group = np.empty(n, dtype=np.int64)
    group[order] = np.cumsum(new) - 1
    return order[starts], group, np.diff(np.append(starts, n))


class InternedColumn(Sequence):
    """A value per row, kept as an int32 id into one table of the distinct values (id 0 is None): a million ops
    with a few hundred distinct shape texts cost 4 bytes each, not a Python object each."""

    __slots__ = ("ids", "values")

    def __init__(self, ids: np.ndarray, values: list) -> None:
        self.ids, self.values = ids, values

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, row):
        if type(row) is slice:
            return [self.values[i] for i in self.ids[row].tolist()]
        return self.values[self.ids.item(row)]  # item: a Python int at once (the steps ask row by row)

    def take(self, rows: np.ndarray) -> InternedColumn:
        return InternedColumn(self.ids[rows], self.values)


class SparseColumn(Sequence):
    """A value per row where almost every row has none: only the rows that have one are stored."""

    __slots__ = ("length", "present")

    def __init__(self, length: int, present: dict) -> None:
        self.length, self.present = length, present

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self.present.get(i) for i in range(*row.indices(self.length))]
        row = int(row)
        if row < 0:
            row += self.length
        if not 0 <= row < self.length:
            raise IndexError(row)
        return self.present.get(row)

    def take(self, rows: np.ndarray) -> SparseColumn:
        return SparseColumn(len(rows), {new: self.present[old] for new, old in enumerate(rows.tolist())
                                        if old in self.present})


@dataclass
class CpuOpTable:
    """CPU ops (aten::*, user functions recorded as ops), with shapes kept as raw JSON text."""

    name_id: np.ndarray  # int32
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    tid: np.ndarray  # int64 (string tids hashed)
    external_id: np.ndarray  # int64, -1 none
    input_dims: InternedColumn  # raw JSON bytes or None, per row
    input_types: InternedColumn
    collective: SparseColumn  # None or dict of collective metadata, per row


@dataclass
class RuntimeTable:
    """CUDA/HIP runtime and driver calls (the host side of every launch)."""

    name_id: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    tid: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray


@dataclass(frozen=True)
class Annotation:
    name: str
    ts_ns: int
    dur_ns: int
    on_gpu: bool  # gpu_user_annotation (GPU timeline) vs user_annotation (CPU timeline)


@dataclass
class Trace:
    path: Path
    rank: int | None
    world_size: int | None
    device_name: str | None
    names: list[str]
    shapes: list[str]
    gpu: GpuTable
    cpu_ops: CpuOpTable
    runtime: RuntimeTable
    annotations: list[Annotation]
    origin_ns: int  # absolute time of t=0 (baseTimeNanoseconds-relative when the trace had it)
    record_meta: dict | None = None  # what `decodegap record` stored (unprofiled step time, ...)
    warnings: list[str] = field(default_factory=list)
    truncated: str | None = None  # why the file ends early (its JSON or gzip stream is cut), None when whole
    known_until_ns: int | None = None  # in a cut file: how far on the host its launches are known
    base_ns: int = 0  # the trace's baseTimeNanoseconds (part of origin_ns), 0 when it had none

    @property
    def has_gpu(self) -> bool:
        return len(self.gpu) > 0

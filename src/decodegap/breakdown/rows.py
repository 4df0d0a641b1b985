"""Per-step and per-layer rows of one rank, computed next to its trace (they need its GPU rows): where each step
sits on the timeline and where its time goes (`StepRow`), and each layer of the typical step (`LayerRow`)."""

from __future__ import annotations

import numpy as np

from decodegap.breakdown.breakdown import Breakdown, busy_ns
from decodegap.records import Struct
from decodegap.rounding import rounded as _r
from decodegap.steps.step import Steps
from decodegap.trace import Trace


class StepRow(Struct):
    """One step of the main rank: where it starts on the GPU timeline and where its time goes."""

    index: int
    phase: str
    label: str | None
    start_ms: float
    ms: float
    gpu_busy_ms: float
    batch: int | None
    tokens: int | None
    category_ms: dict[str, float]


class LayerRow(Struct):
    """One layer of the typical step (the one the layer count was read from)."""

    index: int
    kind: int  # 0..k-1 when layers alternate between k kinds (layer_kinds[kind]), else 0
    start_ms: float  # from the step's start
    ms: float  # from this layer's first kernel to the next layer's
    gpu_ms: float  # GPU time of its kernels


def _row_categories(trace: Trace) -> tuple[np.ndarray, list[str]]:
    """The category of every GPU row, as an index into the distinct categories returned with it, naming each
    distinct (name, kind) once."""
    from decodegap.ops.categories import categorize
    from decodegap.trace.tables import GPU_KIND_NAMES

    gpu = trace.gpu
    if not len(gpu):
        return np.empty(0, dtype=np.int64), []
    keys = gpu.name_id.astype(np.int64) * 4 + gpu.kind.astype(np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    of_key = [categorize(trace.names[int(k) // 4], GPU_KIND_NAMES[int(k) % 4]) for k in uniq.tolist()]
    names = list(dict.fromkeys(of_key))
    index = np.array([names.index(c) for c in of_key], dtype=np.int64)
    return index[inverse.reshape(-1)], names


def step_rows(trace: Trace, steps: Steps) -> list[StepRow]:
    """One row per step: start, wall time, GPU busy time and time per category (Analysis.step_rows)."""
    if not trace.has_gpu:
        return [StepRow(index=s.index, phase=s.kind, label=s.label, start_ms=_r(s.start_ns / 1e6),
                        ms=_r(s.wall_ns / 1e6), gpu_busy_ms=0.0, batch=s.batch, tokens=s.tokens, category_ms={})
                for s in steps.steps]
    gpu = trace.gpu
    cats, names = _row_categories(trace)
    end = gpu.end_ns
    rows = []
    for s in steps.steps:
        r = s.rows
        per: dict[str, float] = {}
        if len(r):
            # GPU time per category, the categories in the order the step first runs them: bincount adds the float
            # durations in row order, as a sum row by row does
            of_row = cats[r]
            ns = np.bincount(of_row, weights=gpu.dur_ns[r], minlength=len(names)).tolist()
            present, first = np.unique(of_row, return_index=True)
            per = {names[c]: ns[c] for c in present[np.argsort(first)].tolist()}
        busy = busy_ns(gpu.ts_ns[r], end[r], s.start_ns, s.end_ns) if len(r) else 0
        rows.append(StepRow(index=s.index, phase=s.kind, label=s.label, start_ms=_r(s.start_ns / 1e6),
                            ms=_r(s.wall_ns / 1e6), gpu_busy_ms=_r(busy / 1e6), batch=s.batch, tokens=s.tokens,
                            category_ms={k: _r(v / 1e6) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}))
    return rows


def layer_rows(trace: Trace, steps: Steps, b: Breakdown) -> list[LayerRow]:
    """One row per layer of the typical step (Analysis.layer_rows)."""
    phase_steps = steps.of(b.phase)
    if not b.layer_starts or b.typical_step is None or not trace.has_gpu:
        return []
    step = phase_steps[b.typical_step]
    rows, gpu = step.rows, trace.gpu
    kinds = max(len(b.layer_kinds), 1)
    starts = list(b.layer_starts)
    bounds = starts + [min(max(b.layer_end, starts[-1] + 1), len(rows))]
    out = []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if hi <= lo:
            continue
        seg = rows[lo:hi]
        t0 = int(gpu.ts_ns[seg[0]])
        t1 = int(gpu.ts_ns[rows[hi]]) if hi < len(rows) else int(gpu.end_ns[seg].max())
        kind = b.layer_kind_of[i] if i < len(b.layer_kind_of) else i % kinds
        out.append(LayerRow(index=i, kind=int(kind), start_ms=_r((t0 - step.start_ns) / 1e6), ms=_r((t1 - t0) / 1e6),
                            gpu_ms=_r(gpu.dur_ns[seg].sum() / 1e6)))
    return out

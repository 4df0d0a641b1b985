"""Steps from step annotations (ProfilerStep, SGLang, vLLM; marks.py reads what they say): a kernel belongs to the
step whose CPU side launched it (kernel -> runtime call by correlation -> the annotation holding the call); the
GPU-side annotation only cross-checks the span. A ProfilerStep that wraps several forwards is cut into them."""

from __future__ import annotations

import numpy as np

from decodegap.steps import anchors as forward_anchors
from decodegap.steps.marks import FAMILY_ORDER, StepMark
from decodegap.steps.phase import is_training, widest_gemm_rows
from decodegap.steps.repetition import normalized_ids
from decodegap.steps.sequence_steps import cut_by_repetition, idle_gaps_ns, name_sequence, unit_starts, unit_tokens
from decodegap.steps.step import Piece
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace


def from_marks(trace: Trace, links: Links, marks: dict[str, list[StepMark]]):
    launch_ts = _launch_ts(trace, links)
    linked = launch_ts >= 0
    for family in FAMILY_ORDER:
        cpu = [m for m in marks.get(family, []) if not m.on_gpu]
        gpu = [m for m in marks.get(family, []) if m.on_gpu]
        warnings: list[str] = []
        if cpu and linked.any():
            pieces = _assign(cpu, launch_ts, trace, warnings)
            source, detail = family, _family_words(family) + " (kernels taken from their launches)"
            if gpu:
                _cross_check(pieces, gpu, warnings)
                pieces = _add_gpu_only(pieces, cpu, gpu, trace)
        elif gpu or cpu:  # no launch records: the marks' own time ranges on the GPU timeline
            use = gpu or cpu
            pieces = _assign(use, trace.gpu.ts_ns, trace, warnings)
            source = family + "_gpu" if family == "profiler_step" and gpu else family
            detail = _family_words(family) + (" (GPU timeline)" if gpu else " (by GPU time)")
        else:
            continue
        pieces = [p for p in pieces if len(p.rows)]
        if family == "profiler_step" and not is_training(trace):
            pieces, split = _split_multi_forward(pieces, trace, links)
            if split:
                detail += f"; {split} of them hold several forwards each, cut at the once-per-forward work"
        if pieces:
            return pieces, source, detail, warnings
    return None


def _split_multi_forward(pieces: list[Piece], trace: Trace, links: Links) -> tuple[list[Piece], int]:
    """A ProfilerStep may wrap a whole generate() call: when the kernels it launched hold several forwards (a period
    with layers and once-per-forward work inside it), those forwards are the steps."""
    names = normalized_ids(trace.names, trace.gpu.name_id)
    graph_of = links.replay
    gaps = idle_gaps_ns(trace.gpu.ts_ns, trace.gpu.end_ns)
    head = widest_gemm_rows(trace, links)
    end = trace.gpu.end_ns
    out, split = [], 0
    seq, canonical = name_sequence(trace)
    anchors_of = forward_anchors.TraceAnchors.of(trace, links, training=False)
    for p in pieces:
        window = (p.mark.ts_ns, p.mark.end_ns) if p.mark else None
        several = window is not None and anchors_of.count_in(*window) >= 2
        by_anchor = forward_anchors.cut(anchors_of, p.rows, seq, canonical, window=window) if several else None
        if by_anchor is not None and len(by_anchor.pieces) >= 2:
            split += 1
            out.extend(Piece(int(trace.gpu.ts_ns[r[0]]), int(end[r].max()), r, whole=True,
                              host_span=(max(lo, p.mark.ts_ns), min(hi, p.mark.end_ns)))
                       for r, (lo, hi) in zip(by_anchor.pieces, by_anchor.spans, strict=True))
            continue
        if anchors_of.times:  # the once-per-forward work is in the trace and says this step holds one forward
            out.append(p)
            continue
        starts = unit_starts(graph_of[p.rows])
        tokens = unit_tokens(names[p.rows], graph_of[p.rows], starts)
        cut = (cut_by_repetition(tokens, gaps[p.rows][starts], names[p.rows], starts,
                                  head[p.rows] if head is not None else None) if len(tokens) >= 6 else None)
        if cut is None or not cut.period_is_step or len(cut.bounds) < 3:
            out.append(p)
            continue
        split += 1
        row_bounds = np.append(starts, len(p.rows))[cut[0]]
        for lo, hi in zip(row_bounds[:-1], row_bounds[1:], strict=True):
            rows = p.rows[lo:hi]
            if len(rows):
                out.append(Piece(int(trace.gpu.ts_ns[rows[0]]), int(end[rows].max()), rows))
    return out, split


def _family_words(family: str) -> str:
    return {"profiler_step": "ProfilerStep annotations", "sglang_step": "SGLang step[...] annotations",
            "vllm_execute": "vLLM execute_... annotations"}[family]


def _launch_ts(trace: Trace, links: Links) -> np.ndarray:
    """Per GPU row, when its launching runtime call started on the host (-1: no launch record)."""
    ts = np.full(len(trace.gpu), -1, dtype=np.int64)
    has = links.runtime_idx >= 0
    ts[has] = trace.runtime.ts_ns[links.runtime_idx[has]]
    return ts


def _assign(marks: list[StepMark], when: np.ndarray, trace: Trace, warnings: list[str]) -> list[Piece]:
    """Each GPU row to the latest-starting mark that contains `when` (its launch time, or its own start)."""
    starts = np.array([m.ts_ns for m in marks], dtype=np.int64)
    ends = np.array([m.end_ns for m in marks], dtype=np.int64)
    overlaps = int((starts[1:] < np.maximum.accumulate(ends)[:-1]).sum()) if len(marks) > 1 else 0
    if overlaps:
        warnings.append(f"{overlaps} step annotation(s) overlap the one before (e.g. {marks[1].name}): each kernel "
                        "went to the latest-starting annotation that holds its launch")
    idx = np.searchsorted(starts, when, side="right") - 1
    ok = (when >= 0) & (idx >= 0)
    inside = np.zeros(len(when), dtype=bool)
    inside[ok] = when[ok] < ends[idx[ok]]
    # A launch past the latest mark's end may still sit in an earlier, longer mark (nesting, overlaps).
    widest = np.maximum.accumulate(np.where(ends == np.maximum.accumulate(ends), np.arange(len(ends)), 0))
    retry = ok & ~inside
    idx[retry] = widest[idx[retry]]
    inside[retry] = when[retry] < ends[idx[retry]]
    idx = np.where(inside, idx, -1)
    gpu = trace.gpu
    end = gpu.end_ns
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    bounds = np.searchsorted(sorted_idx, np.arange(len(marks) + 1), side="left")
    pieces = []
    for i, m in enumerate(marks):
        rows = np.sort(order[bounds[i]:bounds[i + 1]])
        if len(rows):
            pieces.append(Piece(int(gpu.ts_ns[rows[0]]), int(end[rows].max()), rows, m))
        else:
            pieces.append(Piece(m.ts_ns, m.end_ns, rows, m))
    return pieces


def _add_gpu_only(pieces: list[Piece], cpu: list[StepMark], gpu: list[StepMark], trace: Trace) -> list[Piece]:
    """Steps whose CPU-side mark is missing (lost or unreadable) but whose GPU-side one is there: their kernels
    by GPU time, among those no CPU-side step took."""
    named = {m.name for m in cpu}
    orphans = [g for g in gpu if g.name not in named]
    if not orphans:
        return pieces
    taken = np.zeros(len(trace.gpu), dtype=bool)
    for p in pieces:
        taken[p.rows] = True
    ts, end = trace.gpu.ts_ns, trace.gpu.end_ns
    for g in orphans:
        lo, hi = np.searchsorted(ts, [g.ts_ns, g.end_ns], side="left")
        rows = np.arange(lo, hi)[~taken[lo:hi]]
        if len(rows):
            pieces.append(Piece(int(ts[rows[0]]), int(end[rows].max()), rows, g))
    return sorted(pieces, key=lambda p: p.start_ns)


def _cross_check(pieces: list[Piece], gpu_marks: list[StepMark], warnings: list[str]) -> None:
    """The GPU-side annotation of a step spans its kernels; widen the step to it, and say when it is cut short."""
    by_name = {m.name: m for m in gpu_marks}
    short_ones = []
    for p in pieces:
        g = by_name.get(p.mark.name) if p.mark else None
        if g is None or not len(p.rows):
            continue
        slack = max(0.01 * (p.end_ns - p.start_ns), 1000)
        if p.end_ns > g.end_ns + slack or p.start_ns < g.ts_ns - slack:
            short_ones.append(p.mark.name)
        p.start_ns, p.end_ns = min(p.start_ns, g.ts_ns), max(p.end_ns, g.end_ns)
    if short_ones:
        warnings.append(f"the GPU-side annotation of {', '.join(short_ones[:3])}"
                        f"{' and others' if len(short_ones) > 3 else ''} covers only part of the kernels its CPU side "
                        "launched (cut short, or launches from another thread): the steps' kernels were taken from "
                        "their launches")

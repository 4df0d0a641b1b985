"""Finding the steps (forward passes) of a trace, their phase, and what told us.

Direct evidence first, and the result says which was used (`Steps.source`, a stable id):
1. step annotations (`profiler_step`, `sglang_step`, `vllm_execute`; see step_marks.py): a kernel belongs to the
   step whose CPU side launched it (kernel -> runtime call by correlation -> the annotation holding the call); the
   GPU-side annotation only cross-checks the span;
2. graph launches (`graph_launch`): the kernels one cudaGraphLaunch/hipGraphLaunch replays belong to one forward;
   several launches (piecewise graphs) are grouped into forwards by the repetition below, each launch one unit;
3. the repeating kernel sequence (`kernel_repetition`): a forward holds the once-per-forward work (embedding, final
   norm, lm_head, sampling) around its layer run; a period without it is a layer, and a trace holding one forward is
   one step. Cuts never split the layer run; idle gaps only break ties.
A partial step exists only at the edges of the capture (a last graph replay that ran only its graph's first kernels
is one); an interior step is never dropped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from decodegap.errors import UserError
from decodegap.ops.categories import categorize
from decodegap.steps import anchors as forward_anchors
from decodegap.steps.across_forwards import data_independent
from decodegap.steps.anchors import FAMILIES, lost_launches
from decodegap.steps.drafts import draft_forwards
from decodegap.steps.layers import count_layers
from decodegap.steps.marks import FAMILY_ORDER, StepMark, step_marks
from decodegap.steps.phase import (
    GrowingRun,
    grid_blocks,
    growing_runs,
    is_training,
    packed_decode,
    packed_mixed,
    phase_from_tokens,
    phases_from_launches,
    rows_alone,
    step_tokens,
    widest_gemm_rows,
)
from decodegap.steps.repetition import (
    REGULAR,
    Anchor,
    backers,
    find_layers,
    mix_overlap,
    name_classes,
    normalized_ids,
    regular_anchors,
    smallest_period,
)
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace, unique

PHASES = ("decode", "prefill", "mixed", "training")
SAME_MIX = 0.8  # kernel-mix overlap above which a step counts as the same kind as the typical one
PARTIAL = 0.9  # an edge step with fewer than this share of the typical step's activities is cut off
DECODER_FORWARDS = 8  # a decoder's first forwards compared for the encoder's cross-attention projections
CROSS_PROJECTIONS = 4  # most GEMM kernels a decoder layer runs to project the encoder's output to its keys and values

# Stable ids of the evidence (docs/report-schema.md lists them).
SOURCES = ("profiler_step", "profiler_step_gpu", "profiler_step_cpu_only", "sglang_step", "vllm_execute",
           "graph_launch", *(f"anchor_{f}" for f in FAMILIES), "kernel_repetition", "whole_trace", "none")


@dataclass(frozen=True)
class Step:
    index: int
    kind: str  # phase: decode | prefill | mixed | training
    start_ns: int
    end_ns: int
    rows: np.ndarray  # rows of Trace.gpu in this step
    batch: int | None = None
    tokens: int | None = None
    label: str | None = None  # the annotation's name, when one delimited the step

    @property
    def phase(self) -> str:
        return self.kind

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Steps:
    steps: list[Step]
    source: str  # stable id, one of SOURCES
    detail: str = ""  # the evidence in words
    workload: str = "inference"  # or "training"
    dropped_partial: int = 0
    warnings: list[str] = field(default_factory=list)
    graph_launches: int = 0  # graph replays that hold the steps' kernels
    runtime: str = "CUDA"  # CUDA | HIP, from the launch calls

    def of(self, phase: str) -> list[Step]:
        return [s for s in self.steps if s.kind == phase]

    @property
    def decode(self) -> list[Step]:
        return self.of("decode")

    @property
    def prefill(self) -> list[Step]:
        return self.of("prefill")

    @property
    def main_phase(self) -> str:
        """The phase the breakdown describes: decode when there is any, else what the trace holds most of."""
        counts = Counter(s.kind for s in self.steps)
        if counts["decode"] or not counts:
            return "decode"
        return max(PHASES, key=lambda p: (counts[p], -PHASES.index(p)))


@dataclass
class _Piece:
    start_ns: int
    end_ns: int
    rows: np.ndarray
    mark: StepMark | None = None
    whole: bool = False  # the evidence says it is a whole forward (its edges were checked against the window)
    host_span: tuple[int, int] | None = None  # the host time it covers, when the evidence says (anchor to anchor)
    encoder: bool = False  # an encoder's forward joined to the first decoder forward after it: the prefill


def find_steps(trace: Trace, links: Links) -> Steps:
    steps = _find_steps(trace, links)
    if trace.truncated and trace.known_until_ns is not None and not steps.steps:
        raise UserError(f"{trace.path}: {_cut_words(trace, links)}")
    return steps


def _cut_words(trace: Trace, links: Links) -> str:
    """What a cut file kept: its kernels against those its CPU side launched (the launches the file lost, estimated
    from its CPU ops outside the launch records it kept, after the cut or before the first of them, and what each op
    of that name launched among them)."""
    ops, cut = trace.cpu_ops, trace.known_until_ns
    first = int(trace.runtime.ts_ns.min()) if len(trace.runtime.ts_ns) else cut
    before = (ops.ts_ns <= cut) & (ops.ts_ns >= min(first, cut))
    linked = links.op_idx[links.op_idx >= 0]
    kernels_per_op = np.bincount(ops.name_id[linked], minlength=len(trace.names)).astype(float)
    ops_before = np.bincount(ops.name_id[before], minlength=len(trace.names))
    rate = np.divide(kernels_per_op, ops_before, out=np.zeros(len(trace.names)), where=ops_before > 0)
    lost = int(round(rate[ops.name_id[~before]].sum())) + len(lost_launches(trace))
    kept = len(trace.gpu)
    held = (f"{kept} of the about {kept + lost} kernels its CPU side launched are in the file" if kept and lost else
            f"none of the GPU work its {len(ops.ts_ns)} CPU ops launched is in the file")
    return (f"truncated ({trace.truncated}): {held}, and no step ends before the cut (Kineto writes the GPU events "
            "after the CPU ops): capture again and let the profiler finish writing the file")


def _find_steps(trace: Trace, links: Links) -> Steps:
    training = is_training(trace)
    marks = step_marks(trace.annotations)
    found = _from_marks(trace, links, marks) if trace.has_gpu else None
    if found is None and not trace.has_gpu and trace.truncated and trace.known_until_ns is not None:
        return Steps([], "none", "the file ends before its GPU events", "training" if training else "inference")
    if found is None and not trace.has_gpu:
        cpu = [m for m in marks.get("profiler_step", []) if not m.on_gpu]
        steps = [Step(i, "training" if training else "decode", m.ts_ns, m.end_ns, np.empty(0, np.int64), label=m.name)
                 for i, m in enumerate(cpu)]
        return Steps(steps, "profiler_step_cpu_only" if steps else "none",
                     "ProfilerStep annotations (CPU only, no GPU events)" if steps else "no GPU events, no step marks",
                     "training" if training else "inference")
    if found is None and len(trace.gpu) < 6:
        return Steps([], "none", "too few GPU events to find steps", "training" if training else "inference")
    if found is None:
        found = _from_launches_or_repetition(trace, links, training)
    pieces, source, detail, warnings, *dropped = found
    return _classify(trace, links, pieces, source, detail, warnings, training, sum(dropped))


# --- 1. annotations -------------------------------------------------------------------------------------------

def _from_marks(trace: Trace, links: Links, marks: dict[str, list[StepMark]]):
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


def _split_multi_forward(pieces: list[_Piece], trace: Trace, links: Links) -> tuple[list[_Piece], int]:
    """A ProfilerStep may wrap a whole generate() call: when the kernels it launched hold several forwards (a period
    with layers and once-per-forward work inside it), those forwards are the steps."""
    names = normalized_ids(trace.names, trace.gpu.name_id)
    graph_of = links.replay
    gaps = idle_gaps_ns(trace.gpu.ts_ns, trace.gpu.end_ns)
    head = widest_gemm_rows(trace, links)
    end = trace.gpu.end_ns
    out, split = [], 0
    seq, canonical = _name_sequence(trace)
    anchors_of = forward_anchors.TraceAnchors.of(trace, links, training=False)
    for p in pieces:
        window = (p.mark.ts_ns, p.mark.end_ns) if p.mark else None
        several = window is not None and anchors_of.count_in(*window) >= 2
        by_anchor = forward_anchors.cut(anchors_of, p.rows, seq, canonical, window=window) if several else None
        if by_anchor is not None and len(by_anchor.pieces) >= 2:
            split += 1
            out.extend(_Piece(int(trace.gpu.ts_ns[r[0]]), int(end[r].max()), r, whole=True,
                              host_span=(max(lo, p.mark.ts_ns), min(hi, p.mark.end_ns)))
                       for r, (lo, hi) in zip(by_anchor.pieces, by_anchor.spans, strict=True))
            continue
        if anchors_of.times:  # the once-per-forward work is in the trace and says this step holds one forward
            out.append(p)
            continue
        starts = _unit_starts(graph_of[p.rows])
        tokens = _unit_tokens(names[p.rows], graph_of[p.rows], starts)
        cut = (_cut_by_repetition(tokens, gaps[p.rows][starts], names[p.rows], starts,
                                  head[p.rows] if head is not None else None) if len(tokens) >= 6 else None)
        if cut is None or not cut.period_is_step or len(cut.bounds) < 3:
            out.append(p)
            continue
        split += 1
        row_bounds = np.append(starts, len(p.rows))[cut[0]]
        for lo, hi in zip(row_bounds[:-1], row_bounds[1:], strict=True):
            rows = p.rows[lo:hi]
            if len(rows):
                out.append(_Piece(int(trace.gpu.ts_ns[rows[0]]), int(end[rows].max()), rows))
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


def _assign(marks: list[StepMark], when: np.ndarray, trace: Trace, warnings: list[str]) -> list[_Piece]:
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
            pieces.append(_Piece(int(gpu.ts_ns[rows[0]]), int(end[rows].max()), rows, m))
        else:
            pieces.append(_Piece(m.ts_ns, m.end_ns, rows, m))
    return pieces


def _add_gpu_only(pieces: list[_Piece], cpu: list[StepMark], gpu: list[StepMark], trace: Trace) -> list[_Piece]:
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
            pieces.append(_Piece(int(ts[rows[0]]), int(end[rows].max()), rows, g))
    return sorted(pieces, key=lambda p: p.start_ns)


def _cross_check(pieces: list[_Piece], gpu_marks: list[StepMark], warnings: list[str]) -> None:
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


# --- 2. graph launches, 3. repetition ---------------------------------------------------------------------------

def _name_sequence(trace: Trace) -> tuple[np.ndarray, list[str]]:
    """A normalised name id per GPU row (compiler-numbered names made equal), and those names."""
    mapping, canonical = name_classes(trace.names)
    return mapping[trace.gpu.name_id.astype(np.int64)], canonical


def _from_anchors(trace: Trace, links: Links, training: bool):
    seq, canonical = _name_sequence(trace)
    found = forward_anchors.cut(forward_anchors.TraceAnchors.of(trace, links, training), np.arange(len(trace.gpu)),
                                seq, canonical)
    if found is None:
        return None
    pieces = [_Piece(int(trace.gpu.ts_ns[r[0]]), int(trace.gpu.end_ns[r].max()), r, whole=True, host_span=span)
              for r, span in zip(found.pieces, found.spans, strict=True)]
    # a cut file lost the kernels some families are read from: their counts cross-check nothing there
    warnings = [] if trace.truncated else list(found.warnings)
    if found.partial:
        warnings.append(f"{len(found.partial)} partial forward(s) at the capture's edges were left out: "
                        + "; ".join(found.partial))
    return pieces, f"anchor_{found.family.id}", found.detail, warnings, len(found.partial)


def _from_launches_or_repetition(trace: Trace, links: Links, training: bool = False):
    gpu = trace.gpu
    seq_rows = normalized_ids(trace.names, gpu.name_id)
    graph_of = links.replay
    replays = np.unique(graph_of[graph_of >= 0])
    unit_start = _unit_starts(graph_of)
    tokens = _unit_tokens(seq_rows, graph_of, unit_start)
    end = gpu.end_ns
    gaps = idle_gaps_ns(gpu.ts_ns, end)[unit_start]
    n_rows = len(gpu)
    runtime = _runtime(trace)
    if len(replays) == 1 and (graph_of >= 0).sum() >= 0.5 * n_rows:
        rows = np.arange(n_rows)
        piece = _Piece(int(gpu.ts_ns[0]), int(end.max()), rows)
        return [piece], "graph_launch", f"one {runtime} graph replays {int((graph_of >= 0).sum())} of the " \
                                         f"{n_rows} GPU activities: one forward", []
    # Graph replays that each hold a whole forward are the steps; piecewise replays are grouped by the anchors.
    cut = _one_forward_per_replay(tokens, gaps, seq_rows, unit_start, graph_of) if len(replays) > 1 else None
    if cut is None:
        by_anchor = _from_anchors(trace, links, training)
        if by_anchor is not None:
            return by_anchor
        cut = _cut_by_repetition(tokens, gaps, seq_rows, unit_start, widest_gemm_rows(trace, links))
    if cut is None and trace.truncated:  # a cut file with no evidence of a whole step in what it kept
        return [], "none", "no whole step before the cut", []
    if cut is None:
        piece = _Piece(int(gpu.ts_ns[0]), int(end.max()), np.arange(n_rows))
        return [piece], "whole_trace", "no repeating kernel sequence: the whole trace is one step", [
            "no step marks, graph launches or repeating kernel sequence: the whole trace is taken as one step"]
    bounds, what, _ = cut
    row_bounds = np.append(unit_start, n_rows)[bounds]
    pieces = [_Piece(int(gpu.ts_ns[lo]), int(end[lo:hi].max()), np.arange(lo, hi))
              for lo, hi in zip(row_bounds[:-1], row_bounds[1:], strict=True) if hi > lo]
    if len(replays):
        detail = f"{len(replays)} {runtime} graph launches, grouped into forwards by " + what
        partial = _replay_cut_short(pieces, seq_rows, graph_of)
        if partial:
            return pieces[:-1], "graph_launch", detail, [partial], 1
        return pieces, "graph_launch", detail, []
    return pieces, "kernel_repetition", "repeating kernel sequence: " + what, []


def _replay_cut_short(pieces: list[_Piece], seq_rows: np.ndarray, graph_of: np.ndarray) -> str:
    """Why the last forward is partial, or "": a replay of a graph runs all of its kernels, so a last forward whose
    replayed kernels are fewer than the forward's before it, and the first of those same kernels in the same order,
    is one the capture (or the file) ended inside."""
    if len(pieces) < 2:
        return ""
    last, before = (p.rows[graph_of[p.rows] >= 0] for p in pieces[-2:][::-1])
    if 0 < len(last) < len(before) and np.array_equal(seq_rows[last], seq_rows[before[:len(last)]]):
        return (f"the last graph replay ran {len(last)} of the {len(before)} kernels the one before it did: the "
                f"capture ended inside it (left out as partial)")
    return ""


def _unit_starts(graph_of: np.ndarray) -> np.ndarray:
    """Positions where a unit starts: every eager row, and the first row of each graph replay's run."""
    if not len(graph_of):
        return np.empty(0, dtype=np.int64)
    new = np.ones(len(graph_of), dtype=bool)
    new[1:] = (graph_of[1:] < 0) | (graph_of[1:] != graph_of[:-1])
    return np.flatnonzero(new)


def _unit_tokens(seq_rows: np.ndarray, graph_of: np.ndarray, unit_start: np.ndarray) -> np.ndarray:
    """One token per unit: the kernel's name, or for a graph replay the sequence of names it replays."""
    tokens = seq_rows[unit_start].copy()
    graph_units = np.flatnonzero(graph_of[unit_start] >= 0)
    if not len(graph_units):
        return tokens
    ends = np.append(unit_start[1:], len(seq_rows))
    signatures: dict[bytes, int] = {}
    base = int(seq_rows.max()) + 1 if len(seq_rows) else 0
    for u in graph_units.tolist():
        key = seq_rows[unit_start[u]:ends[u]].tobytes()
        tokens[u] = base + signatures.setdefault(key, len(signatures))
    return tokens


def idle_gaps_ns(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each activity (sorted by start), how long the GPU sat idle right before it started."""
    gaps = np.zeros(len(ts), dtype=np.int64)
    if len(ts) > 1:
        gaps[1:] = np.maximum(ts[1:] - np.maximum.accumulate(end)[:-1], 0)
    return gaps


def _pick_step_anchor(anchors: list[Anchor], seq: np.ndarray) -> Anchor | None:
    """The anchor of the widest period that several kernel names agree on.

    Per-step work (embedding, final norm, lm_head, sampling, bookkeeping) is several kernels, each regular at
    the step period; a kernel that runs every k steps is usually alone at its period. So the widest period
    backed by at least three names wins, falling back to two, then one."""
    chosen = None
    for needed in (3, 2, 1):
        chosen = next((a for a in anchors if len(backers(anchors, a, count_slack=2)) >= needed), None)
        if chosen is not None:
            break
    if chosen is None:
        return None
    # A block that is itself k identical repeats means the anchor fires every k steps: use the shorter period.
    first = int(np.flatnonzero(chosen.regular)[0])
    block = seq[chosen.positions[first]:chosen.positions[first + 1]]
    period = smallest_period(block)
    if period < len(block):
        shorter = [a for a in anchors if abs(a.period - period) <= REGULAR * period]
        if shorter:
            chosen = shorter[0]
    return chosen


SAME_LAYERS = 0.7  # Layers.repeat above which the repeating sub-blocks of a period are layers


def _holds_layers(inner, block: np.ndarray, head: np.ndarray | None = None) -> bool:
    """A period is a whole step when it holds alike layers and work outside them (the once-per-forward glue).

    Two repeats prove little (one layer's two norm+projection groups recur twice too, and two occurrences are
    always "evenly spaced"): with two, the period must hold the lm_head (the widest GEMM, when op shapes say which:
    `head`, per kernel of the block) or, without shapes, the two must fill most of it. From three on, the spacing
    is evidence."""
    if not inner.count or inner.count < 2 or inner.repeat(block) < SAME_LAYERS:
        return False
    if inner.glue(len(block)) < max(2.0, 0.2 * inner.period):
        return False
    if inner.count >= 3:
        return True
    return bool(head.any()) if head is not None else 2 * inner.period >= 0.8 * len(block)


class _Cut(NamedTuple):
    """Unit bounds of the forwards a repeating sequence gives, how they were found (words), and whether the period
    that repeats is a whole step (else a layer, the forwards being runs of it)."""

    bounds: np.ndarray
    detail: str
    period_is_step: bool


def _cut_by_repetition(seq: np.ndarray, gaps: np.ndarray, row_seq: np.ndarray, unit_start: np.ndarray,
                       head: np.ndarray | None = None) -> _Cut | None:
    """Unit bounds of the forwards, and how they were found; None when nothing repeats.

    seq holds one token per unit (a kernel, or a whole graph replay); the layers inside a period are looked for
    in its kernels (row_seq), since one graph replay may hold a whole forward."""
    anchor = _pick_step_anchor(regular_anchors(seq), seq)
    if anchor is None:
        return None
    n, period = len(seq), int(round(anchor.period))
    first = int(np.flatnonzero(anchor.regular)[0])
    block_at = int(anchor.positions[first])
    row_at = int(unit_start[block_at])
    row_end = int(unit_start[anchor.positions[first + 1]])
    block = row_seq[row_at:row_end]
    inner = find_layers(block, min_coverage=0.3)
    if _holds_layers(inner, block, head[row_at:row_end] if head is not None else None):
        # The period is a step: cut at the same offset after the anchor in every period, outside the layer run,
        # where the GPU idles longest.
        row_offset = unit_start[np.clip(block_at + np.arange(period), 0, n - 1)] - row_at
        allowed = np.array([o for o in range(period) if row_offset[o] <= inner.first or row_offset[o] > inner.last])
        starts = anchor.positions[:-1][anchor.regular]
        idx = np.clip(starts[:, None] + allowed[None, :], 0, n - 1)
        best = int(allowed[int(np.argmax(np.median(gaps[idx], axis=0)))])
        cuts = anchor.positions + best
        cuts = cuts[cuts < n]
        bounds = np.unique(np.concatenate(([0], cuts, [n])))
        unit = "GPU activities" if len(seq) == len(row_seq) else "units (a graph replay or an eager kernel)"
        return _Cut(bounds, f"a step every {period} {unit} per step, {inner.count} layers each", True)
    # The period is a layer (or a group of alternating layers): forwards are runs of them, split where a long
    # irregular interval holds kernels no layer runs (the once-per-forward work).
    cuts = _forward_boundaries(seq, gaps, anchor)
    bounds = np.concatenate(([0], cuts, [n])).astype(np.int64)
    forwards = len(bounds) - 1
    return _Cut(bounds, f"the repeating block ({period} units) is a layer, not a step: {forwards} forward(s), "
                        "each a run of layers between the once-per-forward work", False)


def _one_graph_between_alike(tokens: np.ndarray, replay_units: np.ndarray) -> bool:
    """Every replay (but a last one, which a cut file may hold in part) replays one graph, and the eager work
    between every two replays is the same (a loop's input updates, or nothing): each replay is a forward. Piecewise
    graphs replay at least two graphs a forward (the first piece holds the embedding, the last the output head), and
    graphs of single layers have the forward's eager glue between only some of them."""
    if len(replay_units) < 2:
        return False
    whole = tokens[replay_units[:-1]] if len(replay_units) > 2 else tokens[replay_units]
    if len(np.unique(whole)) != 1:
        return False
    between = [Counter(tokens[a + 1:b].tolist()) for a, b in zip(replay_units[:-1], replay_units[1:], strict=True)]
    return all(x == between[0] for x in between[1:])


def _one_forward_per_replay(tokens, gaps, row_seq, unit_start, graph_of) -> _Cut | None:
    """Replays that each hold a whole forward (layers and their glue, or one graph replayed with the same eager work
    between every two): one step each, cut between two replays where the GPU idles longest. Replays that hold only
    layers are pieces of one forward: None."""
    replay_units = np.flatnonzero(graph_of[unit_start] >= 0)
    ends = np.append(unit_start[1:], len(row_seq))
    u = int(replay_units[0])
    block = row_seq[unit_start[u]:ends[u]]
    inner = find_layers(block, min_coverage=0.3)
    if not (_holds_layers(inner, block) or _one_graph_between_alike(tokens, replay_units)):
        return None
    cuts = []
    first = int(replay_units[0])
    if first > 0 and unit_start[first] >= 0.5 * (ends[first] - unit_start[first]):
        # Eager work before the first replay as long as half a replay's or longer is a forward of its own (a prefill
        # run eagerly before decodes replayed from CUDA graphs), not the glue before a forward
        between = np.arange(1, first + 1)
        cuts.append(int(between[np.argmax(gaps[between])]))
    for a, b in zip(replay_units[:-1], replay_units[1:], strict=True):
        between = np.arange(a + 1, b + 1)  # the eager units after replay a, and replay b itself
        cuts.append(int(between[np.argmax(gaps[between])]))
    bounds = np.concatenate(([0], cuts, [len(tokens)])).astype(np.int64)
    layers = f" ({inner.count} layers each)" if inner.count else ""
    return _Cut(np.unique(bounds), f"one forward per graph replay{layers}", True)


def _forward_boundaries(seq: np.ndarray, gaps: np.ndarray, anchor: Anchor) -> np.ndarray:
    pos, intervals = anchor.positions, np.diff(anchor.positions)
    regular_blocks = [seq[pos[i]:pos[i + 1]] for i in np.flatnonzero(anchor.regular)]
    inside = set(np.concatenate(regular_blocks).tolist()) if regular_blocks else set()
    cuts = []
    for i in np.flatnonzero(~anchor.regular & (intervals > anchor.period * (1 + REGULAR))):
        lo, hi = int(pos[i]), int(pos[i + 1])
        foreign = [j for j in range(lo, hi) if int(seq[j]) not in inside]
        if foreign:
            span = np.arange(foreign[0], foreign[-1] + 1)
            cuts.append(int(span[np.argmax(gaps[span])]) if len(span) > 1 else foreign[0])
    return np.array(cuts, dtype=np.int64)


# --- phase, edges, checks --------------------------------------------------------------------------------------

def _classify(trace: Trace, links: Links, pieces: list[_Piece], source: str, detail: str, warnings: list[str],
              training: bool, dropped_before: int = 0) -> Steps:
    workload = "training" if training else "inference"
    if not pieces:
        return Steps([], source, detail, workload, 0, warnings)
    names = normalized_ids(trace.names, trace.gpu.name_id)
    if not training and not any(p.mark for p in pieces):
        outputs = _outputs(pieces, trace, links)
        pieces, outputs, detail = _without_drafts(pieces, outputs, names, trace, links, detail)
        if source.startswith("anchor_"):
            pieces = _encoders_joined(pieces, outputs, trace, links, names)
            if any(p.encoder for p in pieces):
                detail += "; an encoder's forward taken with the decoder's first as the prefill"
    from_sequence = source in ("kernel_repetition", "graph_launch")  # cut by counts: fragments to mend
    if from_sequence:
        pieces = _split_overlong(pieces, names, trace)
    tokens = [step_tokens(trace, links, p.rows) for p in pieces]
    gemm_rows = sorted({t.gemm_rows for t in tokens if t.gemm_rows})
    decode_rows = gemm_rows[0] if len(gemm_rows) > 1 else None
    evidence = ["prefill" if p.encoder else p.mark.phase if p.mark and p.mark.phase else
                phase_from_tokens(t, decode_rows) for p, t in zip(pieces, tokens, strict=True)]
    if from_sequence:
        pieces, tokens, evidence = _merge_fragments(pieces, tokens, evidence, trace)
    pieces, tokens, evidence, incomplete = _drop_incomplete(trace, links, pieces, tokens, evidence)
    if not pieces:
        return Steps([], source, detail, workload, dropped_before + len(incomplete),
                     warnings + [_incomplete_words(incomplete)])
    lengths = np.array([len(p.rows) for p in pieces])
    typical_len = float(np.median(lengths))
    reference = Counter(names[pieces[int(np.argsort(lengths)[len(lengths) // 2])].rows].tolist())
    typical_i = int(np.argsort(lengths)[len(lengths) // 2])
    packed: set[int] = set()
    if not training:
        evidence = _recomputed(trace, links, pieces, tokens, evidence, names, warnings)
        evidence, packed = _packed(pieces, tokens, evidence)
    by_launch = (phases_from_launches(trace, [p.rows for p in pieces], names, typical_i) if None in evidence
                 else None) or [None] * len(pieces)
    by_launch = _oriented(by_launch, evidence, pieces)
    typical_wall = float(np.median([p.end_ns - p.start_ns for p in pieces]))
    # Launches that tell some steps from others say which are decodes too; all alike, they tell no phase (a run of
    # recomputing forwards launches alike as well)
    launches_tell = len(set(by_launch) - {None}) > 1
    steps, dropped, notes = [], dropped_before, []
    for i, (p, t, phase, launched) in enumerate(zip(pieces, tokens, evidence, by_launch, strict=True)):
        mix = Counter(names[p.rows].tolist())
        contained = sum(min(c, reference[k]) for k, c in mix.items()) / max(len(p.rows), 1)
        at_edge = i in (0, len(pieces) - 1) and len(pieces) > 1
        cut_off = len(p.rows) < PARTIAL * typical_len and (contained >= 0.95 or (
            phase is None and len(p.rows) < 0.5 * typical_len))
        if at_edge and cut_off and not p.whole and p.mark is None:
            dropped += 1
            where = "first" if i == 0 else "last"
            notes.append(f"{p.mark.name if p.mark else 'the ' + where + ' step'} ({where} in the trace): "
                         f"{len(p.rows)} of the typical {typical_len:.0f} GPU activities")
            continue
        if phase is None and len(pieces) > 1 and (launched == "prefill" or launches_tell and launched):
            phase = launched  # no annotation or op shape: launches say
        if phase is None:  # nor launch shapes: a longer step with another kernel mix is a prefill
            # which kernels it runs, not how often: an eager MoE step runs its experts' kernels more or fewer times
            kinds = set(mix)
            alike = len(kinds & set(reference)) / max(len(kinds | set(reference)), 1)
            other = alike < SAME_MIX and len(p.rows) >= 0.5 * typical_len and p.end_ns - p.start_ns > typical_wall
            phase = "prefill" if other else "decode"
        if training:
            phase = "training"
        batch = p.mark.batch if p.mark and p.mark.batch else t.head_rows if i in packed else t.batch or (
            t.gemm_rows if phase == "decode" else t.head_rows if t.head_rows and t.head_rows < (t.gemm_rows or 0)
            else None)
        n_tokens = p.mark.tokens if p.mark and p.mark.tokens else t.gemm_rows
        steps.append(Step(len(steps), phase, p.start_ns, p.end_ns, p.rows, batch, n_tokens,
                          p.mark.name if p.mark else None))
    if notes:
        warnings.append(f"{len(notes)} partial step(s) at the trace edges were left out: " + "; ".join(notes))
    if incomplete:
        warnings.append(_incomplete_words(incomplete))
        dropped += len(incomplete)
    rows = np.concatenate([s.rows for s in steps]) if steps else np.empty(0, np.int64)
    graphs = len(np.unique(links.replay[rows][links.replay[rows] >= 0]))
    return Steps(steps, source, detail, workload, dropped, warnings, graphs, _runtime(trace))


def _encoders_joined(pieces: list[_Piece], outputs: list[bool] | None, trace: Trace, links: Links,
                     names: np.ndarray) -> list[_Piece]:
    """An encoder-decoder's encoder runs as a forward of its own (an embedding lookup begins it) that ends in no
    output head or sampling, right before the decoder's first forward, which does: the two are the prefill (the
    prompt's processing, up to the first token), as one step. Op shapes must say so: the encoder attends over its
    own tokens, no cache, and the decoder's forward is one token a sequence that does not continue the first's cache
    (a decoder-only prefill run without its output head is followed by its first decode, over the prompt's keys; a
    chunked prefill's first chunk, with no output either, by a chunk of many tokens). Without shapes, the decoder's
    first forward projects the encoder's output to every layer's cross-attention keys and values, once: it runs a
    multiple of its layers' count more matrix products than its next forward, which runs as many as the one after it
    (_projects_encoder_once); or the launches read the first as a prefill and the second as the decodes are launched,
    and the two are stacks of different depths (a model's prefill and its decode read as many layers). `outputs`:
    _outputs of the pieces."""
    if outputs is None or not any(outputs):
        return pieces
    launched: list | None = None

    def encoder_then_decoder(i: int) -> bool:
        nonlocal launched
        t, u = step_tokens(trace, links, pieces[i].rows), step_tokens(trace, links, pieces[i + 1].rows)
        if t.query_len and u.query_len:
            return bool(t.query_len > 1 and t.kv_len == t.query_len and u.query_len == 1
                        and u.kv_len != t.query_len + u.query_len)
        canonical = name_classes(trace.names)[1]
        if _projects_encoder_once(pieces[i + 1:i + 1 + DECODER_FORWARDS], names, canonical,
                                  i + 1 + DECODER_FORWARDS >= len(pieces)):
            return True
        if launched is None:
            lengths = [len(p.rows) for p in pieces]
            launched = phases_from_launches(trace, [p.rows for p in pieces], names,
                                            int(np.argsort(lengths)[len(lengths) // 2])) or []
        if not launched or launched[i] != "prefill" or launched[i + 1] != "decode":
            return False
        depths = [count_layers(names[pieces[k].rows], canonical).count for k in (i, i + 1)]
        return None not in depths and depths[0] != depths[1]

    joined: list[_Piece] = []
    i = 0
    while i < len(pieces):
        p = pieces[i]
        if i + 1 < len(pieces) and not outputs[i] and outputs[i + 1] and encoder_then_decoder(i):
            q = pieces[i + 1]
            span = (p.host_span[0], q.host_span[1]) if p.host_span and q.host_span else None
            joined.append(_Piece(p.start_ns, max(p.end_ns, q.end_ns), np.concatenate((p.rows, q.rows)),
                                 whole=p.whole and q.whole, host_span=span, encoder=True))
            i += 2
            continue
        joined.append(p)
        i += 1
    return joined


def _projects_encoder_once(decoder: list[_Piece], names: np.ndarray, canonical: list[str], ends_trace: bool) -> bool:
    """Whether the first of a decoder's first forwards (`decoder`, two at least; `names`: the name class of each GPU
    activity) runs more matrix products than the second, a whole number more per layer of the others (the cross-
    attention keys and values of the encoder's output, projected once and cached), and the third and most of the
    others as many as the second (no data-dependent launches, an eager MoE's experts, explain the difference). The
    trace's last forward (`ends_trace`: the last of `decoder` is) may be cut short, running fewer. The others' layers
    are read from the names they run alike (two may route their tokens alike by chance)."""
    is_gemm = np.array([categorize(c) == "gemm" for c in canonical])
    gemms = [int(is_gemm[names[p.rows]].sum()) for p in decoder]
    if ends_trace and len(gemms) > 2 and gemms[-1] < gemms[1]:
        decoder, gemms = decoder[:-1], gemms[:-1]
    if len(decoder) < 2:
        return False
    extra = gemms[0] - gemms[1]
    if extra <= 0 or (len(gemms) > 2 and gemms[2] != gemms[1]) or 2 * gemms[1:].count(gemms[1]) < len(gemms) - 1:
        return False
    alike = [names[p.rows] for p, g in zip(decoder[1:], gemms[1:], strict=True) if g == gemms[1]]
    depth = count_layers(alike[0], canonical, data_independent(alike)).count
    # With one forward after the first (a cut file), nothing shows the launches data-independent: the extra must be
    # the projections alone, a few per layer (keys and values, each maybe split in two kernels), not an eager MoE's
    # experts
    return bool(depth) and extra % depth == 0 and (len(decoder) > 2 or extra <= CROSS_PROJECTIONS * depth)


def _oriented(by_launch: list[str | None], evidence: list[str | None], pieces: list[_Piece]) -> list[str | None]:
    """The launches tell unlike steps from alike ones, and which are the prefills by their thread blocks; where op
    shapes say the phase of some steps and every one of them reads the other way by launches, the blocks misled (an
    eager prefill beside decodes a compiler fused into fewer, larger kernels, replayed from CUDA graphs): the
    launches' two groups are the other way round."""
    said = [(e, launched) for e, launched, p in zip(evidence, by_launch, pieces, strict=True)
            if e in ("prefill", "decode") and launched and not p.encoder]  # the shapes', not the join's
    if not said or any(e == launched for e, launched in said) or len(set(by_launch) - {None}) < 2:
        return by_launch  # agreeing, or all launched alike: no two groups to turn round
    return [{"prefill": "decode", "decode": "prefill"}.get(launched) if launched else None for launched in by_launch]


def _without_drafts(pieces: list[_Piece], outputs: list[bool] | None, names: np.ndarray, trace: Trace,
                    links: Links, detail: str) -> tuple[list[_Piece], list[bool] | None, str]:
    """The forwards with the draft model's left out (steps.drafts), their outputs (_outputs), and the evidence
    saying so."""
    if len(pieces) < 3:
        return pieces, outputs, detail
    blocks = grid_blocks(trace)
    drafts = draft_forwards([names[p.rows] for p in pieces], name_classes(trace.names)[1],
                            [blocks[p.rows] for p in pieces], outputs)
    if drafts is None:
        return pieces, outputs, detail
    # The served model checks the drafts' tokens, continuing its sequence from its cache: where op shapes tell, one of
    # its forwards after the first attends to keys before its own. Forwards that each start afresh (a VLM's prefills,
    # vision tower and layers on the same grids) with shorter forwards over their cache after them are generations.
    served = [p for i, p in enumerate(pieces) if i not in drafts.forwards][1:]
    said_by = [t for t in (step_tokens(trace, links, p.rows) for p in served) if t.query_len and t.kv_len]
    if said_by and not any(t.kv_len > t.query_len for t in said_by):
        return pieces, outputs, detail
    said = (f"{len(drafts.forwards)} forwards of a {drafts.layers}-layer draft model between the steps left out "
            f"(assisted / speculative decoding; its per-layer kernels run {drafts.of} times in a step)")
    kept = [i for i in range(len(pieces)) if i not in drafts.forwards]
    return ([pieces[i] for i in kept], None if outputs is None else [outputs[i] for i in kept],
            f"{detail}; {said}" if detail else said)


def _outputs(pieces: list[_Piece], trace: Trace, links: Links) -> list[bool] | None:
    """Whether each forward ends in an output: runs the output head (where op shapes tell) or samples (where the
    trace's host side holds sampling ops); None where neither tells. Either says so: shapes may be recorded for some
    forwards only."""
    head = widest_gemm_rows(trace, links)
    by_head = [bool(head[p.rows].any()) for p in pieces] if head is not None else None
    sampled = forward_anchors.occurrences(trace, links, "sampling", np.arange(len(trace.gpu)))
    when = forward_anchors.launch_times(trace, links)
    if not len(sampled) or when is None:
        return by_head
    spans = [p.host_span or (int(when[p.rows].min()), int(when[p.rows].max())) for p in pieces]
    by_sampling = [bool(np.searchsorted(sampled, hi, "right") > np.searchsorted(sampled, lo, "left"))
                   for lo, hi in spans]
    return by_sampling if by_head is None else [a or b for a, b in zip(by_head, by_sampling, strict=True)]


def _packed(pieces: list[_Piece], tokens: list, evidence: list) -> tuple[list, set[int]]:
    """Continuous batching packs every sequence's tokens into one row: where forwards show it (steps.phase.
    packed_mixed: decodes beside prompt tokens), those are mixed, and rows whose every token is sampled are decodes
    of as many sequences, not extends (the shapes say no more than `query` tokens a row). Also which forwards are
    so read: their batch is the sequences the output head samples, not the one row."""
    free = [not (p.mark and p.mark.phase) for p in pieces]
    if not any(f and packed_mixed(t) for f, t in zip(free, tokens, strict=True)):
        return evidence, set()
    read = ["mixed" if f and packed_mixed(t) else "decode" if f and packed_decode(t) else None
            for f, t in zip(free, tokens, strict=True)]
    rows = {i for i, (f, t) in enumerate(zip(free, tokens, strict=True))
            if f and t.batch == 1 and t.head_rows and t.head_rows >= 2}  # a prefill of several prompts too
    return [r or e for r, e in zip(read, evidence, strict=True)], rows


def _recomputed(trace: Trace, links: Links, pieces: list[_Piece], tokens: list, evidence: list, names: np.ndarray,
                warnings: list[str]) -> list:
    """Forwards that recompute a growing sequence (a loop without a KV cache) are prefills, though only their launch
    grids say so: where no annotation or attention shape gives the phase, a run of forwards (steps.phase.growing_runs)
    whose embedding lookups grow (each forward looks up more tokens, where a decode step looks up one per sequence),
    or, where no lookup is recorded, whose launches mostly grow from first to last, is read as prefills; a run whose
    launches grow less than that but more than a decode step over a KV cache does gets a warning."""
    open_ = [not (p.mark and p.mark.phase) and (e is None or rows_alone(t))
             for p, t, e in zip(pieces, tokens, evidence, strict=True)]
    if len(pieces) < 2 or not any(open_):
        return evidence
    evidence = list(evidence)
    lookup = forward_anchors.lookup_rows(trace, links)
    for run in growing_runs(trace, [p.rows for p in pieces], names, lookup) or []:
        inside = [i for i in range(run.first, run.last + 1) if open_[i]]
        if run.recomputes:
            for i in inside:
                evidence[i] = "prefill"
        elif run.uncertain and inside:
            warnings.append(_uncertain_words(run))
    return evidence


def _uncertain_words(run: GrowingRun) -> str:
    return (f"forwards {run.first}-{run.last}: {run.grown:.0%} of the kernel launches they share run on more thread "
            f"blocks in the last than in the first: more than a decode step's attention over a growing KV cache "
            f"grows, less than forwards that each recompute the whole sequence (no KV cache) grow; neither an "
            f"annotation nor an attention op's shapes say which (record_shapes=True records them), so their phase is "
            f"uncertain")


def _drop_incomplete(trace: Trace, links: Links, pieces: list[_Piece], tokens: list, evidence: list):
    """Steps whose GPU work is not all in the trace (the capture or the file ended before it was written) are
    partial: left out, with what is missing. A step is whole when every launch its CPU side made has its GPU work in
    the trace (matched by correlation): none of its launch records lacks it, and none of its CPU ops that always
    launch came after the launch records end (a file cut short keeps the CPU side and loses the rest). A step's CPU
    side is its annotation's span, the host time between its anchors, or from its first launch to the next step's.
    Where no CPU op is tied to a launch, a step of a cut file must end before the host time the file's GPU events are
    known to reach."""
    lost = lost_launches(trace)
    unlaunched = forward_anchors.unlaunched_ops(trace)
    known_until = None if unlaunched is not None else trace.known_until_ns  # the ops tell, or the reach must
    unlaunched = np.empty(0, np.int64) if unlaunched is None else unlaunched
    if not len(lost) and not len(unlaunched) and known_until is None:
        return pieces, tokens, evidence, []
    when = forward_anchors.launch_times(trace, links)
    firsts = [int(when[p.rows].min()) if when is not None and len(p.rows) else p.start_ns for p in pieces]
    lasts = [int(when[p.rows].max()) if when is not None and len(p.rows) else p.end_ns for p in pieces]
    keep, incomplete = [], []
    for i, p in enumerate(pieces):  # the host time [lo, hi) of its CPU side; nothing closes a last step cut by the
        # kernel sequence: it ends with its last launch
        lo, hi = p.host_span or ((p.mark.ts_ns, p.mark.end_ns + 1) if p.mark else (
            firsts[i], firsts[i + 1] if i + 1 < len(pieces) else lasts[i] + 1))
        missing = int(np.searchsorted(lost, hi, side="left") - np.searchsorted(lost, lo, side="left"))
        unknown = int(np.searchsorted(unlaunched, hi, side="left") - np.searchsorted(unlaunched, lo, side="left"))
        beyond = known_until is not None and hi - 1 > known_until  # the file ends before it does
        (incomplete.append((p, missing, unknown, beyond)) if missing or unknown or beyond else keep.append(i))
    return ([pieces[i] for i in keep], [tokens[i] for i in keep], [evidence[i] for i in keep], incomplete)


def _incomplete_words(incomplete: list) -> str:
    names = [p.mark.name if p.mark else f"the step at {p.start_ns / 1e6:.3f} ms" for p, *_ in incomplete]
    missing, unknown, cut = (sum(x[k] for x in incomplete) for k in (1, 2, 3))
    why = "; ".join(w for w in (f"{missing} launches without their GPU work" if missing else "",
                                f"{unknown} calls of ops that launch, after the launch records end" if unknown else "",
                                f"{cut} run past where the file ends" if cut else "") if w)
    return (f"{len(incomplete)} step(s) whose GPU work is not all in the trace were left out as partial "
            f"({', '.join(names[:3])}{' and others' if len(names) > 3 else ''}: {why})")


def _runtime(trace: Trace) -> str:
    ids = unique(trace.runtime.name_id).tolist()
    return "HIP" if any(trace.names[i].startswith("hip") for i in ids) else "CUDA"


def _merge_fragments(pieces, tokens, evidence, trace: Trace):
    """Fragments (pieces under half a typical step) are parts of a neighbour that an anchor inside it cut apart, as
    when a prefill, running other kernels, does not fit the decode period: a fragment joins a non-decode neighbour
    (the next one first), else the piece before it. A leading fragment before a decode step stays: it is the tail
    of a step the capture began in, left out as partial."""
    typical = float(np.median([len(p.rows) for p in pieces]))
    end = trace.gpu.end_ns

    def small(i):
        return len(items[i][0].rows) < 0.5 * typical and items[i][0].mark is None

    def joinable(i):  # may absorb a fragment
        return items[i][0].mark is None and items[i][2] not in (None, "decode")

    def merge(i, j):  # j absorbs i
        (p, t, e), (q, u, f) = items[i], items[j]
        lo, hi = (p, q) if i < j else (q, p)
        rows = np.concatenate([lo.rows, hi.rows])
        keep_t = t if (t.gemm_rows or 0) > (u.gemm_rows or 0) else u
        items[j] = (_Piece(lo.start_ns, int(max(lo.end_ns, end[hi.rows].max())), rows), keep_t, f or e)
        del items[i]

    items = list(zip(pieces, tokens, evidence, strict=True))
    i = 0
    while i < len(items) and len(items) > 1:
        if small(i) and (items[i][2] is None or items[i][2] != "decode"):
            nxt = i + 1 if i + 1 < len(items) else None
            prev = i - 1 if i > 0 else None
            if nxt is not None and joinable(nxt):
                merge(i, nxt)
                continue
            if prev is not None and (joinable(prev) or nxt is not None):
                merge(i, prev)
                i = prev
                continue
        i += 1
    return [x[0] for x in items], [x[1] for x in items], [x[2] for x in items]


def _split_overlong(pieces: list[_Piece], names: np.ndarray, trace: Trace) -> list[_Piece]:
    """A piece that is a typical step plus a fragment (an anchor the cut missed) becomes the two."""
    lengths = np.array([len(p.rows) for p in pieces])
    typical = int(np.median(lengths))
    if typical < 2:
        return pieces
    reference = Counter(names[pieces[int(np.argsort(lengths)[len(lengths) // 2])].rows].tolist())
    out = []
    end = trace.gpu.end_ns
    for p in pieces:
        if len(p.rows) < 1.5 * typical:
            out.append(p)
            continue
        head, tail = p.rows[:typical], p.rows[-typical:]
        scores = [mix_overlap(Counter(names[r].tolist()), reference) for r in (head, tail)]
        if max(scores) < SAME_MIX:
            out.append(p)
            continue
        split = typical if scores[0] >= scores[1] else len(p.rows) - typical
        for rows in (p.rows[:split], p.rows[split:]):
            out.append(_Piece(int(trace.gpu.ts_ns[rows[0]]), int(end[rows].max()), rows))
    return out


def describe(steps: Steps, layers: int | None) -> str:
    """The first line of a report: what the trace is, e.g. '1 decode forward (batch 32) replayed by one HIP graph'."""
    if not steps.steps:
        return "no steps found"
    parts = []
    for phase in PHASES:
        group = steps.of(phase)
        if not group:
            continue
        noun = "iteration" if phase == "training" else "forward"
        batch = {s.batch for s in group if s.batch}
        extra = f" (batch {batch.pop()})" if len(batch) == 1 else ""
        parts.append(f"{len(group)} {phase} {noun}{'s' if len(group) != 1 else ''}{extra}")
    text = " + ".join(parts)
    if steps.graph_launches:
        one = steps.graph_launches == 1
        text += f" replayed by {'one' if one else steps.graph_launches} {steps.runtime} graph{'' if one else 's'}"
    if layers:
        text += f"; {layers} layers"
    return text

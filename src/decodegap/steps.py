"""Finding the decode steps on the GPU timeline.

Three sources, best first: GPU-side step annotations (`ProfilerStep#N` as gpu_user_annotation, or the ones
`decodegap record` writes); CPU-side annotations mapped to the kernels they launched; and, for traces with no
markers at all (SGLang, vLLM, model.generate), the repeating kernel sequence: a kernel that runs once per step
at a regular distance marks the step, and the cut goes where the GPU idles longest within that period.
Steps whose kernel mix differs from the typical step are prefill; fragments at the trace edges are dropped."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from decodegap.trace.link import Links
from decodegap.trace.tables import Trace

STEP_MARKER = re.compile(r"^(ProfilerStep|decodegap[._ ]?step)\s*#\s*\d+$", re.IGNORECASE)
SAME_MIX = 0.8  # kernel-mix overlap above which a step counts as the same kind as the typical one
REGULAR = 0.1  # an anchor's spacing may vary this much (relative) and still count as regular


@dataclass(frozen=True)
class Step:
    index: int
    kind: str  # "decode" | "prefill"
    start_ns: int
    end_ns: int
    rows: np.ndarray  # rows of Trace.gpu in this step

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Steps:
    steps: list[Step]
    source: str  # how they were found
    dropped_partial: int = 0

    @property
    def decode(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "decode"]

    @property
    def prefill(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "prefill"]


def find_steps(trace: Trace, links: Links) -> Steps:
    gpu_marks = [a for a in trace.annotations if a.on_gpu and STEP_MARKER.match(a.name)]
    cpu_marks = [a for a in trace.annotations if not a.on_gpu and STEP_MARKER.match(a.name)]
    if gpu_marks and len(trace.gpu):
        return _classify(_from_gpu_marks(trace, gpu_marks), trace, "ProfilerStep annotations (GPU timeline)")
    if cpu_marks and len(trace.gpu):
        pieces = _from_cpu_marks(trace, links, cpu_marks)
        if pieces:
            return _classify(pieces, trace, "ProfilerStep annotations (CPU side, mapped to launched kernels)")
    if cpu_marks:  # no GPU activity at all: CPU-only trace
        return Steps([Step(i, "decode", a.ts_ns, a.ts_ns + a.dur_ns, np.empty(0, np.int64))
                      for i, a in enumerate(cpu_marks)], "ProfilerStep annotations (CPU only, no GPU events)")
    if len(trace.gpu) < 6:
        return Steps([], "none: too few GPU events to find steps")
    found = _from_repetition(trace)
    if found is None:
        rows = np.arange(len(trace.gpu))
        span = Step(0, "decode", int(trace.gpu.ts_ns[0]), int(trace.gpu.end_ns.max()), rows)
        return Steps([span], "none found: no repeating kernel sequence, the whole trace is one step")
    pieces, source = found
    return _classify(pieces, trace, source, edges_may_be_partial=True)


def _from_gpu_marks(trace: Trace, marks) -> list[tuple[int, int, np.ndarray]]:
    ts = trace.gpu.ts_ns
    pieces = []
    for a in marks:
        lo, hi = np.searchsorted(ts, [a.ts_ns, a.ts_ns + a.dur_ns], side="left")
        pieces.append((a.ts_ns, a.ts_ns + a.dur_ns, np.arange(lo, hi)))
    return pieces


def _from_cpu_marks(trace: Trace, links: Links, marks) -> list[tuple[int, int, np.ndarray]]:
    """Kernels whose launching runtime call falls inside each CPU-side step range."""
    has_rt = links.runtime_idx >= 0
    launch_ts = np.full(len(trace.gpu), -1, dtype=np.int64)
    launch_ts[has_rt] = trace.runtime.ts_ns[links.runtime_idx[has_rt]]
    pieces = []
    for a in marks:
        rows = np.flatnonzero((launch_ts >= a.ts_ns) & (launch_ts < a.ts_ns + a.dur_ns))
        if len(rows):
            pieces.append((int(trace.gpu.ts_ns[rows].min()), int(trace.gpu.end_ns[rows].max()), rows))
    return pieces


def idle_gaps_ns(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each activity (sorted by start), how long the GPU sat idle right before it started."""
    if not len(ts):
        return np.empty(0, dtype=np.int64)
    prev_end = np.maximum.accumulate(end)
    gaps = np.empty(len(ts), dtype=np.int64)
    gaps[0] = 0
    gaps[1:] = np.maximum(ts[1:] - prev_end[:-1], 0)
    return gaps


@dataclass(frozen=True)
class Anchor:
    name_id: int
    positions: np.ndarray  # where it occurs in the sequence
    period: float  # median distance between occurrences, in activities
    regular: np.ndarray  # bool per interval


def regular_anchors(seq: np.ndarray, min_count: int = 3, min_coverage: float = 0.5) -> list[Anchor]:
    """Names whose occurrences are evenly spaced over most of the sequence, widest spacing first."""
    n = len(seq)
    if n < 2 * min_count:
        return []
    order = np.argsort(seq, kind="stable")
    counts = np.bincount(seq)
    starts = np.concatenate(([0], np.cumsum(counts)))
    anchors = []
    for name_id in np.flatnonzero(counts >= min_count):
        pos = order[starts[name_id]:starts[name_id + 1]]
        intervals = np.diff(pos)
        period = float(np.median(intervals))
        if period < 2:
            continue
        regular = np.abs(intervals - period) <= REGULAR * period
        if regular.mean() < 0.6 or intervals[regular].sum() < min_coverage * n:
            continue
        anchors.append(Anchor(int(name_id), pos, period, regular))
    anchors.sort(key=lambda a: (-a.period, -len(a.positions)))
    return anchors


def smallest_period(seq: np.ndarray) -> int:
    """Length of the shortest block that repeats exactly to make up seq (len(seq) if none)."""
    n = len(seq)
    fail = [0] * n  # prefix function (KMP)
    values = seq.tolist()
    k = 0
    for i in range(1, n):
        while k and values[i] != values[k]:
            k = fail[k - 1]
        if values[i] == values[k]:
            k += 1
        fail[i] = k
    p = n - fail[-1] if n else 0
    return p if p and n % p == 0 else n


def _pick_step_anchor(anchors: list[Anchor], seq: np.ndarray) -> Anchor | None:
    """The anchor of the widest period that several kernel names agree on.

    Per-step work (embedding, final norm, lm_head, sampling, bookkeeping) is several kernels, each regular at
    the step period; a kernel that runs every k steps is usually alone at its period. So the widest period
    backed by at least three names wins, falling back to two, then one."""
    if not anchors:
        return None
    for needed in (3, 2, 1):
        for a in anchors:  # widest period first
            support = sum(1 for b in anchors if abs(b.period - a.period) <= REGULAR * a.period
                          and abs(len(b.positions) - len(a.positions)) <= 2)
            if support >= needed:
                chosen = a
                break
        else:
            continue
        break
    # A block that is itself k identical repeats means the anchor fires every k steps: use the shorter period.
    first = int(np.flatnonzero(chosen.regular)[0])
    block = seq[chosen.positions[first]:chosen.positions[first + 1]]
    period = smallest_period(block)
    if period < len(block):
        shorter = [a for a in anchors if abs(a.period - period) <= REGULAR * period]
        if shorter:
            chosen = shorter[0]
    return chosen


def _from_repetition(trace: Trace) -> tuple[list[tuple[int, int, np.ndarray]], str] | None:
    gpu = trace.gpu
    seq = gpu.name_id.astype(np.int64)
    anchor = _pick_step_anchor(regular_anchors(seq), seq)
    if anchor is None:
        return None
    period = int(round(anchor.period))
    gaps = idle_gaps_ns(gpu.ts_ns, gpu.end_ns)
    # Cut where the GPU idles longest at the same offset after the anchor in every regular period.
    interval_starts = anchor.positions[:-1][anchor.regular]
    offsets = np.arange(period)
    idx = np.clip(interval_starts[:, None] + offsets[None, :], 0, len(seq) - 1)
    best = int(np.argmax(np.median(gaps[idx], axis=0)))
    cuts = anchor.positions + best
    cuts = cuts[cuts < len(seq)]
    bounds = np.concatenate(([0], cuts, [len(seq)]))
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi > lo:
            pieces.append((int(gpu.ts_ns[lo]), int(gpu.end_ns[lo:hi].max()), np.arange(lo, hi)))
    name = trace.names[anchor.name_id]
    short = name if len(name) <= 60 else name[:57] + "..."
    return pieces, f"repeating kernel sequence (once per step: {short}; {period} GPU activities per step)"


def _mix_overlap(a: Counter, b: Counter) -> float:
    shared = sum(min(count, b[key]) for key, count in a.items())
    return shared / max(sum(a.values()), sum(b.values()), 1)


def _classify(pieces, trace: Trace, source: str, edges_may_be_partial: bool = False) -> Steps:
    """Decode = the typical kernel mix; a substantial step with another mix = prefill; edge fragments dropped."""
    if not pieces:
        return Steps([], source)
    names = trace.gpu.name_id
    lengths = np.array([len(rows) for _, _, rows in pieces])
    typical_len = float(np.median(lengths))
    reference_piece = pieces[int(np.argsort(lengths)[len(lengths) // 2])]
    reference = Counter(names[reference_piece[2]].tolist())
    steps, dropped = [], 0
    for i, (start, end, rows) in enumerate(pieces):
        mix = Counter(names[rows].tolist())
        overlap = _mix_overlap(mix, reference)
        # A piece made only of a typical step's kernels, but fewer of them, is a cut-off step (the trace started
        # or stopped mid-step, or the profiler lost the end of the last one), not a prefill.
        contained = sum(min(count, reference[key]) for key, count in mix.items()) / max(len(rows), 1)
        at_edge = i in (0, len(pieces) - 1)
        if overlap >= SAME_MIX:
            kind = "decode"
        elif contained >= 0.95 and len(rows) < typical_len:
            dropped += 1
            continue
        elif len(rows) >= 0.5 * typical_len and not (edges_may_be_partial and at_edge and len(rows) < typical_len
                                                     and overlap >= 0.5):
            kind = "prefill"
        else:
            dropped += 1
            continue
        steps.append(Step(len(steps), kind, int(start), int(end), rows))
    return Steps(steps, source, dropped)

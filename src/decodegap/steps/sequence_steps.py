"""Steps without annotations: the kernels one graph launch replays (piecewise graphs grouped into forwards, each
launch one unit), the once-per-forward anchors (anchors.py), or the repeating kernel sequence: a forward holds the
once-per-forward work (embedding, final norm, lm_head, sampling) around its layer run; a period without it is a
layer, and a trace holding one forward is one step. Cuts never split the layer run; idle gaps only break ties."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np

from decodegap.steps import anchors as forward_anchors
from decodegap.steps.phase import widest_gemm_rows
from decodegap.steps.repetition import (
    REGULAR,
    Anchor,
    backers,
    find_layers,
    name_classes,
    normalized_ids,
    regular_anchors,
    smallest_period,
)
from decodegap.steps.step import Piece, runtime_of
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace


def name_sequence(trace: Trace) -> tuple[np.ndarray, list[str]]:
    """A normalised name id per GPU row (compiler-numbered names made equal), and those names."""
    mapping, canonical = name_classes(trace.names)
    return mapping[trace.gpu.name_id.astype(np.int64)], canonical


def _from_anchors(trace: Trace, links: Links, training: bool):
    seq, canonical = name_sequence(trace)
    found = forward_anchors.cut(forward_anchors.TraceAnchors.of(trace, links, training), np.arange(len(trace.gpu)),
                                seq, canonical)
    if found is None:
        return None
    pieces = [Piece(int(trace.gpu.ts_ns[r[0]]), int(trace.gpu.end_ns[r].max()), r, whole=True, host_span=span)
              for r, span in zip(found.pieces, found.spans, strict=True)]
    # a cut file lost the kernels some families are read from: their counts cross-check nothing there
    warnings = [] if trace.truncated else list(found.warnings)
    if found.partial:
        warnings.append(f"{len(found.partial)} partial forward(s) at the capture's edges were left out: "
                        + "; ".join(found.partial))
    return pieces, f"anchor_{found.family.id}", found.detail, warnings, len(found.partial)


def from_launches_or_repetition(trace: Trace, links: Links, training: bool = False):
    gpu = trace.gpu
    seq_rows = normalized_ids(trace.names, gpu.name_id)
    graph_of = links.replay
    replays = np.unique(graph_of[graph_of >= 0])
    unit_start = unit_starts(graph_of)
    tokens = unit_tokens(seq_rows, graph_of, unit_start)
    end = gpu.end_ns
    gaps = idle_gaps_ns(gpu.ts_ns, end)[unit_start]
    n_rows = len(gpu)
    runtime = runtime_of(trace)
    if len(replays) == 1 and (graph_of >= 0).sum() >= 0.5 * n_rows:
        rows = np.arange(n_rows)
        piece = Piece(int(gpu.ts_ns[0]), int(end.max()), rows)
        return [piece], "graph_launch", f"one {runtime} graph replays {int((graph_of >= 0).sum())} of the " \
                                         f"{n_rows} GPU activities: one forward", []
    # Graph replays that each hold a whole forward are the steps; piecewise replays are grouped by the anchors.
    cut = _one_forward_per_replay(tokens, gaps, seq_rows, unit_start, graph_of) if len(replays) > 1 else None
    if cut is None:
        by_anchor = _from_anchors(trace, links, training)
        if by_anchor is not None:
            return by_anchor
        cut = cut_by_repetition(tokens, gaps, seq_rows, unit_start, widest_gemm_rows(trace, links))
    if cut is None and trace.truncated:  # a cut file with no evidence of a whole step in what it kept
        return [], "none", "no whole step before the cut", []
    if cut is None:
        piece = Piece(int(gpu.ts_ns[0]), int(end.max()), np.arange(n_rows))
        return [piece], "whole_trace", "no repeating kernel sequence: the whole trace is one step", [
            "no step marks, graph launches or repeating kernel sequence: the whole trace is taken as one step"]
    bounds, what, _ = cut
    row_bounds = np.append(unit_start, n_rows)[bounds]
    pieces = [Piece(int(gpu.ts_ns[lo]), int(end[lo:hi].max()), np.arange(lo, hi))
              for lo, hi in zip(row_bounds[:-1], row_bounds[1:], strict=True) if hi > lo]
    if len(replays):
        detail = f"{len(replays)} {runtime} graph launches, grouped into forwards by " + what
        partial = _replay_cut_short(pieces, seq_rows, graph_of)
        if partial:
            return pieces[:-1], "graph_launch", detail, [partial], 1
        return pieces, "graph_launch", detail, []
    return pieces, "kernel_repetition", "repeating kernel sequence: " + what, []


def _replay_cut_short(pieces: list[Piece], seq_rows: np.ndarray, graph_of: np.ndarray) -> str:
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


def unit_starts(graph_of: np.ndarray) -> np.ndarray:
    """Positions where a unit starts: every eager row, and the first row of each graph replay's run."""
    if not len(graph_of):
        return np.empty(0, dtype=np.int64)
    new = np.ones(len(graph_of), dtype=bool)
    new[1:] = (graph_of[1:] < 0) | (graph_of[1:] != graph_of[:-1])
    return np.flatnonzero(new)


def unit_tokens(seq_rows: np.ndarray, graph_of: np.ndarray, unit_start: np.ndarray) -> np.ndarray:
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


def cut_by_repetition(seq: np.ndarray, gaps: np.ndarray, row_seq: np.ndarray, unit_start: np.ndarray,
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

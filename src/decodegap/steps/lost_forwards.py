"""What the forwards a cut file lost the kernels of still tell: Kineto writes every CPU op before the launches and GPU
activities, so a file cut short keeps the host ops of forwards whose kernels it lost. Two kept forwards of an eager MoE
may route their tokens alike, and then its expert loop looks data-independent; the lost forwards' ops show the loop's
ops running a different number of times (steps.across_forwards reads the same from kernels where they were kept)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from decodegap.trace.link import Links
from decodegap.trace.tables import Trace

ALIKE_KEYS = 0.5  # a lost forward is of the kept ones' phase when it runs this share of their ops as often
ALIKE_SIZE = 0.25  # ... and as many ops within this share (a prefill routes its tokens to every expert: many more)
HEAD_CANDIDATES = 32  # launching ops tried, in order, for the one that starts every forward


def varying_past_cut(trace: Trace, links: Links, kept: list[np.ndarray]) -> set[int]:
    """The kernel names (ids into trace.names) that the kept forwards (`kept`: their GPU rows, two or more of one
    phase) launch from a host op that runs a different number of times in a later forward whose kernels the cut lost.
    An op is its name and input shapes where they were recorded (the expert loop's calls over one or two tokens, not
    a norm's over the batch, which launches other kernels), its name alone where not; only ops that run equally often
    in every kept forward are compared (an op over the cache changes shape every step). Forwards are told apart on
    the host by the first launching op that runs once in each kept forward (_head); the last one is left out (the
    capture may end in it)."""
    if trace.known_until_ns is None or len(kept) < 2:  # one forward tells no op over the cache from one that varies
        return set()
    ops, op_of = trace.cpu_ops, links.op_idx
    linked = [op_of[r][op_of[r] >= 0] for r in kept]
    if any(not len(o) for o in linked) or len({int(ops.tid[o[0]]) for o in linked}) != 1:
        return set()
    on_thread = np.flatnonzero(ops.tid == ops.tid[linked[0][0]])
    on_thread = on_thread[np.argsort(ops.ts_ns[on_thread], kind="stable")]
    ts = ops.ts_ns[on_thread]
    spans = [(int(ops.ts_ns[o].min()), int(ops.ts_ns[o].max())) for o in linked]
    head = _head(ops.name_id[on_thread], ts, ops.name_id[linked[0]], spans)
    if head is None:
        return set()
    bounds = ts[ops.name_id[on_thread] == head]
    shaped = ops.input_dims.ids.astype(np.int64) if ops.input_dims.ids.any() else np.zeros(len(ops.ts_ns), np.int64)
    key = ops.name_id.astype(np.int64) * (len(ops.input_dims.values) + 1) + shaped

    def window(k: int) -> Counter:
        lo, hi = np.searchsorted(ts, bounds[k:k + 2], side="left")
        return Counter(key[on_thread[lo:hi]].tolist())

    at = np.searchsorted(bounds, [lo for lo, _ in spans])
    windows = [window(i) for i in at.tolist()]
    ref = {k: c for k, c in windows[0].items() if all(w[k] == c for w in windows[1:])}
    size = sum(windows[0].values())
    changed: set[int] = set()
    for k in range(int(at.max()) + 1, len(bounds) - 1):
        lost = window(k)
        same = sum(1 for op, c in ref.items() if lost[op] == c)
        if same < ALIKE_KEYS * len(ref) or abs(sum(lost.values()) - size) > ALIKE_SIZE * size:
            continue
        changed |= {op for op, c in ref.items() if lost[op] != c}
    if not changed:
        return set()
    rows = np.concatenate(kept)
    rows = rows[op_of[rows] >= 0]
    hit = np.isin(key[op_of[rows]], np.fromiter(changed, dtype=np.int64, count=len(changed)))
    return set(trace.gpu.name_id[rows[hit]].tolist())


def _head(names: np.ndarray, ts: np.ndarray, launching: np.ndarray, spans: list[tuple[int, int]]) -> int | None:
    """The op name that starts each forward on the host: of the first kept forward's launching ops, in order, the
    first that runs once in each kept forward's span (the embedding lookup, not the copy of the inputs a forward
    makes in every layer too) and again after it (the next forward's)."""
    _, first = np.unique(launching, return_index=True)
    for name in launching[np.sort(first)][:HEAD_CANDIDATES].tolist():
        at = ts[names == name]
        if all(np.count_nonzero((at >= lo) & (at <= hi)) == 1 and (at > hi).any() for lo, hi in spans):
            return name
    return None

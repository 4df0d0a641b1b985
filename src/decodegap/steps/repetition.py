"""Repetition in a kernel sequence: the evenly spaced kernels that mark a period, and the layer block inside a step.

A decode step is [once-per-forward work] + L x [layer]; the once-per-forward work (embedding, final norm, lm_head,
sampling) is the glue between the layer runs. Kernel names are normalised first where compilers number them per
graph position (Inductor's `triton_red_fused_add_mean_12`) and where PyTorch picks an elementwise op's vectorised or
unrolled kernel by the pointers' alignment, so the same layer work carries the same name."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from decodegap.steps.layer_kinds import LayerKind, describe_kinds

REGULAR = 0.1  # an anchor's spacing may vary this much (relative) and still count as regular
SIMILAR_SUBBLOCKS = 0.6  # kernel-mix overlap above which k sub-blocks of a block are k layers of a few kinds

# Inductor numbers its kernels per graph position: triton_poi_fused_add_0, triton_red_fused_mean_12, cpp_fused_3.
_COMPILER_NUMBERED = re.compile(r"^((?:triton|cpp)_[a-z]+_\w*?)_\d+$")
_ELEMENTWISE_VARIANT = re.compile(
    r"^(void (?:at::native::)?)(?:vectorized_elementwise_kernel<\d+, |unrolled_elementwise_kernel<"
    r"|elementwise_kernel<\d+, \d+, (?:at::native::)?gpu_kernel_impl(?:_nocast)?<)")
_FUSED_NO_WORK = re.compile(r"_(embedding|_unsafe_view|view|reshape|expand|unsqueeze|squeeze|permute|transpose|alias|"
                            r"as_strided|split_with_sizes)(?=_|$)")


def normalized_name(name: str) -> str:
    m = _COMPILER_NUMBERED.match(name)
    if not m:
        return _elementwise_loop(name)
    # Inductor names a fused kernel by every op its inputs came from, so the embedding lookup that starts the
    # residual stream shows up in the first layers' norm kernels (`..._add_embedding_mean_mul_pow_rsqrt`), and a
    # view of the input (`_unsafe_view`, `expand`) where the producer laid it out otherwise: the same per-layer work
    # as `..._add_mean_mul_pow_rsqrt` in the later layers. Ops that only look up or re-view do no fused work.
    return _FUSED_NO_WORK.sub("", m.group(1))


def _elementwise_loop(name: str) -> str:
    """PyTorch runs one elementwise op as `vectorized_elementwise_kernel<width, F, ...>`,
    `unrolled_elementwise_kernel<F, ...>` or, on strided tensors, `elementwise_kernel<128, 4, gpu_kernel_impl<F>>`,
    picked at launch by the pointers' alignment and the strides (an expert's slice of a gathered buffer, which is
    contiguous or not by the tokens it got; a cache's offset), so which one ran says nothing about the work: all are
    `elementwise_kernel<F>`."""
    m = _ELEMENTWISE_VARIANT.match(name)
    if not m:
        return name
    depth, start = 0, m.end()
    for i in range(start, len(name)):
        ch = name[i]
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
    else:
        return name
    return f"{m.group(1)}elementwise_kernel<{name[start:i]}>"


def name_classes(names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Each name's id among the normalised names (equal after normalising = one id), and per id the first name of
    its class, as the trace spells it (what a report shows and a user can search for)."""
    canon: dict[str, int] = {}
    first: list[str] = []
    ids = []
    for n in names:
        key = normalized_name(n)
        if key not in canon:
            canon[key] = len(first)
            first.append(n)
        ids.append(canon[key])
    return np.array(ids or [0], dtype=np.int64), first


def normalized_ids(names: list[str], name_ids: np.ndarray) -> np.ndarray:
    """name_ids mapped onto ids of normalised names."""
    mapping, _ = name_classes(names)
    return mapping[name_ids.astype(np.int64)] if len(name_ids) else name_ids.astype(np.int64)


@dataclass(frozen=True)
class Anchor:
    name_id: int
    positions: np.ndarray  # where it occurs in the sequence
    period: float  # median distance between occurrences
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


def backers(anchors: list[Anchor], a: Anchor, count_slack: int = 0) -> list[Anchor]:
    """Anchors at a's period that occur as often as a: kernels of the same repeating block."""
    return [b for b in anchors if abs(b.period - a.period) <= REGULAR * a.period
            and abs(len(b.positions) - len(a.positions)) <= count_slack]


def mix_overlap(a: Counter, b: Counter) -> float:
    shared = sum(min(count, b[key]) for key, count in a.items())
    return shared / max(sum(a.values()), sum(b.values()), 1)


@dataclass(frozen=True)
class Layers:
    count: int | None
    evidence: str
    period: float = 0.0  # mean activities per layer
    first: int = 0  # first and last position of a layer kernel: the layer region
    last: int = 0
    kinds: list[LayerKind] = field(default_factory=list)
    starts: tuple[int, ...] = ()  # where each layer begins in the step (its earliest repeating kernel)

    def repeat(self, seq: np.ndarray) -> float:
        """How alike consecutive layers are: the share of positions in the layer region whose kernel recurs one layer
        later (within one position, for layers of slightly different lengths). Real layers: close to 1; two kernel
        groups that merely recur inside one layer (its two norms): far lower."""
        lag = int(round(self.period))
        stop = self.last - lag
        if not self.count or lag < 1 or stop <= self.first:
            return 0.0
        i = np.arange(self.first, stop)
        here = seq[i]
        near = [seq[np.clip(i + d, 0, len(seq) - 1)] for d in (lag - 1, lag, lag + 1)]
        return float(np.mean((here == near[0]) | (here == near[1]) | (here == near[2])))

    def glue(self, length: int) -> float:
        """Activities of a block of `length` that lie outside its layers: the once-per-forward work."""
        return length - (self.count or 0) * self.period


def find_layers(seq: np.ndarray, names: list[str] | None = None, min_coverage: float = 0.5) -> Layers:
    """The repeating block inside one step: the widest evenly spaced kernels that several names agree on; a block
    that splits into k near-identical sub-blocks (alternating attention kinds, dense and MoE layers) is k layers."""
    anchors = regular_anchors(seq, min_count=2, min_coverage=min_coverage)
    for needed in (3, 2):
        for a in anchors:  # widest period first
            group = backers(anchors, a)
            if len(group) < needed:
                continue
            finer = _finer_layers(seq, anchors, a, needed)
            if finer is not None:
                fine, k = finer
                return _layers(fine, backers(anchors, fine), seq, names, kinds=_kinds(seq, group, fine, k, names))
            return _layers(a, group, seq, names)
    return Layers(None, "no repeating block found inside a step")


def _finer_layers(seq: np.ndarray, anchors: list[Anchor], a: Anchor, needed: int) -> tuple[Anchor, int] | None:
    """An anchor at a's period / k occurring k times as often, whose k sub-blocks per block look alike."""
    n = len(a.positions)
    for b in anchors:
        k = round(a.period / b.period)
        if k < 2 or abs(a.period / k - b.period) > REGULAR * b.period or abs(len(b.positions) - k * n) > 2:
            continue
        if len(backers(anchors, b, count_slack=2)) < needed:
            continue
        block_start, block_end = int(a.positions[0]), int(a.positions[1])
        cuts = [int(p) for p in b.positions if block_start <= p < block_end]
        if len(cuts) != k:
            continue
        bounds = cuts + [cuts[0] + (block_end - block_start)]
        subs = [Counter(seq[lo:hi].tolist()) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        if min(mix_overlap(subs[0], s) for s in subs[1:]) >= SIMILAR_SUBBLOCKS:
            return b, k
    return None


def _layers(a: Anchor, group: list[Anchor], seq: np.ndarray, names, kinds=None) -> Layers:
    count = len(a.positions)
    first = min(int(b.positions[0]) for b in group)
    last = max(int(b.positions[-1]) for b in group)
    period = float(a.positions[-1] - a.positions[0]) / max(count - 1, 1)
    evidence = f"{len(group)} kernels run {count} times per step at a regular spacing of {a.period:.0f} GPU activities"
    if kinds:
        evidence += "; " + describe_kinds(kinds)
    # A layer begins at its earliest repeating kernel, not at the one that counted it (which may sit mid-layer).
    shift = int(a.positions[0]) - first
    return Layers(count, evidence, period, first, last, kinds or [], tuple(int(p) - shift for p in a.positions))


def _kinds(seq, coarse_group: list[Anchor], fine: Anchor, k: int, names) -> list[LayerKind]:
    """Which kernels tell the k alternating layers of a block apart: the coarse anchors, by their sub-block."""
    block_start = int(coarse_group[0].positions[0])
    cuts = [int(p) for p in fine.positions if p >= block_start][:k]
    total = len(fine.positions)
    markers: list[list[str]] = [[] for _ in range(k)]
    for b in coarse_group:
        pos = int(b.positions[0])
        slot = (int(np.searchsorted(cuts, pos, side="right")) - 1) % k  # before the first cut: the last kind
        label = names[b.name_id] if names else str(b.name_id)
        markers[slot].append(label)
    per_kind = total // k
    return [LayerKind(per_kind + (1 if i < total - per_kind * k else 0), tuple(m)) for i, m in enumerate(markers)]

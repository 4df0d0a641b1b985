"""Where each layer of a forward begins and ends, given the blocks that count them (steps.layers), and the
result type, Layers:
- a layer begins where layers of its kind run one sequence: the kernels that count layers often run mid-layer (an
  MoE router), so each block between two cuts holds one layer's tail and the next one's head; layer 0's head ends
  the stretch before the first cut, a block that ends alike holds that head, and a head of another kind (a lone
  full-attention layer among linear-attention ones) begins where a known tail ends, or else at the last place that
  begins like layer 0's head after a residual add; what runs between a known tail and the head, an input norm among
  it, begins the next layer (a shared block it runs before its mixer); where no block ends like that stretch (cuts
  late in layers whose kinds differ there: a dense MLP, an MoE layer's experts), the longest run the stretch and a
  block have in common begins the layers, where it begins at one place in the stretch for most blocks (their norm
  and attention; the glue before the layers and the tail of the layer before differ) (aligned, _seam,
  _begun_alike);
- the last layer ends where the once-per-forward tail begins: at the final norm, which runs per-layer norm kernels
  once more than a layer does (so the lm_head and a loss are no layer's, however long the longest layer is), or,
  with layers of several kinds, at the last run of what every layer begins with before its first projection; at
  that run's first kernel where the name that runs once more is a later one of its (the norm's cast runs more often
  in one kind of layer); where the layers begin unlike (a shared block before some), as far as the longest earlier
  layer it begins like ran; a name that counted the layers and runs again from the final norm on (MoE routing
  kernels in beam search's bookkeeping) does not carry the last layer past it where the norm's kernels run there."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import numpy as np

from decodegap.ops.categories import categorize
from decodegap.steps.layer_blocks import (
    Blocks,
    common_prefix,
    common_suffix,
    input_norm,
    per_layer_runs,
    runs_of,
)
from decodegap.steps.layer_kinds import LayerKind, describe_kinds, layer_kinds
from decodegap.trace.tables import isin


@dataclass(frozen=True)
class Layers:
    count: int | None
    evidence: str
    period: float = 0.0  # mean activities per layer
    first: int = 0  # first and last position of a layer kernel in the forward: the layer region
    last: int = 0
    kinds: list[LayerKind] = field(default_factory=list)
    starts: tuple[int, ...] = ()  # where each layer begins in the forward (its earliest per-layer kernel)
    kind_of: tuple[int, ...] = ()  # per layer: index into kinds (empty with one kind)
    backers: tuple[int, ...] = ()  # the name ids that counted the layers
    end: int = 0  # where the last layer ends (exclusive): as long as the longest layer, or to its last kernel
    backer_runs: int = 0  # how often each of `backers` runs in the forward (0: `count`): a hybrid's run in its kind's


NO_LAYERS = Layers(None, "no per-layer work found: no kernel runs the same number of times in every layer")


def bounded_layers(blocks: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], names: list[str] | None,
                   gemm: set[int]) -> Layers:
    c = blocks.count
    # Layer j begins at the earliest first-in-layer-j occurrence of any per-layer name.
    # Layer j begins where the first of its kernels runs: a name with b of its k runs per layer before the first
    # cut has, in the block before cut j, layer j's first b runs last.
    starts = blocks.cuts.copy()
    for n, (k, m, b, _) in ({} if blocks.begun else blocks.periodic).items():  # cut where they begin: starts as cut
        if not k or not b or m != c:
            continue
        p = positions[n]
        bucket = np.searchsorted(blocks.cuts, p, side="right")  # 0: before cut 0, j: block j-1
        for j in range(c):
            runs = p[bucket == j]
            if len(runs) >= b:
                starts[j] = min(starts[j], int(runs[len(runs) - b]))
    if not blocks.begun:
        starts = aligned(blocks, ids, positions, starts, gemm)
    counted = [positions[n] for n in blocks.backers]
    if blocks.mixers:
        counted.append(np.flatnonzero(isin(ids, np.array(blocks.mixers))))
    tail = _tail_start(blocks, positions, int(starts[-1]))
    # A name that counted the layers may run again in the once-per-forward tail (MoE routing kernels in beam search's
    # bookkeeping: its run falls in the last block): the last layer ends at the final norm all the same.
    latest = max(int(p[-1]) for p in counted)
    before = max(int(p[p < tail][-1]) if (p < tail).any() else -1 for p in counted) if tail else latest
    final = 0
    if before < latest:  # only where the final norm's kernels run there
        final, end, last = _last_end(ids, starts, positions, names, tail, before, in_norm=True)
    if not final:
        final, end, last = _last_end(ids, starts, positions, names, tail, latest)
    period = float(starts[-1] - starts[0]) / max(c - 1, 1) if c > 1 else float(last - starts[0] + 1)
    ends = np.append(starts[1:], max(end, last + 1))
    kinds, kind_of = layer_kinds(ids, starts, ends, positions, names, whole_last=bool(final),
                                 alike=set(blocks.alike))
    evidence = f"{len(blocks.backers)} kernels run {c} times per forward, once in each layer"
    if blocks.halves:
        evidence = (f"{len(blocks.backers)} kernels run {2 * c + 1} times per forward, before each of {c} layers' "
                    "mixer and its MLP, and at the final norm")
    other = 0
    if blocks.mixers:
        other = int(isin(ids, np.array(blocks.mixers)).sum()) // len(blocks.mixers)
        evidence = (f"{len(blocks.backers)} kernels run once in each of {c - other} layers, {len(blocks.mixers)} once "
                    f"in each of the other {other} (a hybrid stack: two kinds of mixer)")
    if len(kinds) > 1:
        evidence += "; " + describe_kinds(kinds)
    runs = 2 * c + 1 if blocks.halves else c - other
    return Layers(c, evidence, period, int(starts[0]), last, kinds, tuple(int(s) for s in starts),
                  tuple(kind_of) if len(kinds) > 1 else (), tuple(blocks.backers), int(ends[-1]), runs)


def _last_end(ids: np.ndarray, starts: np.ndarray, positions: dict[int, np.ndarray], names: list[str] | None,
              tail: int, last: int, in_norm: bool = False) -> tuple[int, int, int]:
    """Where the last layer ends, given its last counted kernel `last`: the final norm (found by `tail`, the first
    name to run once more, or by the norm's kernels; `in_norm`: only where `tail` runs among those) or 0, else where
    it runs as long as the longest layer; and `last`."""
    # The last layer runs as long as the longest one: its work after the last per-layer kernel (the MoE block after the
    # norm that counted it) is still the layer's, not the once-per-forward tail.
    typical = int(np.diff(starts).max()) if len(starts) > 1 else last + 1 - int(starts[0])
    end = min(max(last + 1, int(starts[-1]) + typical), len(ids))
    # Layers of several kinds leave no name that tells: the final norm does, however long the last layer's loop ran.
    norm_at, norm_end = _final_norm(ids, starts, positions, last, names)
    if tail:  # past a typical layer it is the final norm only where the norm's kernels run there
        final = tail if (tail < end and not in_norm) or norm_at <= tail < norm_end else 0
    else:
        final = norm_at or _as_long_as_its_kind(ids, starts, positions)
    if norm_at < final < norm_end:  # the name that ran once more is a later kernel of the final norm's: it begins it
        final = norm_at
    return final, final or end, last


def aligned(blocks: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], starts: np.ndarray,
            gemm: set[int]) -> np.ndarray:
    """Layer starts where layers of one kind run one sequence. Between two cuts run the end of one layer (its tail,
    from its cut) and the start of the next (its head, up to its cut). Layer 0's head ends the stretch before the
    first cut, after the glue: a later layer whose block ends the same way has that head, and the rest of its block
    is the previous layer's tail; a layer whose head is of another kind (a lone full-attention layer among linear
    ones) begins where a known tail, from its block's start, ends, or at a seam past what every known tail runs.
    Over the per-layer names only, so an expert loop
    that ran more or fewer times does not shift anything; `starts` (from the names' counts) where nothing lines up."""
    c = blocks.count
    at, seq = per_layer_runs(ids, positions)
    cut = np.searchsorted(at, blocks.cuts)  # each cut's index among them
    lead = seq[:cut[0]]
    between = [seq[cut[j]:cut[j + 1]] for j in range(c - 1)]  # block j: layer j's tail, then layer j + 1's head
    ends_like_lead = [common_suffix(lead, b[1:]) for b in between]  # b[0] is the cut, layer j's own
    head = max(ends_like_lead, default=0)
    if head == 0 or head < cut[0] - int(np.searchsorted(at, starts[0])):
        # Nothing ends like layer 0's head, or less than its counted kernels: the cut may run late in the layers and
        # their kinds differ before it (a dense MLP, then MoE layers' experts); they may still begin alike.
        return _begun_alike(lead, between, at, cut, starts)
    out = starts.copy()
    out[0] = at[cut[0] - head]
    norm = input_norm(lead[len(lead) - head:], gemm)
    tails = [b[:len(b) - head] for b, h in zip(between, ends_like_lead, strict=True) if h >= head]
    for j, b in enumerate(between):
        if ends_like_lead[j] >= head:
            split = len(b) - head
            # Work between a known tail and the head that runs an input norm of its own is a block the next layer
            # runs before its mixer (a shared attention + MLP block), not the previous layer's (an MoE tail after
            # a dense one, its router, runs none).
            split = max((len(t) for t in tails if len(t) < split and np.array_equal(b[:len(t)], t)
                         and len(runs_of(norm, b[len(t):split]))), default=split)
        else:  # another kind of head: the previous layer ends where a known tail does
            least = _tail_runs(blocks, b, tails, lead[len(lead) - head:], gemm)
            split = max((len(t) for t in tails if least <= len(t) < len(b) and np.array_equal(b[:len(t)], t)),
                        default=0)
            split = split or _seam(b, lead[len(lead) - head:], tails, least)
            if not split:
                continue
        out[j + 1] = at[cut[j] + split]
    return out


def _tail_runs(blocks: Blocks, block: np.ndarray, tails: list[np.ndarray], head: np.ndarray, gemm: set[int]) -> int:
    """How far into `block` (a cut's block over the per-layer names) the layer before at least runs: a name run a
    fixed number of times a layer that runs equally often in every known tail (`tails`) runs that often in this one
    (an MoE's router after the attention cut, alike to the router over attention heads that begins the next layer),
    where the block runs it as often as such a tail and layer 0's `head` together (a dense layer's tail, of another
    kind, runs no router: the next layer's own router is not its); GEMM tiles aside (a dense MLP's and the experts'
    may be one)."""
    least = 1
    for n, (k, m, _, _) in blocks.periodic.items():
        ran = {int(np.count_nonzero(t == n)) for t in tails}
        if k and m == blocks.count and n not in gemm and len(ran) == 1 and (times := ran.pop()):
            runs = np.flatnonzero(block == n)
            if len(runs) >= times + int(np.count_nonzero(head == n)):
                least = max(least, int(runs[times - 1]) + 1)
    return least


def _begun_alike(lead: np.ndarray, between: list[np.ndarray], at: np.ndarray, cut: np.ndarray,
                 starts: np.ndarray) -> np.ndarray:
    """Layer starts where the layers begin alike though they end unlike before the cuts (their input norm and
    attention, then a dense MLP or an MoE layer's experts): the longest run that the stretch before the first cut
    and a block have in common begins the layer in each, where it begins at the same place in that stretch for
    most blocks (the glue before the layers and the tail of the layer before differ); `starts` where none does."""
    matches = [SequenceMatcher(None, lead.tolist(), b.tolist(), autojunk=False).find_longest_match(
        0, len(lead), 1, len(b)) for b in between]  # b[0] is the cut, the layer before's own
    first = Counter(m.a for m in matches if m.size > 1).most_common(1)
    if not first:
        return starts
    out = starts.copy()
    out[0] = at[first[0][0]]
    for j, m in enumerate(matches):
        if m.a == first[0][0] and m.size > 1:
            out[j + 1] = at[cut[j] + m.b]
    return out


def _seam(block: np.ndarray, head: np.ndarray, tails: list[np.ndarray], least: int = 1) -> int:
    """Where in `block` (a layer's tail, then a head of another kind) the seam between layers lies: the last place
    that begins the most like layer 0's head (its input norm) after what every known tail ends with (the residual
    add); 0 when nothing does. The last, because the layer before runs its own norms (its MLP's) after an add too;
    by the head alone, because a mixer's output may end like an MLP's; from `least` on, what the layer before's tail
    runs at least (_tail_runs: an MoE's router runs like the next layer's router over attention heads)."""
    best, at = 0, 0
    for s in range(least, len(block)):
        begins = common_prefix(block[s:], head)
        if begins and begins >= best and all(common_suffix(block[:s], t) for t in tails):
            best, at = begins, s
    return at


def _final_norm(ids: np.ndarray, starts: np.ndarray, positions: dict[int, np.ndarray], last: int,
                names: list[str] | None) -> tuple[int, int]:
    """Where the final norm begins and ends (its last kernel's next position) when no name tells (layers of several
    kinds run each name a different number of times): at the last run, after the last layer kernel, of what every
    layer begins with before its first matrix product (its input norm's kernels, which the final norm runs too,
    before the lm_head); (0, 0) when that is fewer than two kernels or runs nowhere there."""
    at, seq = per_layer_runs(ids, positions)
    cut = np.searchsorted(at, starts)
    norm = head_norm(seq, cut, names)
    common = len(norm)
    if common < 2:
        return 0, 0
    for i in range(len(seq) - common, int(cut[-1]), -1):
        if at[i] > last and np.array_equal(seq[i:i + common], norm):
            return int(at[i]), int(at[i + common - 1]) + 1
    return 0, 0


def head_norm(seq: np.ndarray, cut: np.ndarray, names: list[str] | None) -> np.ndarray:
    """What every layer begins with before its first matrix product (its input norm's kernels), over the per-layer
    names `seq`, the layers beginning at `cut` among them."""
    heads = [seq[a:b] for a, b in zip(cut.tolist(), cut[1:].tolist() + [len(seq)], strict=True)]
    norm = heads[0][:min(common_prefix(heads[0], h) for h in heads)]
    projects = [i for i, n in enumerate(norm.tolist()) if names and categorize(names[n]) == "gemm"]
    return norm[:projects[0]] if projects else norm


def _as_long_as_its_kind(ids: np.ndarray, starts: np.ndarray, positions: dict[int, np.ndarray]) -> int:
    """Where the last layer ends when not every layer begins alike (a shared block before some layers' norm): where
    the per-layer kernels of the longest earlier layer it begins with end, and as far past them as that layer ran
    (to the next per-layer kernel where that one ran more: an expert loop); 0 when it begins like no earlier
    layer."""
    at, seq = per_layer_runs(ids, positions)
    cut = np.searchsorted(at, starts).tolist()
    last = seq[cut[-1]:]
    alike = [j for j in range(len(cut) - 1) if 0 < cut[j + 1] - cut[j] <= len(last)
             and np.array_equal(last[:cut[j + 1] - cut[j]], seq[cut[j]:cut[j + 1]])]
    j = max(alike, key=lambda j: cut[j + 1] - cut[j], default=None)
    if j is None or cut[j + 1] - cut[j] == len(last):
        return 0  # like none, or no per-layer kernel follows (no final norm of per-layer names to tell)
    ran = cut[-1] + cut[j + 1] - cut[j]  # the first per-layer kernel past it
    return int(at[ran]) if starts[j + 1] > at[cut[j + 1] - 1] + 1 else int(at[ran - 1]) + 1


def _tail_start(blocks: Blocks, positions: dict[int, np.ndarray], last_start: int) -> int:
    """Where the once-per-forward tail begins after the last layer: the first run, from the last layer's start on, of
    a name every layer runs k times beyond its k (the final norm runs the per-layer norm's kernels once more)."""
    tail = np.iinfo(np.int64).max
    for n, (k, m, _, _) in blocks.periodic.items():
        if k and m == blocks.count:
            after = positions[n][positions[n] >= last_start]
            if len(after) > k:
                tail = min(tail, int(after[k]))
    return 0 if tail == np.iinfo(np.int64).max else int(tail)

"""Blocks of a forward cut at the names that count its layers, the per-layer work they run, and the kernel-
sequence helpers the layer readings share (steps.layers, steps.layer_bounds, steps.residual_blocks).

A candidate layer count c is one that data-independent names share *and* interleave on: occurrence j of
each falls in block j (the blocks begin at the earliest of them); a name is per-layer work for it when the
blocks run it a fixed number of times (0 in a kind without it; one other number in some, as an expert loop
with an idle expert)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodegap.trace.tables import isin, unique

MIN_BACKERS = 1  # names whose occurrences propose a layer count (the partition then has to prove itself)
MAX_COUNTS_PER_NAME = 2  # distinct runs per layer a name may have across layer kinds
GLUE_RUNS = 2  # runs of a per-layer kernel's name outside the layers (the final norm; an lm_head on a projection tile)
OUTSIDE_NAMES = 1 / 3  # share of per-layer names with a layer's worth of runs outside the blocks: a layer left out


@dataclass(frozen=True)
class Blocks:
    count: int
    cuts: np.ndarray  # where each block begins (its earliest backer)
    bounds: np.ndarray  # the cuts and where the last block ends
    backers: list[int]  # names running once per block
    periodic: dict[int, tuple[int, int, int, int]]  # the names that run a fixed number of times per layer (_periodic)

    explained: int = 0  # kernels of the names that run a fixed number of times per block
    common: int = 0  # of those, the kernels of names every block runs
    valid: bool = True  # a layer partition at all (partition)
    beside_gemm: int = 0  # the explained kernels but GEMMs'
    mixers: tuple[int, ...] = ()  # names that cut the layers of a second kind between the backers' (_mixed)
    open_ended: bool = False  # a partition but for the layers it leaves out (of another kind, at an end: _mixed)
    alike: tuple[int, ...] = ()  # a coarser count's names, run in every few of these alike layers: no kind (_finer)
    begun: bool = False  # cut where the layers begin (_realigned), not at the names that counted them
    halves: bool = False  # halves of layers paired (_paired): the backers run before each mixer and MLP, and once more


def partition(backers: list[int], positions: dict[int, np.ndarray], length: int, gemm: set[int],
              gemm_at: np.ndarray) -> Blocks:
    cuts = np.array([positions[n] for n in backers]).min(axis=0)  # each block from its earliest backer
    return blocks_at(cuts, backers, positions, length, gemm, gemm_at)


def blocks_at(cuts: np.ndarray, backers: list[int], positions: dict[int, np.ndarray], length: int, gemm: set[int],
              gemm_at: np.ndarray, mixers: tuple[int, ...] = (),
              per_layer: tuple[np.ndarray, np.ndarray] | None = None, kinds: int = MAX_COUNTS_PER_NAME) -> Blocks:
    c = len(cuts)
    # The last block runs as long as a typical one (what follows it is the forward's tail).
    typical = int(np.median(np.diff(cuts))) if c > 1 else length - int(cuts[0])
    end = int(cuts[-1]) + typical
    if per_layer is not None:
        # A mixer split's last block runs on to the final norm (_final_head): its last layer may be of the other kind
        # and run a longer expert loop than any (a lone attention layer after Mamba ones).
        end = max(end, _final_head(cuts, *per_layer, gemm))
    bounds = np.append(cuts, end)
    periodic = _periodic(positions, bounds, kinds)
    fixed = {n: (k, r) for n, (k, _, _, r) in periodic.items() if k}
    outside = sum(len(positions[n]) - r >= k for n, (k, r) in fixed.items())
    # No partition: the runs outside the blocks are a layer the cut left out; or a layer would run no more than the
    # one kernel that counted it (one name alone is no layer).
    left_out = outside > OUTSIDE_NAMES * len(fixed)
    valid = sum(m == c for _, m, _, _ in periodic.values()) >= MIN_BACKERS + 1
    # Nor when a block runs no matrix product: every layer projects (a norm and a residual add between two norms are
    # a quarter of a layer, not one).
    if len(gemm_at) and valid:
        valid = share_running(bounds, gemm_at) == 1
    # GEMMs run in most blocks of any partition (each part of a layer projects), so they show no work in common: the
    # blocks between a layer's norms share their projections' GEMM kernel when a compiler or cuBLAS picks one tile.
    return Blocks(c, cuts, bounds, backers, periodic, sum(r for *_, r in periodic.values()),
                  sum(r for n, (_, m, _, r) in periodic.items() if m == c and n not in gemm), valid and not left_out,
                  sum(r for n, (*_, r) in periodic.items() if n not in gemm), mixers, valid and left_out)


def _periodic(positions: dict[int, np.ndarray], bounds: np.ndarray,
              kinds: int = MAX_COUNTS_PER_NAME) -> dict[int, tuple[int, int, int, int]]:
    """Names that run a fixed number of times in each layer of a kind (0 in a kind that does not run them: a MoE
    router in dense layers; another number in another kind: an attention layer's q/k norms beside a conv layer's),
    in two layers at least, with at most GLUE_RUNS runs outside the layers (the final norm has the per-layer norm's
    name): name -> (k per layer where fixed else 0, layers that run it, runs before the first cut, runs in layers).
    The blocks between cuts need not start where layers do: a block holds the end of one layer and the start of the
    next, so every block but the last holds one layer's worth, and the stretch before the first cut with the last
    block (`bounds`: the cuts, then where the last block ends) holds the last; a name run in one layer's block and as
    often again past the last block ran in the last layer too, longer than a typical block."""
    c = len(bounds) - 1
    out = {}
    for n, p in positions.items():
        bucket = np.bincount(np.searchsorted(bounds, p, side="right"), minlength=c + 2)  # before, blocks, after
        inner, edge = bucket[1:c], int(bucket[0] + bucket[c])
        values = set(inner.tolist()) - {0}
        if len(values) > kinds or (not values and not edge):
            continue
        last = max((v for v in values | {0} if 0 <= edge - v <= GLUE_RUNS), default=None)  # the last layer's runs
        if last is None and values and 0 < edge < min(values):
            last = edge  # a loop whose trip count depends on the data (experts that got tokens) ran fewer times
        if last is None:
            continue
        per_layer = np.append(inner, last)
        present = int((per_layer > 0).sum())
        if present == 1 and last == 0 and bucket[c + 1] in values:
            # Run in one layer's block and again past the last block: the last layer ran longer than a typical block
            # (a sparse layer after a dense one, each kind every other layer), its runs past it
            last = int(bucket[c + 1])
            per_layer[-1], present = last, 2
        runs = int(per_layer.sum())
        if present >= 2 and len(p) - runs <= GLUE_RUNS:
            k = int(per_layer.max()) if len(values | ({last} - {0})) == 1 else 0
            # Runs of layer 0 before the first cut: what the stretch before it holds, but glue before the layers
            # (rotary tables, masks) may share the name, so no more than what the last layer's block lacks of k.
            ahead = min(int(bucket[0]), k - min(int(bucket[c]), k))
            out[n] = (k, present, ahead, runs)
    return out


def share_running(bounds: np.ndarray, at: np.ndarray) -> float:
    """Share of the blocks between `bounds` that run a kernel at one of `at`'s positions."""
    inside = at[(at >= bounds[0]) & (at < bounds[-1])]
    return len(unique(np.searchsorted(bounds, inside, side="right"))) / (len(bounds) - 1)


def _final_head(cuts: np.ndarray, at: np.ndarray, seq: np.ndarray, gemm: set[int]) -> int:
    """Where the last run, after the last cut, of the head that comes before every cut ends (each block ends with
    the next layer's head, its input norm; the final norm runs its kernels once more): 0 where none runs. The head
    is taken up to its last kernel that is no matrix product: the mixer's first projection may run before the cut,
    and the output head that follows the final norm projects on a tile of its own (a wider output)."""
    i, head = before_every_cut(cuts, at, seq)
    projects = 0  # the head's last kernels that are matrix products
    while projects < head and int(seq[i[0] - 1 - projects]) in gemm:
        projects += 1
    head -= projects
    if not head:
        return 0
    pattern = seq[i[0] - projects - head:i[0] - projects]
    after = runs_of(pattern, seq[i[-1] + 1:])
    return int(at[i[-1] + after[-1] + head]) + 1 if len(after) else 0


def before_every_cut(cuts: np.ndarray, at: np.ndarray, seq: np.ndarray) -> tuple[list[int], int]:
    """Where each cut falls among the per-layer kernels (`at`, `seq`: per_layer_runs), and how many of them run
    alike right before every cut (each block ends with the next layer's head)."""
    i = np.searchsorted(at, cuts).tolist()
    return i, min(common_suffix(seq[:i[0]], seq[:j]) for j in i)


def input_norm(head: np.ndarray, gemm: set[int]) -> np.ndarray:
    """A layer's input norm: the longest stretch without a matrix product of what runs before every cut (a cut
    may come after the mixer's first projection, and what runs before every cut may reach back into the layer
    before, its MLP: both run shorter stretches between their projections)."""
    bounds = [-1] + [t for t, n in enumerate(head.tolist()) if n in gemm] + [len(head)]
    lo, hi = max(zip(bounds[:-1], bounds[1:], strict=True), key=lambda b: (b[1] - b[0], b[0]))
    return head[lo + 1:hi]


def runs_of(pattern: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Where in `seq` each run of `pattern` begins (none for an empty pattern)."""
    n = len(seq) - len(pattern) + 1
    if not len(pattern) or n <= 0:
        return np.empty(0, dtype=np.int64)
    runs = np.ones(n, dtype=bool)
    for t, name in enumerate(pattern.tolist()):
        runs &= seq[t:t + n] == name
    return np.flatnonzero(runs)


def per_layer_runs(ids: np.ndarray, positions: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Where the per-layer names run in the forward, and which name runs there."""
    at = np.flatnonzero(isin(ids, np.fromiter(positions, dtype=np.int64)))
    return at, ids[at]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def common_suffix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[len(a) - n:][::-1] != b[len(b) - n:][::-1])
    return int(differ[0]) if len(differ) else n


def apart(sets: list[list[int]]) -> list[list[int]]:
    """The sets (largest first) that are no part of a larger one: names that interleave with more cut the same
    layers at another of their kernels."""
    kept: list[set[int]] = []
    out = []
    for names in sets:
        if not any(set(names) <= k for k in kept):
            kept.append(set(names))
            out.append(names)
    return out


def interleaved(group: list[int], positions: dict[int, np.ndarray]) -> list[list[int]]:
    """The sets of names of `group` (each running c times) that fall once into each of c blocks, the blocks cut at
    the occurrences of one of them, the set that keeps the most names first."""
    sets: list[list[int]] = []
    for s in sorted(group, key=lambda n: int(positions[n][0])):
        cuts = positions[s]
        kept = [n for n in group if np.array_equal(np.searchsorted(cuts, positions[n], side="right") - 1,
                                                    np.arange(len(cuts)))]
        if kept and kept not in sets:
            sets.append(kept)
    return sorted(sets, key=len, reverse=True)  # stable: among equals, the set cut earliest

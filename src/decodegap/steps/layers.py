"""Layers inside a forward, counted from the per-layer work that does not depend on the data.

A decoder layer runs the same attention, norms and projections whatever the tokens are; an eager MoE layer adds a
launch group per expert that got tokens, so kernel counts and positions shift from layer to layer and step to step.
So layers are read from counts, not from a repeating sequence:
- a name is data-independent when it runs the same number of times in every forward of one phase (with one forward
  to look at, every name is taken as such);
- a candidate layer count c is one that such names share *and* interleave on: occurrence j of each falls in block j
  (the blocks begin at the earliest of them); a name is per-layer work for it when the blocks run it a fixed number
  of times (0 in a kind without it; one other number in some, as an expert loop with an idle expert);
- a count is no partition when a layer's worth of its per-layer work runs outside its blocks, when a block runs no
  matrix product (every layer projects: a norm and a residual add are a quarter of a layer), or when another count
  holds its layers and more before them (the dense layers before a stack of MoE layers, whose own count is smaller),
  or when its names run once in most but not all of a larger count's blocks and nowhere else while that count's
  names run unequally often in its own (the rotary embedding that NoPE layers skip: its blocks hold one layer or
  two), where the larger count's blocks are whole layers (_whole) and explain about as many kernels (_merges);
  a finer count that explains clearly fewer kernels than a coarser one is a loop inside the layers, unless cut again
  where its layers begin (_aligned) it explains as much with up to three per-layer counts a name, every block runs
  an MLP activation and neighbouring blocks run alike (names that count layers of three kinds, a dense KDA layer,
  KDA + MoE and MLA + MoE, run at another place in each kind: blocks cut at them hold parts of two layers)
  (_realigned); and so is one
  in whose blocks the coarser one's input norm (the names that run in each of its blocks and once more after them,
  the final norm) mostly does not run (an eager MoE's expert loop, launched alike in every forward where each
  prefill routes its tokens to as many experts: every layer runs its norm, the loop's iterations none); every set of
  names that interleaves on a count proposes a partition (a rotary pair, twice in each attention layer of a conv /
  attention stack, cuts none; a mask copied once before the layers and once per MoE layer cuts a poor one): the
  valid one of the largest sets, and of those the one whose blocks run the most work in common, stands for it;
- the layers are the partition whose blocks run the most non-GEMM work in common (a norm that runs 2L+1 times does not
  make half-layers: they stand only where no other count partitions, _halves; an eager MoE's expert groups do not make
  layers); a block of k layers of a few kinds (a hybrid stack's group, alternating attention) is k layers when most of
  the finer blocks' work runs in every one of them (two names that take turns at one place in the blocks, sliding and
  full attention, count as run in every one; so do two groups of names, the two mixers' kernels, where every block
  runs one or the other at one place: conv and attention layers, attention every third), most of them run work of
  their own besides or they are alike but for the coarser count's own kernel (a mask Inductor fuses into every 4th
  layer: _alike), and each runs an MLP activation (every layer has its MLP or experts, an attention half has none;
  where the names tell no activation, neighbouring blocks run alike; where the activation is what counts the finer
  blocks, each runs one for being cut there, and neighbouring blocks run at least partly alike, sharing their norms
  and MLP (Gemma 4's per-layer input gate runs the MLP's GeLU again: a short part of each layer cut there shares
  little with the rest); the last block runs to the forward's end, since a last layer of another kind, MoE after
  dense, runs longer than a typical block);
- a hybrid stack's layers each run one mixer of two kinds (Mamba layers with attention layers among them): the
  names that run in some blocks of a partition and nowhere else split those blocks at each run where each part runs
  an MLP activation and a matrix product, and add a block where they run before the first block or after the last
  among the layers' input norms (after the first run of the norm, before the final one: a lone attention layer
  first or last, whose kernels may follow its rotary and cache copies); where what runs only beside them holds an
  MLP activation, they are part of the blocks' layers instead (a shared attention + MLP block in some Mamba layers,
  a Mamba mixer's gated norm in the blocks MoE routers cut: a part would pass for a layer on it), where the rules
  above kept those blocks (a SiLU the conv and the MLPs share cuts Mamba layers into halves); the
  last block runs on to the final norm, since a last layer of the other kind may run a longer expert loop than any;
  a split may start from a count that is no partition only for the lone layers it leaves out at an end (2 of 3
  attention layers in its blocks, the last after them: their own kernels run in 2 blocks and once outside) (_mixed);
- two mixers that take turns layer by layer (conv, attention, ...), where only their own kernels run once per layer
  (a compiler fused the norms into other kernels), count pairs: the counting names run as two runs per block, and
  where what follows each run up to the other runs an MLP activation and a matrix product and runs like what
  follows the other (the same MLP or experts after either mixer), the blocks split at both runs (_in_turn); the
  last block runs on to the final norm (an attention layer after conv ones runs longer than the median block),
  found by the input norm's kernels before the mixer's first projection: the output head after the final norm
  projects on a tile of its own (_final_head);
- a layer begins where layers of its kind run one sequence: the kernels that count layers often run mid-layer (an
  MoE router), so each block between two cuts holds one layer's tail and the next one's head; layer 0's head ends
  the stretch before the first cut, a block that ends alike holds that head, and a head of another kind (a lone
  full-attention layer among linear-attention ones) begins where a known tail ends, or else at the last place that
  begins like layer 0's head after a residual add; what runs between a known tail and the head, an input norm among
  it, begins the next layer (a shared block it runs before its mixer); where no block ends like that stretch (cuts
  late in layers whose kinds differ there: a dense MLP, an MoE layer's experts), the longest run the stretch and a
  block have in common begins the layers, where it begins at one place in the stretch for most blocks (their norm
  and attention; the glue before the layers and the tail of the layer before differ) (_aligned, _seam,
  _begun_alike);
- the last layer ends where the once-per-forward tail begins: at the final norm, which runs per-layer norm kernels
  once more than a layer does (so the lm_head and a loss are no layer's, however long the longest layer is), or,
  with layers of several kinds, at the last run of what every layer begins with before its first projection; at
  that run's first kernel where the name that runs once more is a later one of its (the norm's cast runs more often
  in one kind of layer); where the layers begin unlike (a shared block before some), as far as the longest earlier
  layer it begins like ran; a name that counted the layers and runs again from the final norm on (MoE routing
  kernels in beam search's bookkeeping) does not carry the last layer past it where the norm's kernels run there;
- a count whose names run once more at the final norm (one input norm per layer: parallel attention + MLP) stands for
  the blocks before its last, which runs from the final norm to the forward's end (_before_final_norm), where no
  names count as many layers themselves; a finer count that explains clearly more of the forward than a coarser one
  stands for its layers though they share little (layers of three kinds: dense, sliding and NoPE full attention);
- where a layer so read holds two blocks of one kind, a block being what runs from one run of the input norm (what
  every layer begins with before its first projection) to the next, projecting in and out, the blocks are the layers
  (Nemotron-H: Mamba, MLP, Mamba, attention, MLP, each block one norm, one mixer or MLP, one residual add), or pairs
  of them where their kinds take turns between a mixer's, which runs no MLP activation, and an MLP's
  (_residual_blocks); blocks before the first layer are a layer's where the norm runs there without its first
  kernel, the residual add that ends the layer before (layers aligned by what they run alike begin with it, so a first
  layer of its own kind, after the embedding, passed for glue: a dense layer before groups of MoE layers)
  (_blocks_before);
- unlike layers (dense + MoE, sliding + full attention on different kernels) are kinds (steps.layer_kinds).
The input is a sequence of name ids per forward (normalised kernel names; a graph replay's kernels in replay order)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from itertools import combinations

import numpy as np

from decodegap.ops.categories import categorize
from decodegap.ops.kernel_names import compiler_generated
from decodegap.steps.layer_kinds import LayerKind, describe_kinds, layer_kinds
from decodegap.trace.tables import isin, unique

MIN_BACKERS = 1  # names whose occurrences propose a layer count (the partition then has to prove itself)
MAX_COUNTS_PER_NAME = 2  # distinct runs per layer a name may have across layer kinds
GLUE_RUNS = 2  # runs of a per-layer kernel's name outside the layers (the final norm; an lm_head on a projection tile)
NEAR_EXPLAINED = 0.9  # a finer partition explaining this share of a coarser one's kernels may be its layers
OUTSIDE_NAMES = 1 / 3  # share of per-layer names with a layer's worth of runs outside the blocks: a layer left out
FINER_COMMON = 0.5  # share of a finer partition's explained kernels that must run in all its blocks to be layers
ALIKE_LAYERS = 0.7  # how alike neighbouring layers of a hybrid group run at least, where no activation tells
PARTS_ALIKE = 0.4  # ... at least, where an activation counts them: below, a layer's parts (an extra block and the rest)
KINDS_ALIKE = 0.9  # share of a mixer split's kernels (GEMMs aside) run in every layer of its kind (_common_by_kind)
# An MLP's activation (eager, Inductor-fused and engine kernels name it): every layer runs its own MLP or experts
ACTIVATION = re.compile(r"silu|gelu|swiglu|geglu|act_and_mul|relu|swish", re.IGNORECASE)


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
    # layers only; a re-cut reading's (_residual_blocks) as often as in the reading they counted


NO_LAYERS = Layers(None, "no per-layer work found: no kernel runs the same number of times in every layer")


def count_layers(seq: np.ndarray, names: list[str] | None = None, stable: set[int] | None = None,
                 varying: set[int] = frozenset(), untelling: frozenset[int] = frozenset()) -> Layers:
    """The layers of one forward (`seq`: a name id per GPU activity, in order); `stable`: the data-independent names
    (from data_independent), None to take every name but those in `varying` (from data_dependent); `untelling`:
    names that tell no layer kind (across_forwards.kinds_agreed)."""
    if len(seq) < 4:
        return NO_LAYERS
    ids = seq.astype(np.int64)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids)
    offsets = np.concatenate(([0], np.cumsum(counts)))

    def independent(n: int) -> bool:
        return n in stable if stable is not None else n not in varying

    positions = {int(n): order[offsets[n]:offsets[n + 1]] for n in np.flatnonzero(counts >= 2) if independent(int(n))}
    by_count: dict[int, list[int]] = {}
    for n, p in positions.items():
        by_count.setdefault(len(p), []).append(n)
    distinct = unique(ids).tolist()
    matmul = {n for n in distinct if names and categorize(names[n]) == "gemm"}
    gemm = matmul & set(positions)
    gemm_at = np.flatnonzero(isin(ids, np.fromiter(matmul, dtype=np.int64, count=len(matmul))))  # every GEMM run
    act = [n for n in distinct if names and ACTIVATION.search(names[n])]
    act_at = np.flatnonzero(isin(ids, np.array(act, dtype=np.int64)))  # every MLP activation's run
    candidates: list[_Blocks] = []
    open_ended: list[_Blocks] = []
    for c, group in by_count.items():
        if len(group) < MIN_BACKERS or c * 2 > len(seq):
            continue
        # The sets of names that interleave on the count propose partitions, the sets with the most names first;
        # the first valid one stands for the count (a rotary pair runs twice in each attention layer of a conv /
        # attention stack: no partition), and among sets as large, the one whose blocks run the most work in common
        # (a mask copied once before the layers and once in each MoE layer, as often as the attention kernel runs).
        proposed = [_before_final_norm(_partition(backers, positions, len(ids), gemm, gemm_at), positions, len(ids),
                                       gemm, gemm_at, act_at)
                    for backers in _apart(_interleaved(group, positions))]
        valid = [b for b in proposed if b.valid] or [b for b in proposed if b.open_ended]
        if valid:
            (candidates if valid[0].valid else open_ended).append(max(valid, key=lambda b: (len(b.backers), b.common)))
    # A count read before the final norm (_before_final_norm) stands only where no names count as many layers
    # themselves (they tell where each begins better than the norm's kernels and what runs before the first).
    direct = {b.count for b in candidates if len(positions[b.backers[0]]) == b.count}
    candidates = [b for b in candidates if len(positions[b.backers[0]]) == b.count or b.count not in direct]
    # Halves of layers (a norm before every mixer and every MLP, and the final norm) stand only where no other count
    # is a partition (a dense first layer before groups of sliding / full MoE layers: the mixers count them).
    candidates = [b for b in candidates if not _halves(b, len(ids), act_at)] or candidates
    if not candidates:
        return NO_LAYERS
    # Every valid one, and those that leave a layer out (a lone attention layer after the last Mamba one): a hybrid's
    # mixer split may start from any (_mixed).
    partitions = candidates + open_ended
    # A count that leaves a layer out is no partition: the MoE layers' own count leaves the dense ones before them.
    candidates = [b for b in candidates if not _leaves_out_first(b, candidates, act_at)]
    # A count whose names run in only some layers (the rotary embedding NoPE layers skip) cuts blocks of one or two
    # layers: the names that count every layer run unequally often in its blocks, while it runs at most once in each
    # of theirs. Its blocks merge layers, so it is no partition where the larger count explains as much.
    candidates = [b for b in candidates if not any(_merges(b, o, ids, positions, gemm, act_at) for o in candidates)]
    # A finer count explaining clearly fewer kernels than a coarser one is a loop inside the layers (an eager MoE
    # layer's experts, all taken when a training batch routes tokens to every one), not the layers.
    candidates = [_realigned(b, candidates, ids, positions, gemm, gemm_at, act_at) for b in candidates]
    candidates = [b for b in candidates if _explains_as_much(b, candidates)]
    # So is a finer count in whose blocks the input norm mostly does not run (every layer runs its norm; an eager MoE
    # layer's expert loop, launched alike in every forward where a prefill routes tokens to the same experts, does
    # not), whatever it explains.
    candidates = [b for b in candidates if not any(_loop_in(o, b, positions, gemm) for o in candidates)]
    # The layers are the partition whose blocks run the most work in common: the blocks between one layer's norms
    # (its attention part, its MLP part) share little.
    best = max(candidates, key=lambda b: (b.common, b.count))
    best = _finer(best, candidates, ids, positions, gemm, act_at)
    # Names that run once in the forward may be a lone layer's mixer (an attention layer among Mamba ones).
    lone = {int(n): order[offsets[n]:offsets[n + 1]] for n in np.flatnonzero(counts == 1)
            if independent(int(n)) and int(n) not in matmul}
    fused = {n for n in distinct if names and compiler_generated(names[n])}
    best = _mixed(best, partitions, candidates, ids, positions, lone, gemm, gemm_at, act_at, set(act), fused)
    best = _in_turn(best, ids, positions, gemm, gemm_at, act_at)
    if untelling:
        best = replace(best, alike=tuple(best.alike) + tuple(sorted(untelling)))
    return _residual_blocks(_layers(best, ids, positions, names, gemm), ids, positions, names, gemm_at, act_at,
                            untelling)


def _partition(backers: list[int], positions: dict[int, np.ndarray], length: int, gemm: set[int],
               gemm_at: np.ndarray) -> _Blocks:
    cuts = np.array([positions[n] for n in backers]).min(axis=0)  # each block from its earliest backer
    return _blocks_at(cuts, backers, positions, length, gemm, gemm_at)


def _before_final_norm(blocks: _Blocks, positions: dict[int, np.ndarray], length: int, gemm: set[int],
                       gemm_at: np.ndarray, act_at: np.ndarray) -> _Blocks:
    """The blocks before the last, where the last cut is the final norm: names that run once per layer at its input
    norm (one norm per layer: parallel attention + MLP, Cohere) run once more at the final norm, so their count is one
    more than the layers and its last block holds the final norm and the output head: what runs from it to the
    forward's end is short (under half a typical block) and runs no MLP activation, where every block before it runs
    one (every layer has its MLP or experts), and no MLP activation runs before the first cut (cuts late in each layer
    leave layer 0's MLP before it)."""
    if blocks.count < 3 or not _last_cut_at_final_norm(blocks, length, act_at):
        return blocks
    held = np.searchsorted(blocks.cuts, act_at, side="right") - 1
    if len(unique(held[held >= 0])) != blocks.count - 1:
        return blocks
    return _blocks_at(blocks.cuts[:-1], blocks.backers, positions, length, gemm, gemm_at)


def _halves(blocks: _Blocks, length: int, act_at: np.ndarray) -> bool:
    """Whether a partition's blocks are halves of layers: names that run before every mixer and every MLP run once
    more at the final norm (2L + 1 times), so every other block runs an MLP activation, and the last holds the final
    norm and the output head (short, no activation), with none before the first cut."""
    if blocks.count < 5 or blocks.count % 2 == 0 or not _last_cut_at_final_norm(blocks, length, act_at):
        return False
    held = unique(np.searchsorted(blocks.cuts, act_at, side="right") - 1)
    return len(held) == (blocks.count - 1) // 2 and bool(np.all(np.diff(held) == 2))


def _last_cut_at_final_norm(blocks: _Blocks, length: int, act_at: np.ndarray) -> bool:
    """Whether the last cut may be the final norm: no MLP activation (`act_at`) runs from it on, and what does is
    short (under half a typical block), and none runs before the first cut (cuts late in each layer leave layer 0's
    MLP before it: not at their norm)."""
    return bool(len(act_at) and act_at.max() < blocks.cuts[-1] and act_at.min() >= blocks.cuts[0]
                and length - blocks.cuts[-1] < 0.5 * np.median(np.diff(blocks.cuts)))


def _blocks_at(cuts: np.ndarray, backers: list[int], positions: dict[int, np.ndarray], length: int, gemm: set[int],
               gemm_at: np.ndarray, mixers: tuple[int, ...] = (),
               per_layer: tuple[np.ndarray, np.ndarray] | None = None, kinds: int = MAX_COUNTS_PER_NAME) -> _Blocks:
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
        valid = _share_running(bounds, gemm_at) == 1
    # GEMMs run in most blocks of any partition (each part of a layer projects), so they show no work in common: the
    # blocks between a layer's norms share their projections' GEMM kernel when a compiler or cuBLAS picks one tile.
    return _Blocks(c, cuts, bounds, backers, periodic, sum(r for *_, r in periodic.values()),
                   sum(r for n, (_, m, _, r) in periodic.items() if m == c and n not in gemm), valid and not left_out,
                   sum(r for n, (*_, r) in periodic.items() if n not in gemm), mixers, valid and left_out)


@dataclass(frozen=True)
class _Blocks:
    count: int
    cuts: np.ndarray  # where each block begins (its earliest backer)
    bounds: np.ndarray  # the cuts and where the last block ends
    backers: list[int]  # names running once per block
    periodic: dict[int, tuple[int, int, int, int]]  # the names that run a fixed number of times per layer (_periodic)

    explained: int = 0  # kernels of the names that run a fixed number of times per block
    common: int = 0  # of those, the kernels of names every block runs
    valid: bool = True  # a layer partition at all (_partition)
    beside_gemm: int = 0  # the explained kernels but GEMMs'
    mixers: tuple[int, ...] = ()  # names that cut the layers of a second kind between the backers' (_mixed)
    open_ended: bool = False  # a partition but for the layers it leaves out (of another kind, at an end: _mixed)
    alike: tuple[int, ...] = ()  # a coarser count's names, run in every few of these alike layers: no kind (_finer)
    begun: bool = False  # cut where the layers begin (_realigned), not at the names that counted them


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


def _explains_as_much(blocks: _Blocks, others: list[_Blocks]) -> bool:
    """Whether `blocks` explains about as many kernels as every coarser partition of `others`."""
    return all(blocks.explained >= NEAR_EXPLAINED * o.explained for o in others if o.count < blocks.count)


def _realigned(blocks: _Blocks, others: list[_Blocks], ids: np.ndarray, positions: dict[int, np.ndarray],
               gemm: set[int], gemm_at: np.ndarray, act_at: np.ndarray) -> _Blocks:
    """The partition cut where its layers begin (_aligned), where its own cuts explain clearly fewer kernels than a
    coarser count's: names that count layers of several kinds run at another place in each kind (a dense first layer,
    linear-attention and MLA layers), so blocks cut at them hold parts of two layers and the names' runs per block
    vary; cut where each layer begins, they run a fixed number of times in each. Unchanged where that explains no
    more."""
    if _explains_as_much(blocks, others):
        return blocks
    starts = _aligned(blocks, ids, positions, blocks.cuts.copy(), gemm)
    if np.array_equal(starts, blocks.cuts) or (np.diff(starts) <= 0).any():
        return blocks
    moved = _blocks_at(starts, blocks.backers, positions, len(ids), gemm, gemm_at, kinds=MAX_COUNTS_PER_NAME + 1)
    whole = _share_running(moved.bounds, act_at) == 1
    if not (moved.valid and whole and _explains_as_much(moved, others)):
        return blocks  # every layer runs its MLP (a half cut at its norm does not)
    # Layers cut where they begin run alike, neighbour after neighbour, but at a seam between kinds; halves of layers
    # (a mixer, then its MLP) take turns and share little.
    return replace(moved, begun=True) if _alike_neighbours(moved, ids, positions, gemm) >= ALIKE_LAYERS else blocks


def _leaves_out_first(blocks: _Blocks, others, act_at: np.ndarray) -> bool:
    """True when another partition counts these layers and more before them: its first blocks end before this one's
    first cut and each of its other blocks holds one of this one's cuts (the dense layers that come before a stack of
    MoE layers, whose own count leaves them out). Those first blocks are layers only where each runs an MLP
    activation (`act_at`: where activations run), as every layer does: a name the glue before the layers runs once
    more (a static cache's position update) adds a block of glue, not a layer."""
    for other in others:
        ahead = int(np.searchsorted(other.cuts, blocks.cuts[0], side="right")) - 1  # other's blocks before ours
        if ahead < 1 or other.count != blocks.count + ahead:
            continue
        if other.explained < blocks.explained + ahead * other.explained / (2 * other.count):
            continue  # it explains less than half a layer's worth more: it splits a layer, it adds none
        if len(act_at):
            held = np.searchsorted(other.bounds, act_at, side="right") - 1
            if len(unique(held[(held >= 0) & (held < ahead)])) < ahead:
                continue  # a block ahead runs no activation: glue
        held = np.searchsorted(other.cuts, blocks.cuts, side="right") - 1
        if np.array_equal(held, np.arange(ahead, other.count)):
            return True
    return False


def _merges(coarse: _Blocks, fine: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
            act_at: np.ndarray) -> bool:
    """True when `coarse`'s blocks are runs of `fine`'s of unequal length: each name that counts `coarse` runs once
    in most of `fine`'s blocks and in no other (per-layer work some layers skip), none that counts `fine` runs a
    fixed number of times in `coarse`'s (one layer here, two there), `fine` explains about as many kernels and its
    blocks are whole layers (_whole: halves cut by a name that some layers run twice, a GLM-5 MoE layer's, leave
    one half without an MLP activation)."""
    if fine.count <= coarse.count or fine.explained < NEAR_EXPLAINED * coarse.explained:
        return False
    # Most layers run the skippable work (3 of 4 rotary layers); names in few of the blocks (a layer's attention
    # among its experts' loop bodies) count the layers, and the finer blocks are a loop inside them.
    once = all(n in fine.periodic and fine.periodic[n][0] == 1 and 2 * fine.periodic[n][1] > fine.count
               for n in coarse.backers)
    return (once and not any(coarse.periodic.get(n, (0,))[0] for n in fine.backers)
            and _whole(coarse, fine, ids, positions, gemm, act_at))


def _loop_in(coarse: _Blocks, fine: _Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> bool:
    """True when `fine`'s blocks are a loop inside `coarse`'s layers: the input norm, the names (GEMMs aside) that run
    a fixed number of times in every coarse block and once more after them (the final norm), runs in at most half of
    the finer blocks, each of its names (every layer runs its input norm; an expert loop's iterations run none)."""
    if fine.count <= coarse.count:
        return False
    c, last = coarse.count, max(int(positions[n][-1]) for n in coarse.backers)
    norm = [n for n, (k, m, _, runs) in coarse.periodic.items()
            if k and m == c and n not in gemm and len(positions[n]) == runs + 1 and positions[n][-1] > last]
    if not norm:
        return False
    for n in norm:
        held = np.searchsorted(fine.bounds, positions[n], side="right") - 1
        if 2 * len(unique(held[(held >= 0) & (held < fine.count)])) > fine.count:
            return False
    return True


def _finer(best: _Blocks, candidates: list[_Blocks], ids: np.ndarray, positions: dict[int, np.ndarray],
           gemm: set[int], act_at: np.ndarray) -> _Blocks:
    """A block of k layers (a hybrid stack's repeating group, alternating attention kinds) is k layers: the finer
    partition explains about as many kernels, most of them run in every one of its blocks, and most of its blocks run
    work of their own besides (each layer its own mixer). A block of unlike halves (attention and MLP, cut by the
    norms between them) stays one layer: little runs in every half; so does a layer's loop (an MoE layer's experts),
    whose blocks but one per layer run the loop's body alone."""
    finer = [b for b in candidates if b.count > best.count and b.count % best.count == 0]
    for fine in sorted(finer, key=lambda b: (b.count, b.common), reverse=True):
        common = fine.common + _taking_turns(fine, positions, gemm)
        # Layers of several kinds (a dense first layer, NoPE full-attention layers among sliding ones) share less;
        # a finer count that explains clearly more of the forward stands for them all the same.
        more = fine.explained * NEAR_EXPLAINED > best.explained
        if (fine.explained < NEAR_EXPLAINED * best.explained or (common < FINER_COMMON * fine.beside_gemm and not more)
                or not _whole(best, fine, ids, positions, gemm, act_at)):
            continue
        if _own_work_share(fine, positions, gemm) >= FINER_COMMON:
            return fine
        if _alike(best, fine, positions):
            # Alike layers: what the coarser count ran in every few of them (a mask Inductor recomputes in every
            # 4th) tells no kind either.
            return replace(fine, alike=tuple(best.backers))
    return best


def _alike(coarse: _Blocks, fine: _Blocks, positions: dict[int, np.ndarray]) -> bool:
    """The finer blocks are alike layers, and the coarser count only the kernels that run in every few of them: no
    name but the coarser count's own runs in some interior finer blocks and not in others (a mask Inductor fuses into
    every 4th layer; a hybrid group's layers each run a mixer of their own instead)."""
    c = fine.count
    if c < 4:
        return False
    partial = 0
    for n, p in positions.items():
        held = np.unique(np.searchsorted(fine.bounds, p, side="right") - 1)
        interior = held[(held >= 1) & (held < c - 1)]
        partial += 0 < len(interior) < c - 2 and n not in coarse.backers
    return partial == 0


def _taking_turns(blocks: _Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> int:
    """Kernels of the names that take turns: two names, each once in the blocks it runs in, that run in complementary
    sets of the blocks and at the same place in each (sliding and full attention on two kernels, layer by layer, in
    a stack whose MoE layers already make the layers unlike) do the same part of every layer between them, so they
    count as work the blocks have in common. (An expert loop's body and its layer's own work run in complementary
    blocks too, but at other places.) So do two groups of names, each name once in the blocks it runs in, each group
    in the same blocks, that run in complementary sets of the blocks, their first kernels at the same place (a
    compiled LFM2's conv and attention mixers, attention every third or fourth layer: every layer runs the one or
    the other; layer 0's mixer runs before the first cut and counts with the last block's layer, as in _periodic)."""
    c = blocks.count
    slot: dict[int, tuple[frozenset, int, int]] = {}  # name -> (its blocks, its place in each, its runs)
    for n, (k, m, _, runs) in blocks.periodic.items():
        if k != 1 or m >= c or n in gemm:
            continue
        at = np.searchsorted(blocks.bounds, positions[n], side="right") - 1
        inside = (at >= 0) & (at < c)
        places = unique(positions[n][inside] - blocks.cuts[at[inside]])
        if len(places) == 1:
            slot[n] = (frozenset(at[inside].tolist()), int(places[0]), runs)
    total, paired = 0, set()
    for a, b in combinations(sorted(slot), 2):
        (held_a, place_a, runs_a), (held_b, place_b, runs_b) = slot[a], slot[b]
        if not paired & {a, b} and place_a == place_b and not held_a & held_b and len(held_a | held_b) == c:
            total += runs_a + runs_b
            paired |= {a, b}
    # Two mixers whose kernels take turns as groups (conv, conv, attention, ...: each block runs the one or the other
    # at the same place, layer 0's before the first cut, with the last block's layer)
    groups: dict[frozenset, list[int]] = {}
    for n, (k, m, _, _runs) in blocks.periodic.items():
        if k != 1 or m >= c or n in gemm or n in paired:
            continue
        at = np.searchsorted(blocks.bounds, positions[n], side="right") - 1
        inside = (at >= 0) & (at < c)
        places = unique(positions[n][inside] - blocks.cuts[at[inside]])
        if len(places) == 1:
            held = frozenset(at[inside].tolist()) | ({c - 1} if (at < 0).any() else set())
            groups.setdefault(held, []).append(n)
    place = {h: min(slot[n][1] for n in g) for h, g in groups.items()}  # where each mixer's first kernel runs
    for a, b in combinations(groups, 2):
        if not a & b and len(a | b) == c and place[a] == place[b]:
            total += sum(blocks.periodic[n][3] for n in groups[a] + groups[b])
            break
    return total


def _mixed(best: _Blocks, candidates: list[_Blocks], kept: list[_Blocks], ids: np.ndarray,
           positions: dict[int, np.ndarray], lone: dict[int, np.ndarray], gemm: set[int], gemm_at: np.ndarray,
           act_at: np.ndarray, act: set[int], fused: set[int]) -> _Blocks:
    """A hybrid stack's layers each run one token mixer of two kinds (Mamba layers with attention layers among
    them): the names that count one kind's layers hold layers of the other kind inside some of their blocks. Names
    that run in some blocks of a partition and nowhere else (the attention kernels; also before its first block or
    after its last, where a lone layer of the other kind begins or ends the stack) cut those blocks at each run; the
    parts are layers when each runs an MLP activation and a matrix product (each part then holds one layer's mixer
    and its MLP or experts; a split inside one layer leaves a part with neither) and most of the parts' work runs in
    every part, unless an activation runs among the names only those blocks run (the other mixer's own). Of such
    splits, the one whose parts run the most work in common wins over `best` when it cuts more layers, or when some
    block of `best` runs no MLP activation (halves cut by a name that runs twice per layer).
    `lone`: where the names that run once in the forward run; `kept`: the partitions the partition rules kept, the
    only ones taken as they are (any in `candidates` may be split); `fused`: the compiler-generated names."""
    runs = positions | lone
    whole = _share_running(best.bounds, act_at) == 1  # else `best` cuts halves (an attention part runs no MLP)
    per_layer = _per_layer_runs(ids, positions)
    splits = []
    for coarse in candidates:
        for mixers, extra, own in _inside_some_blocks(coarse, runs, gemm, *per_layer):
            if act & own:
                # An MLP activation among what runs only beside the other mixer (a Mamba mixer's gated norm among
                # MoE layers, a shared attention + MLP block in some Mamba layers) makes that mixer part of the
                # coarse blocks' layers, not layers of its own: its parts would pass for layers on that activation.
                # Taken as it is, the coarse partition must be one the partition rules kept (halves of Mamba layers,
                # their mixer and MLP parts, are a loop inside the Mamba count's blocks, and the mixer's own gated
                # norm would pass them for layers here).
                if not any(coarse is k for k in kept):
                    continue
                split = coarse
            else:
                cuts = np.sort(np.concatenate((coarse.cuts, extra)))
                split = _blocks_at(cuts, coarse.backers, positions, len(ids), gemm, gemm_at, mixers, per_layer)
            if ((split.count > best.count or not whole) and split.valid and _share_running(split.bounds, act_at) == 1
                    and (split.common >= FINER_COMMON * split.beside_gemm
                         or _common_by_kind(split, runs, gemm, fused) >= KINDS_ALIKE * split.beside_gemm)):
                splits.append(split)
    # As among partitions: the layers run the most work in common (a split of a layer's halves runs less).
    return max(splits, key=lambda b: (b.common, b.count), default=best)


def _common_by_kind(split: _Blocks, runs: dict[int, np.ndarray], gemm: set[int], fused: set[int]) -> int:
    """The kernels of the names (GEMMs aside) that run in every layer of a kind of a mixer split: in all its layers,
    in every layer that runs its mixers, or in every layer that does not. A hybrid's layers are alike within a kind,
    and the two mixers share little (a gated delta net's many kernels beside an attention layer's few); a split of
    layers into parts that are no layers leaves parts of no kind alike. A compiler fuses the end of a layer into the
    start of the next, so a layer next to one of the other kind runs its own variant of such a kernel: a compiled
    (`fused`) name all of a kind's layers run but some next to the other kind is of that kind too."""
    c = split.count

    def layers_of(p: np.ndarray) -> frozenset:
        held = np.searchsorted(split.bounds, p, side="right") - 1
        held[held < 0] = c - 1  # before the first cut: the last layer's (_periodic)
        return frozenset(held[held < c].tolist())

    every = frozenset(range(c))
    mixed = frozenset().union(*(layers_of(runs[m]) for m in split.mixers))
    seam = frozenset(i for i in every if any(0 <= j < c and (j in mixed) != (i in mixed) for j in (i - 1, i + 1)))
    kinds = (every, mixed, every - mixed)

    def of_a_kind(held: frozenset, fused_name: bool) -> bool:
        return any(held == kind or (fused_name and held <= kind and kind - held <= seam) for kind in kinds)

    return sum(r for n, (*_, r) in split.periodic.items()
               if n not in gemm and of_a_kind(layers_of(runs[n]), n in fused))


def _in_turn(blocks: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
             gemm_at: np.ndarray, act_at: np.ndarray) -> _Blocks:
    """A hybrid stack whose two mixers take turns layer by layer (conv, attention, conv, ...) counts a pair of layers
    per block where the mixers' own kernels are all that runs once per layer (a compiler fuses each layer's norms
    into other kernels). The counting names then run as two runs in every block, each followed by the layer's MLP or
    experts: the blocks split at each run into layers where every part runs an MLP activation and a matrix product,
    and what follows each run, up to the other, runs an MLP and like what follows the other (the same MLP after
    either mixer). A layer's halves fail that: what follows its attention (its projection, the MLP's first half) runs
    unlike what follows the MLP's activation (the next layer's norm and mixer), and where the MLP's own kernels
    count too, only a residual add and a norm follow each run. Unchanged where no such split holds."""
    if blocks.mixers or len(blocks.backers) < 2:
        return blocks
    backers = sorted(blocks.backers, key=lambda n: int(positions[n][0]))
    runs = np.array([positions[n] for n in backers])
    first = runs.min(axis=0)
    per_layer = _per_layer_runs(ids, positions)
    for k in range(1, len(runs)):  # the first k names' runs, then the others', in every block
        a_end, b_at, b_end = runs[:k].max(axis=0), runs[k:].min(axis=0), runs[k:].max(axis=0)
        if not (a_end < b_at).all():
            continue
        cuts = np.sort(np.concatenate((first, b_at)))
        split = _blocks_at(cuts, backers[:k], positions, len(ids), gemm, gemm_at, tuple(backers[k:]), per_layer)
        nexts = np.append(first[1:], len(ids))
        if (split.valid and _share_running(split.bounds, act_at) == 1
                and _followed_alike(ids, gemm, gemm_at, act_at, a_end, b_at, b_end, nexts)):
            return split
    return blocks


def _followed_alike(ids: np.ndarray, gemm: set[int], gemm_at: np.ndarray, act_at: np.ndarray, a_end: np.ndarray,
                    b_at: np.ndarray, b_end: np.ndarray, nexts: np.ndarray) -> bool:
    """Whether each mixer's run is followed by an MLP: what runs after one's run up to the other's, and after the
    other's up to the next block's first, runs an MLP activation and a matrix product in every block, and the two
    run alike in most blocks (GEMM tiles as one name). A layer's halves cut at the mixer and the MLP kernels leave
    the MLP inside a run, and only a residual add and a norm after each."""
    stretches = np.concatenate((np.stack((a_end + 1, b_at), axis=1), np.stack((b_end + 1, nexts), axis=1)))
    for lo, hi in stretches.tolist():
        if not (((act_at >= lo) & (act_at < hi)).any() and ((gemm_at >= lo) & (gemm_at < hi)).any()):
            return False
    names = np.where(isin(ids, np.fromiter(gemm, dtype=np.int64, count=len(gemm))), -1, ids)
    shares = [SequenceMatcher(None, names[a + 1:b].tolist(), names[e + 1:n].tolist(), autojunk=False).ratio()
              for a, b, e, n in zip(a_end.tolist(), b_at.tolist(), b_end.tolist(), nexts.tolist(), strict=True)]
    return float(np.median(shares)) >= ALIKE_LAYERS


def _inside_some_blocks(blocks: _Blocks, runs: dict[int, np.ndarray], gemm: set[int], at: np.ndarray,
                        seq: np.ndarray) -> list[tuple[tuple[int, ...], np.ndarray, set[int]]]:
    """Groups of names (GEMM tiles aside: the tile tells no layer) that run alike (as often in the same blocks) in a
    proper subset of the blocks and nowhere else; per group its names, where each of its runs begins, and every name
    that runs in just its blocks (however often: the other mixer's own). A run before the first block or after the
    last (a lone layer of the other kind at either end of the stack) counts where it lies between the layers' input
    norms (_inside_layers); runs there are alike when no per-layer kernel runs between them.
    `at`, `seq`: where the per-layer names run, and which (_per_layer_runs)."""
    c = blocks.count
    groups: dict[tuple[int, ...], list[int]] = {}
    where: dict[int, tuple] = {}  # per name: the blocks it runs in, and whether before the first, after the last
    for n, p in sorted(runs.items()):
        if n in gemm:
            continue
        held = np.searchsorted(blocks.bounds, p, side="right") - 1
        edge = (held < 0) | (held >= c)
        if len(unique(held[~edge])) == c or (edge.any() and not _inside_layers(p[edge], blocks, at, seq, gemm)):
            continue
        where[n] = (tuple(unique(held[~edge]).tolist()), bool((held < 0).any()), bool((held >= c).any()))
        held[edge] = c + np.searchsorted(at, p[edge])  # an edge run's place: the per-layer kernels before it
        groups.setdefault(tuple(held.tolist()), []).append(n)
    return [(tuple(group), np.array([runs[n] for n in group]).min(axis=0),
             {n for n, w in where.items() if w == where[group[0]]}) for group in groups.values()]


def _final_head(cuts: np.ndarray, at: np.ndarray, seq: np.ndarray, gemm: set[int]) -> int:
    """Where the last run, after the last cut, of the head that comes before every cut ends (each block ends with
    the next layer's head, its input norm; the final norm runs its kernels once more): 0 where none runs. The head
    is taken up to its last kernel that is no matrix product: the mixer's first projection may run before the cut,
    and the output head that follows the final norm projects on a tile of its own (a wider output)."""
    i, head = _before_every_cut(cuts, at, seq)
    projects = 0  # the head's last kernels that are matrix products
    while projects < head and int(seq[i[0] - 1 - projects]) in gemm:
        projects += 1
    head -= projects
    if not head:
        return 0
    pattern = seq[i[0] - projects - head:i[0] - projects]
    after = _runs_of(pattern, seq[i[-1] + 1:])
    return int(at[i[-1] + after[-1] + head]) + 1 if len(after) else 0


def _before_every_cut(cuts: np.ndarray, at: np.ndarray, seq: np.ndarray) -> tuple[list[int], int]:
    """Where each cut falls among the per-layer kernels (`at`, `seq`: _per_layer_runs), and how many of them run
    alike right before every cut (each block ends with the next layer's head)."""
    i = np.searchsorted(at, cuts).tolist()
    return i, min(_common_suffix(seq[:i[0]], seq[:j]) for j in i)


def _inside_layers(xs: np.ndarray, blocks: _Blocks, at: np.ndarray, seq: np.ndarray, gemm: set[int]) -> bool:
    """Whether the positions `xs`, before the first block or after the last, lie among the layers: after a run of
    their input norm (_input_norm: a mixer's own kernels may come between the norm and the cut), and, after the
    last block, before one (the final norm). The glue before the layers (the embedding) follows no norm; the output
    head and sampling precede none. The norm's latter half stands for it: what runs before every cut may begin with
    the previous layer's residual add, which the first layer, after the embedding, lacks."""
    i, head = _before_every_cut(blocks.cuts, at, seq)
    norm = _input_norm(seq[i[0] - head:i[0]], gemm)
    if len(norm) < 2:
        return False
    norm = norm[-max(2, (len(norm) + 1) // 2):]
    found = _runs_of(norm, seq)  # where each run of the norm begins, among the per-layer kernels
    if not len(found):
        return False
    first_end, last_start = int(at[found[0] + len(norm) - 1]), int(at[found[-1]])
    before = xs < blocks.cuts[0]
    return bool((xs[before] > first_end).all() and (xs[~before] < last_start).all())


def _input_norm(head: np.ndarray, gemm: set[int]) -> np.ndarray:
    """A layer's input norm: the longest stretch without a matrix product of what runs before every cut (a cut
    may come after the mixer's first projection, and what runs before every cut may reach back into the layer
    before, its MLP: both run shorter stretches between their projections)."""
    bounds = [-1] + [t for t, n in enumerate(head.tolist()) if n in gemm] + [len(head)]
    lo, hi = max(zip(bounds[:-1], bounds[1:], strict=True), key=lambda b: (b[1] - b[0], b[0]))
    return head[lo + 1:hi]


def _runs_of(pattern: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Where in `seq` each run of `pattern` begins (none for an empty pattern)."""
    n = len(seq) - len(pattern) + 1
    if not len(pattern) or n <= 0:
        return np.empty(0, dtype=np.int64)
    runs = np.ones(n, dtype=bool)
    for t, name in enumerate(pattern.tolist()):
        runs &= seq[t:t + n] == name
    return np.flatnonzero(runs)


def _whole(coarse: _Blocks, fine: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
           act_at: np.ndarray) -> bool:
    """Whether the finer blocks are whole layers, not a layer's halves: where every coarse block runs an MLP
    activation, every finer one must (each layer has its MLP or experts; an attention half has none); where the names
    tell no activation, neighbouring finer blocks must run alike kernel sequences (a layer's halves do not). Where an
    activation is what counts the finer blocks, each runs one for being cut there (a layer that runs a second
    activation besides its MLP's, Gemma 4's per-layer input gate, cut into two parts that each run one): neighbouring
    blocks must run at least PARTS_ALIKE alike, as layers of two kinds that share their norms and MLP do (a conv
    layer beside a masked attention layer: 51%), and a short part beside the rest of its layer does not (Gemma 4's
    MLP end and gate beside the rest: 27%)."""
    if isin(np.array(fine.backers, dtype=np.int64), ids[act_at]).any():
        # Layers of two kinds share their norms and MLP; a short part of a layer shares little with the rest.
        return _alike_neighbours(fine, ids, positions, gemm) >= PARTS_ALIKE
    if _share_running(coarse.bounds, act_at) == 1:
        # The last finer block runs to the forward's end: its length is a typical block's guess, and a last layer of
        # another kind runs longer (an MoE layer after dense ones reaches its experts' activation late); what follows
        # the layers (the final norm, the output head) runs no activation, and an attention half is never last.
        return _share_running(np.append(fine.bounds[:-1], len(ids)), act_at) == 1
    return _alike_neighbours(fine, ids, positions, gemm) >= ALIKE_LAYERS


def _share_running(bounds: np.ndarray, at: np.ndarray) -> float:
    """Share of the blocks between `bounds` that run a kernel at one of `at`'s positions."""
    inside = at[(at >= bounds[0]) & (at < bounds[-1])]
    return len(unique(np.searchsorted(bounds, inside, side="right"))) / (len(bounds) - 1)


def _alike_neighbours(blocks: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int]) -> float:
    """How alike neighbouring blocks run (the median matching share of their per-layer kernel sequences, GEMMs as one
    name): layers of two kinds differ in a few kernels (the attention kernel), a layer's halves in most."""
    per_layer = isin(ids, np.fromiter(positions, dtype=np.int64))
    names = np.where(isin(ids, np.fromiter(gemm, dtype=np.int64, count=len(gemm))), -1, ids)
    cuts = blocks.cuts.tolist()
    runs = [names[lo:hi][per_layer[lo:hi]].tolist() for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    shares = [SequenceMatcher(None, a, b, autojunk=False).ratio() for a, b in zip(runs[:-1], runs[1:], strict=True)]
    return float(np.median(shares)) if shares else 1.0


def _own_work_share(blocks: _Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> float:
    """Share of the blocks that run per-layer work not every block runs (GEMM tiles aside)."""
    c = blocks.count
    own = np.zeros(c, dtype=bool)
    for n, (_, m, _, _) in blocks.periodic.items():
        if m < c and n not in gemm:
            block = np.searchsorted(blocks.bounds, positions[n], side="right") - 1
            own[block[(block >= 0) & (block < c)]] = True
    return float(own.mean())


def _residual_blocks(found: Layers, ids: np.ndarray, positions: dict[int, np.ndarray], names: list[str] | None,
                     gemm_at: np.ndarray, act_at: np.ndarray, untelling: frozenset[int] = frozenset()) -> Layers:
    """Layers that are each one residual block (a hybrid of single-mixer blocks: Mamba, attention and MLP blocks each
    a layer, Nemotron-H) where the reading holds two blocks of one kind in a layer. A block begins with the input
    norm, the kernels every layer begins with before its first projection (the final norm runs them once more), and
    projects. Every layer of a stack of pre-norm layers runs that norm before its mixer and again before its MLP, so
    its blocks take turns between mixers, which run no MLP activation, and MLPs, which each run one, and pair into
    layers; blocks whose kinds follow one another in no such turn (two mixers in a row: Mamba, then attention), or
    take turns with no MLP activation in either (two mixers), are layers each. Where both run an activation (a Mamba
    mixer's SiLU beside an MLP's) nothing tells pairs from blocks. A norm inside a mixer (MLA's latent norm) cuts more
    blocks, but no layer then holds two of a kind; a block projects twice, in and out. Unchanged where any of that
    fails. The names that counted the reading stay its backers (they run as often in the forward)."""
    if found.count is None or not found.starts or not len(gemm_at):
        return found
    at, seq = _per_layer_runs(ids, positions)
    starts = np.array(found.starts, dtype=np.int64)
    norm = _head_norm(seq, np.searchsorted(at, starts), names)
    if len(norm) < 2:
        return found
    lo, hi = np.searchsorted(at, [starts[0], found.end])
    norm_runs = lo + _runs_of(norm, seq[lo:hi])
    begins = at[norm_runs]  # where each block begins
    if not len(begins) or not isin(starts, begins).all():
        return found
    end = int(found.end)
    before = _blocks_before(norm, at, seq, lo, begins, gemm_at)
    if len(before):  # the norm as read began with the residual add that ends the block before: each begins past it
        begins = at[np.concatenate((before, norm_runs + 1))]
        final = int(np.searchsorted(at, end))
        if final + len(norm) <= len(seq) and at[final] == end and np.array_equal(seq[final:final + len(norm)], norm):
            end = int(at[final + 1])  # the final norm's run too: the last layer's add is its own
    if len(begins) <= found.count:
        return found
    bounds = np.append(begins, end)
    if _fewest_projections(bounds, gemm_at) < 2:
        # Each block reads the residual stream through a projection and writes it back through another: a norm
        # between two projections (Qwen3's q and k norms) or between two norms (a post-norm and the next pre-norm)
        # begins no block.
        return found
    per_layer = isin(ids, np.fromiter(positions, dtype=np.int64))
    plain = np.where(isin(ids, ids[gemm_at]), -1, ids)  # the GEMM tile tells no kind
    index: dict[tuple, int] = {}
    kind = [index.setdefault(tuple(plain[a:b][per_layer[a:b]].tolist()), len(index))
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
    layer_of = np.searchsorted(starts, begins, side="right") - 1
    held = [[k for k, j in zip(kind, layer_of.tolist(), strict=True) if j == i] for i in range(found.count)]
    if all(len(set(h)) == len(h) for h in held) and not len(before):  # (blocks before the first: layers it lacks)
        return found
    colour = _two_turns(kind)
    if colour is not None:
        block_of = np.searchsorted(bounds, act_at, side="right") - 1
        activated = np.isin(np.arange(len(kind)), block_of)
        side = np.array([colour[k] for k in kind])
        runs = [set(activated[side == c].tolist()) for c in (0, 1)]
        if runs == [{False}, {False}]:
            colour = None  # two mixers taking turns, no MLP: each block a layer
        elif sorted(map(sorted, runs)) == [[False], [True]] and runs[side[0]] == {False}:
            begins = begins[side == side[0]]  # a mixer's block, then its MLP's: pairs
            if len(begins) <= found.count:
                return found
        else:
            return found
    ends = np.append(begins[1:], end)
    kinds, kind_of = layer_kinds(ids, begins, ends, positions, names, whole_last=True, alike=set(untelling))
    evidence = (f"{len(begins)} layers of residual blocks, each begun by the input norm's {len(norm)} kernels and "
                f"projecting in and out: " + ("a mixer's block, then its MLP's" if colour is not None else
                                              "one block each (two mixers in a row: a hybrid of single-mixer blocks)"))
    if len(kinds) > 1:
        evidence += "; " + describe_kinds(kinds)
    period = float(begins[-1] - begins[0]) / (len(begins) - 1)
    return Layers(len(begins), evidence, period, int(begins[0]), found.last, kinds, tuple(int(b) for b in begins),
                  tuple(kind_of) if len(kinds) > 1 else (), found.backers, end,
                  found.backer_runs or found.count)


def _blocks_before(norm: np.ndarray, at: np.ndarray, seq: np.ndarray, lo: int, begins: np.ndarray,
                   gemm_at: np.ndarray) -> np.ndarray:
    """Where the blocks of a first layer read as glue begin (indices among the per-layer runs `at`, `seq`, past the
    norm's first kernel), before the first layer (`lo`: its index). Layers aligned by the kernels they run alike may
    begin with the residual add that ends the layer before (the norm's first kernel), which the first layer, after
    the embedding, lacks: a first layer of its own kind (dense before a repeating group of MoE layers) is then read
    as glue. Its blocks begin at the last run of the norm without its first kernel where that kernel does not run just
    before it (an embedding norm on the same kernels runs earlier; glue running the whole norm, a vision tower's, is
    no layer of these), and at the norm's runs after it, where each of them projects in and out up to the first
    layer; none otherwise. Every block then begins past the add (_residual_blocks)."""
    none = np.empty(0, dtype=np.int64)
    if lo == 0 or len(norm) < 3 or not len(begins):
        return none
    first = [r for r in _runs_of(norm[1:], seq[:lo]).tolist() if r == 0 or seq[r - 1] != norm[0]]
    if not first:
        return none
    begin = first[-1]  # the last: an embedding norm on the same kernels runs before it
    later = _runs_of(norm, seq[begin:lo]) + begin
    extra = np.concatenate(([begin], later[later > begin] + 1))  # each past the add before it
    return extra if _fewest_projections(np.append(at[extra], begins[0]), gemm_at) >= 2 else none


def _fewest_projections(bounds: np.ndarray, gemm_at: np.ndarray) -> int:
    """The fewest matrix products (`gemm_at`: where they run) any block between `bounds` runs."""
    per_block = np.bincount(np.searchsorted(bounds, gemm_at, side="right"), minlength=len(bounds) + 1)
    return int(per_block[1:len(bounds)].min())


def _two_turns(kind: list[int]) -> dict[int, int] | None:
    """The class (0 or 1) of each block kind where a sequence of block kinds takes turns between two classes, no two
    blocks of one class in a row (the graph of neighbouring kinds has two colours); None where it does not."""
    colour = {kind[0]: 0}
    for a, b in zip(kind[:-1], kind[1:], strict=True):
        if b not in colour:
            colour[b] = 1 - colour[a]
        elif colour[b] == colour[a]:
            return None
    return colour


def _layers(blocks: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], names: list[str] | None,
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
        starts = _aligned(blocks, ids, positions, starts, gemm)
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
    other = 0
    if blocks.mixers:
        other = int(isin(ids, np.array(blocks.mixers)).sum()) // len(blocks.mixers)
        evidence = (f"{len(blocks.backers)} kernels run once in each of {c - other} layers, {len(blocks.mixers)} once "
                    f"in each of the other {other} (a hybrid stack: two kinds of mixer)")
    if len(kinds) > 1:
        evidence += "; " + describe_kinds(kinds)
    return Layers(c, evidence, period, int(starts[0]), last, kinds, tuple(int(s) for s in starts),
                  tuple(kind_of) if len(kinds) > 1 else (), tuple(blocks.backers), int(ends[-1]), c - other)


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


def _aligned(blocks: _Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], starts: np.ndarray,
             gemm: set[int]) -> np.ndarray:
    """Layer starts where layers of one kind run one sequence. Between two cuts run the end of one layer (its tail,
    from its cut) and the start of the next (its head, up to its cut). Layer 0's head ends the stretch before the
    first cut, after the glue: a later layer whose block ends the same way has that head, and the rest of its block
    is the previous layer's tail; a layer whose head is of another kind (a lone full-attention layer among linear
    ones) begins where a known tail, from its block's start, ends, or at a seam past what every known tail runs.
    Over the per-layer names only, so an expert loop
    that ran more or fewer times does not shift anything; `starts` (from the names' counts) where nothing lines up."""
    c = blocks.count
    at, seq = _per_layer_runs(ids, positions)
    cut = np.searchsorted(at, blocks.cuts)  # each cut's index among them
    lead = seq[:cut[0]]
    between = [seq[cut[j]:cut[j + 1]] for j in range(c - 1)]  # block j: layer j's tail, then layer j + 1's head
    ends_like_lead = [_common_suffix(lead, b[1:]) for b in between]  # b[0] is the cut, layer j's own
    head = max(ends_like_lead, default=0)
    if head == 0 or head < cut[0] - int(np.searchsorted(at, starts[0])):
        # Nothing ends like layer 0's head, or less than its counted kernels: the cut may run late in the layers and
        # their kinds differ before it (a dense MLP, then MoE layers' experts); they may still begin alike.
        return _begun_alike(lead, between, at, cut, starts)
    out = starts.copy()
    out[0] = at[cut[0] - head]
    norm = _input_norm(lead[len(lead) - head:], gemm)
    tails = [b[:len(b) - head] for b, h in zip(between, ends_like_lead, strict=True) if h >= head]
    for j, b in enumerate(between):
        if ends_like_lead[j] >= head:
            split = len(b) - head
            # Work between a known tail and the head that runs an input norm of its own is a block the next layer
            # runs before its mixer (a shared attention + MLP block), not the previous layer's (an MoE tail after
            # a dense one, its router, runs none).
            split = max((len(t) for t in tails if len(t) < split and np.array_equal(b[:len(t)], t)
                         and len(_runs_of(norm, b[len(t):split]))), default=split)
        else:  # another kind of head: the previous layer ends where a known tail does
            least = _tail_runs(blocks, b, tails, lead[len(lead) - head:], gemm)
            split = max((len(t) for t in tails if least <= len(t) < len(b) and np.array_equal(b[:len(t)], t)),
                        default=0)
            split = split or _seam(b, lead[len(lead) - head:], tails, least)
            if not split:
                continue
        out[j + 1] = at[cut[j] + split]
    return out


def _tail_runs(blocks: _Blocks, block: np.ndarray, tails: list[np.ndarray], head: np.ndarray, gemm: set[int]) -> int:
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


def _per_layer_runs(ids: np.ndarray, positions: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Where the per-layer names run in the forward, and which name runs there."""
    at = np.flatnonzero(isin(ids, np.fromiter(positions, dtype=np.int64)))
    return at, ids[at]


def _seam(block: np.ndarray, head: np.ndarray, tails: list[np.ndarray], least: int = 1) -> int:
    """Where in `block` (a layer's tail, then a head of another kind) the seam between layers lies: the last place
    that begins the most like layer 0's head (its input norm) after what every known tail ends with (the residual
    add); 0 when nothing does. The last, because the layer before runs its own norms (its MLP's) after an add too;
    by the head alone, because a mixer's output may end like an MLP's; from `least` on, what the layer before's tail
    runs at least (_tail_runs: an MoE's router runs like the next layer's router over attention heads)."""
    best, at = 0, 0
    for s in range(least, len(block)):
        begins = _common_prefix(block[s:], head)
        if begins and begins >= best and all(_common_suffix(block[:s], t) for t in tails):
            best, at = begins, s
    return at


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _common_suffix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[len(a) - n:][::-1] != b[len(b) - n:][::-1])
    return int(differ[0]) if len(differ) else n


def _final_norm(ids: np.ndarray, starts: np.ndarray, positions: dict[int, np.ndarray], last: int,
                names: list[str] | None) -> tuple[int, int]:
    """Where the final norm begins and ends (its last kernel's next position) when no name tells (layers of several
    kinds run each name a different number of times): at the last run, after the last layer kernel, of what every
    layer begins with before its first matrix product (its input norm's kernels, which the final norm runs too,
    before the lm_head); (0, 0) when that is fewer than two kernels or runs nowhere there."""
    at, seq = _per_layer_runs(ids, positions)
    cut = np.searchsorted(at, starts)
    norm = _head_norm(seq, cut, names)
    common = len(norm)
    if common < 2:
        return 0, 0
    for i in range(len(seq) - common, int(cut[-1]), -1):
        if at[i] > last and np.array_equal(seq[i:i + common], norm):
            return int(at[i]), int(at[i + common - 1]) + 1
    return 0, 0


def _head_norm(seq: np.ndarray, cut: np.ndarray, names: list[str] | None) -> np.ndarray:
    """What every layer begins with before its first matrix product (its input norm's kernels), over the per-layer
    names `seq`, the layers beginning at `cut` among them."""
    heads = [seq[a:b] for a, b in zip(cut.tolist(), cut[1:].tolist() + [len(seq)], strict=True)]
    norm = heads[0][:min(_common_prefix(heads[0], h) for h in heads)]
    projects = [i for i, n in enumerate(norm.tolist()) if names and categorize(names[n]) == "gemm"]
    return norm[:projects[0]] if projects else norm


def _as_long_as_its_kind(ids: np.ndarray, starts: np.ndarray, positions: dict[int, np.ndarray]) -> int:
    """Where the last layer ends when not every layer begins alike (a shared block before some layers' norm): where
    the per-layer kernels of the longest earlier layer it begins with end, and as far past them as that layer ran
    (to the next per-layer kernel where that one ran more: an expert loop); 0 when it begins like no earlier
    layer."""
    at, seq = _per_layer_runs(ids, positions)
    cut = np.searchsorted(at, starts).tolist()
    last = seq[cut[-1]:]
    alike = [j for j in range(len(cut) - 1) if 0 < cut[j + 1] - cut[j] <= len(last)
             and np.array_equal(last[:cut[j + 1] - cut[j]], seq[cut[j]:cut[j + 1]])]
    j = max(alike, key=lambda j: cut[j + 1] - cut[j], default=None)
    if j is None or cut[j + 1] - cut[j] == len(last):
        return 0  # like none, or no per-layer kernel follows (no final norm of per-layer names to tell)
    ran = cut[-1] + cut[j + 1] - cut[j]  # the first per-layer kernel past it
    return int(at[ran]) if starts[j + 1] > at[cut[j + 1] - 1] + 1 else int(at[ran - 1]) + 1


def _tail_start(blocks: _Blocks, positions: dict[int, np.ndarray], last_start: int) -> int:
    """Where the once-per-forward tail begins after the last layer: the first run, from the last layer's start on, of
    a name every layer runs k times beyond its k (the final norm runs the per-layer norm's kernels once more)."""
    tail = np.iinfo(np.int64).max
    for n, (k, m, _, _) in blocks.periodic.items():
        if k and m == blocks.count:
            after = positions[n][positions[n] >= last_start]
            if len(after) > k:
                tail = min(tail, int(after[k]))
    return 0 if tail == np.iinfo(np.int64).max else int(tail)


def _apart(sets: list[list[int]]) -> list[list[int]]:
    """The sets (largest first) that are no part of a larger one: names that interleave with more cut the same
    layers at another of their kernels."""
    kept: list[set[int]] = []
    out = []
    for names in sets:
        if not any(set(names) <= k for k in kept):
            kept.append(set(names))
            out.append(names)
    return out


def _interleaved(group: list[int], positions: dict[int, np.ndarray]) -> list[list[int]]:
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

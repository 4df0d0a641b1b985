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
  matrix product (every layer projects: a norm and a residual add are a quarter of a layer), or when another count holds
  its layers and more before them (the dense layers before a stack of MoE layers, whose own count is smaller), or when
  its names run once in most but not all of a larger count's blocks and nowhere else while that count's names run
  unequally often in its own (the rotary embedding that NoPE layers skip: its blocks hold one layer or two), where the
  larger count's blocks are whole layers (_whole) and explain about as many kernels (_merges); a finer count that
  explains clearly fewer kernels than a coarser one is a loop inside the layers, unless cut again where its layers begin
  (layer_bounds.aligned) it explains as much with up to three per-layer counts a name, every block runs an MLP
  activation and neighbouring blocks run alike (names that count layers of three kinds, a dense KDA layer, KDA + MoE and
  MLA + MoE, run at another place in each kind: blocks cut at them hold parts of two layers) (_realigned); and so is one
  in whose blocks the coarser one's input norm (the names that run in each of its blocks and once more after them, the
  final norm) mostly does not run (an eager MoE's expert loop, launched alike in every forward where each prefill routes
  its tokens to as many experts: every layer runs its norm, the loop's iterations none); every set of names that
  interleaves on a count proposes a partition (a rotary pair, twice in each attention layer of a conv / attention stack,
  cuts none; a mask copied once before the layers and once per MoE layer cuts a poor one): the valid one of the largest
  sets, and of those the one whose blocks run the most work in common, stands for it;
- the layers are the partition whose blocks run the most non-GEMM work in common (a norm that runs 2L+1 times does not
  make half-layers, _halves: paired into layers, a mixer's half and the MLP half after it, they stand where no other
  count partitions or counts as many, _paired; an eager MoE's expert groups do not make
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
- a count whose names run once more at the final norm (one input norm per layer: parallel attention + MLP) stands for
  the blocks before its last, which runs from the final norm to the forward's end (_before_final_norm), where no
  names count as many layers themselves; a finer count that explains clearly more of the forward than a coarser one
  stands for its layers though they share little (layers of three kinds: dense, sliding and NoPE full attention);
- where each layer begins and ends is steps.layer_bounds's reading; a layer so read that holds two blocks of
  one kind is re-cut by steps.residual_blocks;
- unlike layers (dense + MoE, sliding + full attention on different kernels) are kinds (steps.layer_kinds).
The input is a sequence of name ids per forward (normalised kernel names; a graph replay's kernels in replay order)."""


from __future__ import annotations

import re
from dataclasses import replace
from difflib import SequenceMatcher
from itertools import combinations

import numpy as np

from decodegap.ops.categories import categorize
from decodegap.ops.kernel_names import compiler_generated
from decodegap.steps.layer_blocks import (
    MAX_COUNTS_PER_NAME,
    MIN_BACKERS,
    Blocks,
    apart,
    before_every_cut,
    blocks_at,
    input_norm,
    interleaved,
    partition,
    per_layer_runs,
    runs_of,
    share_running,
)
from decodegap.steps.layer_bounds import NO_LAYERS, Layers, aligned, bounded_layers
from decodegap.steps.residual_blocks import residual_blocks
from decodegap.trace.tables import isin, unique

NEAR_EXPLAINED = 0.9  # a finer partition explaining this share of a coarser one's kernels may be its layers
FINER_COMMON = 0.5  # share of a finer partition's explained kernels that must run in all its blocks to be layers
ALIKE_LAYERS = 0.7  # how alike neighbouring layers of a hybrid group run at least, where no activation tells
PARTS_ALIKE = 0.4  # ... at least, where an activation counts them: below, a layer's parts (an extra block and the rest)
KINDS_ALIKE = 0.9  # share of a mixer split's kernels (GEMMs aside) run in every layer of its kind (_common_by_kind)
# An MLP's activation (eager, Inductor-fused and engine kernels name it): every layer runs its own MLP or experts
ACTIVATION = re.compile(r"silu|gelu|swiglu|geglu|act_and_mul|relu|swish", re.IGNORECASE)


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
    candidates: list[Blocks] = []
    open_ended: list[Blocks] = []
    for c, group in by_count.items():
        if len(group) < MIN_BACKERS or c * 2 > len(seq):
            continue
        # The sets of names that interleave on the count propose partitions, the sets with the most names first;
        # the first valid one stands for the count (a rotary pair runs twice in each attention layer of a conv /
        # attention stack: no partition), and among sets as large, the one whose blocks run the most work in common
        # (a mask copied once before the layers and once in each MoE layer, as often as the attention kernel runs).
        proposed = [_before_final_norm(partition(backers, positions, len(ids), gemm, gemm_at), positions, len(ids),
                                       gemm, gemm_at, act_at)
                    for backers in apart(interleaved(group, positions))]
        valid = [b for b in proposed if b.valid] or [b for b in proposed if b.open_ended]
        if valid:
            (candidates if valid[0].valid else open_ended).append(max(valid, key=lambda b: (len(b.backers), b.common)))
    # A count read before the final norm (_before_final_norm) stands only where no names count as many layers
    # themselves (they tell where each begins better than the norm's kernels and what runs before the first).
    direct = {b.count for b in candidates if len(positions[b.backers[0]]) == b.count}
    candidates = [b for b in candidates if len(positions[b.backers[0]]) == b.count or b.count not in direct]
    # Halves of layers (a norm before every mixer and every MLP, and the final norm) are no layers; paired (_paired),
    # they are, where no other count is a partition or counts as many (dense first layers before sliding and full MoE
    # layers, whose attention kernels count 7 and 3 of 10, and nothing else runs once in every layer).
    split = [(b, _halves(b, len(ids), act_at)) for b in candidates]
    candidates = [b for b, halves in split if not halves]
    paired = [_paired(b, positions, len(ids), gemm, gemm_at, act_at) for b, halves in split if halves]
    candidates += [b for b in paired if not candidates or (b.valid and b.count not in {c.count for c in candidates})]
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
    return residual_blocks(bounded_layers(best, ids, positions, names, gemm), ids, positions, names, gemm_at, act_at,
                           untelling)


def _before_final_norm(blocks: Blocks, positions: dict[int, np.ndarray], length: int, gemm: set[int],
                       gemm_at: np.ndarray, act_at: np.ndarray) -> Blocks:
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
    return blocks_at(blocks.cuts[:-1], blocks.backers, positions, length, gemm, gemm_at)


def _halves(blocks: Blocks, length: int, act_at: np.ndarray) -> bool:
    """Whether a partition's blocks are halves of layers: names that run before every mixer and every MLP run once
    more at the final norm (2L + 1 times), so every other block runs an MLP activation, and the last holds the final
    norm and the output head (short, no activation), with none before the first cut."""
    if blocks.count < 5 or blocks.count % 2 == 0 or not _last_cut_at_final_norm(blocks, length, act_at):
        return False
    held = unique(np.searchsorted(blocks.cuts, act_at, side="right") - 1)
    return len(held) == (blocks.count - 1) // 2 and bool(np.all(np.diff(held) == 2))


def _paired(blocks: Blocks, positions: dict[int, np.ndarray], length: int, gemm: set[int], gemm_at: np.ndarray,
            act_at: np.ndarray) -> Blocks:
    """Halves of layers (_halves) paired into layers: each layer from its mixer's half (the block before each one
    that runs an MLP activation), the final norm's block left to the tail."""
    held = unique(np.searchsorted(blocks.cuts, act_at, side="right") - 1)
    return replace(blocks_at(blocks.cuts[held - 1], blocks.backers, positions, length, gemm, gemm_at), halves=True)


def _last_cut_at_final_norm(blocks: Blocks, length: int, act_at: np.ndarray) -> bool:
    """Whether the last cut may be the final norm: no MLP activation (`act_at`) runs from it on, and what does is
    short (under half a typical block), and none runs before the first cut (cuts late in each layer leave layer 0's
    MLP before it: not at their norm)."""
    return bool(len(act_at) and act_at.max() < blocks.cuts[-1] and act_at.min() >= blocks.cuts[0]
                and length - blocks.cuts[-1] < 0.5 * np.median(np.diff(blocks.cuts)))


def _explains_as_much(blocks: Blocks, others: list[Blocks]) -> bool:
    """Whether `blocks` explains about as many kernels as every coarser partition of `others`."""
    return all(blocks.explained >= NEAR_EXPLAINED * o.explained for o in others if o.count < blocks.count)


def _realigned(blocks: Blocks, others: list[Blocks], ids: np.ndarray, positions: dict[int, np.ndarray],
               gemm: set[int], gemm_at: np.ndarray, act_at: np.ndarray) -> Blocks:
    """The partition cut where its layers begin (aligned), where its own cuts explain clearly fewer kernels than a
    coarser count's: names that count layers of several kinds run at another place in each kind (a dense first layer,
    linear-attention and MLA layers), so blocks cut at them hold parts of two layers and the names' runs per block
    vary; cut where each layer begins, they run a fixed number of times in each. Unchanged where that explains no
    more."""
    if _explains_as_much(blocks, others):
        return blocks
    starts = aligned(blocks, ids, positions, blocks.cuts.copy(), gemm)
    if np.array_equal(starts, blocks.cuts) or (np.diff(starts) <= 0).any():
        return blocks
    moved = blocks_at(starts, blocks.backers, positions, len(ids), gemm, gemm_at, kinds=MAX_COUNTS_PER_NAME + 1)
    whole = share_running(moved.bounds, act_at) == 1
    if not (moved.valid and whole and _explains_as_much(moved, others)):
        return blocks  # every layer runs its MLP (a half cut at its norm does not)
    # Layers cut where they begin run alike, neighbour after neighbour, but at a seam between kinds; halves of layers
    # (a mixer, then its MLP) take turns and share little.
    return replace(moved, begun=True) if _alike_neighbours(moved, ids, positions, gemm) >= ALIKE_LAYERS else blocks


def _leaves_out_first(blocks: Blocks, others, act_at: np.ndarray) -> bool:
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


def _merges(coarse: Blocks, fine: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
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


def _loop_in(coarse: Blocks, fine: Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> bool:
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


def _finer(best: Blocks, candidates: list[Blocks], ids: np.ndarray, positions: dict[int, np.ndarray],
           gemm: set[int], act_at: np.ndarray) -> Blocks:
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


def _alike(coarse: Blocks, fine: Blocks, positions: dict[int, np.ndarray]) -> bool:
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


def _taking_turns(blocks: Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> int:
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


def _mixed(best: Blocks, candidates: list[Blocks], kept: list[Blocks], ids: np.ndarray,
           positions: dict[int, np.ndarray], lone: dict[int, np.ndarray], gemm: set[int], gemm_at: np.ndarray,
           act_at: np.ndarray, act: set[int], fused: set[int]) -> Blocks:
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
    # else `best` cuts halves (an attention part runs no MLP); the last layer runs to the forward's end here (an MoE
    # layer after dense ones reaches its experts' activation past a typical block's length)
    whole = share_running(np.append(best.bounds[:-1], len(ids)), act_at) == 1
    per_layer = per_layer_runs(ids, positions)
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
                split = blocks_at(cuts, coarse.backers, positions, len(ids), gemm, gemm_at, mixers, per_layer)
            if ((split.count > best.count or not whole) and split.valid and share_running(split.bounds, act_at) == 1
                    and (split.common >= FINER_COMMON * split.beside_gemm
                         or _common_by_kind(split, runs, gemm, fused) >= KINDS_ALIKE * split.beside_gemm)):
                splits.append(split)
    # As among partitions: the layers run the most work in common (a split of a layer's halves runs less).
    return max(splits, key=lambda b: (b.common, b.count), default=best)


def _common_by_kind(split: Blocks, runs: dict[int, np.ndarray], gemm: set[int], fused: set[int]) -> int:
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


def _in_turn(blocks: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
             gemm_at: np.ndarray, act_at: np.ndarray) -> Blocks:
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
    per_layer = per_layer_runs(ids, positions)
    for k in range(1, len(runs)):  # the first k names' runs, then the others', in every block
        a_end, b_at, b_end = runs[:k].max(axis=0), runs[k:].min(axis=0), runs[k:].max(axis=0)
        if not (a_end < b_at).all():
            continue
        cuts = np.sort(np.concatenate((first, b_at)))
        split = blocks_at(cuts, backers[:k], positions, len(ids), gemm, gemm_at, tuple(backers[k:]), per_layer)
        nexts = np.append(first[1:], len(ids))
        if (split.valid and share_running(split.bounds, act_at) == 1
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


def _inside_some_blocks(blocks: Blocks, runs: dict[int, np.ndarray], gemm: set[int], at: np.ndarray,
                        seq: np.ndarray) -> list[tuple[tuple[int, ...], np.ndarray, set[int]]]:
    """Groups of names (GEMM tiles aside: the tile tells no layer) that run alike (as often in the same blocks) in a
    proper subset of the blocks and nowhere else; per group its names, where each of its runs begins, and every name
    that runs in just its blocks (however often: the other mixer's own). A run before the first block or after the
    last (a lone layer of the other kind at either end of the stack) counts where it lies between the layers' input
    norms (_inside_layers); runs there are alike when no per-layer kernel runs between them.
    `at`, `seq`: where the per-layer names run, and which (per_layer_runs)."""
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


def _inside_layers(xs: np.ndarray, blocks: Blocks, at: np.ndarray, seq: np.ndarray, gemm: set[int]) -> bool:
    """Whether the positions `xs`, before the first block or after the last, lie among the layers: after a run of
    their input norm (input_norm: a mixer's own kernels may come between the norm and the cut), and, after the
    last block, before one (the final norm). The glue before the layers (the embedding) follows no norm; the output
    head and sampling precede none. The norm's latter half stands for it: what runs before every cut may begin with
    the previous layer's residual add, which the first layer, after the embedding, lacks."""
    i, head = before_every_cut(blocks.cuts, at, seq)
    norm = input_norm(seq[i[0] - head:i[0]], gemm)
    if len(norm) < 2:
        return False
    norm = norm[-max(2, (len(norm) + 1) // 2):]
    found = runs_of(norm, seq)  # where each run of the norm begins, among the per-layer kernels
    if not len(found):
        return False
    first_end, last_start = int(at[found[0] + len(norm) - 1]), int(at[found[-1]])
    before = xs < blocks.cuts[0]
    return bool((xs[before] > first_end).all() and (xs[~before] < last_start).all())


def _whole(coarse: Blocks, fine: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int],
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
    if share_running(coarse.bounds, act_at) == 1:
        # The last finer block runs to the forward's end: its length is a typical block's guess, and a last layer of
        # another kind runs longer (an MoE layer after dense ones reaches its experts' activation late); what follows
        # the layers (the final norm, the output head) runs no activation, and an attention half is never last.
        return share_running(np.append(fine.bounds[:-1], len(ids)), act_at) == 1
    return _alike_neighbours(fine, ids, positions, gemm) >= ALIKE_LAYERS


def _alike_neighbours(blocks: Blocks, ids: np.ndarray, positions: dict[int, np.ndarray], gemm: set[int]) -> float:
    """How alike neighbouring blocks run (the median matching share of their per-layer kernel sequences, GEMMs as one
    name): layers of two kinds differ in a few kernels (the attention kernel), a layer's halves in most."""
    per_layer = isin(ids, np.fromiter(positions, dtype=np.int64))
    names = np.where(isin(ids, np.fromiter(gemm, dtype=np.int64, count=len(gemm))), -1, ids)
    cuts = blocks.cuts.tolist()
    runs = [names[lo:hi][per_layer[lo:hi]].tolist() for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    shares = [SequenceMatcher(None, a, b, autojunk=False).ratio() for a, b in zip(runs[:-1], runs[1:], strict=True)]
    return float(np.median(shares)) if shares else 1.0


def _own_work_share(blocks: Blocks, positions: dict[int, np.ndarray], gemm: set[int]) -> float:
    """Share of the blocks that run per-layer work not every block runs (GEMM tiles aside)."""
    c = blocks.count
    own = np.zeros(c, dtype=bool)
    for n, (_, m, _, _) in blocks.periodic.items():
        if m < c and n not in gemm:
            block = np.searchsorted(blocks.bounds, positions[n], side="right") - 1
            own[block[(block >= 0) & (block < c)]] = True
    return float(own.mean())

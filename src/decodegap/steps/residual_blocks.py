"""Layers re-cut at their residual blocks (steps.layers reads the layers first):
- where a layer so read holds two blocks of one kind, a block being what runs from one run of the input norm (what
  every layer begins with before its first projection) to the next, projecting in and out, the blocks are the layers
  (Nemotron-H: Mamba, MLP, Mamba, attention, MLP, each block one norm, one mixer or MLP, one residual add), or pairs
  of them where their kinds take turns between a mixer's, which runs no MLP activation, and an MLP's
  (residual_blocks); blocks before the first layer are a layer's where the norm runs there without its first
  kernel, the residual add that ends the layer before (layers aligned by what they run alike begin with it, so a first
  layer of its own kind, after the embedding, passed for glue: a dense layer before groups of MoE layers)
  (_blocks_before)."""

from __future__ import annotations

import numpy as np

from decodegap.steps.layer_blocks import (
    per_layer_runs,
    runs_of,
)
from decodegap.steps.layer_bounds import Layers, head_norm
from decodegap.steps.layer_kinds import describe_kinds, layer_kinds
from decodegap.trace.tables import isin


def residual_blocks(found: Layers, ids: np.ndarray, positions: dict[int, np.ndarray], names: list[str] | None,
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
    at, seq = per_layer_runs(ids, positions)
    starts = np.array(found.starts, dtype=np.int64)
    norm = head_norm(seq, np.searchsorted(at, starts), names)
    if len(norm) < 2:
        return found
    lo, hi = np.searchsorted(at, [starts[0], found.end])
    norm_runs = lo + runs_of(norm, seq[lo:hi])
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
    layer; none otherwise. Every block then begins past the add (residual_blocks)."""
    none = np.empty(0, dtype=np.int64)
    if lo == 0 or len(norm) < 3 or not len(begins):
        return none
    first = [r for r in runs_of(norm[1:], seq[:lo]).tolist() if r == 0 or seq[r - 1] != norm[0]]
    if not first:
        return none
    begin = first[-1]  # the last: an embedding norm on the same kernels runs before it
    later = runs_of(norm, seq[begin:lo]) + begin
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

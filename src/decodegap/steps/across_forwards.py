"""What the other forwards of a model tell about one forward's layers (steps.layers reads a forward alone): which
kernel names run a data-dependent number of times (an eager MoE layer's expert loop), whether another forward runs the
names that counted the layers once per layer, and, where a phase has one forward, what its other phases' forwards
bear out: the count (an expert loop read as layers; a compiled prefill fused otherwise contradicts nothing) and the
kinds (a kind's own names run in the same layers in every forward)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from decodegap.steps.layers import Layers, count_layers

MOST_NAMES = 0.8  # a forward that runs more of this share of the names forwards repeat runs a second stack


def data_independent(forwards: list[np.ndarray]) -> set[int] | None:
    """Names that run equally often in every forward given (None: one forward, nothing to compare)."""
    if len(forwards) < 2:
        return None
    counts = [Counter(f.tolist()) for f in forwards]
    names = set(counts[0]).intersection(*counts[1:])
    return {n for n in names if len({c[n] for c in counts}) == 1}


def data_dependent(forwards: list[np.ndarray], least_counts: int = 2) -> set[int]:
    """Names whose count differs between forwards that run them (an eager MoE layer's per-expert launches): they run
    `least_counts` or more different numbers of times; names only some forwards run (a prefill's attention kernel)
    are not counted against."""
    seen: dict[int, set[int]] = {}
    for f in forwards:
        for n, c in Counter(f.tolist()).items():
            seen.setdefault(n, set()).add(c)
    return {n for n, c in seen.items() if len(c) >= least_counts}


def second_stacks(forwards: list[np.ndarray]) -> list[bool]:
    """Per forward, whether it runs more of nearly every name the forwards repeat (a median count of 2 or more) than
    most forwards do: a second stack of blocks on the model's kernels (a VLM prefill's vision tower), not
    launches that depend on the data (an eager MoE's expert loop varies its experts' names only; the attention and
    norms run once per layer in every forward)."""
    if len(forwards) < 2:
        return [False] * len(forwards)
    counts = [Counter(f.tolist()) for f in forwards]
    names = set().union(*counts)
    median = {n: float(np.median([c[n] for c in counts])) for n in names}
    repeated = [n for n in names if median[n] >= 2]
    if not repeated:
        return [False] * len(forwards)
    return [sum(c[n] > median[n] for n in repeated) >= MOST_NAMES * len(repeated) for c in counts]


def without_second_stacks(forwards: list[np.ndarray]) -> list[np.ndarray]:
    """The forwards but those that run a second stack of blocks (second_stacks)."""
    kept = [f for f, more in zip(forwards, second_stacks(forwards), strict=True) if not more]
    return kept or forwards


def runs_once_per_layer(seq: np.ndarray, found: Layers) -> bool:
    """Whether a forward (`seq`: its name ids) runs the names that counted `found`'s layers once per layer (of their
    kind, in a hybrid's mixer split): every one it runs, and at least half of them (a forward of another phase may
    run a kernel of its own in place of one). The same model's forwards run the same layers, so a forward that reads
    another count on its own (an eager MoE prefill, routing its tokens to every expert) still runs them so."""
    ran = _backers_run(seq, found)
    return ran is not None and all(r == (found.backer_runs or found.count) for r in ran)


def runs_once_per_layer_beside_another_stack(seq: np.ndarray, blocks: np.ndarray, found: Layers) -> bool:
    """Whether a forward (`seq`: its name ids, `blocks`: the thread blocks each launched) runs the names that counted
    `found`'s layers once per layer on one launch grid each, and as many more times as one another on other grids: a
    second stack of blocks over other tokens, on the model's own kernels (a VLM prefill's vision tower over the
    image's patches, an encoder folded into a forward), not more layers. A name whose grid does not follow the tokens
    (one block per head) runs the two stacks on one grid, as often as the others together, where at least one other
    name shows them apart. The two stacks differ in depth: a piece holding two of the model's forwards (a prefill and a
    decode, on two grids) runs both as deep, and does not count."""
    want = found.backer_runs or found.count
    ran = _backers_run(seq, found)
    if ran is None or not want:
        return False
    extra, apart = set(), False
    for name in found.backers:
        grids = Counter(blocks[seq == name].tolist())
        if not grids:
            continue
        if 0 in grids or (want not in grids.values() and len(grids) > 1):
            return False
        apart |= len(grids) > 1
        extra.add(sum(grids.values()) - want)
    return apart and len(extra) == 1 and extra.pop() not in (0, want)


def runs_otherwise(seq: np.ndarray, found: Layers) -> bool:
    """Whether a forward (`seq`) runs at least half of the names that counted `found`'s layers, not all of them once
    per layer: another forward of the model that contradicts the count (an eager MoE's expert loop, read as layers,
    runs as often as experts got tokens). One that runs fewer of them (a compiled prefill, its kernels fused
    otherwise than a decode's) tells nothing of it."""
    ran = _backers_run(seq, found)
    return ran is not None and any(r != (found.backer_runs or found.count) for r in ran)


def _backers_run(seq: np.ndarray, found: Layers) -> list[int] | None:
    """How often a forward runs each of the names that counted `found`'s layers that it runs; None where it runs
    fewer than half of them (or `found` has none), which tells nothing of the count."""
    if found.count is None or not found.backers:
        return None
    runs = Counter(seq.tolist())
    ran = [runs[n] for n in found.backers if runs[n]]
    return ran if 2 * len(ran) >= len(found.backers) else None


def layers_beside_other_phases(seq: np.ndarray, others: list[np.ndarray], names: list[str] | None,
                               found: Layers | None = None) -> Layers:
    """The layers of a forward that is the one of its phase (`seq`), told by forwards of other phases (`others`);
    `found`: count_layers(seq, names), where already read. One forward tells nothing varies: every layer of the other
    phases' forwards runs the names that count the layers as often, an expert loop's iterations (read as more layers)
    do not. Left out where they vary between the phases, they count fewer layers, run once per layer in another
    phase's forward (where they count as many, the reading with every name stands: more names set its layers' bounds,
    a hybrid's shared block in the layer it begins). A forward that runs few of them (a compiled prefill, fused
    otherwise) contradicts nothing, and where it reads as many layers on its own, it bears the count out. Nor does one
    forward tell a kind's names from those an expert loop ran by chance: the other phases' forwards do
    (kinds_agreed)."""
    found = found if found is not None else count_layers(seq, names)
    varying = data_dependent([seq, *others])
    borne_out = any(runs_once_per_layer(o, found) for o in others) or (
        not any(runs_otherwise(o, found) for o in others)
        and found.count is not None and any(count_layers(o, names).count == found.count for o in others))
    left_out: frozenset[int] | set[int] = frozenset()
    if not borne_out:
        apart = count_layers(seq, names, varying=varying)
        if apart.count is not None and (found.count is None or apart.count < found.count) and any(
                runs_once_per_layer(o, apart) for o in others):
            found, left_out = apart, varying
    untelling = kinds_agreed(found, seq, others, names, varying)
    return count_layers(seq, names, varying=left_out, untelling=untelling) if untelling else found


def kinds_agreed(found: Layers, seq: np.ndarray, others: list[np.ndarray], names: list[str] | None,
                 varying: set[int] | None = None) -> frozenset[int]:
    """Names that run in other layers in another forward of the model than in `found`'s (of `seq`), where that
    forward reads as many layers: they tell no kind. With one forward of a phase nothing tells a name an eager MoE
    layer's expert loop ran by chance (another index kernel where an expert got one token) from one a kind of layer
    runs; a kind's own names (a router in the MoE layers, a shared block) run in the same layers in every forward.
    The two readings may set the layers' bounds a layer apart at a kind's own block (Zamba's shared attention block,
    taken as the end of the layer before it in a prefill): the layers of the other forward are compared shifted by
    the offset (0 or one layer either way) under which the most names run in the same layers.
    `varying`: data_dependent over `seq` and `others`, where already known."""
    if found.count is None or len(found.kinds) < 2:
        return frozenset()
    varying = data_dependent([seq, *others]) if varying is None else varying
    mine = _held_by(seq, found)
    untelling: set[int] = set()
    for other in others:
        theirs_found = count_layers(other, names, varying=varying)
        if theirs_found.count != found.count:
            continue
        theirs = _held_by(other, theirs_found)
        common = mine.keys() & theirs.keys()
        shifted = max(((_shift(theirs, d, found.count), d) for d in (0, 1, -1)),
                      key=lambda t: (sum(mine[n] == t[0][n] for n in common), t[1] == 0))[0]
        untelling |= {n for n in common if mine[n] != shifted[n]}
    return frozenset(untelling)


def _shift(held: dict[int, frozenset[int]], by: int, layers: int) -> dict[int, frozenset[int]]:
    """Each name's layers moved `by` layers, those moved past either end left out, unless it runs in every layer."""
    every = frozenset(range(layers))
    return {n: j if j == every else frozenset(i + by for i in j if 0 <= i + by < layers) for n, j in held.items()}


def _held_by(seq: np.ndarray, found: Layers) -> dict[int, frozenset[int]]:
    """Per name, the layers of `found` that run it."""
    bounds = np.append(np.array(found.starts, dtype=np.int64), found.end)
    lo, hi = int(bounds[0]), min(int(bounds[-1]), len(seq))
    layer = np.searchsorted(bounds, np.arange(lo, hi), side="right") - 1
    held: dict[int, set[int]] = {}
    for n, j in zip(seq[lo:hi].tolist(), layer.tolist(), strict=True):
        held.setdefault(n, set()).add(j)
    return {n: frozenset(j) for n, j in held.items()}

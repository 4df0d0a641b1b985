"""Forwards of a smaller model between the steps: a draft model's (assisted generation, speculative decoding), whose
forwards propose tokens that one forward of the served model then checks. They are not steps of that model: left
out, they would read as extra prefills or decodes and mix a 2-layer model's kernels into a 60-layer model's.

A draft runs the served model's per-layer kernels (same family, same kernels) in fewer layers. Read from the
shortest forward between others: the names that count its layers run there once per layer; in each of the served
model's forwards they run a common larger number of times, every layer on one launch grid (one stack of layers over
the same tokens: a vision tower or an encoder folded into a prefill launches its blocks on other grids); every
forward between the first and last is one or the other, and all end in an output (they propose or check tokens; an
encoder's forward ends in none); and a forward of the served model reads as many layers itself. Another phase of
one model is none of this: its prefill runs the decode's attention and norms once per layer too."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from decodegap.steps.layers import count_layers

SHORTER = 0.75  # a forward this much shorter than the longest may be a smaller model's
SAME_LAYERS = 0.3  # share of its repeated names a shorter forward runs as often as the longest: one model's layers


@dataclass(frozen=True)
class Drafts:
    forwards: frozenset[int]  # indices into the forwards given
    layers: int  # the draft model's
    of: int  # how often its layer-counting names run in each of the served model's forwards


def draft_forwards(forwards: list[np.ndarray], names: list[str], blocks: list[np.ndarray],
                   outputs: list[bool] | None) -> Drafts | None:
    """The draft forwards, or None. `forwards`: a normalised name id per GPU activity of each forward; `blocks`: the
    thread blocks each launched (0 unknown); `outputs`: whether each runs an output head or samples (None: the trace
    does not tell). At least two drafts, one between two forwards of the served model."""
    if len(forwards) < 3:
        return None
    lengths = [len(f) for f in forwards]
    shortest = min(range(1, len(forwards) - 1), key=lambda i: lengths[i])
    longest = int(np.argmax(lengths))
    if lengths[shortest] >= SHORTER * lengths[longest] or _same_layers(forwards[shortest], forwards[longest]):
        return None
    draft = count_layers(forwards[shortest], names)
    if draft.count is None or not draft.backers:
        return None
    runs = [_runs(f, draft.backers) for f in forwards]
    small = runs[shortest]
    larger = Counter(r for r in runs if r is not None and r > small)
    if small is None or not larger:
        return None
    of = larger.most_common(1)[0][0]
    drafts = frozenset(i for i, r in enumerate(runs) if r == small)
    served = [i for i, r in enumerate(runs) if r == of]
    interior = range(1, len(forwards) - 1)
    if (len(drafts) < 2 or not any(served[0] < i < served[-1] for i in drafts)
            or any(i not in drafts and runs[i] != of for i in interior)
            or outputs is not None and not all(outputs[i] for i in interior)
            or not all(_one_stack(forwards[i], blocks[i], draft.backers) for i in served)):
        return None
    # The served model reads its layers itself from one of its forwards, as many as those names say (an eager MoE
    # decode whose expert loop reads as layers, 15 where another's reads 16, is no draft of it)
    own = count_layers(forwards[min(served, key=lambda i: lengths[i])], names)
    if own.count is None or own.count * small != of * draft.count:
        return None
    return Drafts(drafts, draft.count, of)


def _same_layers(short: np.ndarray, long: np.ndarray) -> bool:
    """Whether many names the shorter forward runs more than once run as often in the longer: the same layers (an
    eager MoE decode beside its prefill, which only runs its expert loop more: 47-61% of them in the corpus), no
    smaller model (17% in a real assisted generation). A cheap look before reading any layers."""
    a, b = Counter(short.tolist()), Counter(long.tolist())
    repeated = [n for n, c in a.items() if c > 1]
    return len(repeated) > 0 and sum(a[n] == b[n] for n in repeated) >= SAME_LAYERS * len(repeated)


def _runs(seq: np.ndarray, backers: tuple[int, ...]) -> int | None:
    """How often each of `backers` that `seq` runs runs there, where all run equally often, else None (a decode's
    attention kernel is not a prefill's: the names of another phase are left out)."""
    counts = Counter(seq.tolist())
    runs = {counts[b] for b in backers if counts[b]}
    return runs.pop() if len(runs) == 1 else None


def _one_stack(seq: np.ndarray, blocks: np.ndarray, backers: tuple[int, ...]) -> bool:
    """Each of `backers` launches all its runs in the forward on one grid, and the trace says so (a trace without
    launch grids, as ROCm's often are, cannot tell a served model's layers from a prefill's two stacks)."""
    shown = False
    for b in backers:
        grids = set(blocks[seq == b].tolist())
        if len(grids) > 1 or 0 in grids:
            return False
        shown = shown or bool(grids)
    return shown

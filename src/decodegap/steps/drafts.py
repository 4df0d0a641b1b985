"""Forwards of a smaller model between the steps: a draft model's (assisted generation, speculative decoding), whose
forwards propose tokens that one forward of the served model then checks. They are not steps of that model: left
out, they would read as extra prefills or decodes and mix a 2-layer model's kernels into a 60-layer model's.

A draft forward runs the same per-layer kernels as the served model's (same family, same kernels), only in fewer
layers: every name that counts the long forward's layers runs fewer times, and equally often, in it. A forward of
another phase of the same model does not: its attention and norm kernels run in every layer (an eager MoE prefill's
expert loop reads more layers, but the names that count the decode's still run once per layer there)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from decodegap.steps.layers import count_layers

SHORTER = 0.75  # a forward this much shorter than the longest may be a smaller model's


@dataclass(frozen=True)
class Drafts:
    forwards: frozenset[int]  # indices into the forwards given
    layers: int  # the draft model's
    of: int  # the served model's


def draft_forwards(forwards: list[np.ndarray], names: list[str]) -> Drafts | None:
    """The forwards (`forwards`: a normalised name id per GPU activity of each) of a smaller model, or None. Read
    from the longest forward's layers and the shortest interior one's; at least two drafts, one between two
    forwards of the served model: a forward cut at the capture's edge is none."""
    if len(forwards) < 3:
        return None
    lengths = [len(f) for f in forwards]
    longest = int(np.argmax(lengths))
    shortest = min(range(1, len(forwards) - 1), key=lambda i: lengths[i])
    if lengths[shortest] >= SHORTER * lengths[longest]:
        return None
    served = count_layers(forwards[longest], names)
    if served.count is None or not served.backers:
        return None
    of = served.backer_runs or served.count
    small = _runs(forwards[shortest], served.backers)
    if small is None or not 1 <= small < of:
        return None
    # The draft reads as many layers itself (one, where it has none to count): the served model's per-layer names
    # run once in each of its layers, not an eager MoE's expert loop read as a prefill's layers, run a few times
    # in a decode
    if count_layers(forwards[shortest], names).count != (small if small > 1 else None):
        return None
    drafts = frozenset(i for i, f in enumerate(forwards) if _runs(f, served.backers) == small)
    own = [i for i in range(len(forwards)) if i not in drafts]
    if len(drafts) < 2 or not own or not any(own[0] < i < own[-1] for i in drafts):
        return None
    return Drafts(drafts, small, served.count)


def _runs(seq: np.ndarray, backers: tuple[int, ...]) -> int | None:
    """How often each of `backers` that `seq` runs runs there, where all run equally often, else None (a decode's
    attention kernel is not a prefill's: the names of another phase are left out)."""
    counts = Counter(seq.tolist())
    runs = {counts[b] for b in backers if counts[b]}
    return runs.pop() if len(runs) == 1 else None

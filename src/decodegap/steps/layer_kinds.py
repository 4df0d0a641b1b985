"""Layer kinds, given the layers' bounds (steps.layers): unlike layers (dense + MoE, sliding + full attention on
different kernels) are kinds. Layers with the same set of the names that recur per layer (present in more than a
quarter of the layers, or in fewer but nowhere outside the layers: a lone full-attention layer's own cache copy) are
one kind, but for the coarser count's names that alike layers run in every few of them (steps.layers._alike: the mask
Inductor fuses into every 4th layer tells no kind); one line per kind. A last layer shorter than every other is
taken as cut off (of a kind that runs all it runs) only where no final norm ended it. Which GEMM tile ran tells no
kind (cuBLAS picks it by shape), nor do the kernels a compiler fused into an edge layer with the once-per-forward
work, or into the first layer of a kind that uses it (the rotary tables in the first attention layer of a conv /
attention stack: a lone layer a name or two off a kind only later layers run), or across a seam between kinds (the
delta-net layer before a full-attention one: a lone layer beside another kind, a name or two off a kind)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from decodegap.ops.categories import categorize
from decodegap.ops.kernel_names import compiler_generated

EDGE_FUSED_NAMES = 2  # names an edge layer may differ by from its neighbour and still be of its kind
CUT_OFF = 0.9  # a last layer's block under this share of the shortest other layer was cut off by the forward's tail
KIND_PRESENCE = 0.25  # a name tells kinds apart only when more than this share of the layers runs it


@dataclass(frozen=True)
class LayerKind:
    count: int
    markers: tuple[str, ...]  # kernels that only this kind of layer runs


def layer_kinds(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, positions: dict[int, np.ndarray],
                names: list[str] | None, whole_last: bool = False,
                alike: set[int] = frozenset()) -> tuple[list[LayerKind], list[int]]:
    """The kinds of the layers between `starts` and `ends`, and each layer's; `alike`: names that tell no kind (a
    coarser count's in alike layers, _finer)."""
    n_layers = len(starts)
    # The GEMM library picks its tile by the shape it gets (an expert's token count), so which GEMM kernel a layer's
    # loop ran tells no layer kind from another: the GEMMs a layer runs more than once count as one name here (a dense
    # MLP's own GEMMs, once per layer, still tell it from an MoE layer).
    ran = [frozenset(ids[lo:hi].tolist()) for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True)]
    looped = {int(n) for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True)
              for n, k in Counter(ids[lo:hi].tolist()).items() if k > 1}
    gemm = {n for n in positions if n in looped and names and categorize(names[n]) == "gemm"}
    one_gemm = min(gemm, default=-1)
    present = [frozenset(one_gemm if n in gemm else n for n in r) for r in ran]
    # The names that recur per layer (run at least twice in the forward) and are run by enough of its layers.
    share = Counter(n for s in present for n in s if n in positions)
    # A name fewer layers run tells their kind too when it runs nowhere else in the forward (a full-attention layer's
    # own cache copy); one the once-per-forward work also runs (an arange, a cast) may be glue a layer's edge took in.
    inside = np.zeros(len(ids), dtype=bool)
    inside[int(starts[0]):int(ends[-1])] = True
    own = {n for n in share if inside[positions[n]].all()}
    telling = {n for n, k in share.items()
               if (KIND_PRESENCE * n_layers < k or n in own) and k < n_layers and n not in alike}
    signatures = [s & telling for s in present]
    # The first and last layer border the once-per-forward work, which compilers and engines fuse into them (the
    # embedding with the first norm): a lone edge layer a name or two off its neighbour is that neighbour's kind.
    edges = (0, n_layers - 1)
    for edge in edges:
        # a kind only the edge layers have (both edges fused alike counts too)
        if n_layers < 3 or any(sig == signatures[edge] for i, sig in enumerate(signatures) if i not in edges):
            continue
        others = [sig for i, sig in enumerate(signatures) if sig != signatures[edge] and i not in edges]
        closest = min(others, key=lambda sig: len(sig ^ signatures[edge]), default=None)
        if closest is None or len(closest ^ signatures[edge]) > EDGE_FUSED_NAMES:
            continue
        if names and all(compiler_generated(names[n]) for n in closest ^ signatures[edge]):  # only a compiler fuses
            signatures[edge] = closest
    # A compiler also fuses once-per-forward work into the first layer that uses it (the rotary table into the first
    # attention layer of a conv / attention stack): a lone layer a name or two off a kind that only later layers run,
    # all of those names compiler-generated, is of that kind.
    # So does a layer beside one of another kind (the seam, where a compiler fuses the end of one layer into the start
    # of the next: the linear-attention layer before a full-attention one): a lone layer there a name or two off a
    # kind, all compiler-generated, is of that kind.
    for i in range(1, n_layers - 1):
        if names is None or any(sig == signatures[i] for j, sig in enumerate(signatures) if j != i):
            continue
        later = [sig for j, sig in enumerate(signatures) if j > i and all(signatures[h] != sig for h in range(i))]
        near = [sig for sig in signatures if sig != signatures[i] and len(sig ^ signatures[i]) <= EDGE_FUSED_NAMES]
        seam = [sig for sig in near if any(signatures[j] not in (sig, signatures[i]) for j in (i - 1, i + 1))]
        closest = min(later + seam, key=lambda sig: len(sig ^ signatures[i]), default=None)
        if (closest is not None and len(closest ^ signatures[i]) <= EDGE_FUSED_NAMES
                and all(compiler_generated(names[n]) for n in closest ^ signatures[i])):
            signatures[i] = closest
    # The last layer's block runs into the once-per-forward tail; when it is shorter than every other layer it was
    # cut off there (the cuts sit inside the layers) and shows only part of its kind: a kind that runs all it runs.
    # Not where it ends at the final norm (`whole_last`): it is whole, of a lighter kind (a lone attention layer
    # after Mamba ones).
    lengths = ends - starts
    wider = [sig for sig in signatures[:-1] if sig > signatures[-1]]
    if (not whole_last and n_layers >= 3 and lengths[-1] < CUT_OFF * lengths[:-1].min()
            and signatures.count(signatures[-1]) == 1 and wider):
        signatures[-1] = min(wider, key=len)
    index: dict[frozenset, int] = {}
    kind_of = [index.setdefault(sig, len(index)) for sig in signatures]
    kinds = []
    for k in range(len(index)):
        mine = [ran[i] for i in range(n_layers) if kind_of[i] == k]
        theirs = [ran[i] for i in range(n_layers) if kind_of[i] != k]
        own = frozenset.intersection(*mine) - frozenset().union(*theirs) if theirs else frozenset()
        first_at = {n: int(np.flatnonzero(ids == n)[0]) for n in own}
        labels = tuple(names[n] if names else str(n) for n in sorted(own, key=first_at.get)[:4])
        kinds.append(LayerKind(len(mine), labels))
    return kinds, kind_of


def describe_kinds(kinds: list[LayerKind]) -> str:
    def label(kind: LayerKind) -> str:
        return ", ".join(short(m) for m in kind.markers) if kind.markers else "the common kernels only"

    return f"{len(kinds)} kinds of layer: " + "; ".join(f"{kind.count} with {label(kind)}" for kind in kinds)


def short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[:limit - 3] + "..."

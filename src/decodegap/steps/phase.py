"""What a step is: decode, prefill or mixed (from the tokens its ops see), and whether the trace is training at all.

Evidence, best first: the step's annotation (an engine says DECODE/EXTEND); the attention op's query length against
its KV length (1 query token per sequence = decode); the rows the projection GEMMs see against the decode batch."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from decodegap.ops import shapes as shape_info
from decodegap.ops.categories import is_backward
from decodegap.steps.across_forwards import data_dependent
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace, group_rows, isin, unique

# Autograd and optimizer work exist only when a model trains.
_TRAINING_OP = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$|^Optimizer\.(step|zero_grad)#|"
                          r"^## (backward|optimizer) ##$|^optimizer\.step|^torch::autograd::")
BACKWARD_KERNEL_SHARE = 0.05  # of GPU activities: more than a stray reduction kernel named *_backward

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_scaled_mm",
                      "aten::_addmm_activation"})
# SDPA family: q is [batch, heads, seq, dim] (the entry points, and cuDNN's kernel op under them, the innermost op that
# launches); the flash / efficient *_attention_forward ops take [batch, seq, heads, dim].
_SDPA = re.compile(r"^aten::(_scaled_dot_product_\w*attention\w*|scaled_dot_product_attention"
                   r"|_cudnn_attention_forward)$")
_ATTENTION_FORWARD = re.compile(r"^aten::_(flash|efficient)_attention_forward$")


def is_training(trace: Trace) -> bool:
    names = trace.names
    op_names = {names[i] for i in unique(trace.cpu_ops.name_id).tolist()} if len(trace.cpu_ops.name_id) else set()
    op_names |= {a.name for a in trace.annotations}
    if any(_TRAINING_OP.search(n) for n in op_names):
        return True
    gpu = trace.gpu
    if not len(gpu):
        return False
    ids, counts = np.unique(gpu.name_id, return_counts=True)
    backward = sum(c for i, c in zip(ids.tolist(), counts.tolist(), strict=True) if is_backward(names[i]))
    return backward >= BACKWARD_KERNEL_SHARE * len(gpu)


@dataclass(frozen=True)
class StepTokens:
    gemm_rows: int | None  # the most rows (tokens) a projection GEMM of the step sees
    query_len: int | None  # attention query tokens per sequence
    kv_len: int | None
    batch: int | None  # sequences, from the attention op
    head_rows: int | None = None  # rows of the widest GEMM (the lm_head over the vocabulary)


def _gemm_operands(name: str, shapes: list) -> tuple[list, list] | None:
    """(activation, weight) shapes of a GEMM op; addmm's first input is its bias."""
    if name == "aten::addmm" or name == "aten::_addmm_activation":
        return (shapes[1], shapes[2]) if len(shapes) >= 3 else None
    return (shapes[0], shapes[1]) if len(shapes) >= 2 else None


def _out_width(name: str, weight: list) -> int:
    # linear keeps the weight as [out, in]; mm / matmul / addmm multiply by [in, out]
    return int(weight[0]) if name == "aten::linear" else int(weight[-1])


def _distinct_ops(ops, op_rows: np.ndarray) -> tuple[list[tuple[int, bytes | None, bytes | None]], np.ndarray,
                                                         np.ndarray]:
    """The distinct (name id, input dims, input types) of CPU ops `op_rows`, how many of the rows have each, and per
    row its index among them: what an op's shapes say depends on these three only, so each is read once."""
    dims, types = ops.input_dims, ops.input_types
    names, dim_ids, type_ids = ops.name_id[op_rows], dims.ids[op_rows], types.ids[op_rows]
    first, which, counts = group_rows(names, dim_ids, type_ids)
    return ([(n, dims.values[d], types.values[t]) for n, d, t in
             zip(names[first].tolist(), dim_ids[first].tolist(), type_ids[first].tolist(), strict=True)], counts, which)


def step_tokens(trace: Trace, links: Links, rows: np.ndarray) -> StepTokens:
    ops = trace.cpu_ops
    op_rows = unique(links.op_idx[rows])
    op_rows = op_rows[op_rows >= 0]
    gemm, query, kv, batch, widths = [], [], [], [], []
    distinct, counts, _ = _distinct_ops(ops, op_rows)
    # max and median do not depend on the order of the ops, so each distinct op counts as often as it runs
    for (name_id, dims, types), count in zip(distinct, counts.tolist(), strict=True):
        if not dims:
            continue
        name = trace.names[name_id]
        shapes = [s for s, _ in shape_info.tensors(dims, types)]
        if not shapes or not shapes[0]:
            continue
        operands = _gemm_operands(name, shapes) if name in GEMM_OPS else None
        if operands is not None and len(operands[0]) >= 2 and operands[1]:
            activation, weight = operands
            gemm.append(int(np.prod(activation[:-1])))
            widths.append((_out_width(name, weight), gemm[-1]))
        elif len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4:
            seq_dim = 1 if _ATTENTION_FORWARD.match(name) else 2 if _SDPA.match(name) else None
            if seq_dim is not None:
                query += [shapes[0][seq_dim]] * count
                kv += [shapes[1][seq_dim]] * count
                batch += [shapes[0][0]] * count
    head = max(widths)[1] if widths else None
    # The most rows any projection sees: the tokens of the step (an eager MoE layer's experts see fewer, each).
    return StepTokens(max(gemm) if gemm else None, _median(query), _median(kv), _median(batch), head)


def _median(values: list[int]) -> int | None:
    return int(np.median(values)) if values else None


def phase_from_tokens(t: StepTokens, decode_rows: int | None) -> str | None:
    """decode / prefill from shapes, None when the shapes do not say."""
    if t.query_len is not None:
        return "decode" if t.query_len <= 1 else "prefill"
    if t.gemm_rows and t.head_rows and 1.5 * t.head_rows < t.gemm_rows:
        return "prefill"  # the projections see every token, the lm_head only each sequence's last one
    if t.gemm_rows is not None and decode_rows:
        return "prefill" if t.gemm_rows > 1.5 * decode_rows else "decode"
    return None


def packed_mixed(t: StepTokens) -> bool:
    """Sequences packed into one row (continuous batching: batch 1, each sequence's last token sampled), some
    continuing from a cache and some bringing more tokens: the output head sees two or more rows but fewer than the
    forward's tokens, and attention reaches keys before the row's own (kv > query). No single-sequence forward looks
    like that: a prefill or a speculative extend has one sequence in its row, sampled at its last or every token.
    The row's tokens are the attention's queries, as many as the projections' rows (an encoder-decoder's cross-
    attention projects the encoder's states, more rows than its decoder tokens)."""
    return bool(_one_row(t) and 2 <= t.head_rows < t.gemm_rows)


def packed_decode(t: StepTokens) -> bool:
    """In a trace whose forwards pack sequences (packed_mixed), a row whose every token is sampled is one token of
    each of as many sequences: a decode step (alone, it may be one sequence's speculative extend)."""
    return bool(_one_row(t) and 2 <= t.head_rows == t.gemm_rows)


def _one_row(t: StepTokens) -> bool:
    """One attention row whose queries are all the forward's tokens, reaching keys before them, with an output head."""
    return bool(t.batch == 1 and t.head_rows and t.gemm_rows and t.query_len == t.gemm_rows
                and t.kv_len and t.kv_len > t.query_len)


def rows_alone(t: StepTokens) -> bool:
    """Only the projection rows against the smallest step's can say decode / prefill (no attention shape, no lm_head
    narrower than the projections): a step of 16 rows may be a decode of 16 sequences or a forward over 16 tokens."""
    return t.query_len is None and not (t.gemm_rows and t.head_rows and 1.5 * t.head_rows < t.gemm_rows)


def widest_gemm_rows(trace: Trace, links: Links) -> np.ndarray | None:
    """Per GPU row: launched by the trace's widest GEMM (the lm_head over the vocabulary, once per forward).
    None when no GEMM op recorded its shapes (CUDA-graph replay, record_shapes off)."""
    ops = trace.cpu_ops
    op_rows = unique(links.op_idx[links.op_idx >= 0])
    distinct, _, which = _distinct_ops(ops, op_rows)
    width_of: dict[int, int] = {}  # distinct op -> its GEMM's output width
    for i, (name_id, dims, types) in enumerate(distinct):
        name = trace.names[name_id]
        if name not in GEMM_OPS or not dims:
            continue
        operands = _gemm_operands(name, [s for s, _ in shape_info.tensors(dims, types)])
        if operands is not None and operands[1]:
            width_of[i] = _out_width(name, operands[1])
    if not width_of:
        return None
    widest = max(width_of.values())
    head = np.zeros(len(distinct), dtype=bool)
    head[[i for i, w in width_of.items() if w >= 0.9 * widest]] = True
    heads = op_rows[head[which]]
    return isin(links.op_idx, heads)


SAME_LAUNCHES = 0.7  # share of launch shapes a step has in common with the typical one, below which it is another phase
FEWER_BLOCKS = 0.8  # an unlike group launching under this share of the blocks of the others is the decode side
FEW_STEPS = 64  # steps few enough to compare each with every other where no majority launches alike


def phases_from_launches(trace: Trace, pieces_rows: list[np.ndarray], names: np.ndarray,
                         reference: int) -> list[str] | None:
    """decode / prefill per step from how its kernels were launched, when no annotation or op shape says: a prefill
    runs other kernels, or the same ones on other grids (more tokens, more thread blocks), so its set of launches
    (kernel, grid, block) is unlike a decode step's, while decode steps share theirs (an eager MoE step's experts
    change a few). The unlike steps are the prefills unless they launch clearly fewer blocks than the others.
    `reference`: the index of the typical step (where most steps launch unlike it, a few are compared by size:
    _by_size). None when the trace has no launch shapes."""
    gpu = trace.gpu
    if not len(trace.shapes) or not any(trace.shapes):
        return None
    key = names.astype(np.int64) * 1_000_003 + gpu.grid_id.astype(np.int64) * 1_009 + gpu.block_id.astype(np.int64)
    # Kernels that run three or more different numbers of times over the steps are routed (an eager MoE's expert
    # loop: which experts run, and on how many tokens each, changes every decode step): their launches tell no phase
    # (two counts may be the two phases'). A prefill still launches the kernels every step runs as often (norms,
    # attention, residual adds) on other grids.
    routed = np.array(sorted(data_dependent([names[r] for r in pieces_rows], least_counts=3)), dtype=np.int64)
    launches = [set(key[r[~isin(names[r], routed)]].tolist()) or set(key[r].tolist()) for r in pieces_rows]
    blocks = grid_blocks(trace)

    def alike(a: set, b: set) -> bool:
        return len(a & b) / max(len(a | b), 1) >= SAME_LAUNCHES

    if 2 * sum(alike(a, launches[reference]) for a in launches) <= len(launches) <= FEW_STEPS:
        return _by_size(launches, [_launch_sizes(names, blocks, r) for r in pieces_rows], alike)
    ref = launches[reference]
    unlike = [not alike(a, ref) for a in launches]
    if not any(unlike):
        return ["decode"] * len(pieces_rows)
    geo = [float(np.exp(np.mean(np.log1p(blocks[r])))) if len(r) else 0.0 for r in pieces_rows]
    other = float(np.median([g for g, u in zip(geo, unlike, strict=True) if u]))
    same = float(np.median([g for g, u in zip(geo, unlike, strict=True) if not u]))
    prefill_is_unlike = other >= FEWER_BLOCKS * same
    return ["prefill" if u == prefill_is_unlike else "decode" for u in unlike]


def _by_size(launches: list[set], sizes: list[tuple[np.ndarray, np.ndarray]], alike) -> list[str]:
    """Where no majority of the steps launches like the typical one (a cut file or a short capture: a prefill, an
    extend and a few decodes), the decode steps are those launched like the smallest step, the one the most others
    outgrow kernel by kernel on the launches they share (a decode processes the fewest tokens; an average over all
    launches would count the small kernels of an eager MoE step's extra experts), and the steps that outgrow it are
    prefills."""
    n = len(sizes)
    bigger = np.zeros((n, n), dtype=bool)  # [i, j]: step j runs more of the launches they share on more blocks
    for i in range(n):
        for j in range(n):
            if i != j:
                growth = _compare_launches(sizes[i], sizes[j])
                bigger[i, j] = growth.up > growth.down
    smallest = int(np.argmax(bigger.sum(axis=1) - bigger.sum(axis=0)))
    return ["decode" if alike(launches[k], launches[smallest]) or not bigger[smallest, k] else "prefill"
            for k in range(n)]


def grid_blocks(trace: Trace) -> np.ndarray:
    """Thread blocks each GPU activity launched (grid x * y * z), 0 where unknown."""
    sizes = np.zeros(len(trace.shapes), dtype=np.int64)
    for i, text in enumerate(trace.shapes):
        dims = [int(d) for d in re.findall(r"\d+", text or "")][:3]
        sizes[i] = int(np.prod(dims)) if dims else 0
    return sizes[trace.gpu.grid_id.astype(np.int64)]


# A forward that recomputes the whole sequence (a loop without a KV cache) processes one token more per sequence than
# the forward before it. Its embedding lookup says so directly: a decode step looks up each sequence's new token, the
# same count every step, while a recomputing forward looks up the whole, growing sequence, so the lookup's grid grows
# (b*T blocks for b*T tokens in PyTorch's gather kernel). Where no lookup is recorded, the launches say it less
# directly: nearly every per-token launch (norms, activations, residual adds) grows its grid from forward to forward;
# a decode step over a KV cache grows only the launches that read the cache (attention, the cache append), a minority
# of a forward's launches: at most 18% from first to last in the decode runs of the accuracy corpus and its holdouts,
# against 67% over the ten forwards of an MPT generate loop without a cache. That share fails for an eager MoE: its
# expert loop launches many kernels on one thread block (each expert finding its tokens) that cannot grow for a few
# tokens more, so ten cacheless OLMoE, Mixtral or Qwen3-MoE forwards grow only 27-44% of their launches.
GROWN_MOST = 0.5  # share of shared launches grown from a run's first forward to its last: the run recomputes
GROWN_SOME = 0.25  # from here up to GROWN_MOST: either, the trace cannot tell without op shapes
SHARED_LAUNCHES = 0.5  # consecutive forwards sharing fewer of their launches than this run other kernels: a new run
DOUBLED = 2.0  # one token more per sequence at most doubles a per-token launch (from 1 token to 2): a larger median
# growth is another phase beginning (a decode step followed by a new prompt's prefill)


class _Growth(NamedTuple):
    up: int  # launches on more thread blocks in the later step
    down: int  # on fewer
    shared: int  # launches both steps ran, with a known grid
    factor: float  # median ratio of blocks, later to earlier, of those that grew


@dataclass(frozen=True)
class GrowingRun:
    """Consecutive steps (indices `first` to `last`, both included) whose launches never collapse from one to the
    next, as they do from a prefill to the decode after it; `grown`: the share of the launches the first and last
    share that run on more thread blocks in the last; `lookups`: the thread blocks of each step's embedding lookup,
    where every step of the run has one, and `lookup_kernels` the kernels that ran it; `under_earlier`: every lookup
    of the run is smaller than one an earlier step ran with the same kernels (the sequence only grows, and a forward
    without a cache looks all of it up: such a run continues one from a cache, as prompt-lookup decoding's extends of
    a few tokens grow from a decode's one)."""
    first: int
    last: int
    grown: float
    lookups: tuple[int, ...] | None = None
    lookup_kernels: tuple[tuple[int, ...], ...] | None = None
    under_earlier: bool = False

    @property
    def more_tokens(self) -> bool:
        """The forwards look up a growing sequence, which decode steps (one new token per sequence each) never do:
        from each forward to the next whose lookup ran the same kernels (a grid tells tokens only against the same
        kernel's: PyTorch picks another for some inputs, as for the first forward of a generate at batch 1), the
        lookup never shrinks nor more than doubles (a new prompt after decode steps), and it grows at least once."""
        if self.lookups is None or self.lookup_kernels is None:
            return False
        pairs = [(a, b) for a, b, ka, kb in zip(self.lookups, self.lookups[1:], self.lookup_kernels,
                                                 self.lookup_kernels[1:], strict=False) if ka == kb]
        return (any(b > a for a, b in pairs) and all(a <= b <= DOUBLED * a for a, b in pairs))

    @property
    def recomputes(self) -> bool:
        return not self.under_earlier and (self.more_tokens or self.grown >= GROWN_MOST)

    @property
    def uncertain(self) -> bool:
        return not self.recomputes and GROWN_SOME <= self.grown


def growing_runs(trace: Trace, pieces_rows: list[np.ndarray], names: np.ndarray,
                 lookup: np.ndarray | None = None) -> list[GrowingRun] | None:
    """The steps (in time order) split into runs of forwards over the same kernels whose launches only stay or grow
    gradually: a new run begins where more launches shrink than grow (a prefill followed by a decode step), where
    they grow by more than DOUBLED (a decode step followed by a prefill) or where the two steps share under
    SHARED_LAUNCHES of their launches. A launch is a kernel's n-th launch in its step (normalised
    names: the same launch in two forwards of one model); its size, the thread blocks of its grid. `lookup`: per GPU
    row, launched by the embedding lookup (anchors.lookup_rows): each run keeps its steps' lookup sizes. Runs of one
    step are left out. None when the trace has no launch shapes."""
    if not len(trace.shapes) or not any(trace.shapes):
        return None
    blocks = grid_blocks(trace)
    launches = [_launch_sizes(names, blocks, rows) for rows in pieces_rows]
    looked = [rows[lookup[rows]] if lookup is not None else rows[:0] for rows in pieces_rows]
    sizes = [int(blocks[r].sum()) for r in looked]
    kernels = [tuple(np.unique(names[r]).tolist()) for r in looked]
    runs, start = [], 0
    for i in range(1, len(launches) + 1):
        if i < len(launches) and _continues(launches[i - 1], launches[i]):
            continue
        if i - 1 > start:
            whole = _compare_launches(launches[start], launches[i - 1])
            known = all(sizes[start:i])
            earlier = [sizes[j] for j in range(start) if kernels[j] in kernels[start:i]]
            runs.append(GrowingRun(start, i - 1, whole.up / whole.shared if whole.shared else 0.0,
                                   tuple(sizes[start:i]) if known else None,
                                   tuple(kernels[start:i]) if known else None,
                                   known and bool(earlier) and max(sizes[start:i]) < max(earlier)))
        start = i
    return runs


def _continues(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Step b runs a's kernels, none collapsing (more shrinking than growing) and none jumping (growing by more than
    one token more per sequence can). A kernel some of whose launches grew and others shrank is routed work (an eager
    MoE's expert loop: its n-th launch is another expert, or the same one with other tokens, from step to step) and
    says neither: such launches are left out of the count, so that routing never cuts a run; a collapse or a jump
    moves every per-token kernel one way."""
    g = _compare_launches(a, b, routed=False)
    return g.shared >= SHARED_LAUNCHES * min(len(a[0]), len(b[0])) and g.down <= g.up and g.factor <= DOUBLED


def _launch_sizes(names: np.ndarray, blocks: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys, blocks) of a step's launches, sorted by key: kernel id in the high bits, its n-th launch in the low."""
    rows = np.sort(rows)  # GPU rows are in time order
    kernel = names[rows].astype(np.int64)
    order = np.argsort(kernel, kind="stable")
    ordered = kernel[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    nth = np.arange(len(ordered)) - np.repeat(starts, np.diff(np.r_[starts, len(ordered)]))
    return (ordered << 32) + nth, blocks[rows][order]


def _compare_launches(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
                      routed: bool = True) -> _Growth:
    """How the launches steps a and b share (with a known grid in both) changed from a to b. `routed=False`: up, down
    and factor without the launches of kernels that grew in some launches and shrank in others."""
    keys, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    before, after = a[1][ia], b[1][ib]
    known = (before > 0) & (after > 0)
    shared = int(known.sum())
    if not routed:
        kernel = keys >> 32
        both = np.intersect1d(kernel[known & (after > before)], kernel[known & (after < before)])
        known &= ~np.isin(kernel, both)
    before, after = before[known], after[known]
    grew = after > before
    factor = float(np.median(after[grew] / before[grew])) if grew.any() else 1.0
    return _Growth(int(grew.sum()), int((after < before).sum()), shared, factor)

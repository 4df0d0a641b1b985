"""Forward boundaries from work that happens once per forward, in time: the step finder's rule where no engine
annotation or graph replay says where a step is.

Every causal LM forward looks its input tokens up in the embedding table first and ends with the output head (the
widest GEMM, N = the vocabulary) and, in a generate loop, sampling (argmax / multinomial); compiled forwards run as
one compiled call; training iterations end with an optimizer step (and hold as many forwards as they accumulate
micro-batches). Those are the anchors, in this order of trust
(`FAMILIES`). Each anchor is a time on the host (the CPU op, or the launch of its kernel), and every GPU activity
belongs to the forward its launch falls in, so eager MoE layers that launch a different number of kernels every step
cut nothing; a forward that samples ends at the host's first wait for the GPU after its sampling, else at the
sampling's end (what follows is the next forward's input preparation). An anchor family is used only when the
forwards it cuts agree on their layer count, or, where no family's do, when another family falls as often (the layer
count is then reported uncertain); the others cross-check it. A forward at the edge of the capture is partial only
when the window cut it: per-layer work before the first anchor (a forward the capture began inside), fewer layers or
no output head after the last one (the capture ended inside it), or launches whose GPU work is not in the trace
(lost_launches, unlaunched_ops): such a forward tells nothing of the layers."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from decodegap.steps.across_forwards import (
    data_dependent,
    runs_once_per_layer,
    runs_once_per_layer_beside_another_stack,
    second_stacks,
)
from decodegap.steps.drafts import draft_forwards
from decodegap.steps.layers import count_layers
from decodegap.steps.phase import grid_blocks, widest_gemm_rows
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace, isin

GROUP_GAP = 0.25  # occurrences closer than this share of the widest spacing (in launches) are one anchor (wte + wpe)
LONGER = 1.5  # a forward this many times the median length is left out of what tells the data-dependent names
MAX_CHECKED = 12  # interior forwards whose layer count is checked (evenly spread): a 3,000-step trace stays fast

NEVER_BEFORE, NEVER_AFTER = np.iinfo(np.int64).min, np.iinfo(np.int64).max
_COMPILED_CALL = ("## Call CompiledFxGraph", "Torch-Compiled Region", "CompiledFunction")
# An optimizer's update, where no `Optimizer.step#` annotation says so: torch's fused optimizers, the foreach updates
# only the Adam family runs (clipping and scaling run other foreach ops), or kernels named for an optimizer (apex,
# DeepSpeed, bitsandbytes: no op of their own).
_OPTIMIZER_OP = re.compile(r"^aten::_fused_(adamw?|sgd|adagrad)_$|^aten::_foreach_(addcdiv|addcmul|lerp)_$")
_OPTIMIZER_KERNEL = re.compile(r"adam|adagrad|lamb(?!da)|fused_?sgd|koptimizer", re.IGNORECASE)


@dataclass(frozen=True)
class Family:
    id: str  # stable: embedding | lm_head | sampling | compiled_call | optimizer_step (docs/report-schema.md)
    role: str  # "start": a forward begins at it; "end": a forward ends after it
    words: str


FAMILIES = {
    "optimizer_step": Family("optimizer_step", "end", "optimizer steps"),
    "embedding": Family("embedding", "start", "embedding lookups"),
    "compiled_call": Family("compiled_call", "start", "compiled-graph calls"),
    "lm_head": Family("lm_head", "end", "output-head GEMMs (the widest GEMM)"),
    "sampling": Family("sampling", "end", "sampling ops (argmax / multinomial)"),
}
INFERENCE_ORDER = ("embedding", "lm_head", "sampling", "compiled_call")
TRAINING_ORDER = ("optimizer_step", "embedding")


@dataclass
class AnchorCut:
    pieces: list[np.ndarray]  # GPU rows of each whole forward, in order
    family: Family
    detail: str
    partial: list[str] = field(default_factory=list)  # why each left-out edge piece is partial
    warnings: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # host time each forward covers (anchor to anchor)
    unlike: bool = False  # the forwards read as different layer counts (held by the names that counted one of them)


def launch_times(trace: Trace, links: Links) -> np.ndarray | None:
    """Per GPU row, when it was launched on the host; a row whose launch record is lost, when its op called it (by
    External id), else its GPU-order neighbour's. None when no row has a launch record."""
    when = np.full(len(trace.gpu), -1, dtype=np.int64)
    has = links.runtime_idx >= 0
    if not has.any():
        return None
    when[has] = trace.runtime.ts_ns[links.runtime_idx[has]]
    by_op = ~has & (links.op_idx >= 0)
    when[by_op] = trace.cpu_ops.ts_ns[links.op_idx[by_op]]
    has |= by_op
    idx = np.where(has, np.arange(len(when)), -1)
    np.maximum.accumulate(idx, out=idx)
    first = int(np.flatnonzero(has)[0])
    idx[:first] = first
    return when[idx]


def occurrences(trace: Trace, links: Links, family: str, rows: np.ndarray) -> np.ndarray:
    """Host times of a family's occurrences among `rows` (start times for a start anchor, end times for an end one)."""
    names = trace.names
    ops = trace.cpu_ops
    if family == "optimizer_step":  # the annotation, else the update ops, else the update kernels
        marks = sorted(a.ts_ns + a.dur_ns for a in trace.annotations if not a.on_gpu
                       and a.name.startswith("Optimizer.step#"))
        if marks:
            return np.array(marks, dtype=np.int64)
        hit = isin(ops.name_id, np.array([i for i, n in enumerate(names) if _OPTIMIZER_OP.match(n)], np.int64))
        if hit.any():
            return np.sort(ops.ts_ns[hit] + ops.dur_ns[hit])
        kernel_ids = np.array([i for i, n in enumerate(names) if _OPTIMIZER_KERNEL.search(n)], np.int64)
        return _launches_of(trace, links, rows[isin(trace.gpu.name_id[rows], kernel_ids)])
    if family == "compiled_call":
        return np.array(sorted(a.ts_ns for a in trace.annotations if not a.on_gpu
                               and a.name.startswith(_COMPILED_CALL)), dtype=np.int64)
    if family in ("embedding", "sampling"):
        wanted = {"embedding": ("aten::embedding",), "sampling": ("aten::argmax", "aten::multinomial")}[family]
        ids = [i for i, n in enumerate(names) if n in wanted]
        hit = np.isin(ops.name_id, ids)
        if hit.any():
            t = ops.ts_ns[hit] if family == "embedding" else ops.ts_ns[hit] + ops.dur_ns[hit]
            return np.sort(t)
        if family == "embedding":  # no CPU op (a compiled forward): kernels named for the embedding
            kernel_ids = [i for i, n in enumerate(names) if "embedding" in n.lower() and "backward" not in n.lower()]
            return _launches_of(trace, links, rows[np.isin(trace.gpu.name_id[rows], kernel_ids)])
        return np.empty(0, np.int64)
    if family == "lm_head":
        head = widest_gemm_rows(trace, links)
        return _launches_of(trace, links, rows[head[rows]]) if head is not None else np.empty(0, np.int64)
    raise ValueError(family)


def lookup_rows(trace: Trace, links: Links) -> np.ndarray:
    """Per GPU row: launched by a forward's embedding lookup, whose grid the tokens it looks up set: a kernel launched
    inside an `aten::embedding` op (its index_select or gather, on the op's thread), else, where no such op was
    recorded (a compiled forward), a kernel named for the embedding."""
    ops = trace.cpu_ops
    hit = np.flatnonzero(np.isin(ops.name_id, [i for i, n in enumerate(trace.names) if n == "aten::embedding"]))
    if not len(hit):
        kernel_ids = [i for i, n in enumerate(trace.names) if "embedding" in n.lower() and "backward" not in n.lower()]
        return np.isin(trace.gpu.name_id, kernel_ids)
    if not len(trace.runtime.ts_ns):
        return np.zeros(len(trace.gpu), dtype=bool)
    hit = hit[np.argsort(ops.ts_ns[hit], kind="stable")]
    starts, ends, tids = ops.ts_ns[hit], ops.ts_ns[hit] + ops.dur_ns[hit], ops.tid[hit]
    rt = links.runtime_idx
    launched = rt >= 0
    when = np.where(launched, trace.runtime.ts_ns[np.maximum(rt, 0)], -1)
    j = np.maximum(np.searchsorted(starts, when, side="right") - 1, 0)  # the last lookup begun before the launch
    return launched & (when >= starts[j]) & (when <= ends[j]) & (trace.runtime.tid[np.maximum(rt, 0)] == tids[j])


def lost_launches(trace: Trace) -> np.ndarray:
    """Host times of the launches whose GPU work the capture ended before: calls of a launching kind (one that
    launched some GPU activity of this trace) whose correlation no GPU activity carries, made after the last launch
    whose GPU work is in the trace. Records lost inside the window (profilers drop a few) cut no step."""
    rt, gpu = trace.runtime, trace.gpu
    if not len(rt.ts_ns) or not len(gpu):
        return np.empty(0, np.int64)
    has_gpu = isin(rt.correlation, gpu.correlation) & (rt.correlation >= 0)
    if not has_gpu.any():
        return np.empty(0, np.int64)
    launching = isin(rt.name_id, rt.name_id[has_gpu])
    lost = launching & ~has_gpu & (rt.correlation >= 0) & (rt.ts_ns > rt.ts_ns[has_gpu].max())
    return np.sort(rt.ts_ns[lost])


def unlaunched_ops(trace: Trace) -> np.ndarray | None:
    """Host times of the CPU ops whose launches the file lost: calls, after the last launch record, of an op whose
    every call among the records launched GPU work (by External id). A file cut short keeps its CPU ops (Kineto writes
    them first) and loses the launch records with the GPU events; an op that launches only sometimes (a copy on the
    host) is no evidence, nor is one among the records (profilers drop a few records inside the window). In a cut
    file the records kept may also begin late (its activity buffers written out of time order): calls before the
    first record are then lost too. None when no CPU op is tied to a launch (no External ids): the ops then tell
    nothing."""
    rt, gpu, ops = trace.runtime, trace.gpu, trace.cpu_ops
    if not len(ops.ts_ns) or not len(rt.ts_ns) or not len(gpu):
        return None
    has_gpu = isin(rt.correlation, gpu.correlation) & (rt.correlation >= 0)
    if not has_gpu.any():
        return None
    launching = isin(rt.name_id, rt.name_id[has_gpu])
    first = int(rt.ts_ns[launching].min()) if trace.truncated else None
    last = int(rt.ts_ns[launching].max())
    ids = np.concatenate((rt.external_id[launching], gpu.external_id))
    launched = isin(ops.external_id, ids[ids >= 0]) & (ops.external_id >= 0)
    # an op is among the records where its call reaches the first of them (the op holds its launch call)
    among = (ops.ts_ns <= last) & (ops.ts_ns + ops.dur_ns >= first if first is not None else True)
    n = int(ops.name_id.max()) + 1
    calls = np.bincount(ops.name_id[among], minlength=n)
    hits = np.bincount(ops.name_id[among & launched], minlength=n)
    if not hits.any():
        return None
    always = (calls > 0) & (hits == calls)
    return np.sort(ops.ts_ns[~among & always[ops.name_id] & ~launched])


def host_waits(trace: Trace) -> np.ndarray:
    """End times of the runtime calls in which the host waits for the GPU (stream, device or event synchronize: a
    `.item()` reading a sampled token), sorted."""
    rt = trace.runtime
    ids = [i for i, n in enumerate(trace.names) if "Synchronize" in n and n.startswith(("cuda", "hip", "cu"))]
    hit = isin(rt.name_id, np.array(ids, dtype=np.int64))
    return np.sort(rt.ts_ns[hit] + rt.dur_ns[hit])


def _launches_of(trace: Trace, links: Links, rows: np.ndarray) -> np.ndarray:
    rt = links.runtime_idx[rows]
    rt = rt[rt >= 0]
    return np.sort(trace.runtime.ts_ns[rt]) if len(rt) else np.empty(0, np.int64)


def group(times: np.ndarray, sorted_when: np.ndarray, last: bool = False,
          breaks: np.ndarray | None = None) -> np.ndarray:
    """Occurrences with (almost) no launches between them are one anchor (GPT-2's token and position embeddings):
    the first time of each group, or the last (`last`, for anchors that close a forward). `breaks`: host times of the
    other role's anchors (the sampling that ends a forward, for one that starts them): occurrences with one and some
    launches between them are of two forwards however close (a draft model's short forwards, between a served
    model's); with none between (a file cut short keeps CPU ops whose kernels it lost) they stay one."""
    if len(times) < 2:
        return times
    at = np.searchsorted(sorted_when, times)
    launches = np.diff(at)
    widest = launches.max()
    if len(times) == 2:  # one spacing says nothing of a forward's size (a step annotation's window): the launches
        # past the last (a start anchor's forward) or before the first (an end anchor's) do
        widest = max(widest, at[0] if last else len(sorted_when) - at[1])
    apart = launches >= GROUP_GAP * widest if widest else np.zeros(len(launches), dtype=bool)
    if breaks is not None and len(breaks):
        apart |= (launches > 0) & (np.searchsorted(breaks, times[1:], "left") >
                                   np.searchsorted(breaks, times[:-1], "right"))
    keep = np.concatenate((apart, [True])) if last else np.concatenate(([True], apart))
    return times[keep]


@dataclass(frozen=True)
class TraceAnchors:
    """What the anchors need of a trace, found once: each GPU row's launch time, each family's occurrence times."""

    when: np.ndarray | None  # launch_times
    times: dict[str, np.ndarray]
    # host times of launches whose GPU work the trace lacks (lost_launches, unlaunched_ops): a forward holding one is
    # partial, and tells nothing of the layers
    unknown: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    waits: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # ends of the host's waits (host_waits)
    blocks: np.ndarray | None = None  # thread blocks each GPU row launched (phase.grid_blocks)

    @classmethod
    def of(cls, trace: Trace, links: Links, training: bool) -> TraceAnchors:
        when = launch_times(trace, links)
        rows = np.arange(len(trace.gpu))
        order = TRAINING_ORDER if training else INFERENCE_ORDER
        times = {fid: occurrences(trace, links, fid, rows) for fid in order} if when is not None else {}
        unlaunched = unlaunched_ops(trace)
        unknown = np.sort(np.concatenate((lost_launches(trace), [] if unlaunched is None else unlaunched)))
        return cls(when, {fid: t for fid, t in times.items() if len(t)}, unknown, host_waits(trace), grid_blocks(trace))

    def count_in(self, lo: int, hi: int) -> int:
        """The most occurrences any family has in [lo, hi]: a span with fewer than two holds one forward at most."""
        return max((int(np.searchsorted(t, hi, "right") - np.searchsorted(t, lo, "left"))
                    for t in self.times.values()), default=0)


def cut(anchors_of: TraceAnchors, rows: np.ndarray, seq: np.ndarray, names: list[str],
        window: tuple[int, int] | None = None) -> AnchorCut | None:
    """The forwards among `rows` (sorted GPU rows), from the most trusted anchor family whose forwards agree on their
    layer count (`seq`: a normalised name id per GPU row of the trace, `names` those names); None when no family
    does. `window`: the host time span the rows were taken from (a step annotation's); anchors outside it are not
    this span's."""
    if anchors_of.when is None or len(rows) < 2:
        return None
    when = anchors_of.when[rows]
    sorted_when = np.sort(when)
    found: dict[str, np.ndarray] = {}
    for fid, times in anchors_of.times.items():
        family = FAMILIES[fid]
        # An anchor after the last launch (or before the first) holds nothing, but it closes (opens) the forward
        # next to it: a file cut short keeps its CPU ops, and the forward the cut fell in must end where its
        # successor begins, not at its last launch the file kept.
        times = _with_closing(times, sorted_when, family.role)
        if window is not None:
            times = times[(times >= window[0]) & (times <= window[1])]
        if not len(times):
            continue
        found[fid] = group(times, sorted_when, last=family.role == "end", breaks=_other_role(anchors_of, family))
    # Where no family's forwards agree on their layers (unlike layers that a forward's kernels do not tell apart the
    # same way each time, as a training iteration's MoE layers between dense ones), two families that fall equally
    # often still mark the same forwards: the most trusted of them cuts, and the layer count is left in doubt.
    agreeing = Counter(len(a) for a in found.values())
    doubtful = {fid for fid, a in found.items() if agreeing[len(a)] >= 2}
    # A training iteration ends with its optimizer step and may hold several forwards (gradient accumulation over
    # micro-batches): where every iteration holds as many embedding lookups, the optimizer steps cut, before any
    # family that marks forwards.
    each = _forwards_each(found.get("optimizer_step"), found.get("embedding"))
    if each:
        doubtful.add("optimizer_step")
    tries = [(fid, False) for fid in found] + [(fid, True) for fid in found if fid in doubtful]
    if each:
        tries.sort(key=lambda t: t[0] != "optimizer_step")
    # A forward ends with its sampling: what the host launches after it, before the next forward's anchor, is the
    # next forward's input preparation, as an engine's step holds it.
    closes = anchors_of.times.get("sampling")
    if closes is not None and window is not None:
        closes = closes[(closes >= window[0]) & (closes <= window[1])]
    for fid, doubt in tries:
        anchors = found[fid]
        accumulates = fid == "optimizer_step" and each  # its first iteration is checked by its forwards, not layers
        result = _pieces(rows, when, anchors, FAMILIES[fid], seq, names, any_layers=doubt,
                         closes=closes if fid != "sampling" else None, unknown=anchors_of.unknown,
                         waits=anchors_of.waits, edge_check=not accumulates, blocks=anchors_of.blocks)
        if result is not None:
            if accumulates:
                _first_iteration_holds(result, found["embedding"], each)
                if not result.pieces:
                    continue
            others = [f"{len(a)} {FAMILIES[o].words}" for o, a in found.items() if o != fid]
            result.detail = (f"{len(anchors)} {FAMILIES[fid].words} mark the forwards"
                             + (f" (also seen: {', '.join(others)})" if others else "")
                             + (f"; each iteration holds {each} forwards and backwards (gradient accumulation over "
                                f"{each} micro-batches)" if accumulates and each > 1 else ""))
            # Every family falls once per forward; one that falls more or less often says the forwards are unlike
            # (a second embedding lookup in some of them) or a step holds more than it seems: a cross-check.
            disagree = [f"{len(a)} {FAMILIES[o].words}" for o, a in found.items()
                        if o != fid and abs(len(a) - len(anchors)) > 1 and not (accumulates and o == "embedding")]
            if disagree:
                result.warnings.append(f"the forwards were cut at {len(anchors)} {FAMILIES[fid].words}, but the trace "
                                       f"holds {', '.join(disagree)}: check the step boundaries (--annotate)")
            if doubt or result.unlike:
                alike = ("" if not doubt else " (as many as another kind of anchor)" if not accumulates or each == 1
                         else f" (each holding {each} embedding lookups)")
                result.warnings.append(f"the forwards cut at {len(anchors)} {FAMILIES[fid].words}{alike} read as "
                                       f"different numbers of layers: the layer count is uncertain")
            return result
    return None


def _other_role(anchors_of: TraceAnchors, family: Family) -> np.ndarray | None:
    """The host times of the anchors of the other role than `family`'s that break its groups (group): a forward's
    sampling for a start anchor, its embedding lookup for an end anchor."""
    other = anchors_of.times.get("sampling" if family.role == "start" else "embedding")
    return None if other is None or family.id in ("optimizer_step", "compiled_call") else other


def _forwards_each(steps: np.ndarray | None, starts: np.ndarray | None) -> int | None:
    """How many forwards (`starts`: embedding lookups) every training iteration holds, from one optimizer step to the
    next, when each holds the same number (1 or more); None when they differ or there is no whole iteration."""
    if steps is None or starts is None or len(steps) < 2:
        return None
    each = np.diff(np.searchsorted(starts, steps, side="right"))
    return int(each[0]) if each[0] >= 1 and (each == each[0]).all() else None


def _first_iteration_holds(result: AnchorCut, starts: np.ndarray, each: int) -> None:
    """The first iteration (from the capture's start to its first optimizer step) is partial when it holds fewer
    forwards than every other: the capture began inside it."""
    lo, hi = result.spans[0]
    held = int(np.searchsorted(starts, hi, side="left") - np.searchsorted(starts, lo, side="left"))
    if held < each:
        result.partial.append(f"the first iteration holds {held} of the {each} forwards every other one does: the "
                              "capture began inside it")
        del result.pieces[0], result.spans[0]


def _with_closing(times: np.ndarray, sorted_when: np.ndarray, role: str) -> np.ndarray:
    if role == "start":
        after = np.flatnonzero(times > sorted_when[-1])
        return times[: after[0] + 1] if len(after) else times
    before = np.flatnonzero(times < sorted_when[0])
    return times[before[-1]:] if len(before) else times


def _pieces(rows: np.ndarray, when: np.ndarray, anchors: np.ndarray, family: Family, seq: np.ndarray,
            names: list[str], any_layers: bool = False, closes: np.ndarray | None = None,
            unknown: np.ndarray | None = None, waits: np.ndarray | None = None,
            edge_check: bool = True, blocks: np.ndarray | None = None) -> AnchorCut | None:
    # Each boundary is the first host instant of the forward after it (a launch at t is in that forward iff t is at
    # or after it). A start anchor opens a forward (its own launches belong to it); an end anchor (an op's end, a
    # launch) closes one: a launch at or before it is inside the forward it closes.
    opens = family.role == "start"
    edges_in = anchors if opens else anchors + 1
    waits = np.empty(0, np.int64) if waits is None else waits
    if closes is not None and len(closes):
        edges_in = _after_sampling(edges_in, closes + 1, opens, waits)
    index = np.searchsorted(edges_in, when, side="right")
    order = np.argsort(index, kind="stable")  # launch order may differ from GPU order across streams
    bounds = np.searchsorted(index[order], np.arange(len(anchors) + 2), side="left")
    pieces = [np.sort(rows[order[bounds[i]:bounds[i + 1]]]) for i in range(len(anchors) + 1)]
    last_launch = [int(when[order[bounds[i]:bounds[i + 1]]].max(initial=NEVER_BEFORE)) for i in range(len(pieces))]
    # the host time each piece covers, [lo, hi): the last forward of start anchors runs to the capture's end, or to
    # the end of its sampling
    last_end = NEVER_AFTER
    if opens and closes is not None and len(closes) and closes[-1] >= edges_in[-1]:
        last_end = _first_wait(closes[-1:] + 1, np.array([NEVER_AFTER]), waits)[0]
    edges = np.concatenate(([NEVER_BEFORE], edges_in, [last_end]))
    spans = [(int(edges[i]), int(edges[i + 1])) for i in range(len(pieces))]
    # Start anchors: the piece before the first is outside every forward; the last forward runs to the capture's end.
    # End anchors: the piece after the last is outside; the first forward runs from the capture's start.
    inner = range(1, len(pieces)) if opens else range(len(pieces) - 1)
    out_i = 0 if opens else len(pieces) - 1
    body = [(pieces[i], spans[i]) for i in inner if len(pieces[i])]
    if not body:
        return None
    # A forward some of whose launches lack their GPU work (the file ends inside it) is partial whatever it shows:
    # it is left to the steps stage, and only the others say what a forward's layers are.
    unknown = np.empty(0, np.int64) if unknown is None else unknown
    known = [i for i, (_, (lo, hi)) in enumerate(body)
             if np.searchsorted(unknown, hi, side="left") == np.searchsorted(unknown, lo, side="left")]
    if not known:  # every forward is partial: nothing to check, and no other family's cut is more trusted
        outside = pieces[out_i]
        if len(outside):
            i = 0 if opens else len(body) - 1
            body[i] = (np.sort(np.concatenate([outside, body[i][0]])), body[i][1])
        return AnchorCut([r for r, _ in body], family, "", spans=[span for _, span in body])
    # A draft model's forwards between the served model's (steps.drafts) run its per-layer kernels fewer times: they
    # say nothing of its layers, nor of which names vary with the data (the steps stage leaves them out)
    drafts = (draft_forwards([seq[r] for r, _ in body], names, [blocks[r] for r, _ in body], None)
              if blocks is not None else None)
    if drafts:  # (every whole forward a draft's: keep them all to check)
        known = [i for i in known if i not in drafts.forwards] or known
    picks = [known[k] for k in _spread(len(known))]
    interior = [i for i in picks if 0 < i < len(body) - 1]
    # What depends on the data shows between whole forwards: the one the window may have cut (the last after start
    # anchors, the first before end anchors) runs fewer of every per-layer kernel, and would hide them all.
    uncut = [i for i in picks if i != (len(body) - 1 if opens else 0)]
    compared = interior if len(interior) >= 2 else uncut if len(uncut) >= 2 else picks
    # So does a forward far longer than most: a prefill that also runs a second stack of blocks on the layers' kernels
    # (a VLM's vision tower) runs every per-layer name more often, and would hide them all; forwards of the usual
    # length still show an eager MoE's expert loop
    usual = float(np.median([len(body[i][0]) for i in compared]))
    stacked = {i for i, more in zip(compared, second_stacks([seq[body[i][0]] for i in compared]), strict=True) if more}
    alike = [i for i in compared if len(body[i][0]) <= LONGER * usual and i not in stacked]
    # (one forward left beside a second stack's: nothing shows a name varying with the data)
    varying = data_dependent([seq[body[i][0]] for i in (alike if len(alike) >= 2 or alike and stacked else compared)])
    checked = {i: count_layers(seq[body[i][0]], names, varying=varying) for i in picks}
    edge = len(body) - 1 if opens else 0  # the forward the window may have cut
    readings: dict = {}  # a reading per count, a whole forward's before the edge one's (its names may be cut short)
    for i in sorted(checked, key=lambda i: i == edge):
        if checked[i].count:
            readings.setdefault(checked[i].count, checked[i])
    if not readings:
        return None
    layers = Counter(f.count for f in checked.values() if f.count).most_common(1)[0][0]
    unlike = not any_layers and any(checked[i].count != layers for i in interior)
    if unlike:
        # A forward that reads another count may still run the names that counted it once per layer (an eager MoE
        # prefill, routing to every expert, misreads on its expert loop): the count every interior forward runs so.
        # So may one that runs a second stack of blocks on the model's kernels over other tokens (a VLM prefill's
        # vision tower), on other launch grids.
        agree = {c: {i for i, f in checked.items() if f.count == c or runs_once_per_layer(seq[body[i][0]], r)
                     or blocks is not None and runs_once_per_layer_beside_another_stack(seq[body[i][0]],
                                                                                      blocks[body[i][0]], r)}
                 for c, r in readings.items()}
        held = [c for c in readings if all(i in agree[c] for i in interior)]
        if not held:
            return None  # the anchor does not fall once per forward (`any_layers`: another family says it does)
        layers = max(held, key=lambda c: (len(agree[c]), sum(f.count == c for f in checked.values())))
        # a forward whose launch grids show the second stack reads another count for a known reason: no doubt
        beside = {i for i in interior if blocks is not None and runs_once_per_layer_beside_another_stack(
            seq[body[i][0]], blocks[body[i][0]], readings[layers])}
        unlike = any(checked[i].count != layers and i not in beside for i in interior)
    per_layer = set(readings[layers].backers)
    partial = []
    whole = [seq[body[i][0]] for i in picks if i != edge and checked[i].count == layers]
    if len(body) > 1 and edge in checked and not any_layers and edge_check and _cut_short(  # (in doubt, layers tell
            checked[edge].count, seq[body[edge][0]], layers, per_layer, whole, alone=not interior):  # no edge)
        partial.append(f"the {'last' if opens else 'first'} forward shows {checked[edge].count or 'no'} layers, "
                       f"not {layers}: the capture {'ended' if opens else 'began'} inside it")
        body = body[:-1] if opens else body[1:]
    outside = pieces[out_i]
    if len(outside):
        if _holds_layer_work(seq[outside], per_layer):
            what = family.words.split(" (")[0]
            partial.append(f"{len(outside)} GPU activities {'before the first' if opens else 'after the last'} of "
                           f"the {what} run per-layer kernels: a forward the capture "
                           f"{'began' if opens else 'ended'} inside")
        elif opens:  # the first forward's preparation
            (r, (lo, hi)) = body[0]
            body[0] = (np.concatenate([outside, r]), (spans[out_i][0], hi))
        else:  # bookkeeping after the last forward's output (on the host, up to its last launch)
            (r, (lo, hi)) = body[-1]
            body[-1] = (np.concatenate([r, outside]), (lo, last_launch[out_i] + 1))
    if not body:
        return None
    return AnchorCut([r for r, _ in body], family, "", partial, spans=[span for _, span in body], unlike=unlike)


def _after_sampling(edges: np.ndarray, ends: np.ndarray, opens: bool, waits: np.ndarray) -> np.ndarray:
    """Boundaries moved to where the forward before them ends, when it samples (`ends`: just after each sampling
    op): at the host's first wait for the GPU after its sampling (reading the token), else at the sampling's end. A
    start anchor's forward then begins with its own input preparation, and an output head's forward keeps the
    sampling after it (not a wait: an eager MoE layer of the next forward may wait too)."""
    if opens:  # the last sampling at or before each start, after the start before it
        j = np.searchsorted(ends, edges, side="right") - 1
        prev = np.concatenate(([NEVER_BEFORE], edges[:-1]))
        ok = (j >= 0) & (ends[np.maximum(j, 0)] > prev)
        at = _first_wait(ends[np.maximum(j, 0)], edges, waits)
    else:  # the first sampling after each end, before the next end
        nxt = np.concatenate((edges[1:], [NEVER_AFTER]))
        j = np.minimum(np.searchsorted(ends, edges, side="left"), len(ends) - 1)
        ok = (ends[j] >= edges) & (ends[j] < nxt)
        at = ends[j]
    return np.where(ok, at, edges)


def _first_wait(after: np.ndarray, before: np.ndarray, waits: np.ndarray) -> np.ndarray:
    """The end of the host's first wait in [after, before), else `after`."""
    k = np.minimum(np.searchsorted(waits, after, side="left"), max(len(waits) - 1, 0))
    if not len(waits):
        return after
    return np.where((waits[k] >= after) & (waits[k] < before), waits[k], after)


def _spread(n: int) -> list[int]:
    """The edge forwards and up to MAX_CHECKED interior ones, evenly spread."""
    interior = np.linspace(1, n - 2, num=min(MAX_CHECKED, n - 2)).round().astype(int).tolist() if n > 2 else []
    return sorted({0, n - 1, *interior})


def _cut_short(count: int | None, seq: np.ndarray, layers: int, per_layer: set[int], whole: list[np.ndarray],
               alone: bool = False) -> bool:
    """Whether a forward at the window's edge is cut: it shows another layer count, or it runs only names the whole
    forwards run (`whole`: their name sequences) and some of the names that counted their layers fewer times than
    they all do (half a stack of unlike layers may pass for as many layers of other blocks). A forward of another
    phase runs kernels of its own (a prefill's attention, other GEMM tiles), and may run a per-layer name less often
    (a prefill's chunked mixer in some layers): it is no cut forward on that. `alone`: no interior forward tells
    which count is the forwards' (a capture of a prefill and one decode, whose eager MoE prefill may read another
    count): one that runs kernels the others never run is of another phase, not cut, whatever it shows."""
    runs = Counter(seq.tolist())
    theirs = [Counter(w.tolist()) for w in whole]
    names = set().union(*theirs) if theirs else set()
    if count != layers:
        return not (alone and theirs and not set(runs) <= names)
    if not theirs:
        return False
    return set(runs) <= names and any(0 < runs[n] < min(t[n] for t in theirs) for n in per_layer)


def _holds_layer_work(seq: np.ndarray, per_layer: set[int]) -> bool:
    """A piece outside the anchors holds (part of) a layer when it runs most of the kernels each layer runs once."""
    return len(per_layer & set(seq.tolist())) >= max(1, len(per_layer) / 2)

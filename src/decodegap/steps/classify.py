"""The pieces a trace was cut into made steps: their phase (annotation, op shapes, launches), an encoder-decoder's
encoder joined to the decoder's first forward, a draft model's forwards left out, forwards that recompute a
growing sequence read as prefills, packed (continuous-batching) rows, fragments mended, and partial steps at the
capture's edges or past a cut file's end left out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import cache

import numpy as np

from decodegap.ops.categories import categorize
from decodegap.steps import anchors as forward_anchors
from decodegap.steps.across_forwards import data_independent
from decodegap.steps.anchors import lost_launches
from decodegap.steps.drafts import draft_forwards
from decodegap.steps.layers import count_layers
from decodegap.steps.phase import (
    GrowingRun,
    grid_blocks,
    growing_runs,
    packed_decode,
    packed_mixed,
    phase_from_tokens,
    phases_from_launches,
    rows_alone,
    step_tokens,
    widest_gemm_rows,
)
from decodegap.steps.repetition import mix_overlap, name_classes, normalized_ids
from decodegap.steps.step import Piece, Step, Steps, runtime_of
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace, isin

SAME_MIX = 0.8  # kernel-mix overlap above which a step counts as the same kind as the typical one
PARTIAL = 0.9  # an edge step with fewer than this share of the typical step's activities is cut off
DECODER_FORWARDS = 8  # a decoder's first forwards compared for the encoder's cross-attention projections
CROSS_PROJECTIONS = 4  # most GEMM kernels a decoder layer runs to project the encoder's output to its keys and values


def classify(trace: Trace, links: Links, pieces: list[Piece], source: str, detail: str, warnings: list[str],
              training: bool, dropped_before: int = 0) -> Steps:
    workload = "training" if training else "inference"
    if not pieces:
        return Steps([], source, detail, workload, 0, warnings)
    names = normalized_ids(trace.names, trace.gpu.name_id)
    if not training and not any(p.mark for p in pieces):
        outputs = _outputs(pieces, trace, links)
        pieces, outputs, detail = _without_drafts(pieces, outputs, names, trace, links, detail)
        if source.startswith("anchor_"):
            pieces = _encoders_joined(pieces, outputs, trace, links, names)
            if any(p.encoder for p in pieces):
                detail += "; an encoder's forward taken with the decoder's first as the prefill"
    from_sequence = source in ("kernel_repetition", "graph_launch")  # cut by counts: fragments to mend
    if from_sequence:
        pieces = _split_overlong(pieces, names, trace)
    tokens = [step_tokens(trace, links, p.rows) for p in pieces]
    gemm_rows = sorted({t.gemm_rows for t in tokens if t.gemm_rows})
    decode_rows = gemm_rows[0] if len(gemm_rows) > 1 else None
    evidence = ["prefill" if p.encoder else p.mark.phase if p.mark and p.mark.phase else
                phase_from_tokens(t, decode_rows) for p, t in zip(pieces, tokens, strict=True)]
    if from_sequence:
        pieces, tokens, evidence = _merge_fragments(pieces, tokens, evidence, trace)
    pieces, tokens, evidence, incomplete = _drop_incomplete(trace, links, pieces, tokens, evidence)
    if not pieces:
        return Steps([], source, detail, workload, dropped_before + len(incomplete),
                     warnings + [_incomplete_words(incomplete)])
    lengths = np.array([len(p.rows) for p in pieces])
    typical_len = float(np.median(lengths))
    reference = Counter(names[pieces[int(np.argsort(lengths)[len(lengths) // 2])].rows].tolist())
    typical_i = int(np.argsort(lengths)[len(lengths) // 2])
    packed: set[int] = set()
    # the embedding lookup's kernels, and the runs of forwards whose launches grow gradually: read once, where needed
    lookup = cache(lambda: forward_anchors.lookup_rows(trace, links))
    runs = cache(lambda: growing_runs(trace, [p.rows for p in pieces], names, lookup()))
    if not training:
        evidence = _recomputed(pieces, tokens, evidence, runs, warnings)
        evidence, packed = _packed(pieces, tokens, evidence)
    by_launch = (phases_from_launches(trace, [p.rows for p in pieces], names, typical_i) if None in evidence
                 else None) or [None] * len(pieces)
    by_launch = _oriented(by_launch, evidence, pieces)
    if len(set(by_launch) - {None}) > 1:  # the launches tell two groups apart
        by_launch = _looked_up(by_launch, pieces, trace, lookup(), names)
        if not training:
            by_launch = _drifted(by_launch, runs())
    typical_wall = float(np.median([p.end_ns - p.start_ns for p in pieces]))
    # Launches that tell some steps from others say which are decodes too; all alike, they tell no phase (a run of
    # recomputing forwards launches alike as well)
    launches_tell = len(set(by_launch) - {None}) > 1
    steps, dropped, notes = [], dropped_before, []
    for i, (p, t, phase, launched) in enumerate(zip(pieces, tokens, evidence, by_launch, strict=True)):
        mix = Counter(names[p.rows].tolist())
        contained = sum(min(c, reference[k]) for k, c in mix.items()) / max(len(p.rows), 1)
        at_edge = i in (0, len(pieces) - 1) and len(pieces) > 1
        cut_off = len(p.rows) < PARTIAL * typical_len and (contained >= 0.95 or (
            phase is None and len(p.rows) < 0.5 * typical_len))
        if at_edge and cut_off and not p.whole and p.mark is None:
            dropped += 1
            where = "first" if i == 0 else "last"
            notes.append(f"{p.mark.name if p.mark else 'the ' + where + ' step'} ({where} in the trace): "
                         f"{len(p.rows)} of the typical {typical_len:.0f} GPU activities")
            continue
        if phase is None and len(pieces) > 1 and (launched == "prefill" or launches_tell and launched):
            phase = launched  # no annotation or op shape: launches say
        if phase is None:  # nor launch shapes: a longer step with another kernel mix is a prefill
            # which kernels it runs, not how often: an eager MoE step runs its experts' kernels more or fewer times
            kinds = set(mix)
            alike = len(kinds & set(reference)) / max(len(kinds | set(reference)), 1)
            other = alike < SAME_MIX and len(p.rows) >= 0.5 * typical_len and p.end_ns - p.start_ns > typical_wall
            phase = "prefill" if other else "decode"
        if training:
            phase = "training"
        batch = p.mark.batch if p.mark and p.mark.batch else t.head_rows if i in packed else t.batch or (
            t.gemm_rows if phase == "decode" else t.head_rows if t.head_rows and t.head_rows < (t.gemm_rows or 0)
            else None)
        n_tokens = p.mark.tokens if p.mark and p.mark.tokens else t.gemm_rows
        steps.append(Step(len(steps), phase, p.start_ns, p.end_ns, p.rows, batch, n_tokens,
                          p.mark.name if p.mark else None))
    if notes:
        warnings.append(f"{len(notes)} partial step(s) at the trace edges were left out: " + "; ".join(notes))
    if incomplete:
        warnings.append(_incomplete_words(incomplete))
        dropped += len(incomplete)
    rows = np.concatenate([s.rows for s in steps]) if steps else np.empty(0, np.int64)
    graphs = len(np.unique(links.replay[rows][links.replay[rows] >= 0]))
    return Steps(steps, source, detail, workload, dropped, warnings, graphs, runtime_of(trace))


def _encoders_joined(pieces: list[Piece], outputs: list[bool] | None, trace: Trace, links: Links,
                     names: np.ndarray) -> list[Piece]:
    """An encoder-decoder's encoder runs as a forward of its own (an embedding lookup begins it) that ends in no
    output head or sampling, right before the decoder's first forward, which does: the two are the prefill (the
    prompt's processing, up to the first token), as one step. Op shapes must say so: the encoder attends over its
    own tokens, no cache, and the decoder's forward is one token a sequence that does not continue the first's cache
    (a decoder-only prefill run without its output head is followed by its first decode, over the prompt's keys; a
    chunked prefill's first chunk, with no output either, by a chunk of many tokens). Without shapes, the decoder's
    first forward projects the encoder's output to every layer's cross-attention keys and values, once: it runs a
    multiple of its layers' count more matrix products than its next forward, which runs as many as the one after it
    (_projects_encoder_once); or the launches read the first as a prefill and the second as the decodes are launched,
    and the two are stacks of different depths (a model's prefill and its decode read as many layers). `outputs`:
    _outputs of the pieces."""
    if outputs is None or not any(outputs):
        return pieces
    launched: list | None = None

    def encoder_then_decoder(i: int) -> bool:
        nonlocal launched
        t, u = step_tokens(trace, links, pieces[i].rows), step_tokens(trace, links, pieces[i + 1].rows)
        if t.query_len and u.query_len:
            return bool(t.query_len > 1 and t.kv_len == t.query_len and u.query_len == 1
                        and u.kv_len != t.query_len + u.query_len)
        canonical = name_classes(trace.names)[1]
        if _projects_encoder_once(pieces[i + 1:i + 1 + DECODER_FORWARDS], names, canonical,
                                  i + 1 + DECODER_FORWARDS >= len(pieces)):
            return True
        if launched is None:
            lengths = [len(p.rows) for p in pieces]
            launched = phases_from_launches(trace, [p.rows for p in pieces], names,
                                            int(np.argsort(lengths)[len(lengths) // 2])) or []
        if not launched or launched[i] != "prefill" or launched[i + 1] != "decode":
            return False
        depths = [count_layers(names[pieces[k].rows], canonical).count for k in (i, i + 1)]
        return None not in depths and depths[0] != depths[1]

    joined: list[Piece] = []
    i = 0
    while i < len(pieces):
        p = pieces[i]
        if i + 1 < len(pieces) and not outputs[i] and outputs[i + 1] and encoder_then_decoder(i):
            q = pieces[i + 1]
            span = (p.host_span[0], q.host_span[1]) if p.host_span and q.host_span else None
            joined.append(Piece(p.start_ns, max(p.end_ns, q.end_ns), np.concatenate((p.rows, q.rows)),
                                 whole=p.whole and q.whole, host_span=span, encoder=True))
            i += 2
            continue
        joined.append(p)
        i += 1
    return joined


def _projects_encoder_once(decoder: list[Piece], names: np.ndarray, canonical: list[str], ends_trace: bool) -> bool:
    """Whether the first of a decoder's first forwards (`decoder`, two at least; `names`: the name class of each GPU
    activity) runs more matrix products than the second, a whole number more per layer of the others (the cross-
    attention keys and values of the encoder's output, projected once and cached), and the third and most of the
    others as many as the second (no data-dependent launches, an eager MoE's experts, explain the difference). The
    trace's last forward (`ends_trace`: the last of `decoder` is) may be cut short, running fewer. The others' layers
    are read from the names they run alike (two may route their tokens alike by chance)."""
    is_gemm = np.array([categorize(c) == "gemm" for c in canonical])
    gemms = [int(is_gemm[names[p.rows]].sum()) for p in decoder]
    if ends_trace and len(gemms) > 2 and gemms[-1] < gemms[1]:
        decoder, gemms = decoder[:-1], gemms[:-1]
    if len(decoder) < 2:
        return False
    extra = gemms[0] - gemms[1]
    if extra <= 0 or (len(gemms) > 2 and gemms[2] != gemms[1]) or 2 * gemms[1:].count(gemms[1]) < len(gemms) - 1:
        return False
    alike = [names[p.rows] for p, g in zip(decoder[1:], gemms[1:], strict=True) if g == gemms[1]]
    depth = count_layers(alike[0], canonical, data_independent(alike)).count
    # With one forward after the first (a cut file), nothing shows the launches data-independent: the extra must be
    # the projections alone, a few per layer (keys and values, each maybe split in two kernels), not an eager MoE's
    # experts
    return bool(depth) and extra % depth == 0 and (len(decoder) > 2 or extra <= CROSS_PROJECTIONS * depth)


def _looked_up(by_launch: list[str | None], pieces: list[Piece], trace: Trace, lookup: np.ndarray,
               names: np.ndarray) -> list[str | None]:
    """The launches' two groups turned round where the embedding lookups say so: a prefill looks up more tokens than
    a decode step, and the lookup's grid follows its tokens (on the same kernel). The thread blocks of the rest may
    not: a compiled decode's split reductions launch more blocks for one token than the prefill's tiles for sixteen.
    The lookup kernels every step runs are compared (a compiler may specialise one for the prefill's tokens), and
    every step read as a prefill must look up fewer blocks on them than every step read as a decode (`lookup`: per
    GPU row, launched by an embedding lookup)."""
    blocks = grid_blocks(trace)
    looked = [p.rows[lookup[p.rows]] for p in pieces]
    shared = np.array(sorted(set.intersection(*(set(names[r].tolist()) for r in looked))), dtype=np.int64)
    sizes = [int(blocks[r[isin(names[r], shared)]].sum()) for r in looked]
    if not len(shared) or not all(sizes):
        return by_launch
    prefill = [s for s, b in zip(sizes, by_launch, strict=True) if b == "prefill"]
    decode = [s for s, b in zip(sizes, by_launch, strict=True) if b == "decode"]
    if max(prefill) >= min(decode):
        return by_launch
    return [{"prefill": "decode", "decode": "prefill"}.get(b) if b else None for b in by_launch]


def _oriented(by_launch: list[str | None], evidence: list[str | None], pieces: list[Piece]) -> list[str | None]:
    """The launches tell unlike steps from alike ones, and which are the prefills by their thread blocks; where op
    shapes say the phase of some steps and every one of them reads the other way by launches, the blocks misled (an
    eager prefill beside decodes a compiler fused into fewer, larger kernels, replayed from CUDA graphs): the
    launches' two groups are the other way round."""
    said = [(e, launched) for e, launched, p in zip(evidence, by_launch, pieces, strict=True)
            if e in ("prefill", "decode") and launched and not p.encoder]  # the shapes', not the join's
    if not said or any(e == launched for e, launched in said) or len(set(by_launch) - {None}) < 2:
        return by_launch  # agreeing, or all launched alike: no two groups to turn round
    return [{"prefill": "decode", "decode": "prefill"}.get(launched) if launched else None for launched in by_launch]


def _without_drafts(pieces: list[Piece], outputs: list[bool] | None, names: np.ndarray, trace: Trace,
                    links: Links, detail: str) -> tuple[list[Piece], list[bool] | None, str]:
    """The forwards with the draft model's left out (steps.drafts), their outputs (_outputs), and the evidence
    saying so."""
    if len(pieces) < 3:
        return pieces, outputs, detail
    blocks = grid_blocks(trace)
    drafts = draft_forwards([names[p.rows] for p in pieces], name_classes(trace.names)[1],
                            [blocks[p.rows] for p in pieces], outputs)
    if drafts is None:
        return pieces, outputs, detail
    # The served model checks the drafts' tokens, continuing its sequence from its cache: where op shapes tell, one of
    # its forwards after the first attends to keys before its own. Forwards that each start afresh (a VLM's prefills,
    # vision tower and layers on the same grids) with shorter forwards over their cache after them are generations.
    served = [p for i, p in enumerate(pieces) if i not in drafts.forwards][1:]
    said_by = [t for t in (step_tokens(trace, links, p.rows) for p in served) if t.query_len and t.kv_len]
    if said_by and not any(t.kv_len > t.query_len for t in said_by):
        return pieces, outputs, detail
    said = (f"{len(drafts.forwards)} forwards of a {drafts.layers}-layer draft model between the steps left out "
            f"(assisted / speculative decoding; its per-layer kernels run {drafts.of} times in a step)")
    kept = [i for i in range(len(pieces)) if i not in drafts.forwards]
    return ([pieces[i] for i in kept], None if outputs is None else [outputs[i] for i in kept],
            f"{detail}; {said}" if detail else said)


def _outputs(pieces: list[Piece], trace: Trace, links: Links) -> list[bool] | None:
    """Whether each forward ends in an output: runs the output head (where op shapes tell) or samples (where the
    trace's host side holds sampling ops); None where neither tells. Either says so: shapes may be recorded for some
    forwards only."""
    head = widest_gemm_rows(trace, links)
    by_head = [bool(head[p.rows].any()) for p in pieces] if head is not None else None
    sampled = forward_anchors.occurrences(trace, links, "sampling", np.arange(len(trace.gpu)))
    when = forward_anchors.launch_times(trace, links)
    if not len(sampled) or when is None:
        return by_head
    spans = [p.host_span or (int(when[p.rows].min()), int(when[p.rows].max())) for p in pieces]
    by_sampling = [bool(np.searchsorted(sampled, hi, "right") > np.searchsorted(sampled, lo, "left"))
                   for lo, hi in spans]
    return by_sampling if by_head is None else [a or b for a, b in zip(by_head, by_sampling, strict=True)]


def _packed(pieces: list[Piece], tokens: list, evidence: list) -> tuple[list, set[int]]:
    """Continuous batching packs every sequence's tokens into one row: where forwards show it (steps.phase.
    packed_mixed: decodes beside prompt tokens), those are mixed, and rows whose every token is sampled are decodes
    of as many sequences, not extends (the shapes say no more than `query` tokens a row). Also which forwards are
    so read: their batch is the sequences the output head samples, not the one row."""
    free = [not (p.mark and p.mark.phase) for p in pieces]
    if not any(f and packed_mixed(t) for f, t in zip(free, tokens, strict=True)):
        return evidence, set()
    read = ["mixed" if f and packed_mixed(t) else "decode" if f and packed_decode(t) else None
            for f, t in zip(free, tokens, strict=True)]
    rows = {i for i, (f, t) in enumerate(zip(free, tokens, strict=True))
            if f and t.batch == 1 and t.head_rows and t.head_rows >= 2}  # a prefill of several prompts too
    return [r or e for r, e in zip(read, evidence, strict=True)], rows


def _recomputed(pieces: list[Piece], tokens: list, evidence: list, runs: Callable[[], list[GrowingRun] | None],
                warnings: list[str]) -> list:
    """Forwards that recompute a growing sequence (a loop without a KV cache) are prefills, though only their launch
    grids say so: where no annotation or attention shape gives the phase, a run of forwards (steps.phase.growing_runs)
    whose embedding lookups grow (each forward looks up more tokens, where a decode step looks up one per sequence),
    or, where no lookup is recorded, whose launches mostly grow from first to last, is read as prefills; a run whose
    launches grow less than that but more than a decode step over a KV cache does gets a warning. `runs`: the
    pieces' runs (steps.phase.growing_runs), read on first call."""
    open_ = [not (p.mark and p.mark.phase) and (e is None or rows_alone(t))
             for p, t, e in zip(pieces, tokens, evidence, strict=True)]
    if len(pieces) < 2 or not any(open_):
        return evidence
    evidence = list(evidence)
    for run in runs() or []:
        inside = [i for i in range(run.first, run.last + 1) if open_[i]]
        # Where op shapes give every forward's projection rows, a forward that recomputes the sequence processes
        # more tokens than the one before it: rows that stay from one forward to the next are decode steps (a run
        # of decodes whose lookup's grid grew once, at the next prompt's short prefill)
        rows = [tokens[i].gemm_rows for i in range(run.first, run.last + 1)]
        if all(rows) and any(b <= a for a, b in zip(rows, rows[1:], strict=False)):
            continue
        if run.recomputes:
            for i in inside:
                evidence[i] = "prefill"
        elif run.uncertain and inside:
            warnings.append(_uncertain_words(run))
    return evidence


def _drifted(by_launch: list[str | None], runs: list[GrowingRun] | None) -> list[str | None]:
    """Decode steps over a growing cache drift from the typical step's launches (eager attention's grids follow the
    keys), and the late ones read as another group by their launches. A run of forwards whose launches only grow
    gradually (steps.phase.growing_runs) and recompute nothing holds no prefill once it begins with a decode (a
    prompt's prefill grows more than that over the decode before it, and collapses to the decodes after it): where
    such a run holds two or more steps read as prefills by their launches, all of it is decodes."""
    out = list(by_launch)
    for run in runs or []:
        span = range(run.first, run.last + 1)
        if (not run.recomputes and not run.uncertain and out[run.first] == "decode"
                and sum(out[i] == "prefill" for i in span) >= 2):
            for i in span:
                out[i] = "decode"
    return out


def _uncertain_words(run: GrowingRun) -> str:
    return (f"forwards {run.first}-{run.last}: {run.grown:.0%} of the kernel launches they share run on more thread "
            f"blocks in the last than in the first: more than a decode step's attention over a growing KV cache "
            f"grows, less than forwards that each recompute the whole sequence (no KV cache) grow; neither an "
            f"annotation nor an attention op's shapes say which (record_shapes=True records them), so their phase is "
            f"uncertain")


def _drop_incomplete(trace: Trace, links: Links, pieces: list[Piece], tokens: list, evidence: list):
    """Steps whose GPU work is not all in the trace (the capture or the file ended before it was written) are
    partial: left out, with what is missing. A step is whole when every launch its CPU side made has its GPU work in
    the trace (matched by correlation): none of its launch records lacks it, and none of its CPU ops that always
    launch came after the launch records end (a file cut short keeps the CPU side and loses the rest). A step's CPU
    side is its annotation's span, the host time between its anchors, or from its first launch to the next step's.
    Where no CPU op is tied to a launch, a step of a cut file must end before the host time the file's GPU events are
    known to reach."""
    lost = lost_launches(trace)
    unlaunched = forward_anchors.unlaunched_ops(trace)
    known_until = None if unlaunched is not None else trace.known_until_ns  # the ops tell, or the reach must
    unlaunched = np.empty(0, np.int64) if unlaunched is None else unlaunched
    if not len(lost) and not len(unlaunched) and known_until is None:
        return pieces, tokens, evidence, []
    when = forward_anchors.launch_times(trace, links)
    firsts = [int(when[p.rows].min()) if when is not None and len(p.rows) else p.start_ns for p in pieces]
    lasts = [int(when[p.rows].max()) if when is not None and len(p.rows) else p.end_ns for p in pieces]
    keep, incomplete = [], []
    for i, p in enumerate(pieces):  # the host time [lo, hi) of its CPU side; nothing closes a last step cut by the
        # kernel sequence: it ends with its last launch
        lo, hi = p.host_span or ((p.mark.ts_ns, p.mark.end_ns + 1) if p.mark else (
            firsts[i], firsts[i + 1] if i + 1 < len(pieces) else lasts[i] + 1))
        missing = int(np.searchsorted(lost, hi, side="left") - np.searchsorted(lost, lo, side="left"))
        unknown = int(np.searchsorted(unlaunched, hi, side="left") - np.searchsorted(unlaunched, lo, side="left"))
        beyond = known_until is not None and hi - 1 > known_until  # the file ends before it does
        (incomplete.append((p, missing, unknown, beyond)) if missing or unknown or beyond else keep.append(i))
    return ([pieces[i] for i in keep], [tokens[i] for i in keep], [evidence[i] for i in keep], incomplete)


def _incomplete_words(incomplete: list) -> str:
    names = [p.mark.name if p.mark else f"the step at {p.start_ns / 1e6:.3f} ms" for p, *_ in incomplete]
    missing, unknown, cut = (sum(x[k] for x in incomplete) for k in (1, 2, 3))
    why = "; ".join(w for w in (f"{missing} launches without their GPU work" if missing else "",
                                f"{unknown} calls of ops that launch, after the launch records end" if unknown else "",
                                f"{cut} run past where the file ends" if cut else "") if w)
    return (f"{len(incomplete)} step(s) whose GPU work is not all in the trace were left out as partial "
            f"({', '.join(names[:3])}{' and others' if len(names) > 3 else ''}: {why})")


def _merge_fragments(pieces, tokens, evidence, trace: Trace):
    """Fragments (pieces under half a typical step) are parts of a neighbour that an anchor inside it cut apart, as
    when a prefill, running other kernels, does not fit the decode period: a fragment joins a non-decode neighbour
    (the next one first), else the piece before it. A leading fragment before a decode step stays: it is the tail
    of a step the capture began in, left out as partial."""
    typical = float(np.median([len(p.rows) for p in pieces]))
    end = trace.gpu.end_ns

    def small(i):
        return len(items[i][0].rows) < 0.5 * typical and items[i][0].mark is None

    def joinable(i):  # may absorb a fragment
        return items[i][0].mark is None and items[i][2] not in (None, "decode")

    def merge(i, j):  # j absorbs i
        (p, t, e), (q, u, f) = items[i], items[j]
        lo, hi = (p, q) if i < j else (q, p)
        rows = np.concatenate([lo.rows, hi.rows])
        keep_t = t if (t.gemm_rows or 0) > (u.gemm_rows or 0) else u
        items[j] = (Piece(lo.start_ns, int(max(lo.end_ns, end[hi.rows].max())), rows), keep_t, f or e)
        del items[i]

    items = list(zip(pieces, tokens, evidence, strict=True))
    i = 0
    while i < len(items) and len(items) > 1:
        if small(i) and (items[i][2] is None or items[i][2] != "decode"):
            nxt = i + 1 if i + 1 < len(items) else None
            prev = i - 1 if i > 0 else None
            if nxt is not None and joinable(nxt):
                merge(i, nxt)
                continue
            if prev is not None and (joinable(prev) or nxt is not None):
                merge(i, prev)
                i = prev
                continue
        i += 1
    return [x[0] for x in items], [x[1] for x in items], [x[2] for x in items]


def _split_overlong(pieces: list[Piece], names: np.ndarray, trace: Trace) -> list[Piece]:
    """A piece that is a typical step plus a fragment (an anchor the cut missed) becomes the two."""
    lengths = np.array([len(p.rows) for p in pieces])
    typical = int(np.median(lengths))
    if typical < 2:
        return pieces
    reference = Counter(names[pieces[int(np.argsort(lengths)[len(lengths) // 2])].rows].tolist())
    out = []
    end = trace.gpu.end_ns
    for p in pieces:
        if len(p.rows) < 1.5 * typical:
            out.append(p)
            continue
        head, tail = p.rows[:typical], p.rows[-typical:]
        scores = [mix_overlap(Counter(names[r].tolist()), reference) for r in (head, tail)]
        if max(scores) < SAME_MIX:
            out.append(p)
            continue
        split = typical if scores[0] >= scores[1] else len(p.rows) - typical
        for rows in (p.rows[:split], p.rows[split:]):
            out.append(Piece(int(trace.gpu.ts_ns[rows[0]]), int(end[rows].max()), rows))
    return out

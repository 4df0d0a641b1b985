"""The gap ledger: the measured decode step beside its hardware floor, component by component, and how much of
the excess the findings explain. Used by `analyze --model ...` (with --gpu, or the GPU the trace names).

Measured kernel groups are mapped onto the floor's components (attention projections, KV read, dense MLP,
routed experts, shared experts, router, lm_head, all-reduce) by what the trace tells about each:
- `kernel family`: attention, MoE (fused MoE, grouped GEMM, matmul_ogs, routing) and collective kernels;
- `op`: a GEMM launched by an op that names its component (`aten::_grouped_mm`, an MoE op, SDPA's math path);
- `shape`: a GEMM's operand shapes against the model geometry (vocab -> lm_head; an expert width in a batched or
  3-D operand -> experts);
- `coarse`: a GEMM seen without shapes (CUDA-graph replay) is placed by its calls per step against the model's
  layer counts (every layer: attention; every MoE layer: the MoE block; every dense layer: the dense MLP; once:
  lm_head). A group whose calls add up from several (153 = 78 layers + 75 MoE layers) is split by calls.
Components that cannot be told apart share one row. A physical floor cannot be beaten: a row below its floor means
the mapping split too finely, so it is merged with the rows it shares kernels with; one that still beats its floor
gets a warning (the setup is not the one the floor describes: another --tp, another model)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from decodegap.errors import NAME_ONLY, ParameterError, UserError
from decodegap.floor.floor import MS_DIGITS, Floor
from decodegap.records import Struct

# Floor components (model/floor.py) -> the ledger component that carries them.
COMPONENT_OF = {"attention_weights": "attention_projections", "indexer_weights": "attention_projections",
                "kv_cache": "attention_kv_read", "indexer_cache": "attention_kv_read", "dense_mlp": "dense_mlp",
                "experts": "experts", "router": "experts", "shared_experts": "shared_experts",
                "lm_head": "lm_head", "allreduce": "allreduce",
                # a recurrent mixer's projections and the state it reads in place of a KV cache
                "recurrent_weights": "attention_projections", "recurrent_state": "attention_kv_read"}
MAX_PER_LAYER = 8  # GEMM launches of one kind per layer that a decomposition of calls per step may assume
# The measured time of a row may fall short of its floor by this much before it counts as beating it (the
# floor's datasheet bandwidth vs rounding of per-call times).
BEAT_TOLERANCE = 0.02
DEFAULT_CONTEXT = 4096  # KV tokens per sequence for the floor when the caller gives none
# How a ledger row's measured time was found (its `mapping`), every value the ledger writes: the weight rows by
# their kernels' evidence (strongest first), then the categories without a floor and the step's GPU idle time.
KERNEL_FAMILY, OP, SHAPE, COARSE = "kernel family", "op", "shape", "coarse"
NO_KERNEL, NO_FLOOR, IDLE = "none (no kernel maps to it)", "category (no floor)", "step wall time"
MAPPINGS = (KERNEL_FAMILY, OP, SHAPE, COARSE, NO_KERNEL, NO_FLOOR, IDLE)


@dataclass(frozen=True)
class FloorRequest:
    """What the floor needs besides the GPU, kept until the trace names its GPU."""

    model_path: object
    quant_path: object
    weights: str | None
    kv: str | None
    tp: int
    batch: int
    context: int
    allreduce_us: float | None


class LedgerRow(Struct):
    """Measured time of one floor component (or of components the trace cannot tell apart) beside its floor."""

    category: str
    components: list[str]
    measured_ms: float
    floor_ms: float
    excess_ms: float
    efficiency: float | None
    mapping: str  # one of MAPPINGS: how the measured time was found
    kernel_groups: int | None
    beats_floor: bool


class GapLedger(Struct):
    """The measured decode step beside its floor, component by component, and how much of the excess the findings
    explain."""

    step_ms: float
    floor_ms: float
    excess_ms: float
    efficiency: float | None
    explained_by_findings_ms: float
    unexplained_ms: float
    gpu: str | None
    tp: int
    rows: list[LedgerRow]
    warnings: list[str]


def prepare_model_options(options, model_path, quant_path, weights, kv, gpu, tp, batch, context, allreduce_us):
    """`options` (a decodegap.pipeline.AnalysisOptions) with the model geometry (for findings) and, with a GPU, the
    floor; without one the floor waits for the trace's GPU (`floor_request`, which the pipeline completes)."""
    from decodegap.floor import compute_floor, get_gpu, load_model, resolve_quant
    from decodegap.floor.floor import check_counts, check_tp

    if model_path is None:
        raise ParameterError("{gpu} needs {model} (the floor is computed from the model's config.json)", gpu=gpu,
                             model=NAME_ONLY)
    check_counts(tp=tp, batch=batch, context=context)
    geometry = load_model(model_path)
    check_tp(geometry, tp)
    request = FloorRequest(model_path, quant_path, weights, kv, tp, batch,
                           context if context is not None else DEFAULT_CONTEXT, allreduce_us)
    scheme = resolve_quant(model_path, quant_path, weights, kv)  # a bad quant config fails before the trace
    floor = None if gpu is None else compute_floor(geometry, scheme, get_gpu(gpu), tp=tp, batch=batch,
                                                   context=request.context, allreduce_us=allreduce_us)
    return replace(options, model=geometry, active_tokens=batch * context if context is not None else None,
                   floor=floor, floor_request=request if floor is None else None)


def floor_for_device(request: FloorRequest, geometry, device: str | None) -> tuple[Floor | None, list[str]]:
    """With a model but no GPU given: the floor for the GPU the trace's deviceProperties name, or why none."""
    from decodegap.floor import compute_floor, get_gpu, resolve_quant

    if not device:
        return None, ["no floor: the trace names no GPU; give --gpu NAME for the floor and the gap ledger"]
    try:
        gpu = get_gpu(device)
    except UserError:
        return None, [f"no floor: the trace's GPU '{device}' is not in the GPU table; give --gpu NAME"]
    scheme = resolve_quant(request.model_path, request.quant_path, request.weights, request.kv)
    return compute_floor(geometry, scheme, gpu, tp=request.tp, batch=request.batch, context=request.context,
                         allreduce_us=request.allreduce_us), []


# ---- mapping measured kernels onto floor components -------------------------------------------------------


@dataclass
class _Row:
    components: set[str]
    measured_ms: float = 0.0
    groups: int = 0
    notes: set[str] = field(default_factory=set)


# The launching op names a component where the kernel does not: grouped/MoE GEMM ops, attention ops whose math
# runs as plain GEMMs (SDPA's math path, eager attention modules).
_OP_COMPONENTS = ((re.compile(r"grouped_mm|moe|expert", re.IGNORECASE), "experts"),
                  (re.compile(r"scaled_dot_product|attention|sdpa|flash|paged", re.IGNORECASE), "attention_kv_read"))


def _gemm_candidates(k, g, tp: int) -> tuple[list[tuple[float, frozenset[str]]], str] | None:
    """Shares of a GEMM group's time per candidate component set, and how they were found."""
    for pattern, component in _OP_COMPONENTS:
        if k.op and pattern.search(k.op):
            return [(1.0, frozenset({component}))], OP
    by_shape = _by_shape(k, g, tp)
    if by_shape is not None:
        return [(1.0, by_shape)], SHAPE
    calls = round(k.calls_per_step)
    if calls < 1 or abs(k.calls_per_step - calls) > 0.05:
        return None
    attention = frozenset({"attention_projections", "attention_kv_read"} | ({"dense_mlp"} if not g.is_moe else set()))
    periods = [(g.num_layers, attention)]
    if g.is_moe:
        periods.append((g.num_moe_layers, frozenset({"experts", "shared_experts"})))
        if g.num_dense_layers:
            periods.append((g.num_dense_layers, frozenset({"dense_mlp"})))
    periods.append((1, frozenset({"lm_head"})))
    by_count: dict[int, frozenset] = {}
    for count, comps in periods:  # equal counts (every layer is an MoE layer) cannot be told apart
        if count > 0:
            by_count[count] = by_count.get(count, frozenset()) | comps
    split = _decompose(calls, sorted(by_count.items(), reverse=True))
    if split is None:
        return None
    return [(n / calls, comps) for n, comps in split], COARSE


def _decompose(calls: int, periods: list[tuple[int, frozenset]]) -> list[tuple[int, frozenset]] | None:
    """calls = sum of k_i x period_i with 0 <= k_i <= MAX_PER_LAYER, the fewest terms first, then the fewest
    launches per layer; None when no such sum exists or two tie (the calls do not say where the kernel belongs)."""
    best: list[list[tuple[int, frozenset]]] = []
    best_terms = None

    def search(i: int, left: int, chosen: list[tuple[int, frozenset]]) -> None:
        nonlocal best_terms
        if left == 0:
            # fewest kinds of layer, then fewest launches per layer: 81 = 78 + 3 rather than 75 + 2 x 3
            terms = (len(chosen), sum(n // periods[[c for _, c in periods].index(c)][0] for n, c in chosen))
            if best_terms is None or terms < best_terms:
                best.clear()
                best_terms = terms
            if terms == best_terms:
                best.append(list(chosen))
            return
        if i == len(periods):
            return
        period, comps = periods[i]
        for k in range(min(MAX_PER_LAYER, left // period) if period > 1 else min(left, 1), -1, -1):
            search(i + 1, left - k * period, chosen + ([(k * period, comps)] if k else []))

    search(0, calls, [])
    if len(best) != 1:
        return None
    return best[0]


def _by_shape(k, g, tp: int) -> frozenset[str] | None:
    """The component a GEMM's operand shapes reveal, when they reveal one."""
    if not k.input_shapes:
        return None
    dims = {d for shape, _ in k.input_shapes for d in (shape or [])[-2:] if isinstance(d, int)}
    if not dims:
        return None
    vocab_shards = {g.vocab, -(-g.vocab // tp)}
    if dims & vocab_shards or any(abs(d * tp - g.vocab) < 256 for d in dims if d > 1024):
        return frozenset({"lm_head"})
    if g.is_moe:
        widths = {w // s for w in (g.moe_intermediate, 2 * g.moe_intermediate) for s in {1, tp} if w % s == 0}
        three_d = any(len(shape or []) == 3 for shape, _ in k.input_shapes)
        if dims & widths and g.hidden in dims:
            return frozenset({"experts"}) if three_d or (k.op or "").endswith("bmm") else frozenset(
                {"experts", "shared_experts"})
        if g.num_experts in dims and g.hidden in dims:
            return frozenset({"experts"})  # the router
    shards = {1, tp}

    def split(*widths: int) -> set[int]:
        return {w // s for w in widths for s in shards if w and w % s == 0}

    found: set[str] = set()  # every component the dims fit: equal widths (q_lora == MLP width) stay ambiguous
    if g.intermediate and g.num_dense_layers and g.hidden in dims and dims & split(g.intermediate, 2 * g.intermediate):
        found.add("dense_mlp")
    qk_head = g.qk_nope_head_dim + g.qk_rope_head_dim
    projection_widths = split(g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, 2 * g.num_kv_heads * g.head_dim,
                              (g.num_heads + 2 * g.num_kv_heads) * g.head_dim, g.num_heads * qk_head,
                              g.num_heads * (g.qk_nope_head_dim + g.v_head_dim), g.num_heads * g.v_head_dim)
    projection_widths |= {w for w in (g.q_lora_rank, g.kv_lora_rank + g.qk_rope_head_dim, g.kv_lora_rank) if w}
    if g.hidden in dims and dims & projection_widths:
        found.add("attention_projections")
    if found:
        return frozenset(found)
    cache_widths = {g.kv_lora_rank, g.kv_width} if g.is_mla else {g.head_dim}
    known = projection_widths | cache_widths | {g.hidden, g.head_dim, g.qk_nope_head_dim, g.v_head_dim,
                                                g.num_heads, g.num_kv_heads, 1}
    if dims & cache_widths and dims - known:  # scores or values over the cached tokens (a dim no width explains)
        return frozenset({"attention_kv_read"})
    if dims & cache_widths and dims <= known:  # MLA's absorbed up-projections (per head, no token dim)
        return frozenset({"attention_projections"})
    return None


def _assign(b, g, floor: Floor) -> tuple[dict[frozenset, _Row], list]:
    """Measured time per candidate component set (`b` a Breakdown, `g` the model geometry or None); the other
    groups (non-weight categories) apart."""
    rows: dict[frozenset, _Row] = {}
    links: list[set[frozenset]] = []  # component sets that one kernel group's time was split between
    unmapped = _Row(set())
    for k in b.kernels:
        if k.category == "collective":
            shares, note = [(1.0, frozenset({"allreduce"}))], KERNEL_FAMILY
        elif k.category == "attention":
            shares, note = [(1.0, frozenset({"attention_kv_read"}))], KERNEL_FAMILY
        elif k.category == "moe":
            shares, note = [(1.0, frozenset({"experts"}))], KERNEL_FAMILY
        elif k.category == "gemm":
            found = _gemm_candidates(k, g, floor.tp) if g is not None else None
            if found is None:
                unmapped.measured_ms += k.ms_per_step
                unmapped.groups += 1
                continue
            shares, note = found
            if len(shares) > 1:
                note = COARSE
                links.append({comps for _, comps in shares})
        else:
            continue
        for fraction, comps in shares:
            row = rows.setdefault(comps, _Row(set(comps)))
            row.measured_ms += fraction * k.ms_per_step
            row.groups += 1
            row.notes.add(note)
    return rows, [links, unmapped]


def _merge_overlapping(rows: dict[frozenset, _Row]) -> list[_Row]:
    """Candidate sets that share a component become one row (the measured time cannot be told apart)."""
    merged: list[_Row] = []
    for row in rows.values():
        overlapping = [m for m in merged if m.components & row.components]
        target = _Row(set(row.components), row.measured_ms, row.groups, set(row.notes))
        for m in overlapping:
            target.components |= m.components
            target.measured_ms += m.measured_ms
            target.groups += m.groups
            target.notes |= m.notes
            merged.remove(m)
        merged.append(target)
    return merged


def _merge(a: _Row, b: _Row) -> _Row:
    return _Row(a.components | b.components, a.measured_ms + b.measured_ms, a.groups + b.groups,
                a.notes | b.notes | {COARSE})


def _beats(row: _Row, floor_ms: float) -> bool:
    return floor_ms > 0 and row.measured_ms < floor_ms * (1 - BEAT_TOLERANCE)


def _component_rows(b, g, floor: Floor) -> tuple[list[_Row], dict[str, float], list[str]]:
    floor_of: dict[str, float] = {}
    for c in floor.components:
        name = COMPONENT_OF.get(c.name, c.name)
        floor_of[name] = round(floor_of.get(name, 0.0) + c.ms, MS_DIGITS)
    rows_by_set, (links, unmapped) = _assign(b, g, floor)
    rows = _merge_overlapping(rows_by_set)
    # floor components nothing mapped to get a row of their own (measured 0)
    covered = set().union(*(r.components for r in rows)) if rows else set()
    rows += [_Row({name}) for name in floor_of if name not in covered and floor_of[name] > 0]

    def floor_ms(row: _Row) -> float:
        return _floor_of_row(row, floor_of)

    def linked(row: _Row) -> list[_Row]:
        out = []
        for sets in links:
            touched = [r for r in rows if r is not row and any(r.components & s for s in sets)]
            if any(row.components & s for s in sets):
                out += [r for r in touched if r not in out]
        return out

    changed = True
    while changed:  # a row below its floor is merged with the rows its kernels were split with
        changed = False
        for row in sorted(rows, key=lambda r: -floor_ms(r)):
            if not _beats(row, floor_ms(row)):
                continue
            partners = linked(row)
            if partners:
                merged = row
                for p in partners:
                    merged = _merge(merged, p)
                    rows.remove(p)
                rows.remove(row)
                rows.append(merged)
                changed = True
                break
            if unmapped.groups and "allreduce" not in row.components:
                # GEMMs that nothing placed: every weight row below its floor is compared with them at once
                beaten = [r for r in rows if _beats(r, floor_ms(r)) and "allreduce" not in r.components]
                merged = unmapped
                for r in beaten:
                    merged = _merge(merged, r)
                    rows.remove(r)
                rows.append(merged)
                unmapped = _Row(set())
                changed = True
                break
    if unmapped.groups:
        rows.append(_Row(set(), unmapped.measured_ms, unmapped.groups, {COARSE}))
    warnings = []
    for row in rows:
        least = floor_ms(row)
        if _beats(row, least):
            names = " + ".join(sorted(row.components))
            warnings.append(
                f"gap ledger: {names} measured {row.measured_ms:.3f} ms per step, below its floor of {least:.3f} ms "
                f"(impossible on a {floor.gpu}): the trace is not the setup the floor describes"
                + (f" (one rank of more than --tp {floor.tp}? another model?)" if row.measured_ms > 0 else
                   " (no kernel of the trace maps to it: "
                   + ("a single-rank trace has no collectives" if row.components == {"allreduce"} else
                      "it ran inside kernels the ledger cannot place") + ")"))
    return rows, floor_of, warnings


ORDER = ("attention_projections", "attention_kv_read", "dense_mlp", "experts", "shared_experts", "lm_head",
         "allreduce")


def _row_name(components: set[str]) -> str:
    if not components:
        return "gemm (unmapped)"
    return " + ".join(c for c in ORDER if c in components) or " + ".join(sorted(components))


def _mapping(row: _Row) -> str:
    for note in (COARSE, SHAPE, OP, KERNEL_FAMILY):
        if note in row.notes:
            return note
    return NO_KERNEL


def _floor_of_row(row: _Row, floor_of: dict[str, float]) -> float:
    """The floor of a row's components, rounded as the floor rounds its own times (one value everywhere)."""
    return round(float(sum(floor_of.get(c, 0.0) for c in row.components)), MS_DIGITS)


NO_LEDGER_CPU = "no gap ledger: the trace has no GPU events, and CPU op time cannot be set against a GPU floor"


def gap_ledger(floor: Floor, geometry, b, has_gpu: bool, findings) -> tuple[GapLedger | None, list[str]]:
    """The ledger of the detailed rank (`b` its Breakdown) against `floor`, and its warnings (the floor's, a row
    below its floor, or why there is no ledger); `findings` the report's, for what they explain."""
    if not has_gpu:
        return None, [NO_LEDGER_CPU]
    rows_out = []
    comp_rows, floor_of, warnings = _component_rows(b, geometry, floor)
    for row in comp_rows:
        least = _floor_of_row(row, floor_of)
        got = row.measured_ms
        rows_out.append(LedgerRow(
            category=_row_name(row.components), components=[c for c in ORDER if c in row.components],
            measured_ms=round(got, 4), floor_ms=least, excess_ms=round(max(got - least, 0.0), 4),
            efficiency=round(least / got, 4) if got > 0 and least > 0 else None,
            mapping=_mapping(row), kernel_groups=row.groups, beats_floor=_beats(row, least)))
    for c in b.categories:
        if c.name in ("gemm", "moe", "attention", "collective"):
            continue
        rows_out.append(LedgerRow(category=c.name, components=[], measured_ms=round(c.ms_per_step, 4), floor_ms=0.0,
                                  excess_ms=round(c.ms_per_step, 4), efficiency=None, mapping=NO_FLOOR,
                                  kernel_groups=None, beats_floor=False))
    rows_out.sort(key=lambda r: (-r.floor_ms, -r.measured_ms))
    idle = max(b.step_ms.median - b.busy_ms_per_step, 0.0)
    rows_out.append(LedgerRow(category="gpu_idle", components=[], measured_ms=round(idle, 4), floor_ms=0.0,
                              excess_ms=round(idle, 4), efficiency=None, mapping=IDLE, kernel_groups=None,
                              beats_floor=False))
    step = b.step_ms.median
    excess = max(step - floor.floor_ms, 0.0)
    explained = float(min(sum(f.ms_per_step for f in findings if f.id not in ("profiler_overhead", "outside_step")),
                          excess))
    all_warnings = [f"floor: {w}" for w in floor.warnings] + warnings
    ledger = GapLedger(step_ms=round(step, 4), floor_ms=floor.floor_ms, excess_ms=round(excess, 4),
                       efficiency=round(floor.floor_ms / step, 4) if step else None,
                       explained_by_findings_ms=round(explained, 4), unexplained_ms=round(excess - explained, 4),
                       gpu=floor.gpu, tp=floor.tp, rows=rows_out, warnings=all_warnings)
    return ledger, all_warnings

"""The Analysis: everything decodegap found in a trace, typed and immutable; the one thing every view reads.

Built once from the pipeline's stages (steps, breakdown, findings, floor); `to_dict()` is exactly what
`analyze --format json` prints, `load()` reads a saved report back, and the JSON Schema is generated from these
types (docs/report.schema.json). DataFrame views need pandas (the `pandas` extra)."""

from __future__ import annotations

from html import escape
from pathlib import Path

import msgspec
from msgspec import UNSET, UnsetType

from decodegap import __version__
from decodegap.breakdown import Spread
from decodegap.errors import UserError
from decodegap.kernel_names import short_kernel_name
from decodegap.profiler_check import profiler_check
from decodegap.steps import PHASES, describe
from decodegap.rounding import rounded as _r

SCHEMA = "decodegap.report/1"


class Struct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    pass


class Tool(Struct):
    name: str
    version: str


class TraceInfo(Struct):
    path: str
    files: list[str]
    device: str | None
    detail_rank: int | None


class StepStats(Struct):
    median: float
    mean: float
    min: float
    max: float
    p90: float


class PhaseSteps(Struct):
    count: int
    source: str
    ms: StepStats
    ms_each: list[float]
    tokens: int | None
    batch: int | None


class StepsSummary(Struct):
    decode: PhaseSteps
    prefill: PhaseSteps
    mixed: PhaseSteps
    training: PhaseSteps
    source: str
    source_detail: str
    dropped_partial: int


class StepRow(Struct):
    """One step of the main rank: where it starts on the GPU timeline and where its time goes."""

    index: int
    phase: str
    label: str | None
    start_ms: float
    ms: float
    gpu_busy_ms: float
    batch: int | None
    tokens: int | None
    category_ms: dict[str, float]


class LayerRow(Struct):
    """One layer of the typical step (the one the layer count was read from)."""

    index: int
    kind: int  # 0..k-1 when layers alternate between k kinds (layer_kinds[kind]), else 0
    start_ms: float  # from the step's start
    ms: float  # from this layer's first kernel to the next layer's
    gpu_ms: float  # GPU time of its kernels


class LayerKind(Struct):
    count: int
    markers: list[str]


class Category(Struct):
    name: str
    ms_per_step: float
    share: float
    share_of_step: float


class Kernel(Struct):
    name: str
    short_name: str
    category: str
    calls_per_step: float
    ms_per_step: float
    share: float
    us_per_call: float
    op: str | None
    input_shapes: list | None
    grid: str | list[int] | None  # "[557496, 1, 1]" as the trace wrote it (a list in older reports)
    block: str | list[int] | None
    from_graph: bool
    bytes_per_call: int | None
    bytes_source: str | None
    gbps: float | None


class RankRow(Struct):
    rank: int
    path: str
    decode_steps: int
    step_ms_median: float
    gpu_busy_fraction: float
    collective_ms_per_step: float


class Loose(Struct, omit_defaults=True):
    """Evidence: every field optional (a detector reports what it measured): absent stays absent, null stays null.
    Read by attribute (`ev.pool_slots`) or as the mapping the JSON holds (`ev["pool_slots"]`, `ev.items()`)."""

    def as_dict(self) -> dict:
        return msgspec.to_builtins(self)

    def __getitem__(self, key: str):
        value = self.as_dict()
        if key not in value:
            raise KeyError(key)
        return value[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default=None):
        return self.as_dict().get(key, default)

    def items(self):
        return self.as_dict().items()

    def keys(self):
        return self.as_dict().keys()


Num = float | int


class CollectiveGroup(Loose):
    kernel: str | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    expected_us_per_call: Num | None | UnsetType = UNSET
    slowdown: Num | None | UnsetType = UNSET


class CopyGroup(Loose):
    kernel: str | None | UnsetType = UNSET
    op: str | None | UnsetType = UNSET
    shapes: list | None | UnsetType = UNSET
    weight_shape: list | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    ms_per_step: Num | None | UnsetType = UNSET


class HostGapEvidence(Loose):
    gap_us: Num | None | UnsetType = UNSET
    before: str | None | UnsetType = UNSET
    after: str | None | UnsetType = UNSET


class KvPoolCastEvidence(Loose):
    kernel: str | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    layers: int | None | UnsetType = UNSET
    calls_per_layer: int | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    bytes_per_step: int | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    gbps: Num | None | UnsetType = UNSET
    bytes_source: str | None | UnsetType = UNSET
    op: str | None | UnsetType = UNSET
    from_graph: bool | None | UnsetType = UNSET
    shape: list[int] | None | UnsetType = UNSET
    pool_slots: int | None | UnsetType = UNSET
    row_elements: int | None | UnsetType = UNSET
    dtype_from: str | None | UnsetType = UNSET
    dtype_to: str | None | UnsetType = UNSET
    elements_per_call: int | None | UnsetType = UNSET
    note: str | None | UnsetType = UNSET
    matches_model_kv_width: bool | None | UnsetType = UNSET
    model_kv_width: int | None | UnsetType = UNSET
    active_tokens: int | None | UnsetType = UNSET
    active_fraction: Num | None | UnsetType = UNSET
    bytes_needed_per_call: int | None | UnsetType = UNSET


class HostBoundEvidence(Loose):
    gpu_busy_fraction: Num | None | UnsetType = UNSET
    idle_ms_per_step: Num | None | UnsetType = UNSET
    kernels_per_step: Num | None | UnsetType = UNSET
    launch_us_per_kernel: Num | None | UnsetType = UNSET
    launch_ms_per_step: Num | None | UnsetType = UNSET
    graph_replayed_fraction: Num | None | UnsetType = UNSET
    longest_gaps_us: list[HostGapEvidence] | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET


class CollectiveEvidence(Loose):
    collective_ms_per_step: Num | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    groups: list[CollectiveGroup] | None | UnsetType = UNSET
    expected_ms_per_step: Num | None | UnsetType = UNSET
    excess_ms_per_step: Num | None | UnsetType = UNSET
    model: str | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    collective_ms_per_step_by_rank: dict[str, Num] | None | UnsetType = UNSET  # by rank


class StragglerEvidence(Loose):
    collective_ms_per_step_by_rank: dict[str, Num] | None | UnsetType = UNSET  # by rank
    straggler_rank: int | None | UnsetType = UNSET
    max_wait_ms_per_step: Num | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET


class WeightCopyEvidence(Loose):
    bytes_per_step: int | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    shape_checked_against_model: bool | None | UnsetType = UNSET
    groups: list[CopyGroup] | None | UnsetType = UNSET
    left_out_as_activations: list[CopyGroup] | None | UnsetType = UNSET


class ProfilerEvidence(Loose):
    unprofiled_ms: Num | None | UnsetType = UNSET
    profiled_ms: Num | None | UnsetType = UNSET
    ratio: Num | None | UnsetType = UNSET
    source: str | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    samples: int | None | UnsetType = UNSET
    unprofiled_p10_ms: Num | None | UnsetType = UNSET
    unprofiled_p90_ms: Num | None | UnsetType = UNSET
    spread_ms: Num | None | UnsetType = UNSET
    bimodal: bool | None | UnsetType = UNSET
    call_index: list[int] | None | UnsetType = UNSET
    samples_ms: list[Num] | None | UnsetType = UNSET


class AfterFix(Struct):
    """The step a finding leaves once fixed, from the trace's own numbers; `assumes` what that takes for granted."""

    step_ms: float
    tokens_per_s: float  # per sequence, as the report's: 1000 / step_ms
    assumes: str


class BestCase(Struct):
    """The step once the findings with an estimate are fixed, those whose fixes overlap a costlier one's left out:
    their savings added."""

    step_ms: float
    tokens_per_s: float
    findings: list[str]  # the findings whose savings were added
    assumes: str


class Finding(Struct, tag_field="id"):
    """A root cause; `id` (the tag) says which detector found it and so which evidence type it carries."""

    title: str
    ms_per_step: float
    share: float
    share_of: str
    fix: str
    after_fix: AfterFix | None = None  # None: no estimate (or a report from before there were any)

    @property
    def id(self) -> str:
        return type(self).__struct_config__.tag


class KvPoolCast(Finding, tag="kv_pool_cast", kw_only=True):
    evidence: KvPoolCastEvidence


class HostBound(Finding, tag="host_bound", kw_only=True):
    evidence: HostBoundEvidence


class CollectiveBound(Finding, tag="collective_bound", kw_only=True):
    evidence: CollectiveEvidence


class StragglerRank(Finding, tag="straggler_rank", kw_only=True):
    evidence: StragglerEvidence


class WeightCopy(Finding, tag="weight_copy", kw_only=True):
    evidence: WeightCopyEvidence


class ProfilerOverhead(Finding, tag="profiler_overhead", kw_only=True):
    evidence: ProfilerEvidence


class OutsideStep(Finding, tag="outside_step", kw_only=True):
    evidence: ProfilerEvidence


AnyFinding = KvPoolCast | HostBound | CollectiveBound | StragglerRank | WeightCopy | ProfilerOverhead | OutsideStep


class ProfilerCheck(Struct, omit_defaults=True):
    unprofiled_ms: float
    profiled_ms: float
    ratio: float
    source: str
    samples: int | None = None
    unprofiled_p10_ms: float | None = None
    unprofiled_p90_ms: float | None = None
    spread_ms: float | None = None
    bimodal: bool | None = None
    call_index: list[int] | None = None
    samples_ms: list[float] | None = None


class FloorComponent(Struct):
    name: str
    category: str
    bytes_per_gpu: int
    flops_per_gpu: int
    memory_ms: float
    compute_ms: float
    ms: float
    bound: str
    formats: str
    detail: str


class Params(Struct):
    total: int
    active: int
    active_with_embeddings: int
    active_non_embedding: int
    mtp: int


class MemoryPerGpu(Struct):
    weights_bytes: int
    kv_bytes: int
    gpu_bytes: int | None
    fits: bool | None


class ReplicatedWeights(Struct):
    modules: list[str]
    extra_bytes_per_gpu: int
    extra_ms: float


class Floor(Struct):
    schema: str
    model_type: str
    gpu: str
    tp: int
    batch: int
    context: int
    quant: str
    floor_ms: float
    tokens_per_s: float
    aggregate_tokens_per_s: float
    bound: str
    allreduce_us: float
    params: Params
    memory_per_gpu: MemoryPerGpu
    warnings: list[str]
    components: list[FloorComponent]
    replicated_weights: ReplicatedWeights
    assumptions: list[str]


class LedgerRow(Struct):
    category: str
    components: list[str]
    measured_ms: float
    floor_ms: float
    excess_ms: float
    efficiency: float | None
    mapping: str
    kernel_groups: int | None
    beats_floor: bool


class GapLedger(Struct):
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


class Assumed(Struct):
    """A value the run took where the caller gave none (the model config of the bundled example, the floor's
    context or batch), and why."""

    name: str  # model | context | batch
    value: int | str
    reason: str


class Analysis(Struct, kw_only=True):
    schema: str
    tool: Tool
    trace: TraceInfo
    workload: str  # inference | training
    summary: str  # what the trace is, in words
    steps: StepsSummary
    breakdown_phase: str
    layers: int | None
    layers_evidence: str
    layer_kinds: list[LayerKind]
    gpu_busy_fraction: float | None
    gpu_ms_per_step: float | None
    idle_ms_per_step: float | None
    kernels_per_step: float | None
    launch_us_per_kernel: float | None
    categories: list[Category]
    kernels: list[Kernel]
    ranks: list[RankRow]
    slowest_rank: int | None
    findings: list[AnyFinding]
    best_case: BestCase | None = None
    profiler_check: ProfilerCheck | None
    warnings: list[str]
    floor: Floor | None
    gap: GapLedger | None
    step_rows: list[StepRow] = []
    layer_rows: list[LayerRow] = []
    assumed: list[Assumed] = []

    # --- views -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)

    def to_json(self) -> str:
        return msgspec.json.format(msgspec.json.encode(self), indent=2).decode()

    @property
    def decode(self) -> PhaseSteps:
        return self.steps.decode

    def __repr__(self) -> str:
        main = getattr(self.steps, self.breakdown_phase)
        findings = ", ".join(f.id for f in self.findings) or "none"
        floor = f", floor={self.floor.floor_ms:.3f} ms" if self.floor else ""
        return (f"Analysis({self.trace.path!r}, {self.summary!r}, {self.breakdown_phase} median "
                f"{main.ms.median:.3f} ms, findings: {findings}{floor}, warnings: {len(self.warnings)})")

    def _repr_html_(self) -> str:
        return summary_fragment(self)

    def kernels_df(self):
        return _frame([msgspec.to_builtins(k) for k in self.kernels], list(Kernel.__struct_fields__))

    def categories_df(self):
        return _frame([msgspec.to_builtins(c) for c in self.categories], list(Category.__struct_fields__))

    def findings_df(self):
        rows = [{k: v for k, v in msgspec.to_builtins(f).items() if k != "evidence"}
                | {"evidence": f.evidence.as_dict()} for f in self.findings]
        return _frame(rows, ["id", *Finding.__struct_fields__, "evidence"])

    def steps_df(self):
        cats = sorted({c for r in self.step_rows for c in r.category_ms})
        rows = []
        for r in self.step_rows:
            row = {k: v for k, v in msgspec.to_builtins(r).items() if k != "category_ms"}
            rows.append(row | {f"{c}_ms": r.category_ms.get(c, 0.0) for c in cats})
        columns = [f for f in StepRow.__struct_fields__ if f != "category_ms"] + [f"{c}_ms" for c in cats]
        return _frame(rows, columns)


def summary_fragment(analysis) -> str:
    """A short HTML summary of an Analysis, for Jupyter (`_repr_html_`): what the trace is, findings, categories."""
    phase = getattr(analysis.steps, analysis.breakdown_phase)
    rows = "".join(f"<tr><td>{escape(f.id)}</td><td>{f.ms_per_step:.3f}</td><td>{f.share:.0%}</td>"
                   f"<td style='text-align:left'>{escape(f.title)}</td></tr>" for f in analysis.findings)
    cats = "".join(f"<tr><td>{escape(c.name)}</td><td>{c.ms_per_step:.3f}</td><td>{c.share:.1%}</td></tr>"
                   for c in analysis.categories[:12])
    floor = (f"<p>floor {analysis.floor.floor_ms:.3f} ms on {escape(analysis.floor.gpu)}</p>"
             if analysis.floor else "")
    return (f"<div><p><b>decodegap</b>: {escape(analysis.summary)}; median {phase.ms.median:.3f} ms "
            f"({escape(analysis.steps.source)})</p>{floor}"
            f"<table><tr><th>finding</th><th>ms/step</th><th>share</th><th>what</th></tr>{rows}</table>"
            f"<table><tr><th>category</th><th>ms/step</th><th>% GPU</th></tr>{cats}</table></div>")


def _frame(rows: list[dict], columns: list[str]):
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("the DataFrame views need pandas: pip install 'decodegap[pandas]'") from exc
    return pd.DataFrame(rows, columns=columns)


# --- building ---------------------------------------------------------------------------------------------------



def build(report) -> Analysis:
    """The typed Analysis of a pipeline run (decodegap.pipeline.Report). Through JSON, so that the Analysis holds
    exactly what the report says (rank keys as strings, NaN as null): to_dict() is the parsed JSON report."""
    return msgspec.json.decode(_encoder.encode(_plain(report)), type=Analysis)


def _numpy(value):
    """numpy scalars and arrays that slip into evidence become plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_numpy)


def _plain(report) -> dict:
    main = report.main
    b, steps = main.breakdown, main.steps
    out = {
        "schema": SCHEMA,
        "tool": {"name": "decodegap", "version": __version__},
        "trace": {"path": str(report.path), "files": [str(r.trace.path) for r in report.ranks],
                  "device": main.trace.device_name, "detail_rank": main.rank if len(report.ranks) > 1 else None},
        "workload": steps.workload,
        "summary": describe(steps, b.layers),
        "steps": _steps(steps),
        "breakdown_phase": b.phase,
        "layers": b.layers,
        "layers_evidence": b.layers_evidence,
        "layer_kinds": [{"count": k.count, "markers": list(k.markers)} for k in b.layer_kinds],
        "gpu_busy_fraction": _r(b.gpu_busy_fraction),
        "gpu_ms_per_step": _r(b.gpu_ms_per_step),
        "idle_ms_per_step": _r(max(b.step_ms.median - b.busy_ms_per_step, 0.0)) if main.trace.has_gpu else None,
        "kernels_per_step": _r(b.kernels_per_step, 2),
        "launch_us_per_kernel": _r(b.launch_us_per_kernel, 3),
        "categories": [{"name": c.name, "ms_per_step": _r(c.ms_per_step), "share": _r(c.share),
                        "share_of_step": _r(c.share_of_step)} for c in b.categories],
        "kernels": [kernel_dict(k) for k in b.kernels],
        "ranks": [{"rank": r.rank, "path": str(r.trace.path), "decode_steps": r.breakdown.decode_count,
                   "step_ms_median": _r(r.breakdown.step_ms.median),
                   "gpu_busy_fraction": _r(r.breakdown.gpu_busy_fraction),
                   "collective_ms_per_step": _r(r.collective_ms_per_step())} for r in report.ranks],
        "slowest_rank": main.rank if len(report.ranks) > 1 else None,
        "findings": [f.to_dict() for f in report.findings],
        "best_case": report.best_case.to_dict() if report.best_case is not None else None,
        "profiler_check": profiler_check(report),
        "warnings": list(report.warnings),
        "floor": report.floor_dict,
        "gap": report.gap,
        "step_rows": main.step_rows,  # computed next to the rank's trace (decodegap.pipeline.step_rows)
        "layer_rows": main.layer_rows,
        "assumed": list(report.assumed),
    }
    return out


def kernel_dict(k) -> dict:
    return {
        "name": k.name, "short_name": short_kernel_name(k.name), "category": k.category,
        "calls_per_step": _r(k.calls_per_step, 3), "ms_per_step": _r(k.ms_per_step), "share": _r(k.share),
        "us_per_call": _r(k.us_per_call, 3), "op": k.op, "input_shapes": k.input_shapes, "grid": k.grid,
        "block": k.block, "from_graph": k.from_graph, "bytes_per_call": k.bytes_per_call,
        "bytes_source": k.bytes_source, "gbps": _r(k.gbps, 1),
    }


def _ms(values: list[float]) -> dict:
    s = Spread.of(values)
    return {"median": _r(s.median), "mean": _r(s.mean), "min": _r(s.min), "max": _r(s.max), "p90": _r(s.p90)}


def _known(values: list) -> int | None:
    """The value the steps agree on (their median), None when no step knows it."""
    known = sorted(v for v in values if v)
    return known[len(known) // 2] if known else None


def _steps(steps) -> dict:
    out = {}
    for phase in PHASES:
        group = steps.of(phase)
        out[phase] = {"count": len(group), "source": steps.source, "ms": _ms([s.wall_ns / 1e6 for s in group]),
                      "ms_each": [_r(s.wall_ns / 1e6) for s in group],
                      "tokens": _known([s.tokens for s in group]), "batch": _known([s.batch for s in group])}
    out["source"] = steps.source
    out["source_detail"] = steps.detail
    out["dropped_partial"] = steps.dropped_partial
    return out


# --- reading back ------------------------------------------------------------------------------------------------

def load(path: str | Path) -> Analysis:
    """A report saved with `analyze --format json` (or Analysis.to_json), read back."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return msgspec.json.decode(raw, type=Analysis)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise UserError(f"{path}: not a decodegap report ({str(exc)[:200]})") from None


def json_schema() -> dict:
    """The JSON Schema of the report, generated from the types above (shipped as docs/report.schema.json)."""
    schema = msgspec.json.schema(Analysis)
    schema["$id"] = "https://decodegap.dev/schema/report-1.json"
    schema["title"] = "decodegap report (schema decodegap.report/1)"
    return schema

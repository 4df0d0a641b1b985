"""The Analysis: everything decodegap found in a trace, typed and immutable; the one thing every view reads.

Built once from the pipeline's stages (steps, breakdown, findings, floor); `to_dict()` is exactly what
`analyze --format json` prints, `load()` reads a saved report back, and the JSON Schema is generated from these
types (docs/report.schema.json). DataFrame views need pandas (the `pandas` extra).

The stage after the pipeline; may import it and every stage below, never report/, api or commands/."""

from __future__ import annotations

from dataclasses import fields
from html import escape
from pathlib import Path

import msgspec

from decodegap import __version__
from decodegap.breakdown.breakdown import CategoryTime, Spread
from decodegap.errors import UserError
from decodegap.findings.records import (  # noqa: F401  (the finding records, re-exported: decodegap.analysis.*)
    AfterFix,
    AnyFinding,
    BestCase,
    CollectiveBound,
    CollectiveEvidence,
    CollectiveGroup,
    CopyGroup,
    Finding,
    HostBound,
    HostBoundEvidence,
    HostGapEvidence,
    KvPoolCast,
    KvPoolCastEvidence,
    Loose,
    OutsideStep,
    ProfilerEvidence,
    ProfilerOverhead,
    StragglerEvidence,
    StragglerRank,
    WeightCopy,
    WeightCopyEvidence,
)
from decodegap.floor.ledger import GapLedger, LedgerRow  # noqa: F401
from decodegap.ops.kernel_names import short_kernel_name
from decodegap.steps.layer_kinds import LayerKind
from decodegap.floor.floor import Floor, FloorComponent, MemoryPerGpu, Params, ReplicatedWeights  # noqa: F401
from decodegap.pipeline import Assumed, Report
from decodegap.findings.profiler_check import ProfilerCheck
from decodegap.records import Struct, as_json_data
from decodegap.rounding import rounded as _r
from decodegap.breakdown.rows import LayerRow, StepRow
from decodegap.steps.step import PHASES
from decodegap.steps.steps import describe

SCHEMA = "decodegap.report/1"


class Tool(Struct):
    name: str
    version: str


class TraceInfo(Struct):
    path: str
    files: list[str]
    device: str | None
    detail_rank: int | None


class PhaseSteps(Struct):
    count: int
    source: str
    ms: Spread  # of the wall time of one step (median, mean, min, max, p90)
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
    categories: list[CategoryTime]
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
        return as_json_data(self)

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
        return _frame([msgspec.to_builtins(c) for c in self.categories], [f.name for f in fields(CategoryTime)])

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

def build(report: Report) -> Analysis:
    """The Analysis of a pipeline run (a decodegap.pipeline.Report), assembled from the stages' records: the
    detailed rank's steps and breakdown rounded as the report shows them, the findings, floor and ledger as they
    came."""
    main = report.main
    b, steps = main.breakdown, main.steps
    several = len(report.ranks) > 1
    return Analysis(
        schema=SCHEMA,
        tool=Tool(name="decodegap", version=__version__),
        trace=TraceInfo(path=str(report.path), files=[str(r.trace.path) for r in report.ranks],
                        device=main.trace.device_name, detail_rank=main.rank if several else None),
        workload=steps.workload,
        summary=describe(steps, b.layers),
        steps=_steps(steps),
        breakdown_phase=b.phase,
        layers=b.layers,
        layers_evidence=b.layers_evidence,
        layer_kinds=list(b.layer_kinds),
        gpu_busy_fraction=_r(b.gpu_busy_fraction),
        gpu_ms_per_step=_r(b.gpu_ms_per_step),
        idle_ms_per_step=_r(max(b.step_ms.median - b.busy_ms_per_step, 0.0)) if main.trace.has_gpu else None,
        kernels_per_step=_r(b.kernels_per_step, 2),
        launch_us_per_kernel=_r(b.launch_us_per_kernel, 3),
        categories=[CategoryTime(c.name, _r(c.ms_per_step), _r(c.share), _r(c.share_of_step)) for c in b.categories],
        kernels=[kernel_row(k) for k in b.kernels],
        ranks=[RankRow(rank=r.rank, path=str(r.trace.path), decode_steps=r.breakdown.decode_count,
                       step_ms_median=_r(r.breakdown.step_ms.median),
                       gpu_busy_fraction=_r(r.breakdown.gpu_busy_fraction),
                       collective_ms_per_step=_r(r.collective_ms_per_step())) for r in report.ranks],
        slowest_rank=main.rank if several else None,
        findings=list(report.findings),
        best_case=report.best_case,
        profiler_check=report.profiler_check,
        warnings=list(report.warnings),
        floor=report.floor.rounded() if report.floor is not None else None,
        gap=report.gap,
        step_rows=list(main.step_rows),  # computed next to the rank's trace (decodegap.breakdown.rows)
        layer_rows=list(main.layer_rows),
        assumed=list(report.assumed),
    )


def kernel_row(k) -> Kernel:
    """A kernel group of the breakdown (breakdown.KernelGroup) as the report lists it."""
    return Kernel(
        name=k.name, short_name=short_kernel_name(k.name), category=k.category,
        calls_per_step=_r(k.calls_per_step, 3), ms_per_step=_r(k.ms_per_step), share=_r(k.share),
        us_per_call=_r(k.us_per_call, 3), op=k.op, input_shapes=k.input_shapes, grid=k.grid,
        block=k.block, from_graph=k.from_graph, bytes_per_call=k.bytes_per_call,
        bytes_source=k.bytes_source, gbps=_r(k.gbps, 1),
    )


def _ms(values: list[float]) -> Spread:
    s = Spread.of(values)
    return Spread(_r(s.median), _r(s.mean), _r(s.min), _r(s.max), _r(s.p90))


def _known(values: list) -> int | None:
    """The value the steps agree on (their median), None when no step knows it."""
    known = sorted(v for v in values if v)
    return known[len(known) // 2] if known else None


def _steps(steps) -> StepsSummary:
    phases = {}
    for phase in PHASES:
        group = steps.of(phase)
        phases[phase] = PhaseSteps(count=len(group), source=steps.source, ms=_ms([s.wall_ns / 1e6 for s in group]),
                                   ms_each=[_r(s.wall_ns / 1e6) for s in group],
                                   tokens=_known([s.tokens for s in group]), batch=_known([s.batch for s in group]))
    return StepsSummary(**phases, source=steps.source, source_detail=steps.detail,
                        dropped_partial=steps.dropped_partial)


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

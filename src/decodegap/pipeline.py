"""The analysis pipeline: load -> link -> steps -> breakdown -> findings, for one trace or one per rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from decodegap.breakdown import Breakdown, compute_breakdown
from decodegap.steps import Steps, find_steps
from decodegap.trace import Trace, load_traces
from decodegap.trace.link import Links, link


@dataclass
class RankAnalysis:
    trace: Trace
    links: Links
    steps: Steps
    breakdown: Breakdown

    @property
    def rank(self) -> int:
        return self.trace.rank if self.trace.rank is not None else 0

    def collective_ms_per_step(self) -> float:
        return sum(c.ms_per_step for c in self.breakdown.categories if c.name == "collective")


@dataclass
class AnalysisOptions:
    tpot_ms: float | None = None  # time per output token measured without the profiler
    model: object | None = None  # decodegap.model.ModelGeometry when --model is given
    floor: object | None = None  # decodegap.model.floor.Floor when --gpu is given too
    active_tokens: int | None = None  # batch x context, when given: the KV a step really reads


@dataclass
class Report:
    path: Path
    ranks: list[RankAnalysis]
    options: AnalysisOptions
    findings: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    floor_dict: dict | None = None  # the floor (JSON form) when --model and --gpu were given
    gap: dict | None = None  # the gap ledger, likewise

    @property
    def workload(self) -> str:
        return "training" if any(r.steps.workload == "training" for r in self.ranks) else "inference"

    @property
    def main(self) -> RankAnalysis:
        """The rank whose step is shown in detail: the slowest one (it sets the pace of every step)."""
        return max(self.ranks, key=lambda r: (r.breakdown.step_ms.median, -r.rank))


TRAINING_FINDINGS = ("collective_bound", "straggler_rank")


def sanity_warnings(r: RankAnalysis, options: AnalysisOptions) -> list[str]:
    """What the step and layer boundaries imply that cannot be true, or that limits what the numbers mean."""
    out = []
    b, steps = r.breakdown, r.steps
    if not r.trace.has_gpu:
        out.append("the trace has no GPU events: the breakdown covers CPU ops only")
    if not steps.steps:
        out.append(f"no steps found ({steps.detail or steps.source})")
    elif len(steps.steps) == 1:
        out.append(f"the trace holds one {'iteration' if steps.workload == 'training' else 'forward'}: "
                   "statistics over steps come from one sample")
    if steps.steps and b.layers is None and steps.workload == "inference":
        out.append(f"layer count unknown: {b.layers_evidence}")
    geometry = options.model
    if b.layers and geometry is not None and getattr(geometry, "num_layers", None) \
            and b.layers != geometry.num_layers and steps.workload == "inference":
        out.append(f"the trace shows {b.layers} layers per step, the model config {geometry.num_layers}: another "
                   "model, pipeline parallelism, or step boundaries that are off")
    floor = options.floor
    if floor is not None and b.phase == "decode" and b.decode_count and b.step_ms.median \
            and b.step_ms.median < floor.floor_ms:
        out.append(f"a decode step of {b.step_ms.median:.3f} ms is shorter than its hardware floor "
                   f"({floor.floor_ms:.3f} ms): impossible; the step boundaries ({steps.source}) are likely wrong, or "
                   "the model, GPU, batch or context given do not match the trace")
    return out


def analyze_trace(trace: Trace) -> RankAnalysis:
    links = link(trace)
    steps = find_steps(trace, links)
    return RankAnalysis(trace, links, steps, compute_breakdown(trace, links, steps))


def analyze_path(path: str | Path, options: AnalysisOptions | None = None) -> Report:
    from decodegap.findings import run_detectors

    options = options or AnalysisOptions()
    ranks = [analyze_trace(t) for t in load_traces(path)]
    report = Report(Path(path), ranks, options)
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen and len(ranks) > 1:
            report.warnings.append(f"two traces claim rank {r.rank} ({seen[r.rank]} and {r.trace.path.name}): "
                                   "are they from different runs?")
        seen.setdefault(r.rank, r.trace.path.name)
    for r in ranks:
        prefix = f"rank {r.rank}: " if len(ranks) > 1 else ""
        report.warnings.extend(prefix + w for w in r.trace.warnings)
        report.warnings.extend(prefix + w for w in r.steps.warnings + sanity_warnings(r, options))
    report.findings = run_detectors(report)
    if report.workload == "training":  # decode advice does not apply to a training job
        report.findings = [f for f in report.findings if f.id in TRAINING_FINDINGS]
    if options.floor is not None:
        from decodegap.floor_ledger import gap_ledger

        report.floor_dict = options.floor.to_dict()
        report.gap = gap_ledger(report)
    return report

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
    def main(self) -> RankAnalysis:
        """The rank whose step is shown in detail: the slowest one (it sets the pace of every step)."""
        return max(self.ranks, key=lambda r: (r.breakdown.step_ms.median, -r.rank))


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
        if not r.trace.has_gpu:
            report.warnings.append(prefix + "the trace has no GPU events: the breakdown covers CPU ops only")
        elif not r.steps.decode:
            report.warnings.append(prefix + f"no decode steps found ({r.steps.source})")
        if r.steps.dropped_partial:
            report.warnings.append(prefix + f"{r.steps.dropped_partial} partial step(s) at the trace edges "
                                   "were left out")
    report.findings = run_detectors(report)
    if options.floor is not None:
        from decodegap.gap import gap_ledger

        report.floor_dict = options.floor.to_dict()
        report.gap = gap_ledger(report)
    return report

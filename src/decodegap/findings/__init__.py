"""Root-cause detectors. Each module looks at one typed input and returns Finding records with evidence and a fix.

Per-rank detectors (`RANK_DETECTORS`) read one rank's `RankInput` and run where that rank is analyzed (a worker
process or a Ray task, next to its trace); cross-rank ones read the per-rank summaries (`RanksInput`) or the
profiler check, on the driver. `order_findings` puts them together in one stable order."""

from __future__ import annotations

from decodegap.findings.base import Finding, RankInput, RanksInput

__all__ = ["Finding", "RankInput", "RanksInput", "order_findings", "run_rank_detectors", "run_cross_rank_detectors"]

# The order findings of equal cost are listed in (the sort by cost is stable).
DETECTOR_ORDER = ("kv_pool_cast", "host_bound", "collective_bound", "weight_copy", "profiler_overhead")
RANK_DETECTORS = ("kv_pool_cast", "host_bound", "weight_copy")


def run_rank_detectors(rank: RankInput) -> dict[str, list[Finding]]:
    """The per-rank detectors' findings on one rank, by detector."""
    from decodegap.findings import host_bound, kv_pool_cast, weight_copy

    return {"kv_pool_cast": kv_pool_cast.detect(rank), "host_bound": host_bound.detect(rank),
            "weight_copy": weight_copy.detect(rank)}


def run_cross_rank_detectors(ranks: RanksInput, check: dict | None) -> dict[str, list[Finding]]:
    """The detectors that compare ranks (collectives, stragglers) or read the profiler check, by detector."""
    from decodegap.findings import collective_bound, profiler_overhead

    return {"collective_bound": collective_bound.detect(ranks), "profiler_overhead": profiler_overhead.detect(check)}


def order_findings(by_detector: dict[str, list[Finding]]) -> list[Finding]:
    """Every detector's findings, costliest first."""
    found = [f for name in DETECTOR_ORDER for f in by_detector.get(name, [])]
    found.sort(key=lambda f: -f.ms_per_step)
    return found

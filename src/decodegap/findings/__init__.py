"""Root-cause detectors. Each module looks at a Report and returns Finding records with evidence and a fix."""

from __future__ import annotations

from decodegap.findings.base import Finding

__all__ = ["Finding", "run_detectors"]


def run_detectors(report) -> list[Finding]:
    from decodegap.findings import collective_bound, host_bound, kv_pool_cast, profiler_overhead, weight_copy

    detectors = (kv_pool_cast.detect, host_bound.detect, collective_bound.detect, weight_copy.detect,
                 profiler_overhead.detect)
    found: list[Finding] = []
    for detect in detectors:
        found.extend(detect(report))
    found.sort(key=lambda f: -f.ms_per_step)
    return found


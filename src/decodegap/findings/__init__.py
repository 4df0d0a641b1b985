"""Root-cause detectors. Each module looks at a Report and returns Finding records with evidence and a fix."""

from __future__ import annotations

from decodegap.findings.base import Finding

__all__ = ["Finding", "run_detectors"]


def run_detectors(report) -> list[Finding]:
    from decodegap.findings import DETECTORS

    found: list[Finding] = []
    for detect in DETECTORS:
        found.extend(detect(report))
    found.sort(key=lambda f: -f.ms_per_step)
    return found


DETECTORS: list = []

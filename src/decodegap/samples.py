"""The spread of timed samples: median, p10/p90, and whether they fall into two groups (two kinds of call in one
timed window, e.g. two generate calls of different shapes). Stdlib only: record writes it, analyze reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The bimodality rule (docs/record.md, "Unprofiled timing"): split the sorted samples at their widest gap, among
# splits that leave at least BIMODAL_MIN_SHARE of the samples (and 2) on each side. The samples are two groups
# when that gap is at least BIMODAL_GAP_FACTOR times the larger of the two sides' spreads and at least
# BIMODAL_MIN_REL_GAP of the median. The spread of a side is its range (below 10 samples) or its p10-p90 width.
# Checked on unimodal noise (normal, lognormal, uniform, exponential, Pareto): under 3% false positives at 10
# samples, none at 20 or more; two groups 3x apart are found every time from 10 samples.
BIMODAL_MIN_SAMPLES = 8
BIMODAL_MIN_SHARE = 0.2
BIMODAL_GAP_FACTOR = 2.0
BIMODAL_MIN_REL_GAP = 0.05
_RANGE_BELOW = 10


@dataclass(frozen=True)
class Mode:
    median: float
    count: int


@dataclass(frozen=True)
class Spread:
    """What the samples look like: median, p10/p90 (linear interpolation), and their groups if two."""

    median: float | None
    p10: float | None
    p90: float | None
    bimodal: bool
    modes: tuple[Mode, ...]


def median(values: list[float]) -> float:
    """statistics.median of non-empty values (the middle one, or the mean of the middle two), without importing
    statistics and the random, fractions and decimal modules it brings to every run's start."""
    ordered = sorted(values)
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `ordered` sorted and non-empty."""
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _side_spread(side: list[float]) -> float:
    if len(side) < _RANGE_BELOW:
        return side[-1] - side[0]
    return percentile(side, 0.9) - percentile(side, 0.1)


def two_modes(samples: list[float]) -> tuple[list[float], list[float]] | None:
    """The two groups of samples under the documented rule, or None when they form one."""
    ordered = sorted(samples)
    n = len(ordered)
    if n < BIMODAL_MIN_SAMPLES:
        return None
    least = max(2, math.ceil(BIMODAL_MIN_SHARE * n))
    splits = range(least, n - least + 1)
    if not splits:
        return None
    cut = max(splits, key=lambda k: ordered[k] - ordered[k - 1])
    low, high = ordered[:cut], ordered[cut:]
    gap = high[0] - low[-1]
    if gap < BIMODAL_GAP_FACTOR * max(_side_spread(low), _side_spread(high)):
        return None
    if gap < BIMODAL_MIN_REL_GAP * median(ordered):
        return None
    return low, high


def spread(samples: list[float]) -> Spread:
    if not samples:
        return Spread(None, None, None, False, ())
    ordered = sorted(samples)
    groups = two_modes(ordered)
    modes = tuple(Mode(float(median(g)), len(g)) for g in groups) if groups else ()
    return Spread(
        median=float(median(ordered)),
        p10=percentile(ordered, 0.1),
        p90=percentile(ordered, 0.9),
        bimodal=groups is not None,
        modes=modes,
    )

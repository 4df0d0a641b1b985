"""profiler_overhead / outside_step: the profiled step against the time per token measured without the profiler
(--tpot, or what `decodegap record` measured). The incident's engineers checked 93.2 vs 95 ms this way.

Rule: fire when the profiled median differs from the unprofiled median by more than TOLERANCE of it AND lies
outside the unprofiled samples' p10-p90 spread by more than that spread: when the calls timed without the
profiler vary as much as the difference (two generate calls of different shapes in one window), the difference
is not evidence of anything."""

from __future__ import annotations

import msgspec

from decodegap.findings.records import Finding, make_finding
from decodegap.findings.profiler_check import ProfilerCheck

TOLERANCE = 0.15

FIX_SLOWER = ("Trust the ratios more than the absolute times: profiling (especially record_shapes and with_stack) "
              "slows the host, so host-bound steps look slower than they are. Capture fewer steps with "
              "record_shapes off to confirm, or compare with CUDA-graph replay.")
FIX_FASTER = ("The unprofiled time per token is longer than the profiled step: time is spent outside the "
              "captured region (scheduler, detokenizer, sampling on the CPU, host syncs between steps). Profile "
              "the whole loop, or time the pieces between steps.")


def _outside_spread(check: ProfilerCheck) -> float | None:
    """How far the profiled step lies outside the unprofiled p10-p90 band (ms); None without a band."""
    low, high = check.unprofiled_p10_ms, check.unprofiled_p90_ms
    if low is None or high is None:
        return None
    profiled = check.profiled_ms
    return max(low - profiled, profiled - high, 0.0)


def detect(check: ProfilerCheck | None) -> list[Finding]:
    """`check`: the profiler check (decodegap.findings.profiler_check), None when no unprofiled time is known."""
    if check is None:
        return []
    profiled, unprofiled = check.profiled_ms, check.unprofiled_ms
    diff = profiled - unprofiled
    outside = _outside_spread(check)
    spread = check.spread_ms
    ev = msgspec.to_builtins(check)
    ev["rule"] = (f"|profiled - unprofiled| > {TOLERANCE:.0%} of unprofiled"
                  + (" and the profiled step outside the unprofiled p10-p90 band by more than the band's width"
                     if spread is not None else ""))
    if abs(diff) <= TOLERANCE * unprofiled:
        return []
    if spread is not None and (outside is None or outside <= spread):
        return []  # the unprofiled calls vary as much as the difference: nothing to report
    band = (f"; unprofiled p10-p90 {check.unprofiled_p10_ms:.1f}-{check.unprofiled_p90_ms:.1f} ms over "
            f"{check.samples} calls" if spread is not None else "")
    if diff > 0:
        title = (f"The profiled step ({profiled:.1f} ms) is {diff:.1f} ms slower than without the profiler "
                 f"({unprofiled:.1f} ms{band}): profiler overhead inflates the host-bound part of the step")
        return [make_finding("profiler_overhead", title, diff, diff / profiled, ev, FIX_SLOWER)]
    title = (f"Without the profiler a token takes {unprofiled:.1f} ms ({band.lstrip('; ') or 'one figure'}), "
             f"{-diff:.1f} ms more than the profiled step ({profiled:.1f} ms): time goes outside the captured step")
    return [make_finding("outside_step", title, -diff, -diff / unprofiled, ev, FIX_FASTER)]

"""Root-cause detectors. Each module looks at one typed input and returns Finding records with evidence and a fix.

Per-rank detectors (`RANK_DETECTORS`) read one rank's `RankInput` and run where that rank is analyzed (a worker
process or a Ray task, next to its trace); cross-rank ones read the per-rank summaries (`RanksInput`) or the
profiler check, on the driver. `order_findings` puts them together in one stable order; `best_case` adds what
fixing them would buy. The records they return (one type per detector, typed evidence, `after_fix`) are in
`records`; the profiler check they read in `profiler_check`.

May import: floor/ (the GPU table: link speeds), ops/ and the helpers; they read the breakdown handed to them."""

from __future__ import annotations

from decodegap.findings.base import RankInput, RanksInput
from decodegap.findings.records import AfterFix, AnyFinding, BestCase, Finding, tokens_per_s
from decodegap.ops.kernel_names import short_kernel_name

__all__ = ["AfterFix", "AnyFinding", "BestCase", "Finding", "RankInput", "RanksInput", "best_case", "order_findings",
           "run_rank_detectors", "run_cross_rank_detectors"]

# The order findings of equal cost are listed in (the sort by cost is stable).
DETECTOR_ORDER = ("kv_pool_cast", "host_bound", "collective_bound", "weight_copy", "profiler_overhead")
RANK_DETECTORS = ("kv_pool_cast", "host_bound", "weight_copy")


def run_rank_detectors(rank: RankInput) -> dict[str, list[Finding]]:
    """The per-rank detectors' findings on one rank, by detector."""
    from decodegap.findings import host_bound, kv_pool_cast, weight_copy

    return {"kv_pool_cast": kv_pool_cast.detect(rank), "host_bound": host_bound.detect(rank),
            "weight_copy": weight_copy.detect(rank)}


def run_cross_rank_detectors(ranks: RanksInput, check) -> dict[str, list[Finding]]:
    """The detectors that compare ranks (collectives, stragglers) or read the profiler check (a
    decodegap.profiler_check.ProfilerCheck, None without an unprofiled time), by detector."""
    from decodegap.findings import collective_bound, profiler_overhead

    return {"collective_bound": collective_bound.detect(ranks), "profiler_overhead": profiler_overhead.detect(check)}


def order_findings(by_detector: dict[str, list[Finding]]) -> list[Finding]:
    """Every detector's findings, costliest first."""
    found = [f for name in DETECTOR_ORDER for f in by_detector.get(name, [])]
    found.sort(key=lambda f: -f.ms_per_step)
    return found


# --- what the fixes would buy together ----------------------------------------------------------------------------

def fixed_parts(f) -> frozenset[str]:
    """The part of the step a finding's fix takes its time from (GPU idle, the collectives, kernel groups by name):
    two fixes that take from the same part do not add up. `f`: a Finding (its evidence typed, or a saved report's
    dict)."""
    ev = f.evidence
    if f.id == "host_bound":
        return frozenset({"gpu idle"})
    if f.id in ("collective_bound", "straggler_rank"):
        return frozenset({"collectives"})
    if f.id == "kv_pool_cast" and ev.get("kernel"):
        return frozenset({"kernel " + short_kernel_name(ev["kernel"])})
    if f.id == "weight_copy":
        return frozenset("kernel " + g["kernel"] for g in ev.get("groups") or [] if g.get("kernel"))
    return frozenset({f.id})


def best_case(findings: list, step_ms: float) -> BestCase | None:
    """The findings' estimates combined (findings costliest first, as ordered); None when none has an estimate."""
    taken, parts, saved, left_out = [], set(), 0.0, []
    for f in findings:
        if f.after_fix is None:
            continue
        mine = fixed_parts(f)
        if mine & parts:
            left_out.append(f.id)
            continue
        taken.append(f.id)
        parts |= mine
        saved += max(step_ms - f.after_fix.step_ms, 0.0)
    if not taken:
        return None
    assumes = ("each fix as its finding's after_fix assumes"
               + (f"; {' + '.join(taken)} take their time from different parts of the step, so their savings add"
                  if len(taken) > 1 else "")
               + (f"; left out (their fix overlaps one above): {', '.join(left_out)}" if left_out else ""))
    best = round(max(step_ms - saved, 0.0), 4)
    return BestCase(step_ms=best, tokens_per_s=round(tokens_per_s(best), 3), findings=taken, assumes=assumes)

"""Two decode profiles side by side: step time, categories, kernel groups (new, gone, faster, slower), findings that
appeared or vanished, and the step BEFORE's findings predict beside AFTER's. Works on JSON reports, so either side
can be a trace (decodegap.api.load_report analyzes it) or a saved report."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import msgspec

from decodegap.errors import UserError
from decodegap.analysis import SCHEMA

CHANGE = 0.10  # relative change below which a kernel group counts as unchanged
MIN_MS = 0.005  # and absolute change below which, too
SAVED_REPORT_MAX_BYTES = 50_000_000  # a larger .json is read as a trace


class _Ms(msgspec.Struct):
    median: Union[float, None] = None


class _Decode(msgspec.Struct):
    ms: _Ms


class _Steps(msgspec.Struct):
    decode: _Decode


class _Category(msgspec.Struct):
    name: str
    ms_per_step: float


class _Kernel(msgspec.Struct):
    name: str
    category: str
    ms_per_step: float
    calls_per_step: float


class _Finding(msgspec.Struct):
    id: str


class _TracePath(msgspec.Struct):
    path: str


class _SavedReport(msgspec.Struct):
    """What diff reads from a saved report (other fields are free)."""

    trace: _TracePath
    steps: _Steps
    categories: list[_Category]
    kernels: list[_Kernel]
    findings: list[_Finding]


def saved_report(path: Path) -> dict | None:
    """The saved report at `path` (a small .json), checked for the fields diff reads and for finite, non-negative
    numbers; None when the file is no decodegap report (it is then read as a trace)."""
    if not (path.is_file() and path.suffix == ".json" and path.stat().st_size < SAVED_REPORT_MAX_BYTES):
        return None
    try:
        data = json.loads(path.read_bytes())  # Python's json reads NaN and Infinity too: refused below, by name
    except RecursionError:
        raise UserError(f"{path}: the JSON is nested too deeply to be a decodegap report") from None
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    try:
        msgspec.convert(data, _SavedReport)
    except msgspec.ValidationError as exc:
        raise UserError(f"{path}: a damaged decodegap report ({exc})") from None
    bad = _first_bad_number(data)
    if bad is not None:
        raise UserError(f"{path}: a damaged decodegap report ({bad} is {_value_at(data, bad)!r}: "
                        "reports hold finite numbers only)")
    for where, value in _times(data):
        if value is not None and value < 0:
            raise UserError(f"{path}: a damaged decodegap report ({where} is {value}, a negative time)")
    return data


def _first_bad_number(data) -> str | None:
    """The path (a.b[2].c) of the first NaN or infinite number in a JSON value; iterative, so depth costs nothing."""
    stack = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "$"
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
    return None


def _value_at(data, where: str):
    for part in where.replace("[", ".[").split("."):
        if part and part != "$":
            data = data[int(part[1:-1])] if part.startswith("[") else data[part]
    return data


def _times(data: dict):
    yield "steps.decode.ms.median", data["steps"]["decode"]["ms"]["median"]
    phase = data.get("breakdown_phase")
    median = ((data["steps"].get(phase) or {}).get("ms") or {}).get("median") if isinstance(phase, str) else None
    if isinstance(median, (int, float)):
        yield f"steps.{phase}.ms.median", median
    if isinstance(data.get("idle_ms_per_step"), (int, float)):
        yield "idle_ms_per_step", data["idle_ms_per_step"]
    for i, c in enumerate(data["categories"]):
        yield f"categories[{i}].ms_per_step", c["ms_per_step"]
    for i, k in enumerate(data["kernels"]):
        yield f"kernels[{i}].ms_per_step", k["ms_per_step"]
        yield f"kernels[{i}].calls_per_step", k["calls_per_step"]


def _step_ms(report: dict) -> float:
    """The median step of the phase the report's breakdown describes (decode when the trace has any)."""
    steps = report["steps"]
    phase = report.get("breakdown_phase") or "decode"
    side = steps.get(phase) if isinstance(steps.get(phase), dict) else steps["decode"]
    median = (side.get("ms") or {}).get("median") if isinstance(side, dict) else None
    return float(median) if isinstance(median, (int, float)) and not isinstance(median, bool) else 0.0


# --- kernel groups matched across the two sides ------------------------------------------------------------------

def _shape_key(k: dict) -> tuple[str, str]:
    """How a report split a kernel's calls into groups: by the launching op's shapes (eager) or by launch shape."""
    if k.get("input_shapes"):
        return "shapes", json.dumps(k["input_shapes"])
    return "launch", f"{k.get('grid')}|{k.get('block')}"


def _merged(entries: list[dict]) -> dict:
    """Several groups of one kernel name as one: times and calls summed."""
    first = entries[0]
    return {**first, "ms_per_step": sum(e["ms_per_step"] for e in entries),
            "calls_per_step": sum(e["calls_per_step"] for e in entries)}


def match_kernels(before: list[dict], after: list[dict]) -> list[tuple[dict | None, dict | None, str]]:
    """(before group, after group, matched by) for every kernel group of either side. Groups are matched by kernel
    name first; a name's groups stay split by shapes (or by launch shape) only when every group of that name on
    both sides was split the same way. An eager trace splits by op shapes, a CUDA-graph replay (no ops) by grid:
    the same kernel would otherwise count as gone on one side and new on the other."""
    names: dict[str, tuple[list, list]] = {}
    for side, groups in ((0, before), (1, after)):
        for k in groups:
            names.setdefault(k["name"], ([], []))[side].append(k)
    pairs = []
    for old, new in names.values():
        kinds = {_shape_key(k)[0] for k in old + new}
        if not old or not new or len(kinds) == 1:
            how = "name" if not old or not new else next(iter(kinds))
            by_key_old = {_shape_key(k): k for k in old}
            by_key_new = {_shape_key(k): k for k in new}
            for key in by_key_old.keys() | by_key_new.keys():
                pairs.append((by_key_old.get(key), by_key_new.get(key), how))
        else:
            pairs.append((_merged(old), _merged(new), "name"))
    return pairs


def _kernel_row(o: dict | None, n: dict | None, how: str) -> dict:
    o_ms, n_ms = (o["ms_per_step"] if o else 0.0), (n["ms_per_step"] if n else 0.0)
    if o is None:
        status = "new"
    elif n is None:
        status = "gone"
    elif abs(n_ms - o_ms) < max(MIN_MS, CHANGE * o_ms):
        status = "same"
    else:
        status = "faster" if n_ms < o_ms else "slower"
    k = n or o
    return {"status": status, "name": k["name"], "short_name": k.get("short_name", k["name"]),
            "category": k["category"], "before_ms": round(o_ms, 4), "after_ms": round(n_ms, 4),
            "delta_ms": round(n_ms - o_ms, 4),
            "before_calls": o["calls_per_step"] if o else 0, "after_calls": n["calls_per_step"] if n else 0,
            "matched_by": how}


# --- findings, GPU idle, warnings ---------------------------------------------------------------------------------

def _finding_rows(before: dict, after: dict) -> list[dict]:
    """Every finding of either side: gone, kept or new, with its time per step on each side."""
    def by_id(report: dict) -> dict:
        out: dict[str, float] = {}
        for f in report["findings"]:
            ms = f.get("ms_per_step")
            out[f["id"]] = out.get(f["id"], 0.0) + (ms if isinstance(ms, (int, float)) else 0.0)
        return out

    old, new = by_id(before), by_id(after)
    estimates = {f["id"]: _estimate_ms(f) for f in before["findings"]}
    order = {"gone": 0, "kept": 1, "new": 2}
    rows = [{"id": i, "status": "kept" if i in old and i in new else "gone" if i in old else "new",
             "before_ms": round(old[i], 4) if i in old else None, "after_ms": round(new[i], 4) if i in new else None,
             "predicted_step_ms": estimates.get(i)}
            for i in old.keys() | new.keys()]
    return sorted(rows, key=lambda r: (order[r["status"]], r["id"]))


def _estimate_ms(finding: dict) -> float | None:
    """The step a finding's after_fix predicts (None: no estimate, or a report from before there were any)."""
    after = finding.get("after_fix")
    ms = after.get("step_ms") if isinstance(after, dict) else None
    return float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None


@dataclass(frozen=True)
class _Estimated:
    """A saved finding as decodegap.findings.best_case reads one."""

    id: str
    evidence: dict
    after_fix: object


def prediction(before: dict, after: dict, before_ms: float, after_ms: float) -> dict | None:
    """The step BEFORE's findings predict once those gone on AFTER are fixed (their after_fix estimates added as
    the report's best case adds them), beside AFTER's measured step; None when no finding that went had one."""
    from types import SimpleNamespace

    from decodegap.findings import best_case

    gone = {f["id"] for f in before["findings"]} - {f["id"] for f in after["findings"]}
    fixed = [_Estimated(f["id"], f.get("evidence") if isinstance(f.get("evidence"), dict) else {},
                        SimpleNamespace(step_ms=_estimate_ms(f)))
             for f in before["findings"] if f["id"] in gone and _estimate_ms(f) is not None]
    best = best_case(fixed, before_ms) if before_ms else None
    if best is None or best.step_ms <= 0:
        return None
    return {"step_ms": round(best.step_ms, 4), "findings": list(best.findings), "measured_ms": after_ms,
            "off_pct": round((after_ms / best.step_ms - 1.0) * 100.0, 2)}


def _has_gpu(report: dict) -> bool:
    """Whether the report's trace has GPU activity (a CPU-only trace has no busy GPU time in any step)."""
    rows = report.get("step_rows") or []
    return bool(report.get("gpu_busy_fraction")) or any(
        isinstance(r, dict) and isinstance(r.get("gpu_busy_ms"), (int, float)) and r["gpu_busy_ms"] > 0 for r in rows)


def _idle_ms(report: dict) -> float | None:
    value = report.get("idle_ms_per_step")
    return value if isinstance(value, (int, float)) and _has_gpu(report) else None


def _gpu_idle(before: dict, after: dict) -> dict | None:
    """The GPU-idle row (the step's time with no GPU activity): None when a side lacks it (an old saved report, a
    CPU-only trace)."""
    b, a = _idle_ms(before), _idle_ms(after)
    if b is None or a is None:
        return None
    return {"before_ms": round(b, 4), "after_ms": round(a, 4), "delta_ms": round(a - b, 4)}


def _model_type(report: dict) -> str | None:
    floor = report.get("floor")
    return floor.get("model_type") if isinstance(floor, dict) else None


def comparability_warnings(before: dict, after: dict) -> list[str]:
    """What makes the two sides different workloads rather than one workload before and after a change."""
    out = []
    checks = (("GPU", (before.get("trace") or {}).get("device"), (after.get("trace") or {}).get("device")),
              ("layer count", before.get("layers"), after.get("layers")),
              ("model type (from --model)", _model_type(before), _model_type(after)))
    for what, b, a in checks:
        if b is not None and a is not None and b != a:
            out.append(f"the two sides differ in {what}: {b} before, {a} after; the diff compares different "
                       "workloads")
    return out


def diff_reports(before: dict, after: dict) -> dict:
    b_ms, a_ms = _step_ms(before), _step_ms(after)
    cats = {}
    for side, report in (("before", before), ("after", after)):
        for c in report["categories"]:
            cats.setdefault(c["name"], {"before": 0.0, "after": 0.0})[side] = c["ms_per_step"]
    categories = sorted(({"name": n, "before_ms": v["before"], "after_ms": v["after"],
                          "delta_ms": round(v["after"] - v["before"], 4)} for n, v in cats.items()),
                        key=lambda r: r["delta_ms"])
    kernels = [_kernel_row(o, n, how) for o, n, how in match_kernels(before["kernels"], after["kernels"])]
    kernels.sort(key=lambda r: r["delta_ms"])
    b_ids = {f["id"] for f in before["findings"]}
    a_ids = {f["id"] for f in after["findings"]}
    return {
        "schema": "decodegap.diff/1",
        "before": {"path": before["trace"]["path"], "step_ms": b_ms, "findings": sorted(b_ids),
                   "device": before["trace"].get("device"), "layers": before.get("layers")},
        "after": {"path": after["trace"]["path"], "step_ms": a_ms, "findings": sorted(a_ids),
                  "device": after["trace"].get("device"), "layers": after.get("layers")},
        "speedup": round(b_ms / a_ms, 4) if a_ms else None,
        "step_delta_ms": round(a_ms - b_ms, 4),
        "predicted": prediction(before, after, b_ms, a_ms),
        "categories": categories,
        "gpu_idle": _gpu_idle(before, after),
        "kernels": [k for k in kernels if k["status"] != "same"],
        "unchanged_kernel_groups": sum(1 for k in kernels if k["status"] == "same"),
        "findings_vanished": sorted(b_ids - a_ids),
        "findings_appeared": sorted(a_ids - b_ids),
        "findings_kept": sorted(b_ids & a_ids),
        "findings": _finding_rows(before, after),
        "warnings": comparability_warnings(before, after),
    }


# --- the CI gate ---------------------------------------------------------------------------------------------------

def check_gate_pct(pct: float) -> float:
    if not (math.isfinite(pct) and pct >= 0):
        raise UserError(f"--fail-if-slower {pct}: not a percentage (a finite number >= 0)")
    return pct


def gate(d: dict, pct: float) -> dict:
    """The verdict of `--fail-if-slower PCT`: fails when AFTER's median step is more than PCT% slower."""
    check_gate_pct(pct)
    b_ms, a_ms = d["before"]["step_ms"], d["after"]["step_ms"]
    for side, ms in (("before", b_ms), ("after", a_ms)):
        if not ms or ms <= 0:
            raise UserError(f"--fail-if-slower: {d[side]['path']} has no step time to compare (no steps found)")
    slower_pct = (a_ms / b_ms - 1.0) * 100.0
    failed = slower_pct > pct
    change = ("no change" if round(slower_pct, 1) == 0 else
              f"{slower_pct:.1f}% slower" if slower_pct > 0 else f"{-slower_pct:.1f}% faster")
    verdict = (f"decodegap gate: {'FAIL' if failed else 'PASS'}: median step {b_ms:.3f} -> {a_ms:.3f} ms "
               f"({change}; limit {pct:g}% slower)")
    return {"limit_pct": pct, "slower_pct": round(slower_pct, 3), "failed": failed, "verdict": verdict}


def render_diff(d: dict, fmt: str = "text", top: int = 15) -> str:
    if fmt == "json":
        return json.dumps(d, indent=2) + "\n"
    md = fmt == "md"
    lines = [("## " if md else "") + f"decodegap diff: {d['before']['path']} -> {d['after']['path']}", "",
             f"step time: {d['before']['step_ms']:.3f} ms -> {d['after']['step_ms']:.3f} ms ({_step_change(d)})"]
    predicted = d.get("predicted")
    if predicted:
        lines.append(f"predicted by before's findings once {' + '.join(predicted['findings'])} "
                     f"{'is' if len(predicted['findings']) == 1 else 'are'} fixed: {predicted['step_ms']:.3f} ms; "
                     f"measured {predicted['measured_ms']:.3f} ms ({predicted['off_pct']:+.1f}%)")
    findings = d.get("findings") or []
    if findings:
        def listed(status: str) -> str:
            return ", ".join(_finding_label(f) for f in findings if f["status"] == status) or "-"
        lines.append(f"findings gone: {listed('gone')}; kept: {listed('kept')}; new: {listed('new')}")
    lines += [f"warning: {w}" for w in d.get("warnings") or []]
    lines += ["", "by category (ms/step)"]
    header = ["category", "before", "after", "delta"]
    rows = [[c["name"], f"{c['before_ms']:.3f}", f"{c['after_ms']:.3f}", f"{c['delta_ms']:+.3f}"]
            for c in d["categories"]]
    if d.get("gpu_idle"):
        idle = d["gpu_idle"]
        rows.append(["(GPU idle)", f"{idle['before_ms']:.3f}", f"{idle['after_ms']:.3f}", f"{idle['delta_ms']:+.3f}"])
    lines += _table(header, rows, md)
    if not d["kernels"]:
        lines += ["", f"kernel groups: none changed ({d['unchanged_kernel_groups']} unchanged)"]
        return "\n".join(lines) + "\n"
    lines += ["", f"kernel groups that changed ({d['unchanged_kernel_groups']} unchanged)"]
    header = ["status", "kernel", "category", "calls before", "calls after", "before ms", "after ms", "delta ms"]
    rows = [[k["status"], k["short_name"], k["category"], f"{k['before_calls']:g}", f"{k['after_calls']:g}",
             f"{k['before_ms']:.3f}", f"{k['after_ms']:.3f}", f"{k['delta_ms']:+.3f}"]
            for k in sorted(d["kernels"], key=lambda k: -abs(k["delta_ms"]))[:top]]
    lines += _table(header, rows, md)
    return "\n".join(lines) + "\n"


def _step_change(d: dict) -> str:
    """"+1.234 ms, 1.05x slower"; "no change" when the two medians agree to the microsecond shown."""
    delta = d["step_delta_ms"]
    if f"{d['before']['step_ms']:.3f}" == f"{d['after']['step_ms']:.3f}":
        return "no change"
    speedup = d["speedup"]
    if not speedup:
        return f"{delta:+.3f} ms"
    return f"{delta:+.3f} ms, " + (f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower")


def _finding_label(f: dict) -> str:
    if f["status"] == "kept":
        return f"{f['id']} ({f['before_ms']:.3f} -> {f['after_ms']:.3f} ms)"
    ms = f["before_ms"] if f["status"] == "gone" else f["after_ms"]
    return f"{f['id']} ({ms:.3f} ms)"


def _table(header: list[str], rows: list[list[str]], md: bool) -> list[str]:
    if md:
        return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:{'<' if i < 3 else '>'}{w}}}" for i, w in enumerate(widths))
    return ["  " + fmt.format(*header)] + ["  " + fmt.format(*r) for r in rows]


def check_inputs(*paths: Path) -> None:
    for p in paths:
        if not p.exists():
            raise UserError(f"{p}: no such file or folder")

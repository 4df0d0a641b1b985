"""Two decode profiles side by side: step time, categories, kernel groups (new, gone, faster, slower) and
findings that appeared or vanished. Works on JSON reports, so either side can be a trace or a saved report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Union

import msgspec

from decodegap.errors import UserError
from decodegap.analysis import SCHEMA

CHANGE = 0.10  # relative change below which a kernel group counts as unchanged
MIN_MS = 0.005  # and absolute change below which, too
SAVED_REPORT_MAX_BYTES = 50_000_000  # a larger .json is read as a trace


def load_report(path: Path, tpot_ms: float | None = None) -> dict:
    """A report dict from a trace, a folder of traces, or a saved `analyze --format json` report."""
    if path.is_file() and path.suffix == ".json" and path.stat().st_size < SAVED_REPORT_MAX_BYTES:
        saved = _saved_report(path)
        if saved is not None:
            return saved
    from decodegap.pipeline import AnalysisOptions, analyze_path
    from decodegap.report.json import report_dict

    return report_dict(analyze_path(path, AnalysisOptions(tpot_ms=tpot_ms)))


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


def _saved_report(path: Path) -> dict | None:
    """The saved report at `path`, checked for the fields diff reads and for finite, non-negative numbers;
    None when the file is no decodegap report (it is then read as a trace)."""
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
    for i, c in enumerate(data["categories"]):
        yield f"categories[{i}].ms_per_step", c["ms_per_step"]
    for i, k in enumerate(data["kernels"]):
        yield f"kernels[{i}].ms_per_step", k["ms_per_step"]
        yield f"kernels[{i}].calls_per_step", k["calls_per_step"]


def _key(k: dict) -> tuple:
    shapes = json.dumps(k.get("input_shapes")) if k.get("input_shapes") else f"{k.get('grid')}|{k.get('block')}"
    return k["name"], shapes


def _step_ms(report: dict) -> float:
    return report["steps"]["decode"]["ms"]["median"] or 0.0


def diff_reports(before: dict, after: dict) -> dict:
    b_ms, a_ms = _step_ms(before), _step_ms(after)
    cats = {}
    for side, report in (("before", before), ("after", after)):
        for c in report["categories"]:
            cats.setdefault(c["name"], {"before": 0.0, "after": 0.0})[side] = c["ms_per_step"]
    categories = sorted(({"name": n, "before_ms": v["before"], "after_ms": v["after"],
                          "delta_ms": round(v["after"] - v["before"], 4)} for n, v in cats.items()),
                        key=lambda r: r["delta_ms"])
    old = {_key(k): k for k in before["kernels"]}
    new = {_key(k): k for k in after["kernels"]}
    kernels = []
    for key in old.keys() | new.keys():
        o, n = old.get(key), new.get(key)
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
        kernels.append({"status": status, "name": k["name"], "short_name": k.get("short_name", k["name"]),
                        "category": k["category"], "before_ms": round(o_ms, 4), "after_ms": round(n_ms, 4),
                        "delta_ms": round(n_ms - o_ms, 4),
                        "before_calls": o["calls_per_step"] if o else 0, "after_calls": n["calls_per_step"] if n else 0})
    kernels.sort(key=lambda r: r["delta_ms"])
    b_ids = {f["id"] for f in before["findings"]}
    a_ids = {f["id"] for f in after["findings"]}
    return {
        "schema": "decodegap.diff/1",
        "before": {"path": before["trace"]["path"], "step_ms": b_ms, "findings": sorted(b_ids)},
        "after": {"path": after["trace"]["path"], "step_ms": a_ms, "findings": sorted(a_ids)},
        "speedup": round(b_ms / a_ms, 4) if a_ms else None,
        "step_delta_ms": round(a_ms - b_ms, 4),
        "categories": categories,
        "kernels": [k for k in kernels if k["status"] != "same"],
        "unchanged_kernel_groups": sum(1 for k in kernels if k["status"] == "same"),
        "findings_vanished": sorted(b_ids - a_ids),
        "findings_appeared": sorted(a_ids - b_ids),
    }


def render_diff(d: dict, fmt: str = "text", top: int = 15) -> str:
    if fmt == "json":
        return json.dumps(d, indent=2) + "\n"
    md = fmt == "md"
    speed = f"{d['speedup']:.2f}x" if d["speedup"] else "n/a"
    lines = [("## " if md else "") + f"decodegap diff: {d['before']['path']} -> {d['after']['path']}", "",
             f"step time: {d['before']['step_ms']:.3f} ms -> {d['after']['step_ms']:.3f} ms "
             f"({d['step_delta_ms']:+.3f} ms, {speed} faster)" if d["speedup"] and d["speedup"] >= 1 else
             f"step time: {d['before']['step_ms']:.3f} ms -> {d['after']['step_ms']:.3f} ms "
             f"({d['step_delta_ms']:+.3f} ms, {speed})"]
    if d["findings_vanished"] or d["findings_appeared"]:
        lines.append(f"findings gone: {', '.join(d['findings_vanished']) or '-'}; "
                     f"new: {', '.join(d['findings_appeared']) or '-'}")
    lines += ["", "by category (ms/step)"]
    header = ["category", "before", "after", "delta"]
    rows = [[c["name"], f"{c['before_ms']:.3f}", f"{c['after_ms']:.3f}", f"{c['delta_ms']:+.3f}"]
            for c in d["categories"]]
    lines += _table(header, rows, md)
    lines += ["", f"kernel groups that changed ({d['unchanged_kernel_groups']} unchanged)"]
    header = ["status", "kernel", "category", "calls before", "calls after", "before ms", "after ms", "delta ms"]
    rows = [[k["status"], k["short_name"], k["category"], f"{k['before_calls']:g}", f"{k['after_calls']:g}",
             f"{k['before_ms']:.3f}", f"{k['after_ms']:.3f}", f"{k['delta_ms']:+.3f}"]
            for k in sorted(d["kernels"], key=lambda k: -abs(k["delta_ms"]))[:top]]
    lines += _table(header, rows, md)
    return "\n".join(lines) + "\n"


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

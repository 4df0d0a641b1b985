"""The Perfetto overlay (`analyze TRACE --annotate OUT`): the original trace with decodegap's own events added.

decodegap's events (`"cat": "decodegap"`) sit on their own process track: a span per step it found (`decode step
3`), a span per layer nested inside each step (`layer 12`), and on a second thread a span per kernel a finding
blames (`kv_pool_cast: <kernel>`; findings that blame no kernel get one instant at the first step). Opening OUT in
Perfetto or chrome://tracing shows decodegap's boundaries over the kernels.

The original text is streamed through unchanged, chunk by chunk (the input is never modified and never held
whole): decodegap's events are written right after the `[` that opens `traceEvents`, which the loader's reader
finds by the JSON's structure in any layout (wherever traceEvents sits among the top-level keys). Times are the
trace's own microseconds: the loader's times are nanoseconds from the trace's first event (`Trace.origin_ns`, which
includes `baseTimeNanoseconds` wherever the file wrote it, `Trace.base_ns`), so that base is taken off again."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from decodegap.ops import shapes as shape_info
from decodegap.breakdown.breakdown import infer_layers
from decodegap.errors import ParameterError, UserError
from decodegap.ops.kernel_names import short_kernel_name
from decodegap.steps.repetition import name_classes
from decodegap.trace.json_events import Reader
from decodegap.trace.load import file_id, same_file
from decodegap.trace.read import TruncatedStream, iter_text_chunks

if TYPE_CHECKING:
    from decodegap.pipeline import Report

# A pid no process can have (Linux pids stop at 2**22), so decodegap's track never merges with the trace's own.
PID = 0xDEC0DE
STEPS_TID, FINDINGS_TID = 1, 1000  # overlapping steps (rare) take lanes 2, 3, ...; findings likewise from 1000
MAX_SPANS_PER_FINDING = 100_000
MARGIN_NS = 2  # spans of one thread that would touch are kept this far apart (see _nested)
GZIP_LEVEL = 3  # fast: the overlay is for viewing, not archiving
_BLANKS = b" \t\n\r"


@dataclass(frozen=True)
class Span:
    name: str
    start_ns: int  # on the loader's clock (from the trace's first event)
    end_ns: int
    args: dict = field(default_factory=dict)


@dataclass
class Overlay:
    """decodegap's events for one trace file, before they are put on the file's clock."""

    steps: list[tuple[Span, list[Span]]] = field(default_factory=list)  # each step with its layers
    findings: list[Span] = field(default_factory=list)
    instants: list[Span] = field(default_factory=list)


# --- what to draw ----------------------------------------------------------------------------------------------

def overlay_of(rank, findings: list) -> Overlay:
    """Steps, their layers and the findings' kernels of one rank (a pipeline RankAnalysis)."""
    steps = rank.steps.steps
    overlay = Overlay()
    layer_bounds = _layer_finder(rank)
    for s in steps:
        word = "training iteration" if s.kind == "training" else f"{s.kind} step"
        args = {"phase": s.kind, "index": s.index, "ms": round(s.wall_ns / 1e6, 4)}
        args.update({k: v for k, v in (("label", s.label), ("batch", s.batch), ("tokens", s.tokens)) if v})
        step = Span(f"{word} {s.index}", s.start_ns, s.end_ns, args)
        layers = [Span(f"layer {i}", lo, hi, {"layer": i, "step": s.index})
                  for i, (lo, hi) in enumerate(_nested(layer_bounds(s), s.start_ns, s.end_ns))]
        overlay.steps.append((step, layers))
    first = min((s.start_ns for s in steps), default=0)
    for f in findings:
        spans = _finding_spans(rank, f)
        if spans:
            overlay.findings += spans
        else:  # a finding about the whole step (host-bound, profiler overhead): one mark where the steps begin
            overlay.instants.append(Span(f.id, first, first, {"finding": f.id, "title": f.title}))
    overlay.findings.sort(key=lambda sp: sp.start_ns)
    return overlay


def _layer_finder(rank):
    """A function step -> [(start_ns, end_ns)] of its layers. Each step is cut where the kernel that marks the layers
    in the typical step runs (its normalised name); a step where that kernel runs a different number of times has
    its own repeating block found (repetition.find_layers on its kernel sequence)."""
    trace, b = rank.trace, rank.breakdown
    if not trace.has_gpu:
        return lambda step: []
    mapping, _ = name_classes(trace.names)
    classes = mapping[trace.gpu.name_id.astype(np.int64)] if len(trace.gpu) else np.empty(0, np.int64)
    anchor, count = None, 0
    phase_steps = rank.steps.of(b.phase)
    if b.layer_starts and b.typical_step is not None and b.typical_step < len(phase_steps):
        typical = phase_steps[b.typical_step]
        anchor, count = int(classes[typical.rows[b.layer_starts[0]]]), len(b.layer_starts)
    gpu = trace.gpu

    def bounds(step) -> list[tuple[int, int]]:
        rows = step.rows
        if len(rows) < 2:
            return []
        starts = np.flatnonzero(classes[rows] == anchor) if anchor is not None else np.empty(0, np.int64)
        if anchor is None or len(starts) != count:
            found = infer_layers(trace, rows)
            starts = np.asarray(found.starts if found.count else (), dtype=np.int64)
        if len(starts) < 2:
            return []
        period = int(np.median(np.diff(starts)))
        out = []
        for i, lo in enumerate(starts.tolist()):
            hi = int(starts[i + 1]) if i + 1 < len(starts) else min(lo + period, len(rows))
            t0 = int(gpu.ts_ns[rows[lo]])
            t1 = int(gpu.ts_ns[rows[hi]]) if hi < len(rows) else int(gpu.end_ns[rows[lo:hi]].max())
            out.append((t0, t1))
        return out

    return bounds


def _nested(bounds: list[tuple[int, int]], lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """Layer spans inside their step and not overlapping each other: a thread's spans must nest to be drawn. A span
    that would end where the next layer (or its step) ends is cut MARGIN_NS short: a viewer that reads microseconds
    as float64 may move each end by a nanosecond, and touching spans would then overlap."""
    bounds = list(bounds)
    last = lo
    for i, (start, end) in enumerate(bounds):
        start = min(max(start, last, lo), hi)
        limit = min(hi, bounds[i + 1][0]) if i + 1 < len(bounds) else hi
        end = min(max(end, start), limit)
        if end == limit and end - start > 2 * MARGIN_NS:
            end -= MARGIN_NS
        last = end
        yield start, end


def _kernel_entries(evidence) -> list[dict]:
    """Every part of a finding's evidence that names a kernel (a "kernel" key, at any depth), outermost first."""
    out, stack = [], [evidence]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            if isinstance(item.get("kernel"), str):
                out.append(item)
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _agrees(k, entry: dict, finding, root: bool) -> bool:
    """Whether kernel group k is the one an evidence entry describes: by the numbers the entry gives (rounded as
    the detectors round them), its shapes, and for the evidence's root the finding's own time per step."""
    checks = []
    calls, ms, shapes = entry.get("calls_per_step"), entry.get("ms_per_step"), entry.get("shapes")
    if isinstance(calls, (int, float)):
        checks.append(abs(k.calls_per_step - calls) <= 0.006)
    if isinstance(ms, (int, float)):
        checks.append(abs(k.ms_per_step - ms) <= 0.0006)
    elif root:  # the finding's own time, as the report rounds it
        checks.append(abs(k.ms_per_step - finding.ms_per_step) <= 0.00006)
    if isinstance(shapes, list) and k.input_shapes is not None:
        checks.append([s for s, _ in k.input_shapes] == shapes)
    return bool(checks) and all(checks)


def blamed_groups(rank, finding) -> list:
    """The kernel groups (breakdown.KernelGroup) a finding blames. Evidence names a kernel in full or shortened;
    when that names several groups, the ones its numbers describe."""
    out = []
    evidence = finding.evidence.as_dict()
    for entry in _kernel_entries(evidence):
        name = entry["kernel"]
        named = [k for k in rank.breakdown.kernels if k.name == name or short_kernel_name(k.name) == name]
        if len(named) > 1:
            named = [k for k in named if _agrees(k, entry, finding, entry is evidence)] or named
        out += [k for k in named if k not in out]
    return out


def _signature(trace, links, row: int) -> tuple:
    """A GPU row's kernel group as the breakdown forms it: (name, op, op shapes) when its op recorded shapes,
    else (name, op, grid, block)."""
    gpu, ops = trace.gpu, trace.cpu_ops
    name = trace.names[int(gpu.name_id[row])]
    op = int(links.op_idx[row])
    op_name = trace.names[int(ops.name_id[op])] if op >= 0 else None
    if op >= 0 and ops.input_dims[op]:
        return name, op_name, [[shape, dtype] for shape, dtype in shape_info.tensors(ops.input_dims[op],
                                                                                   ops.input_types[op])]
    return (name, op_name, trace.shapes[int(gpu.grid_id[row])] or None, trace.shapes[int(gpu.block_id[row])] or None)


def _group_signature(k) -> tuple:
    if k.input_shapes is not None:
        return k.name, k.op, k.input_shapes
    return k.name, k.op, k.grid, k.block


def _finding_spans(rank, finding) -> list[Span]:
    """A span over every call, within the steps, of each kernel group the finding blames."""
    trace = rank.trace
    groups = blamed_groups(rank, finding) if trace.has_gpu else []
    if not groups:
        return []
    gpu = trace.gpu
    wanted = [_group_signature(k) for k in groups]
    name_ids = [i for i, n in enumerate(trace.names) if n in {k.name for k in groups}]
    rows = np.concatenate([s.rows for s in rank.steps.steps]) if rank.steps.steps else np.empty(0, np.int64)
    rows = np.sort(rows[np.isin(gpu.name_id[rows], name_ids)])
    spans = []
    for row in rows.tolist():
        if _signature(trace, rank.links, row) not in wanted:
            continue
        name = trace.names[int(gpu.name_id[row])]
        spans.append(Span(f"{finding.id}: {short_kernel_name(name)}", int(gpu.ts_ns[row]), int(gpu.end_ns[row]),
                          {"finding": finding.id, "kernel": name, "title": finding.title}))
        if len(spans) >= MAX_SPANS_PER_FINDING:
            break
    return spans


# --- on the file's clock ---------------------------------------------------------------------------------------

def _us(ns: int) -> str:
    """Nanoseconds as microseconds with three decimals, exactly (no float rounding of epoch-sized times)."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _lanes(spans: list[Span]) -> list[int]:
    """A lane per span (sorted by start) such that spans of one lane never overlap."""
    ends: list[int] = []
    out = []
    for sp in spans:
        lane = next((i for i, end in enumerate(ends) if end + MARGIN_NS <= sp.start_ns), len(ends))
        if lane == len(ends):
            ends.append(sp.end_ns)
        else:
            ends[lane] = sp.end_ns
        out.append(lane)
    return out


def event_lines(overlay: Overlay, shift_ns: int) -> list[bytes]:
    """The overlay as Chrome trace events (one JSON object each), shifted onto the file's clock."""
    enc = msgspec.json.encode
    tids: dict[int, str] = {}

    def span(sp: Span, tid: int) -> bytes:
        return (b'{"ph": "X", "cat": "decodegap", "name": ' + enc(sp.name) + b', "pid": %d, "tid": %d, '
                % (PID, tid) + b'"ts": ' + _us(sp.start_ns + shift_ns).encode() + b', "dur": '
                + _us(sp.end_ns - sp.start_ns).encode() + b', "args": ' + enc(sp.args) + b"}")

    lines = []
    for (step, layers), lane in zip(overlay.steps, _lanes([s for s, _ in overlay.steps]), strict=True):
        tid = STEPS_TID + lane
        tids[tid] = "steps and layers" + (f" ({lane + 1})" if lane else "")
        lines.append(span(step, tid))
        lines += [span(layer, tid) for layer in layers]
    for sp, lane in zip(overlay.findings, _lanes(overlay.findings), strict=True):
        tids[FINDINGS_TID + lane] = "findings" + (f" ({lane + 1})" if lane else "")
        lines.append(span(sp, FINDINGS_TID + lane))
    for sp in overlay.instants:
        tids.setdefault(FINDINGS_TID, "findings")
        lines.append(b'{"ph": "i", "s": "p", "cat": "decodegap", "name": ' + enc(sp.name)
                     + b', "pid": %d, "tid": %d, "ts": ' % (PID, FINDINGS_TID) + _us(sp.start_ns + shift_ns).encode()
                     + b', "args": ' + enc(sp.args) + b"}")
    meta = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "decodegap"}},
            {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": -1}}]
    meta += [{"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": name}}
             for tid, name in sorted(tids.items())]
    return [enc(m) for m in meta] + lines


# --- streaming the original through -----------------------------------------------------------------------------

def _chunks(path: Path) -> Iterator[bytes]:
    try:
        yield from iter_text_chunks(path)
    except TruncatedStream:
        raise UserError(f"{path}: cannot annotate a truncated trace (the gzip stream ends early)") from None


def write_annotated(src: Path, dst: Path, rank, findings: list) -> int:
    """Write src's text with decodegap's events for `rank` added to dst (gzip when dst ends in .gz). Returns the
    number of events added. They go right after the `[` that opens traceEvents, found by the loader's reader
    whatever the layout (the text before it is copied as it comes)."""
    lines = event_lines(overlay_of(rank, findings), rank.trace.origin_ns - rank.trace.base_ns)
    chunks = _chunks(src)
    locator = Reader(src, None, locate=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    try:
        with (gzip.open(tmp, "wb", compresslevel=GZIP_LEVEL) if dst.name.endswith(".gz") else open(tmp, "wb")) as out:
            offset = 0  # of the chunk in the text
            for chunk in chunks:
                locator.feed(chunk)
                if locator.events_at is not None:
                    split = locator.events_at - offset
                    out.write(chunk[:split])
                    rest = chunk[split:]
                    break
                out.write(chunk)
                offset += len(chunk)
            else:
                raise UserError(f"{src}: cannot annotate: no traceEvents list in the trace")
            while not rest.lstrip(_BLANKS):  # is the original list empty? (its first byte that is not blank says)
                more = next(chunks, None)
                if more is None:
                    break
                rest += more
            empty = rest.lstrip(_BLANKS)[:1] == b"]"
            out.write(b"\n  " + b",\n  ".join(lines) + (b"" if empty else b","))
            out.write(rest)
            last = bytes(rest[-64:])
            for chunk in chunks:
                out.write(chunk)
                last = (last + bytes(chunk[-64:]))[-64:]
        if last.rstrip(_BLANKS)[-1:] not in (b"}", b"]"):
            raise UserError(f"{src}: cannot annotate a truncated trace (its JSON ends early)")
        os.replace(tmp, dst)
    except OSError as exc:
        raise UserError(f"{dst}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return len(lines)


# --- the command's entry -----------------------------------------------------------------------------------------

TRACE_SUFFIXES = (".json", ".gz")  # an OUT named like this is a file, never the folder a folder input needs


def _folder_name(out: Path) -> str:
    name = out.name
    for suffix in (".gz", ".json"):
        name = name[: -len(suffix)] if name.lower().endswith(suffix) else name
    return str(out.with_name(name or "annotated"))


def check_target(src: str | Path, out: str | Path, keep: tuple[Path, ...] = ()) -> None:
    """Refuse an OUT that cannot receive the overlay of `src` (a folder for a file, a file for a folder, the
    input itself, or another file the run reads: `keep`, the model's config), before any analysis. Raises
    ParameterError naming `out`."""
    src, out = Path(src), Path(out)
    if src.is_dir():
        if out.exists() and not out.is_dir():
            raise ParameterError("{out}: is a file, but the input is a folder of traces: give a folder for the "
                                 "annotated traces", out=str(out))
        if not out.exists() and out.name.lower().endswith(TRACE_SUFFIXES):
            raise ParameterError(f"{{out}}: names a file, but the input is a folder of traces: give a folder for "
                                 f"the annotated traces (e.g. {_folder_name(out)})", out=str(out))
        if same_file(src, out):
            raise ParameterError("{out}: is the input folder; the annotated traces go to a new folder (the input "
                                 "is never changed)", out=str(out))
    elif out.is_dir():
        raise ParameterError("{out}: is a folder; give the annotated trace's file name (e.g. out.json.gz)",
                             out=str(out))
    elif same_file(src, out):
        raise ParameterError("{out}: is the input trace; the annotated trace goes to a new file (the input is "
                             "never changed)", out=str(out))
    for kept in keep:
        if same_file(Path(kept), out):
            raise ParameterError(f"{{out}}: is {kept}, an input of this run; the annotated trace goes to a new file "
                                 "(the input is never changed)", out=str(out))


def write_overlay(report: Report, out: str | Path) -> list[Path]:
    """Annotate every trace file of a pipeline Report: a file input gives the file `out`; a folder input gives a
    folder `out` holding each rank's file under its path relative to the input folder. Returns what was written."""
    out = Path(out)
    check_target(report.path, out)
    for r in report.ranks:
        if r.trace.truncated:
            raise UserError(f"{r.trace.path}: cannot annotate a truncated trace (its events would not close)")
    if report.path.is_dir():
        targets = [(r, out / r.trace.path.relative_to(report.path)) for r in report.ranks]
    else:
        targets = [(report.ranks[0], out)] if report.ranks else []
    inputs = {file_id(r.trace.path) for r in report.ranks}
    for _, dst in targets:  # any rank's trace, not only its own: OUT inside the input folder could name another's
        if file_id(dst) in inputs - {None}:
            raise ParameterError(f"{{out}}: {dst} is an input trace; the annotated trace goes to a new file (the "
                                 "input is never changed)", out=str(out))
    written = []
    for r, dst in targets:
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{dst.parent}: cannot create ({exc.strerror or exc})") from None
        write_annotated(r.trace.path, dst, _with_events(r.trace.path), report.findings)
        written.append(dst)
    return written


@dataclass
class RankTrace:
    """One rank with its event tables: the pipeline keeps only summaries, the overlay needs every kernel's rows."""

    trace: object
    links: object
    steps: object
    breakdown: object


def _with_events(path: Path) -> RankTrace:
    from decodegap.breakdown.breakdown import compute_breakdown
    from decodegap.steps.steps import find_steps
    from decodegap.trace import load_trace
    from decodegap.trace.link import link

    trace = load_trace(path)
    links = link(trace)
    steps = find_steps(trace, links)
    return RankTrace(trace, links, steps, compute_breakdown(trace, links, steps))

"""The view model: the facts of an Analysis, worded and formatted once, for every format (text, Markdown, HTML).

A view computes nothing about the trace: every number comes from the Analysis as it is; this module only words
it, formats it and picks what a reader sees first. The renderers (text.py, markdown.py, html.py) lay the same
View out, so the formats cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass

from decodegap.analysis import Analysis, Finding, Kernel
from decodegap.ops.kernel_names import short_kernel_name

# A text value of a finding's evidence longer than this is shown shortened (full on demand where the format can).
EVIDENCE_TEXT_MAX = 60

MAPPING_KEY = ("mapping: kernel family = attention/MoE/collective kernels; op = the launching op names it; shape = "
               "operand shapes against the model; coarse = calls per step against the layer counts, or several "
               "components compared together")


@dataclass(frozen=True)
class Name:
    """A cell whose full text is long (a kernel name): the short form is shown, the full one on demand."""

    short: str
    full: str

    def __str__(self) -> str:
        return self.short


Cell = str | Name


@dataclass(frozen=True)
class Table:
    key: str  # ranks | categories | kernels | floor | ledger
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    numeric: frozenset[int]  # right-aligned columns
    # Columns a narrow terminal drops, the least needed first; the rest always stay.
    optional: tuple[int, ...] = ()
    shrink: frozenset[int] = frozenset()  # text columns that a narrow terminal shortens (names)
    lead: str | None = None  # the sentence that heads the table (floor, ledger)
    note: str | None = None  # the line under it
    total_last: bool = False  # the last row is a total


@dataclass(frozen=True)
class FindingView:
    id: str
    title: str
    amount: str  # "67.467 ms/step (73% of the step)"
    evidence: tuple[tuple[str, Cell], ...]
    fix: str
    after_fix: str | None = None  # "26.128 ms/step = 38.3 tok/s per sequence"
    assumes: str | None = None  # what that estimate takes for granted


@dataclass(frozen=True)
class View:
    path: str
    summary: tuple[str, ...]
    findings: tuple[FindingView, ...]
    tables: tuple[Table, ...]
    warnings: tuple[str, ...]
    noun: str  # "decode step", "training iteration", "prefill forward"
    has_gpu: bool
    best_case: str | None = None  # the step once several findings are fixed, when more than one adds to it

    def table(self, key: str) -> Table | None:
        return next((t for t in self.tables if t.key == key), None)


# --- formatting ----------------------------------------------------------------------------------------------

def fmt_bytes(n: int | None) -> str:
    if not n:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_calls(calls: float) -> str:
    return f"{calls:.0f}" if abs(calls - round(calls)) < 0.05 else f"{calls:.2f}"


def _dims(value) -> str:
    if isinstance(value, list | tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    return str(value or "").replace(" ", "")


def fmt_shapes(k: Kernel) -> str:
    if k.input_shapes:
        return " ".join(f"{shape}" for shape, _ in k.input_shapes[:3]).replace(" ", "")
    if k.grid:
        return f"grid{_dims(k.grid)} block{_dims(k.block)}"
    return ""


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3f}"


def step_noun(phase: str) -> str:
    return {"decode": "decode step", "training": "training iteration"}.get(phase, f"{phase} forward")


def has_gpu(a: Analysis) -> bool:
    """Whether the trace has GPU activity: a CPU-only breakdown reports no busy fraction (0)."""
    return bool(a.gpu_busy_fraction) or any(r.gpu_busy_ms for r in a.step_rows)


def evidence_value(key: str, value) -> Cell:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return fmt_bytes(value) if key.startswith("bytes") or key.endswith("_bytes") else f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, str):
        return Name(short_kernel_name(value, EVIDENCE_TEXT_MAX), value) if len(value) > EVIDENCE_TEXT_MAX else value
    if isinstance(value, list | tuple):
        text = ", ".join(str(v) for v in value)
        return Name(text[: EVIDENCE_TEXT_MAX - 3] + "...", text) if len(text) > EVIDENCE_TEXT_MAX else text
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items())
        return Name(text[: EVIDENCE_TEXT_MAX - 3] + "...", text) if len(text) > EVIDENCE_TEXT_MAX else text
    return str(value)


# --- the view ------------------------------------------------------------------------------------------------

def summary_lines(a: Analysis) -> list[str]:
    phase = getattr(a.steps, a.breakdown_phase)
    gpu = has_gpu(a)
    lines = [f"decodegap: {a.trace.path}" + (f"  ({a.trace.device})" if a.trace.device else "")]
    lines.append(f"{a.summary}  [{a.steps.source}: {a.steps.source_detail}]")
    if phase.count:
        s = phase.ms
        noun = step_noun(a.breakdown_phase)
        rate = f"  = {1000 / s.median:.1f} tok/s per sequence" if s.median and a.breakdown_phase == "decode" else ""
        lines.append(f"{noun} time: median {s.median:.3f} ms  (min {s.min:.3f}, p90 {s.p90:.3f}, max {s.max:.3f})"
                     + rate if s.median else f"{noun} time: n/a")
        layers = f"; {a.layers} layers ({a.layers_evidence})" if a.layers else ""
        if gpu:
            lines.append(f"GPU busy {a.gpu_busy_fraction or 0:.0%} of the step; {a.gpu_ms_per_step or 0:.3f} ms of "
                         f"GPU work and {a.kernels_per_step or 0:.0f} GPU activities per step" + layers)
        else:
            lines.append(f"no GPU events: {a.gpu_ms_per_step or 0:.3f} ms of CPU op self time and "
                         f"{a.kernels_per_step or 0:.0f} CPU ops per step" + layers)
    if a.assumed:
        lines.append("assumed (not given): " + "; ".join(f"{x.name} {x.value}, {x.reason}" for x in a.assumed))
    check = a.profiler_check
    if check:
        band = (f" (p10-p90 {check.unprofiled_p10_ms:.3f}-{check.unprofiled_p90_ms:.3f} ms over "
                f"{check.samples} calls{', bimodal: two kinds of call' if check.bimodal else ''})"
                if check.unprofiled_p10_ms is not None and check.unprofiled_p90_ms is not None else "")
        lines.append(f"profiled {check.profiled_ms:.3f} ms vs unprofiled {check.unprofiled_ms:.3f} ms per step"
                     f"{band} ({check.source}): ratio {check.ratio:.2f}")
    return lines


def fmt_step(step_ms: float, tokens_per_s: float) -> str:
    return f"{step_ms:.3f} ms/step = {tokens_per_s:.1f} tok/s per sequence"


def _finding(f: Finding, gpu: bool) -> FindingView:
    work = "GPU" if gpu else "CPU op"
    basis = "of the step" if f.share_of == "step_wall" else f"of the step's {work} time"
    evidence = tuple((k, evidence_value(k, v)) for k, v in f.evidence.items() if v is not None)
    after = f.after_fix
    return FindingView(f.id, f.title, f"{f.ms_per_step:.3f} ms/step ({f.share:.0%} {basis})", evidence, f.fix,
                       fmt_step(after.step_ms, after.tokens_per_s) if after else None,
                       after.assumes if after else None)


def best_case_line(a: Analysis) -> str | None:
    """The best case in words, when it adds up more than one finding (else it is that finding's own estimate)."""
    best = a.best_case
    if best is None or len(best.findings) < 2:
        return None
    return f"{fmt_step(best.step_ms, best.tokens_per_s)} once {' + '.join(best.findings)} are fixed ({best.assumes})"


def _ranks(a: Analysis) -> Table | None:
    if len(a.ranks) <= 1:
        return None
    rows = tuple((f"{r.rank}{' (slowest)' if r.rank == a.slowest_rank else ''}", str(r.decode_steps),
                  f"{r.step_ms_median:.3f}", f"{r.gpu_busy_fraction:.0%}", f"{r.collective_ms_per_step:.3f}")
                 for r in a.ranks)
    return Table("ranks", "Ranks", ("rank", "decode steps", "step ms (median)", "GPU busy", "collective ms/step"),
                 rows, frozenset(range(5)))


def _categories(a: Analysis, noun: str, gpu: bool) -> Table | None:
    if not a.categories:
        return None
    unit = "GPU" if gpu else "CPU op"
    rows = [(c.name, f"{c.ms_per_step:.3f}", f"{c.share:.1%}", f"{c.share_of_step:.1%}") for c in a.categories]
    step = getattr(a.steps, a.breakdown_phase).ms.median
    if gpu and a.idle_ms_per_step is not None:
        rows.append(("(GPU idle)", f"{a.idle_ms_per_step:.3f}", "",
                     f"{a.idle_ms_per_step / step:.1%}" if step else ""))
    rank = f" (rank {a.slowest_rank})" if len(a.ranks) > 1 and a.slowest_rank is not None else ""
    return Table("categories", f"Time per {noun} by category{rank}", ("category", "ms/step", f"% {unit} time",
                                                                      "% of step"),
                 tuple(rows), frozenset({1, 2, 3}))


def _kernels(a: Analysis, top: int, gpu: bool) -> Table | None:
    if not a.kernels:
        return None
    what = "kernels" if gpu else "CPU ops (self time)"
    rows = []
    for k in a.kernels[:top]:
        shapes = fmt_shapes(k)
        op = (k.op or ("graph replay" if k.from_graph else "")) + (" " + shapes if shapes else "")
        rows.append((Name(k.short_name, k.name), k.category, fmt_calls(k.calls_per_step), f"{k.ms_per_step:.3f}",
                     f"{k.share:.1%}", f"{k.us_per_call:.1f}", op.strip(), fmt_bytes(k.bytes_per_call),
                     f"{k.gbps:.0f}" if k.gbps else ""))
    return Table("kernels", f"Top {what} ({min(top, len(a.kernels))} of {len(a.kernels)} groups)",
                 ("kernel", "category", "calls/step", "ms/step", "share", "us/call", "op / shapes", "bytes/call",
                  "GB/s"), tuple(rows), frozenset({2, 3, 4, 5, 7, 8}), optional=(6, 7, 8, 5, 2),
                 shrink=frozenset({0, 6}))


def floor_headline(a: Analysis) -> str:
    f = a.floor
    return (f"{f.model_type} on {f.tp} x {f.gpu}, batch {f.batch}, context {f.context}: floor {f.floor_ms:.3f} "
            f"ms/step = {f.tokens_per_s:.1f} tok/s per sequence ({f.aggregate_tokens_per_s:.1f} aggregate), "
            f"{f.bound}-bound")


def _floor(a: Analysis) -> Table | None:
    f = a.floor
    if f is None:
        return None
    rows = [(c.name, f"{c.ms:.3f}", f"{c.ms / f.floor_ms if f.floor_ms else 0:.1%}", c.bound, _gb(c.bytes_per_gpu),
             c.formats, c.detail) for c in f.components]
    memory = sum(c.bytes_per_gpu for c in f.components if c.category != "collective")  # wire bytes are no memory
    rows.append(("total", f"{f.floor_ms:.3f}", "100%", f.bound, _gb(memory), "", ""))
    p = f.params
    note = (f"params: {_billions(p.total)} total, {_billions(p.active)} active per token; quant: {f.quant}; "
            f"lower bound: {'; '.join(f.assumptions)}" if f.assumptions else
            f"params: {_billions(p.total)} total, {_billions(p.active)} active per token; quant: {f.quant}")
    return Table("floor", "Floor", ("component", "ms", "share", "bound", "GB/GPU", "format", "detail"), tuple(rows),
                 frozenset({1, 2, 4}), optional=(6, 5, 4), shrink=frozenset({0}), lead=floor_headline(a), note=note,
                 total_last=True)


def ledger_headline(a: Analysis) -> str:
    g = a.gap
    eff = f"{g.efficiency:.1%}" if g.efficiency is not None else "n/a"
    return (f"measured {g.step_ms:.3f} ms/step vs floor {g.floor_ms:.3f} ms on {g.tp} x {g.gpu or '?'} (efficiency "
            f"{eff}); excess {g.excess_ms:.3f} ms, of which the findings explain {g.explained_by_findings_ms:.3f} ms")


def _ledger(a: Analysis) -> Table | None:
    g = a.gap
    if g is None:
        return None
    rows = []
    for r in g.rows:
        eff = f"{r.efficiency:.1%}" if r.efficiency is not None else ""
        rows.append((r.category, f"{r.measured_ms:.3f}", f"{r.floor_ms:.3f}", f"{r.excess_ms:.3f}",
                     eff + (" BELOW FLOOR" if r.beats_floor else ""), r.mapping))
    return Table("ledger", "Gap ledger", ("component", "measured ms", "floor ms", "excess ms", "efficiency",
                                          "mapping"),
                 tuple(rows), frozenset({1, 2, 3, 4}), optional=(5,), shrink=frozenset({0}),
                 lead=ledger_headline(a), note=MAPPING_KEY)


def view_of(a: Analysis, top: int = 15) -> View:
    gpu = has_gpu(a)
    noun = step_noun(a.breakdown_phase)
    tables = [t for t in (_ranks(a), _categories(a, noun, gpu), _kernels(a, top, gpu), _floor(a), _ledger(a)) if t]
    return View(path=a.trace.path, summary=tuple(summary_lines(a)),
                findings=tuple(_finding(f, gpu) for f in a.findings), tables=tuple(tables),
                warnings=tuple(a.warnings), noun=noun, has_gpu=gpu, best_case=best_case_line(a))

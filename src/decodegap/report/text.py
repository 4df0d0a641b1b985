"""Terminal report: findings first, then the step, categories and top kernels, as rich tables."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from decodegap.kernel_names import short_kernel_name
from decodegap.steps import describe
from decodegap.profiler_check import profiler_check


def _fmt_bytes(n: int | None) -> str:
    if not n:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _calls(calls: float) -> str:
    return f"{calls:.0f}" if abs(calls - round(calls)) < 0.05 else f"{calls:.2f}"


def _shapes(k) -> str:
    if k.input_shapes:
        return " ".join(f"{shape}" for shape, _ in k.input_shapes[:3]).replace(" ", "")
    if k.grid:
        return f"grid{k.grid.replace(' ', '')} block{(k.block or '').replace(' ', '')}"
    return ""


def _terminal_width() -> int:
    """The real terminal's width when there is one (at least 120), else 160 for files and pipes."""
    import shutil
    import sys

    if sys.stdout.isatty():
        return max(shutil.get_terminal_size((160, 40)).columns, 120)
    return 160


def step_noun(phase: str) -> str:
    return {"decode": "decode step", "training": "training iteration"}.get(phase, f"{phase} forward")


def summary_lines(report) -> list[str]:
    main = report.main
    b, steps = main.breakdown, main.steps
    lines = [f"decodegap: {report.path}" + (f"  ({main.trace.device_name})" if main.trace.device_name else "")]
    lines.append(describe(steps, b.layers) + f"  [{steps.source}: {steps.detail}]")
    if b.counts.get(b.phase):
        s = b.step_ms
        noun = step_noun(b.phase)
        rate = f"  = {1000 / s.median:.1f} tok/s per sequence" if s.median and b.phase == "decode" else ""
        lines.append(f"{noun} time: median {s.median:.3f} ms  (min {s.min:.3f}, p90 {s.p90:.3f}, max {s.max:.3f})"
                     + rate if s.median else f"{noun} time: n/a")
        layers = f"; {b.layers} layers ({b.layers_evidence})" if b.layers else ""
        if main.trace.has_gpu:
            lines.append(f"GPU busy {b.gpu_busy_fraction:.0%} of the step; {b.gpu_ms_per_step:.3f} ms of GPU work and "
                         f"{b.kernels_per_step:.0f} GPU activities per step" + layers)
        else:
            lines.append(f"no GPU events: {b.gpu_ms_per_step:.3f} ms of CPU op self time and "
                         f"{b.kernels_per_step:.0f} CPU ops per step" + layers)
    check = profiler_check(report)
    if check:
        band = (f" (p10-p90 {check['unprofiled_p10_ms']:.3f}-{check['unprofiled_p90_ms']:.3f} ms over "
                f"{check['samples']} calls{', bimodal: two kinds of call' if check.get('bimodal') else ''})"
                if "unprofiled_p10_ms" in check else "")
        lines.append(f"profiled {check['profiled_ms']:.3f} ms vs unprofiled {check['unprofiled_ms']:.3f} ms per step"
                     f"{band} ({check['source']}): ratio {check['ratio']:.2f}")
    return lines


def render_text(report, top: int = 15, full_names: bool = False, width: int | None = None) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or _terminal_width(), force_terminal=False, color_system=None,
                      highlight=False, markup=False)
    for line in summary_lines(report):
        console.print(line)
    main = report.main
    b = main.breakdown
    if report.findings:
        console.print()
        console.print("ROOT CAUSES (by time per step)")
        for i, f in enumerate(report.findings, 1):
            console.print(f"{i}. [{f.id}] {f.title}")
            work = "GPU" if report.main.trace.has_gpu else "CPU op"
            basis = "of the step" if f.share_of == "step_wall" else f"of the step's {work} time"
            console.print(f"   {f.ms_per_step:.3f} ms/step ({f.share:.0%} {basis})")
            console.print(f"   fix: {f.fix}")
    if len(report.ranks) > 1:
        table = Table(title="ranks", title_justify="left")
        for col in ("rank", "decode steps", "step ms (median)", "GPU busy", "collective ms/step"):
            table.add_column(col, justify="right")
        for r in report.ranks:
            mark = " (slowest)" if r is main else ""
            table.add_row(f"{r.rank}{mark}", str(r.breakdown.decode_count), f"{r.breakdown.step_ms.median:.3f}",
                          f"{r.breakdown.gpu_busy_fraction:.0%}", f"{r.collective_ms_per_step():.3f}")
        console.print(table)
    if b.categories:
        unit = "GPU" if main.trace.has_gpu else "CPU op"
        rank_note = f" (rank {main.rank})" if len(report.ranks) > 1 else ""
        table = Table(title=f"time per {step_noun(b.phase)} by category{rank_note}", title_justify="left")
        for col in ("category", "ms/step", f"% {unit} time", "% of step"):
            table.add_column(col, justify="right" if col != "category" else "left")
        for c in b.categories:
            table.add_row(c.name, f"{c.ms_per_step:.3f}", f"{c.share:.1%}", f"{c.share_of_step:.1%}")
        idle = max(b.step_ms.median - b.busy_ms_per_step, 0.0)
        if main.trace.has_gpu:
            table.add_row("(GPU idle)", f"{idle:.3f}", "",
                          f"{idle / b.step_ms.median:.1%}" if b.step_ms.median else "")
        console.print(table)
    if b.kernels:
        what = "kernels" if main.trace.has_gpu else "CPU ops (self time)"
        table = Table(title=f"top {what} ({min(top, len(b.kernels))} of {len(b.kernels)} groups)",
                      title_justify="left")
        for col in ("kernel", "category", "calls/step", "ms/step", "share", "us/call", "op / shapes", "bytes/call",
                    "GB/s"):
            text_col = col in ("kernel", "category", "op / shapes")
            folded = col == "kernel" and full_names
            table.add_column(col, justify="left" if text_col else "right", no_wrap=not folded,
                             overflow="fold" if folded else "ellipsis",
                             max_width={"kernel": None if folded else 42, "op / shapes": 32}.get(col),
                             min_width=11 if col == "category" else None if text_col else len(col))
        for k in b.kernels[:top]:
            name = k.name if full_names else short_kernel_name(k.name)
            op = (k.op or ("graph replay" if k.from_graph else "")) + (" " + _shapes(k) if _shapes(k) else "")
            gbps = k.gbps
            table.add_row(name, k.category, _calls(k.calls_per_step), f"{k.ms_per_step:.3f}", f"{k.share:.1%}",
                          f"{k.us_per_call:.1f}", op, _fmt_bytes(k.bytes_per_call),
                          f"{gbps:.0f}" if gbps else "")
        console.print(table)
    if report.gap is not None:
        from decodegap.floor_ledger import render_gap_text

        console.print(render_gap_text(report.gap))
    if report.warnings:
        console.print()
        for w in report.warnings:
            console.print(f"warning: {w}")
    return buffer.getvalue()

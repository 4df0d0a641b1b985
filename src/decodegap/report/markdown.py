"""Markdown report, for pasting into an issue or a pull request."""

from __future__ import annotations

from decodegap.kernel_names import short_kernel_name
from decodegap.report.text import _calls, _fmt_bytes, _shapes, step_noun, summary_lines


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def render_markdown(report, top: int = 15) -> str:
    lines = ["## decodegap report", ""]
    lines += [f"- {line}" for line in summary_lines(report)]
    main = report.main
    b = main.breakdown
    if report.findings:
        lines += ["", "### Root causes", ""]
        for i, f in enumerate(report.findings, 1):
            work = "GPU" if report.main.trace.has_gpu else "CPU op"
            basis = "of the step" if f.share_of == "step_wall" else f"of {work} time"
            lines.append(f"{i}. **`{f.id}`** {f.title} — **{f.ms_per_step:.3f} ms/step ({f.share:.0%} {basis})**  ")
            lines.append(f"   Fix: {f.fix}")
    if len(report.ranks) > 1:
        lines += ["", "### Ranks", ""]
        lines += _table(["rank", "decode steps", "step ms", "GPU busy", "collective ms/step"],
                        [[str(r.rank), str(r.breakdown.decode_count), f"{r.breakdown.step_ms.median:.3f}",
                          f"{r.breakdown.gpu_busy_fraction:.0%}", f"{r.collective_ms_per_step():.3f}"]
                         for r in report.ranks])
    if b.categories:
        lines += ["", f"### Time per {step_noun(b.phase)} by category", ""]
        lines += _table(["category", "ms/step", "% GPU time", "% of step"],
                        [[c.name, f"{c.ms_per_step:.3f}", f"{c.share:.1%}", f"{c.share_of_step:.1%}"]
                         for c in b.categories])
    if b.kernels:
        lines += ["", "### Top kernels", ""]
        lines += _table(["kernel", "category", "calls/step", "ms/step", "share", "us/call", "op / shapes",
                         "bytes/call", "GB/s"],
                        [[f"`{short_kernel_name(k.name)}`", k.category, _calls(k.calls_per_step), f"{k.ms_per_step:.3f}",
                          f"{k.share:.1%}", f"{k.us_per_call:.1f}",
                          ((k.op or ("graph replay" if k.from_graph else "")) + " " + _shapes(k)).strip(),
                          _fmt_bytes(k.bytes_per_call), f"{k.gbps:.0f}" if k.gbps else ""]
                         for k in b.kernels[:top]])
    if report.gap is not None:
        from decodegap.floor_ledger import render_gap_markdown

        lines += ["", render_gap_markdown(report.gap)]
    if report.warnings:
        lines += ["", "### Warnings", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"

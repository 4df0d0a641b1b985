"""Markdown report, for pasting into an issue or a pull request: the same View as the terminal and HTML reports."""

from __future__ import annotations

from decodegap.analysis import Analysis
from decodegap.report.view import Name, Table, View, view_of


def _md(cell) -> str:
    text = f"`{cell.short}`" if isinstance(cell, Name) else cell
    return text.replace("|", "\\|")


def table_lines(t: Table) -> list[str]:
    out = ["| " + " | ".join(t.headers) + " |",
           "|" + "|".join("---:" if i in t.numeric else "---" for i in range(len(t.headers))) + "|"]
    for n, row in enumerate(t.rows):
        cells = [_md(c) for c in row]
        if t.total_last and n == len(t.rows) - 1:
            cells = [f"**{c}**" if c else c for c in cells]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_view(view: View) -> str:
    lines = ["## decodegap report", ""]
    lines += [f"- {line}" for line in view.summary]
    if view.findings:
        lines += ["", "### Root causes", ""]
        for i, f in enumerate(view.findings, 1):
            after = f"; after the fix: **{f.after_fix}**" if f.after_fix else ""
            lines.append(f"{i}. **`{f.id}`** {f.title} — **{f.amount}**{after}  ")
            if f.evidence:
                lines.append("   Evidence: " + "; ".join(f"{k} = {_md(v)}" for k, v in f.evidence) + "  ")
            lines.append(f"   Fix: {f.fix}" + ("  " if f.after_fix else ""))
            if f.after_fix:
                lines.append(f"   The estimate assumes {f.assumes}")
        if view.best_case:
            lines += ["", f"Best case: {view.best_case}"]
    for t in view.tables:
        lines += ["", f"### {t.title}", ""]
        if t.lead:
            lines += [f"{t.lead}.", ""]
        lines += table_lines(t)
        if t.note:
            lines += ["", t.note]
    if view.warnings:
        lines += ["", "### Warnings", ""] + [f"- {w}" for w in view.warnings]
    return "\n".join(lines) + "\n"


def render_markdown(analysis: Analysis, top: int = 15) -> str:
    return render_view(view_of(analysis, top))

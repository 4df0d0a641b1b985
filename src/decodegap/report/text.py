"""Terminal report: findings first, then the ranks, categories, top kernels, floor and gap ledger, as rich tables
that fit the terminal (COLUMNS honoured): a narrow terminal drops a table's least needed columns and shortens
kernel names, so every line fits."""

from __future__ import annotations

import io
import os
import shutil
import sys

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from decodegap.analysis import Analysis
from decodegap.report.view import Name, Table, View, view_of

PIPE_WIDTH = 160  # output to a file or a pipe, without COLUMNS
MIN_WIDTH = 40
NAME_MIN = 28  # a name column narrower than this stops being readable: drop other columns first
INDENT = 3


def terminal_width() -> int:
    """COLUMNS when set, else the terminal's width, else PIPE_WIDTH for files and pipes."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), MIN_WIDTH)
    if sys.stdout.isatty():
        return max(shutil.get_terminal_size((PIPE_WIDTH, 40)).columns, MIN_WIDTH)
    return PIPE_WIDTH


def _cell(value, full_names: bool) -> str:
    if isinstance(value, Name):
        return value.full if full_names else value.short
    return value


def _natural(t: Table, i: int, full_names: bool) -> int:
    return max([len(t.headers[i])] + [len(_cell(row[i], full_names)) for row in t.rows])


def shorten(text: str, width: int) -> str:
    """`text` in `width` characters, its middle left out: names differ at both ends (a GEMM's tile and its
    variant suffix), so keeping the head alone would make rows look alike."""
    if len(text) <= width:
        return text
    if width < 5:
        return text[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _rich_table(t: Table, keep: list[int], full_names: bool, name_widths: dict[int, int]) -> RichTable:
    """A rich table of the columns `keep`; name columns (t.shrink) at most name_widths[i] wide."""
    title = None if t.lead else t.title[0].lower() + t.title[1:]
    table = RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                      show_edge=False)
    for i in keep:
        if i in t.shrink:
            table.add_column(t.headers[i], no_wrap=not full_names, overflow="fold" if full_names else "ellipsis",
                             min_width=name_widths[i], max_width=name_widths[i])
        else:  # numbers and short words keep their width: only names give way
            table.add_column(t.headers[i], justify="right" if i in t.numeric else "left", no_wrap=True,
                             min_width=_natural(t, i, full_names))
    def cell(row, i: int) -> str:
        text = _cell(row[i], full_names)
        return shorten(text, name_widths[i]) if i in t.shrink and not full_names else text

    for n, row in enumerate(t.rows):
        table.add_row(*(cell(row, i) for i in keep),
                      style="bold" if t.total_last and n == len(t.rows) - 1 else None)
    return table


def _width_of(renderable) -> int:
    buffer = io.StringIO()
    Console(file=buffer, width=10_000, color_system=None, highlight=False, markup=False).print(renderable)
    return max((len(line.rstrip()) for line in buffer.getvalue().splitlines()), default=0)


def _name_widths(t: Table, keep: list[int], full_names: bool, width: int) -> tuple[dict[int, int], bool]:
    """Widths for the name columns that make the table `width` wide at most (each no wider than its longest
    name), and whether that is readable: each got at least NAME_MIN (or all it needs)."""
    names = [i for i in keep if i in t.shrink]
    if not names:
        return {}, True
    natural = {i: _natural(t, i, full_names) for i in names}
    fixed = _width_of(_rich_table(t, keep, full_names, dict.fromkeys(names, 1))) - len(names)
    budget = width - fixed
    total = sum(natural.values())
    if total <= budget:
        return natural, True
    # each name column its readable minimum, then what is left to them in order (the kernel name first)
    widths = {i: max(1, min(natural[i], NAME_MIN, budget // len(names))) for i in names}
    left = budget - sum(widths.values())
    for i in names:
        extra = max(min(natural[i] - widths[i], left), 0)
        widths[i] += extra
        left -= extra
    readable = all(widths[i] >= min(natural[i], NAME_MIN) for i in names)
    # an optional name column (op / shapes) stays only while the first one (the kernel) is shown whole
    whole = widths[names[0]] == natural[names[0]]
    return widths, readable and (whole or not any(i in t.optional for i in names))


def fit_table(t: Table, width: int, full_names: bool = False) -> RichTable:
    """The table with the columns that fit `width`: the least needed columns go first, until every name column
    has at least NAME_MIN characters; names are then shortened (ellipsis) to what is left."""
    keep = list(range(len(t.headers)))
    widths, readable = _name_widths(t, keep, full_names, width)
    for drop in t.optional:
        if readable:
            break
        keep.remove(drop)
        widths, readable = _name_widths(t, keep, full_names, width)
    return _rich_table(t, keep, full_names, widths)


def _print_findings(console: Console, view: View) -> None:
    console.print()
    console.print("ROOT CAUSES (by time per step)")
    for i, f in enumerate(view.findings, 1):
        console.print(f"{i}. [{f.id}] {f.title}")
        after = f"; after the fix: {f.after_fix}" if f.after_fix else ""
        console.print(Padding(Text(f.amount + after), (0, 0, 0, INDENT)))
        if f.evidence:
            evidence = "; ".join(f"{k}={v}" for k, v in f.evidence)
            console.print(Padding(Text(f"evidence: {evidence}"), (0, 0, 0, INDENT)))
        console.print(Padding(Text(f"fix: {f.fix}"), (0, 0, 0, INDENT)))
        if f.after_fix:
            console.print(Padding(Text(f"the estimate assumes {f.assumes}"), (0, 0, 0, INDENT)))
    if view.best_case:
        console.print(f"best case: {view.best_case}")


def render_view(view: View, full_names: bool = False, width: int | None = None) -> str:
    width = width or terminal_width()
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None, highlight=False,
                      markup=False)
    for line in view.summary:
        console.print(line)
    if view.findings:
        _print_findings(console, view)
    for t in view.tables:
        console.print()
        if t.lead:
            console.print(f"{t.title.upper()}: {t.lead}")
        console.print(fit_table(t, width, full_names))
        if t.note:
            console.print(Padding(Text(t.note), (0, 0, 0, 2)))
    if view.warnings:
        console.print()
        for w in view.warnings:
            console.print(f"warning: {w}")
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())  # rich pads lines to width


def render_text(analysis: Analysis, top: int = 15, full_names: bool = False, width: int | None = None) -> str:
    return render_view(view_of(analysis, top), full_names=full_names, width=width)

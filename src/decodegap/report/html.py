"""A self-contained HTML report: one file, no network, no script, its plots inline SVG drawn here. It lays out the
same View as the terminal and Markdown reports, plus three plots: the steps on a timeline (each step's time by
category, GPU idle on top), the layers of the typical step (time per layer, by layer kind), and the floor against
the measured step (the gap ledger's rows)."""

from __future__ import annotations

from html import escape

from decodegap.analysis import Analysis
from decodegap.report.view import Name, Table, View, view_of

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;width:100%;table-layout:auto}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right;vertical-align:top}
td.l,th.l{text-align:left}td.n{overflow-wrap:anywhere;min-width:16em}th{white-space:nowrap}
@media (max-width:900px){.opt{display:none}}
.scroll{max-width:100%;overflow-x:auto}
code{font-size:12px}.bar{background:#4a78c2;height:10px;display:inline-block}
.finding{border-left:4px solid #c2484a;padding:4px 12px;margin:10px 0;background:#fbf3f3}
.finding dl{display:grid;grid-template-columns:max-content 1fr;gap:0 12px;margin:6px 0;font-size:12px}
.finding dt{color:#555}.finding dd{margin:0;overflow-wrap:anywhere}
.fix{color:#333}.after{color:#1f5f2a}.warn{color:#8a5a00}details{font-size:12px;color:#555}summary{cursor:pointer}
svg{width:100%;max-width:1000px;height:auto;display:block}svg text{font:11px system-ui,sans-serif;fill:#333}
.note{font-size:12px;color:#555}
"""

PALETTE = ("#4a78c2", "#e08a3c", "#5aa65a", "#c2484a", "#8c6bb1", "#8c564b", "#d67ab1", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78")
IDLE = "#d9d9d9"
WIDTH, LEFT, RIGHT, TOP = 960, 72, 16, 12


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _rect(x: float, y: float, w: float, h: float, fill: str, tip: str, extra: str = "") -> str:
    return (f"<rect x='{_num(x)}' y='{_num(y)}' width='{_num(max(w, 0))}' height='{_num(max(h, 0))}' "
            f"fill='{fill}'{extra}><title>{escape(tip)}</title></rect>")


def _text(x: float, y: float, s: str, anchor: str = "start") -> str:
    return f"<text x='{_num(x)}' y='{_num(y)}' text-anchor='{anchor}'>{escape(s)}</text>"


def _svg(height: int, body: list[str], label: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {WIDTH} {height}' width='{WIDTH}' "
            f"height='{height}' role='img' aria-label='{escape(label)}'>" + "".join(body) + "</svg>")


def _legend(items: list[tuple[str, str]], y: float) -> list[str]:
    out, x = [], LEFT
    for name, color in items:
        if x + 14 + 7 * len(name) > WIDTH - RIGHT:
            x, y = LEFT, y + 16
        out.append(f"<rect x='{x}' y='{_num(y - 9)}' width='10' height='10' fill='{color}'/>")
        out.append(_text(x + 14, y, name))
        x += 14 + 7 * len(name) + 14
    return out


def _y_axis(top: float, height: float, vmax: float, unit: str) -> list[str]:
    out = [f"<line x1='{LEFT}' y1='{_num(top)}' x2='{LEFT}' y2='{_num(top + height)}' stroke='#999'/>"]
    for frac in (0, 0.5, 1):
        y = top + height * (1 - frac)
        out.append(f"<line x1='{LEFT - 4}' y1='{_num(y)}' x2='{WIDTH - RIGHT}' y2='{_num(y)}' stroke='#eee'/>")
        out.append(_text(LEFT - 6, y + 4, f"{vmax * frac:.3g} {unit}", "end"))
    return out


def category_colors(a: Analysis) -> dict[str, str]:
    names = [c.name for c in a.categories]
    names += sorted({c for r in a.step_rows for c in r.category_ms} - set(names))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def timeline_svg(a: Analysis) -> str:
    """The steps where they are on the trace's timeline, each a bar as wide as its wall time and as tall: its GPU
    time by category (scaled to the GPU-busy time when streams overlap), GPU idle on top; the floor dashed."""
    rows = a.step_rows
    if not rows:
        return ""
    colors = category_colors(a)
    plot_h, top = 200, TOP + 12  # room for the phase labels
    vmax = max([r.ms for r in rows] + [a.floor.floor_ms if a.floor else 0.0]) or 1.0
    plot_w = WIDTH - LEFT - RIGHT
    t0 = min(r.start_ms for r in rows)
    span = max(r.start_ms + r.ms for r in rows) - t0 or 1.0
    body = _y_axis(top, plot_h, vmax, "ms")
    phases = {r.phase for r in rows}
    for r in rows:
        x = LEFT + (r.start_ms - t0) / span * plot_w
        bar = max(r.ms / span * plot_w - 1, 1.0)  # a pixel apart: back-to-back steps stay told apart
        summed = sum(r.category_ms.values())
        scale = r.gpu_busy_ms / summed if summed > r.gpu_busy_ms > 0 else 1.0
        y = top + plot_h
        name = f"{r.phase} step {r.index}" + (f" ({r.label})" if r.label else "")
        for cat, ms in r.category_ms.items():
            h = ms * scale / vmax * plot_h
            y -= h
            body.append(_rect(x, y, bar, h, colors.get(cat, PALETTE[-1]), f"{name}: {cat} {ms:.3f} ms"))
        idle = max(r.ms - r.gpu_busy_ms, 0.0) if r.category_ms else r.ms
        h = idle / vmax * plot_h
        body.append(_rect(x, y - h, bar, h, IDLE, f"{name}: {r.ms:.3f} ms from {r.start_ms:.3f} ms, GPU idle "
                                                   f"{idle:.3f} ms"))
        if len(phases) > 1 and bar >= 7 * len(r.phase):  # which bar is a prefill, where the steps mix
            body.append(_text(x + bar / 2, y - h - 3, r.phase, "middle"))
    for frac in (0, 0.25, 0.5, 0.75, 1):
        body.append(_text(LEFT + frac * plot_w, top + plot_h + 14, f"{t0 + frac * span:.4g}",
                          "start" if frac == 0 else "end" if frac == 1 else "middle"))
    if a.floor:
        y = top + plot_h * (1 - a.floor.floor_ms / vmax)
        body.append(f"<line x1='{LEFT}' y1='{_num(y)}' x2='{WIDTH - RIGHT}' y2='{_num(y)}' stroke='#c2484a' "
                    f"stroke-dasharray='6 4'><title>floor {a.floor.floor_ms:.3f} ms</title></line>")
        body.append(_text(WIDTH - RIGHT, y - 4, f"floor {a.floor.floor_ms:.3f} ms", "end"))
    body.append(_text(LEFT + plot_w / 2, top + plot_h + 30, "trace time (ms); bar height: the step's time", "middle"))
    legend = [(c, colors[c]) for c in colors] + [("GPU idle", IDLE)]
    body += _legend(legend, top + plot_h + 50)
    return _svg(top + plot_h + 50 + 16 * (1 + len(legend) // 8), body, "timeline of the steps by category")


def layer_kind_rows(a: Analysis) -> list[tuple[str, int, float, float]]:
    """(kind, layers, mean ms, total ms) per layer kind, from the layer rows."""
    out = []
    kinds = sorted({r.kind for r in a.layer_rows})
    for kind in kinds:
        spans = [r.ms for r in a.layer_rows if r.kind == kind]
        markers = a.layer_kinds[kind].markers if kind < len(a.layer_kinds) else []
        name = f"kind {kind}" + (f" ({', '.join(markers[:3])})" if markers else "") if len(kinds) > 1 else "all"
        out.append((name, len(spans), sum(spans) / len(spans), sum(spans)))
    return out


def layers_svg(a: Analysis) -> str:
    """Each layer of the typical step: its span (from its first kernel to the next layer's) and, darker, the GPU
    time of its kernels; one color per layer kind."""
    rows = a.layer_rows
    if not rows:
        return ""
    plot_h, top = 160, TOP
    vmax = max(r.ms for r in rows) or 1.0
    plot_w = WIDTH - LEFT - RIGHT
    slot = plot_w / len(rows)
    bar = max(slot * 0.8, 1.0)
    body = _y_axis(top, plot_h, vmax, "ms")
    for n, r in enumerate(rows):
        x = LEFT + n * slot + (slot - bar) / 2
        color = PALETTE[r.kind % len(PALETTE)]
        h = r.ms / vmax * plot_h
        tip = f"layer {r.index} (kind {r.kind}): {r.ms:.3f} ms from {r.start_ms:.3f} ms"
        body.append(_rect(x, top + plot_h - h, bar, h, color, tip, " opacity='0.45'"))
        g = min(r.gpu_ms, r.ms) / vmax * plot_h
        body.append(_rect(x, top + plot_h - g, bar, g, color, f"layer {r.index}: GPU {r.gpu_ms:.3f} ms"))
        if len(rows) <= 40 or n % max(len(rows) // 20, 1) == 0:
            body.append(_text(x + bar / 2, top + plot_h + 14, str(r.index), "middle"))
    body.append(_text(LEFT + plot_w / 2, top + plot_h + 30, "layer of the typical step (light: span, dark: GPU time)",
                      "middle"))
    return _svg(top + plot_h + 40, body, "time per layer")


def floor_svg(a: Analysis) -> str:
    """The measured step against the floor, then each gap-ledger row: measured (solid) over floor (outlined)."""
    if a.floor is None:
        return ""
    pairs = [("step", a.gap.step_ms if a.gap else getattr(a.steps, a.breakdown_phase).ms.median, a.floor.floor_ms)]
    if a.gap:
        pairs += [(r.category, r.measured_ms, r.floor_ms) for r in a.gap.rows]
    vmax = max([m for _, m, _ in pairs] + [f for _, _, f in pairs]) or 1.0
    label_w, row_h = 300, 22
    plot_w = WIDTH - label_w - RIGHT - 150
    body = []
    for n, (name, measured, least) in enumerate(pairs):
        y = TOP + n * row_h
        body.append(_text(label_w - 8, y + 14, name if len(name) <= 44 else name[:41] + "...", "end"))
        body.append(_rect(label_w, y + 3, measured / vmax * plot_w, 8, "#4a78c2",
                          f"{name}: measured {measured:.3f} ms"))
        body.append(_rect(label_w, y + 12, least / vmax * plot_w, 8, "#ffffff", f"{name}: floor {least:.3f} ms",
                          " stroke='#c2484a'"))
        body.append(_text(label_w + max(measured, least) / vmax * plot_w + 6, y + 15,
                          f"{measured:.3f} / {least:.3f} ms"))
    height = TOP + len(pairs) * row_h
    body += _legend([("measured", "#4a78c2"), ("floor", "#c2484a")], height + 14)
    return _svg(height + 24, body, "floor against the measured step")


# --- tables and findings -------------------------------------------------------------------------------------

def _cell_html(cell) -> str:
    if isinstance(cell, Name):
        if cell.short == cell.full:
            return f"<code>{escape(cell.full)}</code>"
        return (f"<details title='{escape(cell.full)}'><summary><code>{escape(cell.short)}</code></summary>"
                f"<code>{escape(cell.full)}</code></details>")
    return escape(cell)


def table_html(t: Table, bars: list[float | None] | None = None) -> str:
    """The table; `bars`: a share (0..1) per row to draw as a bar beside it."""
    def cls(i: int) -> str:
        # names (kernels, ledger rows) break anywhere and a narrow window hides the optional columns (as the
        # terminal drops them): the table fits the window
        classes = ([] if i in t.numeric else ["l"]) + (["n"] if i in t.shrink else []) + (
            ["opt"] if i in t.optional else [])
        return f" class='{' '.join(classes)}'" if classes else ""

    head = "".join(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(t.headers)) + ("<th></th>" if bars else "")
    out = [f"<h2>{escape(t.title)}</h2>"]
    if t.lead:
        out.append(f"<p>{escape(t.lead)}</p>")
    out.append(f"<div class='scroll'><table><tr>{head}</tr>")
    for n, row in enumerate(t.rows):
        style = " style='font-weight:bold'" if t.total_last and n == len(t.rows) - 1 else ""
        cells = "".join(f"<td{cls(i)}>{_cell_html(c)}</td>" for i, c in enumerate(row))
        if bars is not None:
            share = bars[n] if n < len(bars) else None
            cells += ("<td class='l' style='width:35%'>"
                      + (f"<span class='bar' style='width:{100 * share:.1f}%'></span>" if share else "") + "</td>")
        out.append(f"<tr{style}>{cells}</tr>")
    out.append("</table></div>")
    if t.note:
        out.append(f"<p class='note'>{escape(t.note)}</p>")
    return "\n".join(out)


def findings_html(view: View) -> str:
    out = ["<h2>Root causes</h2>"]
    for f in view.findings:
        evidence = "".join(f"<dt>{escape(k)}</dt><dd>{_cell_html(v)}</dd>" for k, v in f.evidence)
        after = f"; <span class='after'>after the fix: <b>{escape(f.after_fix)}</b></span>" if f.after_fix else ""
        out.append(f"<div class='finding'><b><code>{escape(f.id)}</code></b> {escape(f.title)}<br>"
                   f"<b>{escape(f.amount)}</b>{after}"
                   + (f"<dl>{evidence}</dl>" if evidence else "<br>")
                   + f"<span class='fix'>Fix: {escape(f.fix)}</span>"
                   + (f"<br><span class='after'>The estimate assumes {escape(f.assumes or '')}</span>"
                      if f.after_fix else "") + "</div>")
    if view.best_case:
        out.append(f"<p class='after'>Best case: {escape(view.best_case)}</p>")
    return "\n".join(out)


def _layer_kinds_html(a: Analysis) -> str:
    rows = "".join(f"<tr><td class='l'>{escape(name)}</td><td>{count}</td><td>{mean:.3f}</td><td>{total:.3f}</td></tr>"
                   for name, count, mean, total in layer_kind_rows(a))
    return ("<table style='width:auto'><tr><th class='l'>layer kind</th><th>layers</th><th>mean ms</th>"
            f"<th>total ms</th></tr>{rows}</table>")


def render_view(view: View, a: Analysis) -> str:
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           "<meta name='viewport' content='width=device-width, initial-scale=1'><title>decodegap report</title>",
           f"<style>{STYLE}</style></head><body><h1>decodegap report</h1><ul>"]
    out += [f"<li>{escape(line)}</li>" for line in view.summary]
    out.append("</ul>")
    if view.findings:
        out.append(findings_html(view))
    timeline = timeline_svg(a)
    if timeline:
        out.append(f"<h2>Steps on the timeline ({len(a.step_rows)} steps)</h2>{timeline}")
    layers = layers_svg(a)
    if layers:
        out.append(f"<h2>Time per layer ({len(a.layer_rows)} layers of the typical {escape(view.noun)})</h2>{layers}"
                   + _layer_kinds_html(a))
    floor = floor_svg(a)
    if floor:
        out.append(f"<h2>Floor against the measured {escape(view.noun)}</h2>{floor}")
    for t in view.tables:
        out.append(table_html(t, bars=[c.share for c in a.categories] if t.key == "categories" else None))
    if view.warnings:
        out.append("<h2>Warnings</h2><ul>" + "".join(f"<li class='warn'>{escape(w)}</li>" for w in view.warnings)
                   + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def render_html(analysis: Analysis, top: int = 25) -> str:
    return render_view(view_of(analysis, top), analysis)


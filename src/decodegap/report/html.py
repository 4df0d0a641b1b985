"""A self-contained HTML report (no scripts, no external files): for sharing a diagnosis as one file."""

from __future__ import annotations

from html import escape

from decodegap.kernel_names import short_kernel_name
from decodegap.report.text import _calls, _fmt_bytes, _shapes, step_noun, summary_lines

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
td.l,th.l{text-align:left}code{font-size:12px}.bar{background:#4a78c2;height:10px;display:inline-block}
.finding{border-left:4px solid #c2484a;padding:4px 12px;margin:10px 0;background:#fbf3f3}
.fix{color:#333}.warn{color:#8a5a00}details{font-size:12px;color:#555}
"""


def render_html(report, top: int = 25) -> str:
    main = report.main
    b = main.breakdown
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>decodegap report</title>",
           f"<style>{STYLE}</style></head><body><h1>decodegap report</h1><ul>"]
    out += [f"<li>{escape(line)}</li>" for line in summary_lines(report)]
    out.append("</ul>")
    if report.findings:
        out.append("<h2>Root causes</h2>")
        work = "GPU" if main.trace.has_gpu else "CPU op"
        for f in report.findings:
            basis = "of the step" if f.share_of == "step_wall" else f"of the step's {work} time"
            out.append(f"<div class='finding'><b><code>{escape(f.id)}</code></b> {escape(f.title)}<br>"
                       f"<b>{f.ms_per_step:.3f} ms/step</b> ({f.share:.0%} {basis})<br>"
                       f"<span class='fix'>Fix: {escape(f.fix)}</span></div>")
    if len(report.ranks) > 1:
        out.append("<h2>Ranks</h2><table><tr><th>rank</th><th>decode steps</th><th>step ms</th><th>busy</th>"
                   "<th>collective ms/step</th></tr>")
        for r in report.ranks:
            out.append(f"<tr><td>{r.rank}</td><td>{r.breakdown.decode_count}</td>"
                       f"<td>{r.breakdown.step_ms.median:.3f}</td><td>{r.breakdown.gpu_busy_fraction:.0%}</td>"
                       f"<td>{r.collective_ms_per_step():.3f}</td></tr>")
        out.append("</table>")
    if b.categories:
        out.append(f"<h2>Time per {step_noun(b.phase)} by category</h2><table><tr><th class='l'>category</th>"
                   "<th>ms/step</th><th>share</th><th class='l'></th></tr>")
        for c in b.categories:
            out.append(f"<tr><td class='l'>{escape(c.name)}</td><td>{c.ms_per_step:.3f}</td><td>{c.share:.1%}</td>"
                       f"<td class='l'><span class='bar' style='width:{400 * c.share:.0f}px'></span></td></tr>")
        out.append("</table>")
    if b.kernels:
        out.append(f"<h2>Top kernels ({min(top, len(b.kernels))} of {len(b.kernels)} groups)</h2><table><tr>"
                   "<th class='l'>kernel</th><th class='l'>category</th><th>calls/step</th><th>ms/step</th>"
                   "<th>share</th><th>us/call</th><th class='l'>op / shapes</th><th>bytes/call</th><th>GB/s</th></tr>")
        for k in b.kernels[:top]:
            op = ((k.op or ("graph replay" if k.from_graph else "")) + " " + _shapes(k)).strip()
            out.append(f"<tr><td class='l'><details><summary><code>{escape(short_kernel_name(k.name))}</code>"
                       f"</summary>{escape(k.name)}</details></td><td class='l'>{escape(k.category)}</td>"
                       f"<td>{_calls(k.calls_per_step)}</td><td>{k.ms_per_step:.3f}</td><td>{k.share:.1%}</td>"
                       f"<td>{k.us_per_call:.1f}</td><td class='l'><code>{escape(op)}</code></td>"
                       f"<td>{_fmt_bytes(k.bytes_per_call)}</td><td>{f'{k.gbps:.0f}' if k.gbps else ''}</td></tr>")
        out.append("</table>")
    if report.gap is not None:
        from decodegap.floor_ledger import render_gap_html

        out.append(render_gap_html(report.gap))
    if report.warnings:
        out.append("<h2>Warnings</h2><ul>" + "".join(f"<li class='warn'>{escape(w)}</li>" for w in report.warnings)
                   + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


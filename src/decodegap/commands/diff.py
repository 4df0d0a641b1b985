"""`decodegap diff BEFORE AFTER`: two traces (or folders, or saved JSON reports) side by side; with
`--fail-if-slower PCT`, a CI gate on the median step."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json"]), default="text", show_default=True)
@click.option("--top", type=click.IntRange(1, 10_000), default=15, show_default=True)
@click.option("--fail-if-slower", "fail_pct", type=float, metavar="PCT",
              help="Exit 1 when AFTER's median step is more than PCT% slower than BEFORE's (a CI gate); "
                   "the verdict is the last line (on stderr with --format json).")
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="Hugging Face config.json (or its folder) of the traces' model: sharpens the findings of a trace "
                   "side (a saved report keeps its own).")
@click.option("--batch", type=click.IntRange(1, 1_000_000), help="Sequences per step (default: 1).")
@click.option("--context", type=click.IntRange(1, 100_000_000),
              help="KV tokens per sequence: sizes the active KV, so that kv_pool_cast can predict the step after "
                   "its fix.")
def command(before: Path, after: Path, fmt: str, top: int, fail_pct: float | None, model_path: Path | None,
            batch: int | None, context: int | None) -> None:
    """Compare two decode profiles: step time, categories and GPU idle, kernel groups new/gone/faster/slower,
    findings gone/kept/new."""
    from decodegap.api import load_report
    from decodegap.report.diff import check_gate_pct, check_inputs, diff_reports, gate, render_diff

    if fail_pct is not None:
        check_gate_pct(fail_pct)  # before the (slow) analysis of two traces
    check_inputs(before, after)
    sides = [load_report(p, model=model_path, batch=batch, context=context) for p in (before, after)]
    d = diff_reports(*sides)
    verdict = gate(d, fail_pct) if fail_pct is not None else None
    if verdict is not None:
        d["gate"] = verdict
    click.echo(render_diff(d, fmt, top), nl=False)
    if verdict is not None:
        # after a blank line: in Markdown a line right below a table would be read as one more row
        click.echo(verdict["verdict"] if fmt == "json" else "\n" + verdict["verdict"], err=fmt == "json")
        if verdict["failed"]:
            sys.exit(1)  # click's Exit is swallowed outside standalone mode

"""`decodegap diff BEFORE AFTER`: two traces (or folders, or saved JSON reports) side by side."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json"]), default="text", show_default=True)
@click.option("--top", type=click.IntRange(1, 10_000), default=15, show_default=True)
def command(before: Path, after: Path, fmt: str, top: int) -> None:
    """Compare two decode profiles: step time, categories, kernel groups new/gone/faster/slower, findings."""
    from decodegap.compare import check_inputs, diff_reports, load_report, render_diff

    check_inputs(before, after)
    click.echo(render_diff(diff_reports(load_report(before), load_report(after)), fmt, top), nl=False)

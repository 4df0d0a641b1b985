"""`decodegap demo`: reproduce the incident with a GLM-5-shaped decode loop, record it, analyze it; or compare
the KV read strategies (full_cast, gather_cast, fused) side by side."""

from __future__ import annotations

from pathlib import Path

import click

from decodegap.demo.config import KV_DTYPES, KV_READS, SCALES
from decodegap.errors import UserError


@click.command("demo")
@click.option("--kv-read", type=click.Choice(KV_READS), default="full_cast", show_default=True,
              help="How attention reads the FP8 KV pool: the incident's pool-wide cast, gather-then-cast, "
                   "or the fused Triton kernel.")
@click.option("--compare", is_flag=True, help="Run full_cast, gather_cast and fused in turn and compare them.")
@click.option("--scale", type=click.Choice(SCALES), default=None,
              help="tiny (CPU, seconds) or full (78 layers, 495,552-slot pool: one H200). "
                   "Default: full on a GPU, tiny on a CPU.")
@click.option("--layers", type=click.IntRange(1, 1000), help="Override the layer count.")
@click.option("--pool-slots", type=click.IntRange(1, 100_000_000), help="KV pool token slots per layer.")
@click.option("--context", type=click.IntRange(1, 10_000_000), help="Active tokens per sequence.")
@click.option("--batch", type=click.IntRange(1, 4096), help="Sequences decoded together.")
@click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default="fp8", show_default=True)
@click.option("--cuda-graph", is_flag=True, help="Capture one decode step in a CUDA graph and replay it.")
@click.option("--steps", type=click.IntRange(1, 1000), default=3, show_default=True, help="Profiled steps.")
@click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True, help="Steps before timing.")
@click.option("--timed", type=click.IntRange(1, 10_000), default=5, show_default=True,
              help="Steps timed without the profiler.")
@click.option("--shapes/--no-shapes", "record_shapes", default=True, show_default=True,
              help="Record op input shapes (what names the pool in the finding; not seen under graph replay).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("decodegap-demo"),
              show_default=True, help="Folder for the traces.")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path),
              help="With --compare: also write the table as Markdown to this file.")
@click.option("--seed", type=int, default=0, show_default=True)
def command(kv_read, compare, scale, layers, pool_slots, context, batch, kv_dtype, cuda_graph, steps, warmup, timed,
            record_shapes, device, out_dir, markdown_path, seed):
    """Run a GLM-5-shaped decode loop (random weights, paged FP8 latent KV pool), record it with the project's
    own profiler window, and print the analysis: on full_cast it names kv_pool_cast."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("decodegap demo needs torch (pip install 'decodegap[gpu]')") from None
    from decodegap.demo.config import make_config
    from decodegap.demo.model import DemoModel
    from decodegap.demo import runner

    try:
        dev = runner.pick_device(device)
    except (ValueError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    if cuda_graph and dev.type != "cuda":
        raise UserError("--cuda-graph needs a CUDA device")
    try:
        config = make_config(scale or ("full" if dev.type == "cuda" else "tiny"), layers=layers,
                             pool_slots=pool_slots, context=context, batch=batch, kv_dtype=kv_dtype,
                             kv_read=kv_read, cuda_graph=cuda_graph, seed=seed)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    reads = list(KV_READS) if compare else [kv_read]
    effective = []
    for r in reads:
        eff, note = runner.effective_kv_read(r, dev)
        if note:
            click.echo(f"note: {note}", err=True)
        if eff not in effective:
            effective.append(eff)
    click.echo(f"demo: {config.layers} layers, hidden {config.hidden}, {config.heads} heads, {config.experts} experts "
               f"top-{config.top_k}, pool {config.pool_slots:,} slots x {config.kv_width} {config.kv_dtype} "
               f"({config.pool_bytes_per_layer * config.layers / 1e9:.2f} GB), {config.batch} x {config.context:,} "
               f"active tokens, on {dev}" + (" with CUDA graphs" if cuda_graph else ""), err=True)
    model = DemoModel(config.with_(kv_read=effective[0]), dev)
    if compare:
        rows = runner.compare(model, effective, cuda_graph, timed, out_dir, steps, warmup, record_shapes,
                              log=lambda m: click.echo(m, err=True))
        click.echo(runner.compare_table(rows), nl=False)
        if markdown_path is not None:
            try:
                markdown_path.write_text(runner.compare_table(rows, markdown=True))
            except OSError as exc:
                raise UserError(f"{markdown_path}: cannot write ({exc.strerror})") from None
        for r in rows:
            click.echo(f"trace {r.kv_read}: {r.trace}")
        _print_diffs(rows)
        return
    from decodegap.analysis import build
    from decodegap.report.text import render_text

    runner.set_kv_read(model, effective[0], cuda_graph)
    path = runner.record(model, out_dir, steps, warmup, timed, record_shapes)
    click.echo(render_text(build(runner.analyze(path, config))), nl=False)
    click.echo(f"trace: {path}")


def _print_diffs(rows) -> None:
    """What each fix changed in the recorded traces, against the first strategy (full_cast)."""
    from decodegap.report.diff import diff_reports, render_diff
    from decodegap.report.json import report_dict

    base = rows[0]
    for row in rows[1:]:
        if base.report is not None and row.report is not None:
            click.echo()
            click.echo(render_diff(diff_reports(report_dict(base.report), report_dict(row.report)), "text", top=8),
                       nl=False)

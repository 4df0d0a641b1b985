"""`decodegap analyze TRACE`: where every millisecond of a decode step goes, and why."""

from __future__ import annotations

import math
from pathlib import Path

import click

from decodegap.errors import UserError

def example_path(name: str = "example_trace.json.gz") -> Path:
    """A file of the bundled example (decodegap.api.EXAMPLE_TRACE and its config)."""
    return Path(__file__).parent.parent / "data" / name  # the package's folder, as importlib.resources finds it


def _finite_positive_ms(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    # click's FloatRange lets nan and inf through (every comparison with nan is False)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a time in ms (a finite number above 0)", ctx=ctx, param=param)
    return value


def render(analysis, fmt: str, top: int = 15, full_names: bool = False) -> str:
    """The report of one Analysis in a format: every format reads the same Analysis (built once)."""
    if fmt == "json":
        from decodegap.report.json import render_json

        return render_json(analysis) + "\n"
    if fmt == "html":
        from decodegap.report.html import render_html

        return render_html(analysis, top=top)
    if fmt == "md":
        from decodegap.report.markdown import render_markdown

        return render_markdown(analysis, top=top)
    from decodegap.report.text import render_text

    return render_text(analysis, top=top, full_names=full_names)


@click.command("analyze")
@click.argument("trace", required=False, type=click.Path(path_type=Path))
@click.option("--example", is_flag=True,
              help="Analyze the bundled example: the incident reproduced on an H200 (with its GLM-5 config).")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json", "html"]), default="text", show_default=True)
@click.option("--top", type=click.IntRange(1, 10_000), default=15, show_default=True, help="Kernel groups to list.")
@click.option("--full-names", is_flag=True, help="Show full kernel names in the text report.")
@click.option("--tpot", "tpot_ms", type=float, callback=_finite_positive_ms,
              help="Time per output token measured WITHOUT the profiler, in ms, to cross-check the profiled step.")
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="Hugging Face config.json (or its folder): sharpens findings and enables the floor.")
@click.option("--quant", "quant_path", type=click.Path(path_type=Path), help="hf_quant_config.json, if separate.")
@click.option("--weights", help="Weight format when the config has none (bf16, fp8, nvfp4, mxfp4, q4_k, ...).")
@click.option("--kv", "kv_format", help="KV cache dtype (bf16, fp8).")
@click.option("--gpu", help="GPU for the floor and gap ledger (h100, h200, b200, a100, l40s, rtx-pro-6000, mi300x); "
                            "default with --model: the GPU the trace names.")
@click.option("--tp", type=click.IntRange(1, 1024), default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--batch", type=click.IntRange(1, 1_000_000), help="Sequences per step, for the floor (default: 1).")
@click.option("--context", type=click.IntRange(1, 100_000_000),
              help="KV tokens per sequence (default for the floor: 4096); also sizes the active KV for findings.")
@click.option("--allreduce-us", type=click.FloatRange(min=0), help="All-reduce latency for the floor, in us.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the report to a file instead of stdout.")
@click.option("--jobs", type=click.IntRange(1, 4096),
              help="Ranks of a folder analyzed in parallel processes (default: the cores, capped by memory).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Analyze the ranks of a folder as Ray tasks (pip install 'decodegap[ray]'): alone, a local Ray for "
                   "this run; with an address (auto, ray://head:10001), that cluster. Put it after TRACE.")
@click.option("--annotate", "annotate_out", type=click.Path(path_type=Path), metavar="OUT",
              help="Also write the trace with decodegap's steps, layers and findings added (opens in Perfetto; "
                   "gzip when OUT ends in .gz; a folder of traces gives a folder OUT).")
def command(trace, example, fmt, top, full_names, tpot_ms, model_path, quant_path, weights, kv_format, gpu, tp,
            batch, context, allreduce_us, output, jobs, ray_address, annotate_out):
    """Read a torch.profiler trace (a .json/.json.gz file or a folder of per-rank traces) and show where the
    time of each decode step goes, the root causes, and the fixes."""
    # (decodegap.analysis: imported as the trace is read)
    from decodegap.api import EXAMPLE_TRACE, input_files, run
    from decodegap.trace.load import same_file
    from decodegap.report.progress import load_progress

    if trace is None and ray_address and Path(ray_address).exists():  # `--ray TRACE`: the trace, not an address
        trace, ray_address = Path(ray_address), ""
    if example and trace:
        raise UserError("give a TRACE or --example, not both")
    if not example and trace is None:
        raise UserError("missing TRACE (a .json/.json.gz trace or a folder of them); try --example")
    source = EXAMPLE_TRACE if example else trace
    read = input_files(source, model_path, quant_path)  # before the analysis: an output that is an input is refused
    if output is not None:
        for file in read:
            if same_file(file, output):
                raise UserError(f"-o {output}: is {file}, an input of this run; the report goes to a new file (the "
                                "input is never changed)")
    if annotate_out is not None:  # before the analysis: a wrong OUT is refused at once
        from decodegap.report.annotate import check_target

        if output is not None and output.resolve() == annotate_out.resolve():
            raise UserError(f"{output}: -o and --annotate name the same file")
        if source.exists():
            check_target(source, annotate_out, keep=read)
    with load_progress():
        report = run(source, model=model_path, quant=quant_path, weights=weights,
                     kv=kv_format, gpu=gpu, tp=tp, batch=batch, context=context, tpot_ms=tpot_ms,
                     allreduce_us=allreduce_us, jobs=jobs, ray=ray_address)
    if annotate_out is not None:
        from decodegap.report.annotate import write_overlay

        for written in write_overlay(report, annotate_out):
            click.echo(f"decodegap: annotated trace written to {written}", err=True)
    from decodegap.analysis import build

    text = render(build(report), fmt, top=top, full_names=full_names)
    if output is not None:
        try:
            output.write_text(text)
        except OSError as exc:
            raise UserError(f"{output}: cannot write ({exc.strerror})") from None
    else:
        click.echo(text, nl=False)
